"""``train.keep_checkpoints: 2`` with a detached tau watcher, on a real sshd training host: the
trainer no longer prunes tau-blind; the watcher keeps the newest two, the best by tau and the
step another item names (``item:train@step:40``), deletes the rest once evaluated, and the
deletions reach the journal and ``status`` with the bytes they freed."""

from __future__ import annotations

import json

import pytest
import yaml

from core.state.store import Store
from tests.conftest import ROOT, run_cli
from tests.integration.test_watch_detached import EVERY, capsules, make_plan

pytestmark = [pytest.mark.integration, pytest.mark.ml, pytest.mark.slow]
STEPS = 5 * EVERY


def test_keep_two_keeps_the_best_tau_and_a_named_step_and_says_what_it_freed(
        sshd_factory, tiny_models, tmp_path):
    (gpu,) = sshd_factory(1)
    plan, wd = make_plan(tmp_path, tiny_models, gpu, steps=STEPS)
    doc = json.loads(plan.read_text())
    doc["hosts"]["kpro6"]["env"] = {"PYTHONPATH": str(ROOT)}  # this checkout's core.ml there
    train = next(i for i in doc["items"] if i["id"] == "train")
    train["action"]["params"]["overrides"]["train.keep_checkpoints"] = 2
    doc["items"].append({"id": "strip-40", "content": "the step the operator chose",
                         "needs": ["train"], "action": {"kind": "extract_weights", "host": "kpro6",
                         "params": {"checkpoint": "item:train@step:40", "out": "drafters/s40"}}})
    plan.write_text(json.dumps(doc))
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "--all", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    s = Store(tmp_path / "s.db")
    run = s.latest_run("train")
    train_cap, watch_cap = capsules(wd, run.id)
    # the trainer was told to keep all: the watcher, which knows tau, prunes
    assert yaml.safe_load((train_cap / "train.yaml").read_text())["train"]["keep_checkpoints"] is None
    taus = {e.step: e.tau for e in s.watch_entries(run.id)}
    assert sorted(taus) == list(range(EVERY, STEPS + 1, EVERY)), (  # every one evaluated first
        res.stderr[-2000:], (watch_cap / "log").read_text()[-2000:])
    best = max(sorted(taus), key=lambda st: taus[st])
    out_dir = wd / run.config["out_dir"]  # an absolute host path stays itself
    left = sorted(int(p.name[5:-3]) for p in out_dir.glob("step_*.pt"))
    want = sorted({STEPS - EVERY, STEPS, best, 40})
    assert left == want, (left, taus)
    assert (wd / "drafters/s40/model.safetensors").exists()  # the named step was there to strip
    log = json.loads((watch_cap / "retention.json").read_text())
    gone = sorted(d["step"] for d in log["deleted"])
    assert gone == sorted(set(taus) - set(want))
    assert all(d["bytes"] > 0 for d in log["deleted"])
    events = s.events(kinds=["checkpoints_deleted"])
    journaled = sorted(st for e in events for st in e.data["steps"])
    assert journaled == gone  # each deletion journaled once
    assert sum(e.data["freed_bytes"] for e in events) == log["freed_bytes"] > 0
    assert all("freed" in e.message and "kept" in e.message for e in events)
    s.close()
    doc = json.loads(run_cli("status", plan, "--json", env=env).stdout)
    w = {i["id"]: i.get("watcher") for i in doc["items"]}["train"]
    assert sorted(w["deleted"]) == gone and w["freed_bytes"] == log["freed_bytes"]
