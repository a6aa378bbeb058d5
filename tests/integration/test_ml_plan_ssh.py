"""The ML actions end to end on two real sshd hosts (a training host and an eval host):
extract_hidden -> train (process launcher, tiny model, 100 steps) -> extract_weights from its
checkpoint -> relay -> eval against a baseline drafter; compare --json reports both; a
v4-options run and a default run differ in exactly the documented knobs (diff)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import ROOT, run_cli
from tests.integration.mlplan import extract_item, ssh_host

pytestmark = [pytest.mark.integration, pytest.mark.ml, pytest.mark.slow]


def test_extract_train_strip_relay_eval_compare_diff(sshd_factory, tiny_models, tmp_path):
    gpu, ev = sshd_factory(2)
    train_wd, eval_wd = tmp_path / "kpro6", tmp_path / "ct129"
    for wd in (train_wd, eval_wd):
        (wd / "models").mkdir(parents=True)
        subprocess.run(["cp", "-r", str(tiny_models / "target"), str(wd / "models/target")], check=True)
    subprocess.run(["cp", "-r", str(tiny_models / "drafter"), str(eval_wd / "models/zlab")], check=True)
    (tmp_path / "train").mkdir()
    for name in ("v5.yaml", "v4-legacy.yaml"):
        (tmp_path / "train" / name).write_text((ROOT / "plans" / "train" / name).read_text())
    overrides = {"target": "models/target", "data.features": "feats/train",
                 "train.max_steps": 100, "train.checkpoint_every": 50, "train.log_every": 10}
    plan = tmp_path / "campaign.yaml"
    plan.write_text(json.dumps({
        "name": "campaign",
        "hosts": {"kpro6": ssh_host(gpu, train_wd), "ct129": ssh_host(ev, eval_wd)},
        "items": [
            extract_item("feats", "Extract hidden states on the training host", "kpro6",
                         prompts=str(tiny_models / "prompts.jsonl"), layers=[0, 2, 3], out="feats/train",
                         max_new_tokens=48),
            {"id": "train-v5", "content": "Train v5", "needs": ["feats"],
             "action": {"kind": "train", "host": "kpro6", "params": {
                 "config": "train/v5.yaml", "overrides": overrides}}},
            {"id": "train-v4", "content": "Train v4 (legacy options)", "needs": ["feats"],
             "action": {"kind": "train", "host": "kpro6", "params": {
                 "config": "train/v4-legacy.yaml", "overrides": {**overrides, "train.max_steps": 50}}}},
            {"id": "strip", "content": "Strip optimizer state", "needs": ["train-v5"],
             "action": {"kind": "extract_weights", "host": "kpro6", "params": {
                 "checkpoint": "item:train-v5@latest", "out": "drafters/v5"}}},
            {"id": "relay", "content": "Relay the drafter to the eval host", "needs": ["strip"],
             "action": {"kind": "relay", "params": {"src": "kpro6:drafters/v5",
                                                    "dst": "ct129:drafters/v5"}}},
            {"id": "eval", "content": "Eval v5 vs z-lab", "needs": ["relay"],
             "action": {"kind": "eval", "host": "ct129", "params": {
                 "drafter": "drafters/v5", "baseline": "models/zlab", "target": "models/target",
                 "prompts": str(tiny_models / "prompts.jsonl"), "max_new_tokens": 32,
                 "label": "v5"}}},
        ]}))
    # prompts given as absolute local paths: they are files beside nothing; use host: form
    doc = json.loads(plan.read_text())
    for it in doc["items"]:
        p = it["action"]["params"]
        if "prompts" in p:
            p["prompts"] = "host:" + p["prompts"]
    plan.write_text(json.dumps(doc))
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    assert run_cli("validate", plan).returncode == 0
    res = run_cli("run", plan, "--all", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "train-v5: step " in res.stderr and "tokens/s" in res.stderr  # training progress shown
    doc = json.loads(run_cli("status", plan, "--json", env=env).stdout)
    assert all(i["status"] == "done" for i in doc["items"]), doc
    comp = json.loads(run_cli("compare", plan, "--json", env=env).stdout)
    text = json.dumps(comp)
    assert "v5" in text and "baseline" in text
    # checkpoints are artefacts; metrics were recorded from the JSON lines
    from core.state.store import Store

    s = Store(tmp_path / "s.db")
    steps = [a.step for a in s.artefacts("train-v5", "checkpoint")]
    assert steps == [50, 100]
    run = s.latest_run("train-v5")
    losses = s.metric_series(run.id, "loss")
    assert [st for st, _ in losses][:3] == [10, 20, 30] and losses[-1][0] == 100
    # v4 vs v5: exactly the documented knobs differ
    res = run_cli("diff", plan, "train-v4", "train-v5", "--json", env=env)
    assert res.returncode == 0, res.stderr
    diff = json.loads(res.stdout)
    assert set(diff) == {"loss.soft_kl_weight", "loss.temperature", "loss.streak_weighting",
                         "loss.gamma", "noise.target", "fc_layers", "train.max_steps"}, diff
