"""The train action's torchrun launcher: 2 CPU processes (gloo) train for real."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from core.store import Store
from tests.conftest import ROOT, run_cli

pytestmark = [pytest.mark.ml, pytest.mark.slow]
PY = sys.executable


def test_torchrun_two_cpu_processes_train(tmp_path):
    subprocess.run([PY, "-m", "core.ml.tiny", str(tmp_path / "models"), "--fit-steps", "0"],
                   check=True, capture_output=True, cwd=ROOT)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "v5.yaml").write_text((ROOT / "plans/train/v5.yaml").read_text())
    plan = tmp_path / "tr.yaml"
    plan.write_text(json.dumps({
        "name": "tr", "hosts": {"box": {"local": True, "workdir": str(tmp_path), "python": PY}},
        "items": [
            {"id": "feats", "content": "features", "action": {"kind": "extract_hidden",
             "host": "box", "params": {"target": "models/target", "prompts": "host:models/prompts.jsonl",
                                       "layers": [0, 2, 3], "out": "feats", "max_new_tokens": 32}}},
            {"id": "train", "content": "torchrun x2", "needs": ["feats"],
             "action": {"kind": "train", "host": "box", "params": {
                 "config": "train/v5.yaml", "launcher": "torchrun", "nproc_per_node": 2,
                 "overrides": {"target": "models/target", "data.features": "feats",
                               "train.max_steps": 20, "train.checkpoint_every": 10,
                               "train.log_every": 5}}}}]}))
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "--all", env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    s = Store(tmp_path / "s.db")
    run = s.latest_run("train")
    assert run["launcher"] == "torchrun"
    assert [a["step"] for a in s.artefacts("train", "checkpoint")] == [10, 20]
    assert [st for st, _ in s.metric_series(run["id"], "loss")] == [5, 10, 15, 20]
    log = s.log_bytes(run["id"]).decode()
    assert "torch.distributed.run" in (tmp_path / ".specdeck" / "runs" / run["id"] / "cmd.sh").read_text()
    assert '"world_size": 2' in log or "world_size=2" in log or "2 ranks" in log, log[-2000:]
