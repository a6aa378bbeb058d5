"""A run whose start fails on a real sshd host ends (never stays ``starting``) and the CLI
exits with the contract's status: 1 when the host refused or a remote command failed (even
killed by a signal), 3 when the host went away, never 0 or the remote command's number."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from core.capsules import jobs
from core.plans.planfile import parse_plan
from core.runs.runner import Runner
from core.state.store import Store
from tests.conftest import run_cli

pytestmark = pytest.mark.integration


def _plan(tmp_path: Path, alias: str, workdir: Path, env: dict | None = None) -> Path:
    host = {"ssh": alias, "workdir": str(workdir), **({"env": env} if env else {})}
    p = tmp_path / "p.yaml"
    p.write_text(json.dumps({
        "name": "p", "hosts": {"gpu": host},
        "items": [{"id": "job", "content": "a remote job",
                   "action": {"kind": "shell", "host": "gpu",
                              "params": {"command": "echo never"}}}]}))
    return p


def _runs(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT state, error FROM runs").fetchall()


def _run_and_check(plan: Path, state: Path) -> tuple:
    env = {"SPECDECK_STATE": str(state)}
    res = run_cli("run", plan, "job", env=env)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    runs = _runs(state)
    assert len(runs) == 1 and runs[0][0] == "failed", runs  # never left `starting`
    doc = json.loads(run_cli("status", plan, "--json", env=env).stdout)
    assert doc["items"][0]["status"] == "failed"
    return res, runs[0][1]


def test_a_refused_start_ends_the_run_failed_and_exits_1(sshd, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the workdir's parent should be\n")
    plan = _plan(tmp_path, sshd.alias, blocker / "remote")
    res, error = _run_and_check(plan, tmp_path / "s.db")
    assert "not-a-dir" in error and "gpu" in error  # says where and what


def test_a_start_command_killed_by_a_signal_exits_1_not_0(sshd, tmp_path):
    # The launch's own shell dies of SIGKILL (a fake `touch` kills its parent shell): the
    # remote command has no exit status at all, which used to exit 0.
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    (fakebin / "touch").write_text("#!/bin/sh\nkill -KILL $PPID\n")
    (fakebin / "touch").chmod(0o755)
    plan = _plan(tmp_path, sshd.alias, tmp_path / "remote",
                 env={"PATH": f"{fakebin}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
    res, error = _run_and_check(plan, tmp_path / "s.db")
    assert "signal KILL" in error and "signal KILL" in res.stderr


async def test_a_host_lost_while_starting_ends_the_run_and_counts_unreachable(
        sshd, tmp_path, monkeypatch):
    plan_path = _plan(tmp_path, sshd.alias, tmp_path / "remote")
    plan = parse_plan(plan_path.read_text(), str(plan_path), path=plan_path)
    store = Store(tmp_path / "s.db")
    runner = Runner(plan, store, poll=0.05)
    real = jobs.start

    async def host_goes_away(host, run_id, launch, **kw):
        sshd.stop()  # the capsule's files were not written yet
        return await real(host, run_id, launch, **kw)

    monkeypatch.setattr(jobs, "start", host_goes_away)
    try:
        summary = await runner.run_items(["job"])
        assert summary.unreachable == ("job",) and not summary.failed  # the CLI: exit 3
        run = store.latest_run("job")
        assert run.state == "failed" and not store.live_runs()
        assert run.capsule and run.capsule in run.error and "gpu" in run.error
        assert runner.statuses()["job"] == "failed"
    finally:
        await runner.close()
        store.close()


def test_a_node_that_cannot_start_stops_the_ranks_already_started(sshd_factory, tmp_path):
    # torchrun over two hosts: node 0 starts, node 1's workdir cannot exist. The run fails and
    # node 0's rank is stopped (it would wait for its peer forever), not left behind.
    s0, s1 = sshd_factory(2)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x\n")
    plan = tmp_path / "t.yaml"
    plan.write_text(json.dumps({
        "name": "t",
        "hosts": {"node0": {"ssh": s0.alias, "workdir": str(tmp_path / "wd0")},
                  "node1": {"ssh": s1.alias, "workdir": str(blocker / "wd1")}},
        "items": [{"id": "job", "content": "two-node training",
                   "action": {"kind": "train", "host": "node0", "params": {
                       "command": "exec sleep 300", "launcher": "torchrun",
                       "nodes": ["node1"], "rdzv_port": 29555}}}]}))
    state = tmp_path / "s.db"
    res, error = _run_and_check(plan, state)
    assert "not-a-dir" in error
    pids = list((tmp_path / "wd0" / ".specdeck" / "runs").glob("*/pid"))
    assert len(pids) == 1  # node 0 did start
    pid = int(pids[0].read_text().split()[0])
    assert not Path(f"/proc/{pid}").exists() or \
        Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
