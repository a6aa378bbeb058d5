"""The train action's torchrun launcher: 2 CPU processes (gloo) train for real, on one host
and across two real sshd hosts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from core.state.store import Store
from tests.conftest import ROOT, run_cli

pytestmark = [pytest.mark.ml, pytest.mark.slow]
PY = sys.executable


def train_plan_run(tmp_path, hosts: dict, prompts: str, launch: dict) -> tuple[Store, dict]:
    """Extract features on the first host, train 20 steps with ``launch`` params there; the
    run must succeed with checkpoints at 10 and 20 and two ranks in its log."""
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "v5.yaml").write_text((ROOT / "plans/train/v5.yaml").read_text())
    node0 = next(iter(hosts))
    plan = tmp_path / "tr.yaml"
    plan.write_text(json.dumps({
        "name": "tr", "hosts": hosts,
        "items": [
            {"id": "feats", "content": "features", "action": {"kind": "extract_hidden",
             "host": node0, "params": {"target": "models/target", "prompts": prompts,
                                       "layers": [0, 2, 3], "out": "feats", "max_new_tokens": 32}}},
            {"id": "train", "content": "torchrun", "needs": ["feats"],
             "action": {"kind": "train", "host": node0, "params": {
                 "config": "train/v5.yaml", "launcher": "torchrun", **launch,
                 "overrides": {"target": "models/target", "data.features": "feats",
                               "train.max_steps": 20, "train.checkpoint_every": 10,
                               "train.log_every": 5}}}}]}))
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "--all", env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    s = Store(tmp_path / "s.db")
    run = s.latest_run("train")
    assert run.state == "succeeded" and run.launcher == "torchrun"
    assert [a.step for a in s.artefacts("train", "checkpoint")] == [10, 20]
    assert [st for st, _ in s.metric_series(run.id, "loss")] == [5, 10, 15, 20]
    log = s.log_bytes(run.id).decode()
    assert '"world_size": 2' in log or "world_size=2" in log or "2 ranks" in log, log[-2000:]
    return s, run


def test_torchrun_two_cpu_processes_train(tmp_path):
    subprocess.run([PY, "-m", "core.ml.tiny", str(tmp_path / "models"), "--fit-steps", "0"],
                   check=True, capture_output=True, cwd=ROOT)
    _, run = train_plan_run(tmp_path, {"box": {"local": True, "workdir": str(tmp_path),
                                               "python": PY}},
                            "host:models/prompts.jsonl", {"nproc_per_node": 2})
    cmd = (tmp_path / ".specdeck" / "runs" / run.id / "cmd.sh").read_text()
    assert "torch.distributed.run" in cmd and "--standalone" in cmd


@pytest.mark.integration
def test_torchrun_across_two_ssh_hosts(sshd_factory, tiny_models, tmp_path):
    """Multi-node torchrun: node 0 is the item's host (the rendezvous, at the HostName the
    ssh config resolves its alias to), node 1 a second plan host with its own capsule and
    config copy; one process each, world size 2, gloo."""
    from tests.integration.sshd import free_port

    n0, n1 = sshd_factory(2)
    wd0, wd1 = tmp_path / "node0", tmp_path / "node1"
    (wd0 / "models").mkdir(parents=True)
    wd1.mkdir()
    subprocess.run(["cp", "-r", str(tiny_models / "target"), str(wd0 / "models/target")],
                   check=True)
    port = free_port("127.0.0.2")
    _, run = train_plan_run(
        tmp_path, {"node0": {"ssh": n0.alias, "workdir": str(wd0), "python": PY},
                   "node1": {"ssh": n1.alias, "workdir": str(wd1), "python": PY}},
        "host:" + str(tiny_models / "prompts.jsonl"),
        {"nproc_per_node": 1, "nodes": ["node1"], "rdzv_port": port})
    node0 = wd0 / ".specdeck" / "runs" / run.id
    node1 = wd1 / ".specdeck" / "runs" / run.id
    cmd0, cmd1 = (node0 / "cmd.sh").read_text(), (node1 / "cmd.sh").read_text()
    assert f"--rdzv_endpoint 127.0.0.2:{port}" in cmd0 and f"127.0.0.2:{port}" in cmd1
    assert "--node_rank 1" in cmd1 and "--nnodes 2" in cmd1
    assert (node1 / "train.yaml").read_text() == (node0 / "train.yaml").read_text()
    assert (node1 / "exit").read_text().strip() == "exit 0"
