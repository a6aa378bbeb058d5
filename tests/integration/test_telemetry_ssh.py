"""Host telemetry over a real OpenSSH connection: a train item runs detached on an sshd test
host whose PATH starts with a fake ``nvidia-smi`` (tests/fakegpu.py: four GPUs, GPU 2
falling to 0 %); ``specdeck status --json`` samples the host at each call (no agent, the
host's own connection) and shows the four GPUs, their processes and the disk, and raises
the stall alert exactly once. A host without nvidia-smi: status says so and exits 0."""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests import fakegpu
from tests.conftest import run_cli

pytestmark = pytest.mark.integration

PLAN = """
name: tele-ssh
hosts:
  gpu: {{ssh: sshd0, workdir: {wd}, python: {py}}}
telemetry: {{every: 0.5, idle_minutes: 0.02}}
items:
  - id: train
    content: A trainer that runs until stopped
    action: {{kind: train, host: gpu, params: {{command: "exec sleep 60", out: out}}}}
"""


def _plan(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.format(wd=tmp_path / "remote-wd", py=sys.executable))
    return path


def _started(tmp_path) -> tuple:
    """The plan's train item started detached over SSH: (plan, state, env)."""
    plan, state = _plan(tmp_path), tmp_path / "state.db"
    env = {"SPECDECK_STATE": str(state)}
    res = run_cli("run", plan, "train", "--detach", env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    return plan, state, env


def _status(plan, state) -> dict:
    res = run_cli("status", plan, "--json", env={"SPECDECK_STATE": str(state)}, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_status_json_shows_four_gpus_and_one_stall_alert_over_ssh(sshd_factory, tmp_path):
    bin_dir = tmp_path / "fakebin"
    fakegpu.install(bin_dir, idle_after=2)
    sshd_factory(1, path_first=bin_dir)
    plan, state, env = _started(tmp_path)
    try:
        doc = _status(plan, state)
        gpu = doc["hosts"]["gpu"]
        assert [g["index"] for g in gpu["gpus"]] == [0, 1, 2, 3] and gpu["no_gpus"] is None
        assert {g["name"] for g in gpu["gpus"]} == {"NVIDIA H100 80GB HBM3"}
        assert [g["util"] for g in gpu["gpus"]] == [87.0, 93.0, 91.0, 89.0]
        assert gpu["gpus"][3]["power"] is None and gpu["gpus"][0]["power"] == 312.45
        assert gpu["gpus"][1]["processes"] == [
            {"pid": 41214, "used_mib": 61499.0, "name": "/usr/bin/python3"}]
        run_id = doc["items"][0]["run"]["id"]
        assert gpu["run"] == run_id and doc["items"][0]["run"]["state"] == "running"
        disk = gpu["disks"][0]
        assert disk["path"].endswith(f".specdeck/runs/{run_id}") and disk["free"] > 0
        assert doc["alerts"] == []
        alerts: list = []
        for _ in range(12):  # GPU 2 idle from the 3rd sample; 1.2 s idle raises it
            time.sleep(0.4)
            doc = _status(plan, state)
            alerts = doc["alerts"]
            if alerts:
                break
        assert len(alerts) == 1, alerts
        assert alerts[0]["run"] == run_id and "stall" in alerts[0]["message"]
        assert "GPU 2" in alerts[0]["message"] and "GPU 0" not in alerts[0]["message"]
        assert doc["hosts"]["gpu"]["gpus"][2]["util"] == 0.0
        time.sleep(0.5)
        assert len(_status(plan, state)["alerts"]) == 1  # raised once, not at every look
        text = run_cli("status", plan, env=env, timeout=60)
        assert text.returncode == 0
        assert "host gpu: 4 GPUs 67 % (0 87 % · 1 93 % · 2 0 % · 3 89 %)" in text.stdout, \
            text.stdout
        assert "ALERT" in text.stdout and "stall" in text.stdout
    finally:
        run_cli("stop", plan, "train", "--yes", "--grace", "1", env=env, timeout=60)


def test_a_host_without_nvidia_smi_breaks_nothing(sshd_factory, tmp_path):
    sshd_factory(1)  # sshd's own PATH: no nvidia-smi there
    plan, state, env = _started(tmp_path)
    try:
        doc = _status(plan, state)
        gpu = doc["hosts"]["gpu"]
        assert gpu["gpus"] == [] and gpu["no_gpus"] == "no nvidia-smi on this host"
        assert gpu["disks"] and gpu["disks"][0]["free"] > 0
        assert doc["items"][0]["run"]["state"] == "running" and doc["alerts"] == []
        text = run_cli("status", plan, env=env, timeout=60)
        assert text.returncode == 0
        assert "host gpu: no GPU telemetry (no nvidia-smi on this host); disk " in text.stdout
    finally:
        run_cli("stop", plan, "train", "--yes", "--grace", "1", env=env, timeout=60)
