"""Detached runs on real sshd hosts: kill -9 of specdeck, remote SIGKILL, sshd restarts,
hostile logs. The stored log must hold every line exactly once whatever happens."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.runs.events import HostStateChanged, RunEnded
from core.plans.planfile import parse_plan
from core.runs.runner import Runner
from core.state.store import Store
from tests.conftest import ROOT, cli_until, run_cli

pytestmark = pytest.mark.integration


def ssh_plan(tmp_path: Path, alias: str, command: str, name: str = "r") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(json.dumps({
        "name": name,
        "hosts": {"gpu": {"ssh": alias, "workdir": str(tmp_path / "remote")}},
        "items": [{"id": "job", "content": "a remote job",
                   "action": {"kind": "shell", "host": "gpu", "params": {"command": command}}}],
    }))
    return p


def test_kill_9_of_run_then_attach_stores_every_line_once(sshd, tmp_path):
    plan = ssh_plan(tmp_path, sshd.alias,
                    "for i in $(seq 1 240); do echo \"line $i\"; sleep 0.05; done")
    state = tmp_path / "s.db"
    proc = cli_until(state, "run", plan, "job", line="│ line 40")
    proc.kill()
    proc.wait()
    res = run_cli("attach", plan, "job", env={"SPECDECK_STATE": str(state)}, timeout=60)
    assert res.returncode == 0, res.stderr
    log = run_cli("logs", plan, "job", env={"SPECDECK_STATE": str(state)}).stdout
    assert log.splitlines() == [f"line {i}" for i in range(1, 241)]
    doc = json.loads(run_cli("status", plan, "--json", env={"SPECDECK_STATE": str(state)}).stdout)
    run = doc["items"][0]["run"]
    assert (run["state"], run["exit_code"], doc["items"][0]["status"]) == ("succeeded", 0, "done")


async def _runner(plan_path: Path, store: Store, events: list) -> Runner:
    plan = parse_plan(plan_path.read_text(), str(plan_path), path=plan_path)
    return Runner(plan, store, emit=events.append, poll=0.05)


async def _start(tmp_path: Path, alias: str, command: str):
    """A runner running ``command`` as item ``job`` on ``alias``: (store, events, runner, task)."""
    store = Store(tmp_path / "s.db")
    events: list = []
    runner = await _runner(ssh_plan(tmp_path, alias, command), store, events)
    return store, events, runner, asyncio.create_task(runner.run_item(runner.plan.item("job")))


async def test_remote_sigkill_fails_the_item_with_signal_9(sshd, tmp_path):
    store, events, runner, task = await _start(tmp_path, sshd.alias, "echo started; sleep 300")
    for _ in range(200):
        run = store.live_run("job")
        if run and run.pid and store.log_tail(run.id):
            break
        await asyncio.sleep(0.05)
    os.kill(run.pid, signal.SIGKILL)  # the "remote" process: same machine, other sshd
    t0 = time.monotonic()
    status = await asyncio.wait_for(task, 10)
    assert time.monotonic() - t0 < 5
    end = store.run(run.id)
    assert status == "failed"
    assert (end.state, end.signal, end.exit_code) == ("failed", "KILL", None)
    assert any(isinstance(e, RunEnded) and e.signal == "KILL" for e in events)
    await runner.close()


async def test_sshd_outage_then_reconnect_resumes_the_stream(sshd, tmp_path):
    store, events, runner, task = await _start(
        tmp_path, sshd.alias, "for i in $(seq 1 150); do echo \"n $i\"; sleep 0.04; done")
    for _ in range(400):
        run = store.live_run("job")
        if run and run.log_lines >= 20:
            break
        await asyncio.sleep(0.05)
    sshd.stop()  # the server and every session on it go away; the run capsule does not
    for _ in range(400):
        if any(isinstance(e, HostStateChanged) and e.state in ("reconnecting", "unreachable")
               for e in events):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("host state never left connected")
    assert not task.done()
    await asyncio.sleep(1.0)
    sshd.start()
    status = await asyncio.wait_for(task, 60)
    assert status == "done"
    states = [e.state for e in events if isinstance(e, HostStateChanged)]
    assert states[-1] == "connected" and any(s in ("reconnecting", "unreachable") for s in states)
    run = store.latest_run("job")
    assert store.log_bytes(run.id).decode().splitlines() == [f"n {i}" for i in range(1, 151)]
    await runner.close()


async def test_hostile_log_content_is_stored_byte_exact(sshd, tmp_path):
    script = tmp_path / "remote" / "hostile.py"
    script.parent.mkdir(parents=True)
    script.write_text(
        "import sys\n"
        "w = sys.stdout.buffer.write\n"
        "w(b'\\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 clear:\\x1b[2J\\n')\n"
        "w(b'x' * (1 << 20) + b'\\n')\n"
        "w(b'bad utf8 \\xff\\xfe\\xc3\\n')\n"
        "w(b'{\"step\": 1, \"loss\": 2.5, \"acc\": [0.5, 0.25]}\\n')\n"
        "w(b'no newline at the end')\n")
    plan = ssh_plan(tmp_path, sshd.alias, f"python3 {script}")
    store = Store(tmp_path / "s.db")
    runner = await _runner(plan, store, [])
    assert await runner.run_item(runner.plan.item("job")) == "done"
    run = store.latest_run("job")
    remote = (Path(run.capsule) / "log").read_bytes()
    assert store.log_bytes(run.id) == remote
    assert store.metric_series(run.id, "loss") == [(1, 2.5)]
    assert store.metric_series(run.id, "acc[1]") == [(1, 0.25)]
    from core.text import sanitize

    shown = sanitize(store.log_tail(run.id, 10)[0])
    assert "\x1b" not in shown and "red" in shown
    await runner.close()


def test_changed_host_key_is_refused_by_run(sshd, ssh_home, tmp_path):
    plan = ssh_plan(tmp_path, sshd.alias, "echo hi")
    sshd.stop()
    sshd.regenerate_host_key()
    sshd.start()
    res = run_cli("run", plan, "job", env={"SPECDECK_STATE": str(tmp_path / "s.db")})
    assert res.returncode == 3, res.stderr
    assert "CHANGED" in res.stderr or "changed" in res.stderr
    assert not (tmp_path / "remote" / ".specdeck").exists()


def test_params_reach_the_remote_command_literally(sshd, tmp_path):
    p = tmp_path / "q.yaml"
    p.write_text(json.dumps({
        "name": "q", "hosts": {"gpu": {"ssh": sshd.alias, "workdir": str(tmp_path / "remote")}},
        "vars": {"v": "'; touch pwned1 #"},
        "items": [{"id": "job", "content": "x", "action": {"kind": "shell", "host": "gpu",
                   "params": {"command": "printf '<%s>\\n' ${v}",
                              "args": ["$(touch pwned2)", "'; touch pwned3 #"]}}}]}))
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", p, "job", env=env)
    assert res.returncode == 0, res.stderr
    assert not list((tmp_path / "remote").glob("pwned*"))
    out = run_cli("logs", p, "job", env=env).stdout
    assert out == "<'; touch pwned1 #>\n<$(touch pwned2)>\n<'; touch pwned3 #>\n"
