"""Run capsules (core.capsules.jobs) against a host in memory (tests/unit/fakehost.py): what a start
writes and returns, how a capsule's files read as a state and an outcome, and how a log is
followed into a real SQLite store (whole lines only, exactly once). The wrapper's own shell
is exercised on real hosts (tests/integration)."""

from __future__ import annotations

import asyncio
import shlex

import pytest

from core.capsules import jobs
from core.errors import HostUnreachable
from core.capsules.jobs import CapsuleState, Launch, Launched
from core.state.store import Store
from tests.unit.fakehost import PID, FakeHost


async def test_start_writes_the_capsule_and_returns_where_it_went():
    host = FakeHost(workdir="/w")
    host.env = {"HF_HOME": "/data/hf cache"}
    got = await jobs.start(host, "r1", Launch("python -m core.ml.eval", env={"A": "x'y"},
                                              cwd="out"))
    capsule = "/w/.specdeck/runs/r1"
    assert got == Launched(capsule, PID, "100 boot 4243 101")
    script = host.files[f"{capsule}/cmd.sh"].decode().splitlines()
    assert script[-1] == "python -m core.ml.eval" and script[-2] == "cd /w/out || exit 97"
    exports = dict(ln.removeprefix("export ").split("=", 1) for ln in script
                   if ln.startswith("export "))
    assert {k: shlex.split(v)[0] for k, v in exports.items()} == {
        "HF_HOME": "/data/hf cache", "A": "x'y", jobs.MARKER: capsule}
    assert "/w/out" in host.dirs and f"{capsule}/wrapper.sh" in host.files


async def test_a_start_whose_pid_never_appears_is_an_unreachable_host():
    class Silent(FakeHost):
        def _start(self, capsule):  # the wrapper never ran
            pass

    with pytest.raises(HostUnreachable, match="did not start within 0.1s"):
        await jobs.start(Silent(), "r1", Launch("true"), timeout=0.1)


def test_a_bad_environment_name_is_refused():
    with pytest.raises(ValueError, match="bad environment variable name 'A-B'"):
        jobs.cmd_script(Launch("true", env={"A-B": "1"}), FakeHost())


@pytest.mark.parametrize("exit_file, state", [
    (b"exit 0\n", CapsuleState("ended", 0, None)), (b"exit 3\n", CapsuleState("ended", 3, None)),
    (b"signal 9\n", CapsuleState("ended", None, "KILL")), (None, CapsuleState("running", pid=PID))])
async def test_a_capsule_reads_as_its_state(exit_file, state):
    host = FakeHost(programs={"work": (b"", 0)})
    host.held.add("work")
    got = await jobs.start(host, "r1", Launch("work"))
    if exit_file is not None:
        host.files[f"{got.capsule}/exit"] = exit_file
    assert await jobs.inspect(host, got.capsule) == state


async def test_a_capsule_without_pid_or_directory():
    host = FakeHost()
    assert (await jobs.inspect(host, "/w/.specdeck/runs/none")).state == "missing"
    await host.makedirs("/w/.specdeck/runs/r2")
    assert (await jobs.inspect(host, "/w/.specdeck/runs/r2")).state == "nopid"


async def _wait(cond, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.01)


async def test_follow_stores_whole_lines_once_and_the_torn_last_one_at_the_end(tmp_path):
    host = FakeHost()
    host.held.add("train")
    store = Store(tmp_path / "s.db")
    try:
        store.claim_run("r1", "it", "shell", "gpu", owner="me", launcher="process")
        got = await jobs.start(host, "r1", Launch("train"))
        store.update_run("r1", state="running", capsule=got.capsule, pid=got.pid)
        host.files[f"{got.capsule}/log"] = b"step=1 loss=0.5\nstep=2 lo"
        shown: list[str] = []
        follower = asyncio.ensure_future(jobs.follow(
            host, store, "r1", got.capsule, on_lines=shown.extend,
            regex=r"step=(?P<step>\d+) loss=(?P<loss>[0-9.]+)", poll=0.01, inspect_every=0))
        await _wait(lambda: store.run("r1").log_lines == 1)
        assert store.log_bytes("r1") == b"step=1 loss=0.5\n"  # the torn line waits
        host.end(got.capsule, 0, b"ss=0.25\ntail without newline")
        end = await asyncio.wait_for(follower, 10)
        assert end == CapsuleState("ended", 0, None)
        log = b"step=1 loss=0.5\nstep=2 loss=0.25\ntail without newline"
        assert store.log_bytes("r1") == log and shown[-1] == "tail without newline"
        assert [(p.step, p.name, p.value) for p in store.metric_rows("r1")] == [
            (1, "loss", 0.5), (2, "loss", 0.25)]
        # a second follower (another specdeck, a restart) stores nothing twice
        again = await jobs.follow(host, store, "r1", got.capsule, poll=0.01, inspect_every=0)
        assert again.state == "ended" and store.log_bytes("r1") == log
        assert len(store.metric_rows("r1")) == 2
    finally:
        store.close()


async def test_follow_waits_out_an_unreachable_host_and_resumes(tmp_path):
    host = FakeHost()
    store = Store(tmp_path / "s.db")
    try:
        store.claim_run("r1", "it", "shell", "gpu", owner="me", launcher="process")
        host.held.add("work")
        got = await jobs.start(host, "r1", Launch("work"))
        store.update_run("r1", state="running", capsule=got.capsule)
        states: list[str] = []
        host.reachable = False
        follower = asyncio.ensure_future(jobs.follow(host, store, "r1", got.capsule,
                                                     on_state=states.append, poll=0.01,
                                                     inspect_every=0))
        await _wait(lambda: states == ["reconnecting"])
        host.end(got.capsule, 0, b"written while away\n")
        host.reachable = True
        assert (await asyncio.wait_for(follower, 10)).state == "ended"
        assert states == ["reconnecting", "following"]
        assert store.log_bytes("r1") == b"written while away\n"
    finally:
        store.close()
