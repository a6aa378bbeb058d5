"""Adopting runs specdeck did not start, on real hosts: a nohup'd process over real sshd, a
tmux session, a plain sbatch job (tests/integration/test_adopt_slurm.py); never launching
an in_progress item twice; a stop while a run is starting."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from core.runs import adopt as adopt_mod
from core.runs.adopt import from_plan
from core.plans.adopt_spec import AdoptSpec
from core.errors import InvalidInput
from core.plans.planfile import parse_plan
from core.runs.runner import Runner
from core.state.store import Store
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.integration

NUMBERED = "for i in $(seq 1 100000); do echo \"line $i\"; sleep 0.05; done"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _plan(tmp_path: Path, host: dict, *, command: str = "touch LAUNCHED; sleep 300",
          adopt: dict | None = None, vars: dict | None = None) -> Path:
    p = tmp_path / "v5.yaml"
    train = {"id": "train-v4", "content": "v4, started by hand", "status": "in_progress",
             "action": {"kind": "shell", "host": "gpu", "params": {"command": command}}}
    if adopt is not None:
        train["adopt"] = adopt
    p.write_text(json.dumps({
        "name": "v5", "hosts": {"gpu": host}, "vars": vars or {},
        "items": [train,
                  {"id": "eval-v4", "content": "needs v4", "needs": ["train-v4"],
                   "action": {"kind": "shell", "host": "gpu", "params": {"command": "echo ok"}}},
                  {"id": "stop-v4", "content": "stop v4",
                   "action": {"kind": "stop", "params": {"item": "train-v4", "grace_s": 2}}}]}))
    return p


def _ssh(ssh_home, alias: str, command: str) -> str:
    """Plain OpenSSH, as an operator starts a run by hand."""
    return subprocess.run(
        ["ssh", "-F", str(ssh_home.config_path), "-i", str(ssh_home.identity),
         "-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={ssh_home.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", alias, command],
        check=True, capture_output=True, text=True, timeout=30).stdout


def _numbers(text: str) -> list[int]:
    return [int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("line ")]


def test_nohup_over_ssh_adopted_followed_once_across_kill_9_and_stopped(sshd, ssh_home,
                                                                          tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    log = remote / "v4.log"
    # started by hand over plain ssh: a numbered line every 50 ms, and a child that lingers
    out = _ssh(ssh_home, sshd.alias,
               f"cd {remote}; nohup bash -c 'sleep 1000 & echo $! > child.pid; {NUMBERED}' "
               f"> {log} 2>&1 < /dev/null & echo $!")
    pid = int(out.split()[-1])
    for _ in range(100):
        if (remote / "child.pid").exists() and log.stat().st_size > 0:
            break
        time.sleep(0.05)
    child = int((remote / "child.pid").read_text())
    try:
        _scenario(ssh_home, sshd, tmp_path, remote, log, pid, child)
    finally:
        for p in (pid, child):
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def _scenario(ssh_home, sshd, tmp_path, remote, log, pid, child) -> None:
    assert _alive(pid) and _alive(child)
    plan = _plan(tmp_path, {"ssh": sshd.alias, "workdir": str(remote)})
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}

    # run --all starts nothing, names adopt, exits 0; the dependent waits
    before = subprocess.run(["pgrep", "-c", "-f", "LAUNCHED"], capture_output=True, text=True)
    res = run_cli("run", plan, "--all", env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "specdeck adopt" in res.stderr and "train-v4" in res.stderr
    assert "eval-v4: not run, waits on train-v4 (in_progress)" in res.stderr
    assert "stop-v4: nothing to stop until train-v4 is adopted" in res.stderr
    after = subprocess.run(["pgrep", "-c", "-f", "LAUNCHED"], capture_output=True, text=True)
    assert after.stdout == before.stdout and not (remote / "LAUNCHED").exists()
    doc = json.loads(run_cli("status", plan, "--json", env=env).stdout)
    assert [(i["id"], i["status"], i["run"]) for i in doc["items"]] == [
        ("train-v4", "in_progress", None), ("eval-v4", "pending", None),
        ("stop-v4", "pending", None)]

    # adopt --pid --log, then kill -9 of specdeck mid-way
    e = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "console.cli", "adopt", str(plan), "train-v4",
                             "--pid", str(pid), "--log", str(log)], env=e,
                            stderr=subprocess.PIPE, text=True)
    seen = 0
    for line in proc.stderr:
        if "│ line " in line:
            seen += 1
            if seen == 30:
                break
    proc.kill()
    proc.wait()
    time.sleep(0.5)  # lines written while nobody follows
    attach = subprocess.Popen([sys.executable, "-m", "console.cli", "attach", str(plan), "train-v4",
                               "-q"], env=e, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    res = run_cli("stop", plan, "train-v4", "--yes", "--grace", "3", env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "stopped (exit status unknown)" in res.stderr
    attach.wait(30)
    assert not _alive(pid) and not _alive(child)

    # every line from the adoption point, exactly once, to the last one written
    stored = _numbers(run_cli("logs", plan, "train-v4", env=env).stdout)
    written = _numbers(log.read_text())
    first = stored[0]
    assert first > 1 and stored == written[written.index(first):]
    print(f"adopted at line {first}; stored {len(stored)} lines {first}..{stored[-1]}, "
          f"each once; {len(written)} written")
    store = Store(tmp_path / "s.db")
    run = store.latest_run("train-v4")
    info = run.adopt
    assert log.read_bytes()[:info["base"]].count(b"\n") == first - 1  # the adoption point
    assert (run.state, run.exit_code, run.launcher) == ("stopped", None, "adopt:pid")
    store.close()
    doc = json.loads(run_cli("status", plan, "--json", env=env).stdout)
    assert doc["items"][0]["run"]["state"] == "stopped"


async def _runner(plan: Path, tmp_path: Path) -> tuple[Runner, Store]:
    store = Store(tmp_path / "s.db")
    return Runner(parse_plan(plan.read_text(), str(plan), path=plan), store, poll=0.05), store


@asynccontextmanager
async def _running(plan: Path, tmp_path: Path):
    """:func:`_runner`'s (runner, store), both closed when the block ends, however it ends."""
    runner, store = await _runner(plan, tmp_path)
    try:
        yield runner, store
    finally:
        await runner.close()
        store.close()


async def test_bad_input_records_nothing(tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    log = wd / "run.log"
    log.write_text("x\n")
    plan = _plan(tmp_path, {"local": True, "workdir": str(wd)})
    runner, store = await _runner(plan, tmp_path)
    item = runner.plan.item("train-v4")
    other = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              "sleep", "30"]) if os.geteuid() == 0 else None
    mine = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL)
    dead = subprocess.Popen(["true"])
    dead.wait()
    cases = [(AdoptSpec(pid=dead.pid, log=str(log)), "no such process"),
             (AdoptSpec(pid=os.getpid(), log=str(log)), "specdeck's own"),
             (AdoptSpec(pid=mine.pid, log=str(wd / "nope.log")), "no such file"),
             (AdoptSpec(pid=mine.pid, log=str(wd)), "not a regular file"),
             (AdoptSpec(pid=mine.pid), "not a file"),  # its stdout is /dev/null
             (AdoptSpec(tmux="no-such-session-i15"), "no such session")]
    if other is not None:
        cases.append((AdoptSpec(pid=other.pid, log=str(log)), "belongs to another user"))
    try:
        for spec, why in cases:
            with pytest.raises(InvalidInput, match=why):
                await runner.adopt(item.id, spec)
        assert store.runs_for_item("train-v4") == [] and store.status_history("train-v4") == []
        assert store.events(kinds=["adopted", "run_claimed"]) == []
    finally:
        for p in (mine, other):
            if p is not None:
                p.kill()
                p.wait()
        await runner.close()
        store.close()
    # through the CLI: exit status 2, a clear message
    res = run_cli("adopt", plan, "train-v4", "--pid", str(dead.pid), "--log", log,
                  env={"SPECDECK_STATE": str(tmp_path / "s.db")})
    assert res.returncode == 2 and f"pid {dead.pid} on gpu: no such process" in res.stderr


async def test_plan_adopt_field_is_adopted_by_run_and_ends_with_unknown_status(tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    proc = subprocess.Popen(["bash", "-c", "for i in $(seq 1 30); do echo \"line $i\"; "
                             "sleep 0.05; done"], stdout=open(wd / "v4.log", "wb"),
                            start_new_session=True)
    (wd / "v4.pid").write_text(f"{proc.pid}\n")
    plan = _plan(tmp_path, {"local": True, "workdir": str(wd)},
                 adopt={"pid_file": "${run}.pid", "log": "${run}.log", "from_start": True},
                 vars={"run": "v4"})
    async with _running(plan, tmp_path) as (runner, store):
        summary = await asyncio.wait_for(runner.run_items(["train-v4"]), 30)
        proc.wait()
        assert summary.failed == ("train-v4",) and not (wd / "LAUNCHED").exists()
        run = store.latest_run("train-v4")
        assert (run.state, run.exit_code, run.signal) == ("lost", None, None)
        assert "exit status is unknown" in run.error
        assert _numbers(store.log_bytes(run.id).decode()) == list(range(1, 31))
        # that run has ended: running the item again launches it, it does not re-adopt
        item = runner.plan.item("train-v4")
        assert not from_plan(item, runner.statuses()[item.id], runner.store.runs_for_item(item.id))
        assert adopt_mod.unadopted(runner.plan, item, runner.statuses(),
                                   runner.store.live_run) is None


def _tmux(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=10)


@pytest.fixture
def tmux_session(tmp_path):
    if subprocess.run(["which", "tmux"], capture_output=True).returncode:
        pytest.skip("tmux not installed (apt-get install tmux)")
    names = []

    def make(command: str) -> str:
        name = f"i15-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # never the name of an earlier test's session
        _tmux("new-session", "-d", "-s", name, "-x", "100", "-y", "20", command).check_returncode()
        names.append(name)
        return name

    yield make
    for n in names:
        _tmux("kill-session", "-t", f"={n}")


async def test_tmux_session_adopted_then_stopped(tmp_path, tmux_session):
    wd = tmp_path / "wd"
    wd.mkdir()
    s = tmux_session(f"bash -c 'sleep 1000 & echo $! > {wd}/child.pid; {NUMBERED}'")
    plan = _plan(tmp_path, {"local": True, "workdir": str(wd)})
    async with _running(plan, tmp_path) as (runner, store):
        await runner.adopt("train-v4", AdoptSpec(tmux=s), follow=False)
        run = store.live_run("train-v4")
        assert run.launcher == "adopt:tmux"
        follower = asyncio.create_task(runner.attach_run(run))
        for _ in range(100):  # the pane's output, piped into the capsule from now on
            if store.run(run.id).log_lines >= 5:
                break
            await asyncio.sleep(0.05)
        pane = int(_tmux("list-panes", "-t", f"={s}", "-F", "#{pane_pid}").stdout)
        child = int((wd / "child.pid").read_text())
        outcome = await runner.stop_run(run.id, grace_s=2)
        assert outcome.state == "stopped"
        await asyncio.wait_for(follower, 10)
        assert _tmux("has-session", "-t", f"={s}").returncode != 0
        assert not _alive(pane) and not _alive(child)
        nums = _numbers(store.log_bytes(run.id).decode().replace("\r", ""))
        assert len(nums) >= 5 and nums == list(range(nums[0], nums[-1] + 1))
        assert runner.statuses()["train-v4"] == "stopped"


async def test_tmux_dead_pane_gives_the_exit_status(tmp_path, tmux_session):
    wd = tmp_path / "wd"
    wd.mkdir()
    gate = wd / "gate"  # the pane exits once adopted, however slow a loaded machine makes that
    s = tmux_session(f"bash -c 'until [ -e {gate} ]; do sleep 0.1; done; echo bye; exit 3'")
    plan = _plan(tmp_path, {"local": True, "workdir": str(wd)})
    async with _running(plan, tmp_path) as (runner, store):
        adopting = asyncio.create_task(runner.adopt("train-v4", AdoptSpec(tmux=s)))
        deadline = time.monotonic() + 600  # the pane is kept on exit from the claim on: no exit before it
        while store.live_run("train-v4") is None and not adopting.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        gate.touch()
        status = await asyncio.wait_for(adopting, 60)
        run = store.latest_run("train-v4")
        assert "bye" in store.log_bytes(run.id).decode()
        kept = _tmux("list-panes", "-s", "-t", f"={s}", "-F", "#{pane_dead} #{pane_dead_status}").stdout
        if kept.strip() == "1":  # tmux 3.3a can drop a dead pane's status (a race of its own; seen
            # 1 run in 15 outside specdeck): then the status is unknown, and said so, never guessed
            assert (status, run.state, run.exit_code) == ("failed", "lost", None)
            assert adopt_mod.UNKNOWN_EXIT in run.error
        else:
            assert kept.split() == ["1", "3"]
            assert (status, run.state, run.exit_code) == ("failed", "failed", 3)


async def test_stop_while_starting_ends_what_the_start_creates(tmp_path, slow_starts):
    wd = tmp_path / "wd"
    wd.mkdir()
    plan = _plan(tmp_path, {"local": True, "workdir": str(wd)},
                 command="echo $$$$ > started.pid; exec sleep 300")
    doc = json.loads(plan.read_text())
    doc["items"][0].pop("status")
    plan.write_text(json.dumps(doc))
    launching = slow_starts
    async with _running(plan, tmp_path) as (runner, store):
        task = asyncio.create_task(runner.run_item(runner.plan.item("train-v4")))
        await asyncio.wait_for(launching.wait(), 10)
        run = store.live_run("train-v4")
        assert run.state == "starting"
        stopping = asyncio.create_task(runner.stop_run(run.id, grace_s=2))
        while store.run(run.id).error != "stop requested" and not stopping.done():
            await asyncio.sleep(0.02)
        launching.release.set()  # the start goes on only once the stop was asked for
        outcome = await asyncio.wait_for(stopping, 30)
        assert outcome.state == "stopped"
        assert await asyncio.wait_for(task, 10) == "stopped"  # the item too, not failed
        pid = int((wd / "started.pid").read_text())
        assert not _alive(pid)
        assert store.run(run.id).state == "stopped"


async def test_adopted_train_item_records_metrics_and_checkpoints(tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    script = wd / "trainer.sh"
    script.write_text(
        "sleep 0.5\n"
        "for s in $(seq 1 20); do echo \"{\\\"step\\\": $s, \\\"loss\\\": $s.5}\"; "
        "if [ $((s % 10)) = 0 ]; then echo \"{\\\"event\\\": \\\"checkpoint\\\", "
        "\\\"step\\\": $s, \\\"path\\\": \\\"$PWD/out/step_$s.pt\\\"}\"; fi; sleep 0.05; done\n")
    proc = subprocess.Popen(["bash", str(script)], cwd=wd, stdout=open(wd / "train.log", "wb"),
                            start_new_session=True)
    plan = wd.parent / "t.yaml"
    plan.write_text(json.dumps({
        "name": "t", "hosts": {"gpu": {"local": True, "workdir": str(wd)},
                               "ev": {"local": True, "workdir": str(tmp_path / "ev")}},
        "items": [{"id": "train-v4", "content": "v4", "status": "in_progress",
                   "action": {"kind": "train", "host": "gpu", "params": {
                       "command": "false", "out": "out",
                       "watch_eval": {"host": "ev", "target": "models/target",
                                      "cache": "feats"}}}}]}))
    async with _running(plan, tmp_path) as (runner, store):
        try:
            task = asyncio.create_task(runner.adopt("train-v4",
                                                  AdoptSpec(pid=proc.pid, log=str(wd / "train.log"))))
            while proc.poll() is None:  # reaped as it ends (a zombie has ended too)
                await asyncio.sleep(0.05)
            await asyncio.wait_for(task, 30)
            run = store.latest_run("train-v4")
            assert [s for s, _ in store.metric_series(run.id, "loss")] == list(range(1, 21))
            assert [a.step for a in store.artefacts("train-v4", "checkpoint")] == [10, 20]
            # watch_eval picked each checkpoint up (the files are not real, so their evals fail)
            assert {e.step for e in store.watch_entries(run.id)} == {10, 20}
            assert run.state == "lost" and "exit status is unknown" in run.error
        finally:
            if proc.poll() is None:
                proc.kill()


def test_run_all_adopts_from_the_plan_and_its_stop_item_stops_it(tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    proc = subprocess.Popen(["bash", "-c", NUMBERED], stdout=open(wd / "v4.log", "wb"),
                            start_new_session=True)
    (wd / "v4.pid").write_text(str(proc.pid))
    plan = _plan(tmp_path, {"local": True, "workdir": str(wd)},
                 adopt={"pid_file": "v4.pid", "log": "v4.log"})
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    try:
        res = run_cli("run", plan, "--all", env=env, timeout=60)
        proc.wait(10)  # stopped by stop-v4, once adopted: not a second copy, nothing lost
        doc = json.loads(run_cli("status", plan, "--json", env=env).stdout)
        got = {i["id"]: (i["status"], (i["run"] or {}).get("state")) for i in doc["items"]}
        assert got == {"train-v4": ("stopped", "stopped"), "eval-v4": ("pending", None),
                       "stop-v4": ("done", "succeeded")}, res.stderr
        assert not (wd / "LAUNCHED").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
