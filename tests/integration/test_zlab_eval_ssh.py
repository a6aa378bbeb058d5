"""An eval item on one of the reference's sets, over a real sshd: the set is built on the machine
that runs specdeck from the copy the plan names, uploaded content-addressed, and evaluated turn
by turn on the eval host (mt-bench); the stored rows are the subset's turns."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.ml]

QUESTIONS = [[f"Write a line about {i}.", "Now shorter."] for i in range(5)]


def test_eval_on_zlab_mt_bench_over_ssh(sshd_factory, tiny_models, tmp_path):
    (ev,) = sshd_factory(1)
    wd = tmp_path / "ct129"
    (wd / "models").mkdir(parents=True)
    for name in ("target", "drafter"):
        subprocess.run(["cp", "-r", str(tiny_models / name), str(wd / "models" / name)], check=True)
    data = tmp_path / "data" / "mt_bench" / "data" / "train-00000-of-00001.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("".join(json.dumps({"prompt_id": i, "prompt": q}) + "\n" for i, q in enumerate(QUESTIONS)))
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({
        "name": "zlab",
        "hosts": {"ct129": {"ssh": ev.alias, "workdir": str(wd), "python": sys.executable}},
        "items": [{"id": "eval", "content": "tau on the reference's mt-bench",
                   "action": {"kind": "eval", "host": "ct129", "params": {
                       "drafter": "models/drafter", "target": "models/target", "limit": 2,
                       "prompts": "zlab:mt-bench:data/mt_bench", "max_new_tokens": 6}}}]}))
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "--all", env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    uploaded = list((wd / ".specdeck" / "prompts").glob("zlab-mt-bench-*.jsonl"))
    assert len(uploaded) == 1 and json.loads(uploaded[0].read_text().splitlines()[0])["prompt_set"]["seed"] == 42

    order = list(range(len(QUESTIONS)))
    random.Random(42).shuffle(order)
    want = {f"mt-bench/{i}#{k}" for i in order[:2] for k in (1, 2)}
    from core.state.store import Store

    store = Store(tmp_path / "s.db")
    assert {r.prompt_id for r in store.eval_results("eval")} == want
    assert {r.settings["prompts"] for r in store.eval_results("eval")} == {
        hashlib.sha256(uploaded[0].read_bytes()).hexdigest()}
    result = json.loads(Path(store.latest_run("eval").result["result"]).read_text())
    assert [p["id"] for p in result["per_prompt"]] == [f"mt-bench/{i}#{k}" for i in order[:2] for k in (1, 2)]
    assert result["prompts"]["set"]["subset"] == 2 and result["prompts"]["set"]["name"] == "zlab:mt-bench"
