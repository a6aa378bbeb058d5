"""relay between two local hosts: both data paths, cancel + resume, pacing, a changing source.

The SSH versions of these (two real sshd hosts) are in tests/integration/test_relay_ssh.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time

import pytest

from core.actions.relay import Relay, RelayParams, default_streams, human, parse_rate, split_ranges
from core.errors import ActionFailed
from core.hosts.local import LocalHost

MB = 1 << 20


class Ctx:
    def __init__(self):
        self.lines: list[str] = []

    def progress(self, message: str, **fields) -> None:
        self.lines.append(message)


def make(path, size: int) -> str:
    data = os.urandom(size)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def file_between_hosts(tmp_path, size: int) -> tuple[str, LocalHost, LocalHost]:
    """A ``size``-byte f.bin on local host a (``tmp_path/A``), and host b (``tmp_path/B``):
    (its sha256, a, b)."""
    digest = make(tmp_path / "A" / "f.bin", size)
    return (digest, LocalHost("a", workdir=str(tmp_path / "A")),
            LocalHost("b", workdir=str(tmp_path / "B")))


async def cut_ranges_copy(tmp_path, size: int, streams: int, rate: str):
    """A ``streams``-range copy of a new ``size``-byte file, cancelled once every range has
    a journal: (sha256, a, b, the relay, the bytes each range landed)."""
    digest, a, b = file_between_hosts(tmp_path, size)
    relay = Relay(RelayParams(src="a:f.bin", dst="b:f.bin", streams=streams))
    task = asyncio.create_task(relay._one(Ctx(), a, "f.bin", b, "f.bin", size, None,
                                          parse_rate(rate), streams=streams))
    journals = [tmp_path / "B" / f"f.bin.part.r{i}" for i in range(streams)]
    while not all(j.exists() for j in journals):
        await asyncio.sleep(0.05)
        assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    ranges = json.loads((tmp_path / "B" / "f.bin.part.ranges").read_text())["ranges"]
    return digest, a, b, relay, [int(j.read_text().split()[-1]) - s
                                 for j, (s, _) in zip(journals, ranges)]


async def relay(tmp_path, size, *, src_host=None, bwlimit=None):
    a = src_host or LocalHost("a", workdir=str(tmp_path / "A"))
    b = LocalHost("b", workdir=str(tmp_path / "B"))
    ctx = Ctx()
    r = Relay(RelayParams(src="a:f.bin", dst="b:out/f.bin", bwlimit=bwlimit))
    from core.actions.relay import parse_rate

    res = await r._one(ctx, a, "f.bin", b, "out/f.bin", size, None, parse_rate(bwlimit))
    return res, ctx


@pytest.mark.parametrize("path", ["bulk", "asyncssh"])
async def test_both_paths_copy_verify_and_record(tmp_path, monkeypatch, path):
    monkeypatch.setenv("SPECDECK_RELAY_PATH", path)
    digest = make(tmp_path / "A" / "f.bin", 5 * MB + 17)
    res, ctx = await relay(tmp_path, 5 * MB + 17)
    out = tmp_path / "B" / "out" / "f.bin"
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest == res["sha256"]
    assert res["bytes_sent"] == 5 * MB + 17 and res["resumed_from"] == 0
    record = (tmp_path / "B" / "out" / "f.bin.sha256").read_text().splitlines()
    st = (tmp_path / "A" / "f.bin").stat()
    assert record[0] == f"{digest} {5 * MB + 17}"
    assert record[1] == f"src {st.st_size} {st.st_ino} {st.st_dev} " + record[1].split()[-1]
    assert record[2].startswith(f"dst {5 * MB + 17} ")
    assert not (tmp_path / "B" / "out" / "f.bin.part").exists()
    want = ("a (local file) -> specdeck -> b (local file)" if path == "bulk"
            else "a -> specdeck -> b in-process streams (SPECDECK_RELAY_PATH=asyncssh)")
    assert any(want in line for line in ctx.lines), ctx.lines


async def test_small_file_stays_on_the_open_connection_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDECK_RELAY_PATH", raising=False)
    make(tmp_path / "A" / "f.bin", MB)
    res, ctx = await relay(tmp_path, MB)
    assert res["bytes_sent"] == MB
    assert not any("data path" in line for line in ctx.lines), ctx.lines  # no news


async def test_cancel_leaves_a_part_that_the_next_run_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECK_RELAY_PATH", "bulk")
    size = 24 * MB
    digest = make(tmp_path / "A" / "f.bin", size)
    part = tmp_path / "B" / "out" / "f.bin.part"
    task = asyncio.create_task(relay(tmp_path, size, bwlimit="16M"))
    while not (part.exists() and part.stat().st_size >= 4 * MB):
        await asyncio.sleep(0.02)
        assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    have = part.stat().st_size
    assert 4 * MB <= have < size
    res, ctx = await relay(tmp_path, size)
    assert res["resumed_from"] == have and res["bytes_sent"] == size - have
    assert any("verifying sha256 of b's whole file against a" in line for line in ctx.lines)
    assert hashlib.sha256((tmp_path / "B" / "out" / "f.bin").read_bytes()).hexdigest() == digest


async def test_bwlimit_paces_the_bulk_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECK_RELAY_PATH", "bulk")
    make(tmp_path / "A" / "f.bin", 12 * MB)
    t0 = time.monotonic()
    await relay(tmp_path, 12 * MB, bwlimit="24M")
    # 12 MiB at 24 MiB/s: the pacing sleeps until 0.5 s minus one chunk's worth
    assert time.monotonic() - t0 >= 0.45


async def test_source_changed_during_copy_is_caught_and_nothing_renamed(tmp_path, monkeypatch):
    """The trainer rewrites the checkpoint (same size, new bytes) while it is copied: the
    stream's hash agrees with itself, so the source's identity (inode, mtime) taken before
    and after is what catches it; nothing is renamed, and the rerun starts over."""
    monkeypatch.setenv("SPECDECK_RELAY_PATH", "bulk")
    size = 24 * MB
    make(tmp_path / "A" / "f.bin", size)
    part = tmp_path / "B" / "out" / "f.bin.part"
    task = asyncio.create_task(relay(tmp_path, size, bwlimit="16M"))
    while not (part.exists() and part.stat().st_size >= 2 * MB):
        await asyncio.sleep(0.02)
    with (tmp_path / "A" / "f.bin").open("r+b") as f:  # in place: same inode, same size
        f.write(os.urandom(MB))
    with pytest.raises(ActionFailed) as err:
        await task
    assert "changed while it was copied" in str(err.value), err.value
    assert "nothing was renamed" in str(err.value)
    assert "is something still writing it?" in err.value.hint and "rm " in err.value.hint
    assert not (tmp_path / "B" / "out" / "f.bin").exists()
    assert part.exists()
    res, ctx = await relay(tmp_path, size)  # the partial copy of the old bytes is dropped
    assert res["resumed_from"] == 0 and res["bytes_sent"] == size
    assert any("source changed since the partial copy" in line for line in ctx.lines)
    assert (hashlib.sha256((tmp_path / "B" / "out" / "f.bin").read_bytes()).hexdigest()
            == hashlib.sha256((tmp_path / "A" / "f.bin").read_bytes()).hexdigest())


async def test_stop_run_cancels_an_in_process_relay_and_the_rerun_resumes(tmp_path, monkeypatch):
    """The console's stop (x) on a relay it runs: cancelled at once, state stopped, the .part
    kept, and the progress lines were the run's log."""
    from core.plans.planfile import parse_plan
    from core.runs.runner import Runner
    from core.state.store import Store

    monkeypatch.setenv("SPECDECK_RELAY_PATH", "bulk")
    size = 24 * MB
    digest = make(tmp_path / "A" / "f.bin", size)
    plan = parse_plan(f"""
name: stopper
hosts:
  a: {{local: true, workdir: {tmp_path / 'A'}}}
  b: {{local: true, workdir: {tmp_path / 'B'}}}
items:
  - {{id: copy, content: relay, action: {{kind: relay, params: {{src: "a:f.bin", dst: "b:f.bin", bwlimit: 16M}}}}}}
""")
    store = Store(tmp_path / "s.db")
    runner = Runner(plan, store)
    task = asyncio.create_task(runner.run_item(plan.item("copy")))
    part = tmp_path / "B" / "f.bin.part"
    while not (part.exists() and part.stat().st_size >= 4 * MB):
        await asyncio.sleep(0.02)
    live = store.live_run("copy")
    out = await runner.stop_run(live.id, grace_s=5)
    assert out.state == "stopped"
    assert await task == "stopped"  # the caller carries on: no CancelledError
    run = store.run(live.id)
    assert run.state == "stopped" and run.error == "stopped by the operator"
    log = store.log_bytes(live.id).decode()
    assert "data path: a (local file) -> specdeck -> b (local file)" in log
    assert "MB/s" in log  # the first meter line
    have = part.stat().st_size
    assert 4 * MB <= have < size
    runner2 = Runner(plan, store)
    monkeypatch.setenv("SPECDECK_RELAY_PATH", "auto")
    store.set_status("copy", "pending")
    assert await runner2.run_item(plan.item("copy")) == "done"
    assert store.latest_run("copy").result["resumed_from"] == have
    assert hashlib.sha256((tmp_path / "B" / "f.bin").read_bytes()).hexdigest() == digest
    await runner.close()
    await runner2.close()


@pytest.mark.parametrize("path", ["bulk", "asyncssh"])
async def test_plan_sha256_is_the_reference_for_a_fresh_copy(tmp_path, monkeypatch, path):
    monkeypatch.setenv("SPECDECK_RELAY_PATH", path)
    digest = make(tmp_path / "A" / "f.bin", 3 * MB)
    a = LocalHost("a", workdir=str(tmp_path / "A"))
    b = LocalHost("b", workdir=str(tmp_path / "B"))
    ctx = Ctx()
    ok = await Relay(RelayParams(src="a:f.bin", dst="b:g.bin", sha256=digest.upper()))._one(
        ctx, a, "f.bin", b, "g.bin", 3 * MB, digest.upper(), None)
    assert ok["sha256"] == digest
    assert any("the stream against the plan's" in line for line in ctx.lines)
    wrong = "0" * 64
    with pytest.raises(ActionFailed) as err:
        await Relay(RelayParams(src="a:f.bin", dst="b:h.bin", sha256=wrong))._one(
            Ctx(), a, "f.bin", b, "h.bin", 3 * MB, wrong, None)
    assert f"plan expects {wrong}" in str(err.value) and "nothing was renamed" in str(err.value)
    assert "check which checkpoint you meant" in err.value.hint
    assert not (tmp_path / "B" / "h.bin").exists()


async def test_stopping_an_in_process_run_whose_specdeck_died_ends_it(tmp_path):
    from core.plans.planfile import parse_plan
    from core.runs.runner import Runner
    from core.state.store import Store

    plan = parse_plan(f"""
name: orphan
hosts:
  a: {{local: true, workdir: {tmp_path / 'A'}}}
items:
  - {{id: copy, content: relay, action: {{kind: relay, params: {{src: "a:f", dst: "a:g"}}}}}}
""")
    store = Store(tmp_path / "s.db")
    store.claim_run("copy-1", "copy", "relay", None, owner="thishost:1:1")  # another machine
    store.update_run("copy-1", state="running", pid=1)
    with pytest.raises(Exception) as err:
        await Runner(plan, store).stop_run("copy-1", grace_s=1)
    assert "runs inside another specdeck" in str(err.value)
    assert store.run("copy-1").state == "running"  # untouched: maybe alive elsewhere
    store.end_run("copy-1", "interrupted")
    import socket

    store.claim_run("copy-2", "copy", "relay", None, owner=f"{socket.gethostname()}:999999:1")
    store.update_run("copy-2", state="running", pid=999999)
    out = await Runner(plan, store).stop_run("copy-2", grace_s=1)
    assert out.state == "interrupted"
    assert store.run("copy-2").error == "the specdeck running it is gone"


@pytest.mark.parametrize("path", ["bulk", "asyncssh"])
async def test_directory_rerun_skips_verified_files_and_tells_the_whole_eta(
        tmp_path, monkeypatch, path):
    monkeypatch.setenv("SPECDECK_RELAY_PATH", path)
    model = tmp_path / "A" / "model"
    sizes = {"model-00001.safetensors": 3 * MB, "model-00002.safetensors": 2 * MB + 5,
             "config.json": 300}
    digests = {name: make(model / name, size) for name, size in sizes.items()}
    a = LocalHost("a", workdir=str(tmp_path / "A"))
    b = LocalHost("b", workdir=str(tmp_path / "B"))

    class Ctx2(Ctx):
        async def connected(self, name):
            return {"a": a, "b": b}[name]

    relay = Relay(RelayParams(src="a:model", dst="b:model"))
    ctx = Ctx2()
    first = await relay.run(ctx)
    assert first["bytes_sent"] == sum(sizes.values())
    assert any(" · all " in line and "of 5.2 MB" in line for line in ctx.lines), ctx.lines
    # a cut during the last file: the manifest and that file are missing
    out = tmp_path / "B" / "model"
    book = tmp_path / "B" / "model.specdeck-relay"
    assert sorted(p.name for p in out.iterdir()) == sorted(sizes)  # only the user's files
    (book / "manifest.json").unlink()
    (out / "model-00002.safetensors").unlink()
    (book / "sums" / "model-00002.safetensors").unlink()
    ctx = Ctx2()
    again = await relay.run(ctx)
    assert again["bytes_sent"] == sizes["model-00002.safetensors"]
    assert sum("already there, verified" in line for line in ctx.lines) == 2
    for name, digest in digests.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    assert (await relay.check(ctx)).state == "done"


async def test_range_streams_copy_verify_and_show_each_stream(tmp_path, monkeypatch):
    """streams: 4 on a 70 MB file: four range streams (one local dd each) write .part in
    place, the destination's whole file is hashed against the source's, then renamed; the
    progress line shows the total and each stream's rate; the journals are cleaned up."""
    monkeypatch.setenv("SPECDECK_RELAY_PATH", "auto")
    size = 70 * MB + 5
    digest, a, b = file_between_hosts(tmp_path, size)
    ctx = Ctx()
    res = await Relay(RelayParams(src="a:f.bin", dst="b:f.bin", streams=4, bwlimit="140M"))._one(
        ctx, a, "f.bin", b, "f.bin", size, None, parse_rate("140M"), streams=4)
    assert res["streams"] == 4 and res["bytes_sent"] == size and res["sha256"] == digest
    assert hashlib.sha256((tmp_path / "B" / "f.bin").read_bytes()).hexdigest() == digest
    assert any(", 4 range streams" in line and "(local dd)" in line for line in ctx.lines)
    assert any(re.search(r" · 4 streams( \d+){4} MB/s", line) for line in ctx.lines), ctx.lines
    assert any("verifying sha256 of b's whole file against a" in line for line in ctx.lines)
    assert sorted(p.name for p in (tmp_path / "B").iterdir()) == ["f.bin", "f.bin.sha256"]


async def test_bwlimit_caps_the_total_of_all_streams(tmp_path, monkeypatch):
    size = 40 * MB
    _, a, b = file_between_hosts(tmp_path, size)
    t0 = time.monotonic()
    await Relay(RelayParams(src="a:f.bin", dst="b:f.bin"))._one(
        Ctx(), a, "f.bin", b, "f.bin", size, None, parse_rate("40M"), streams=4)
    # 40 MiB at 40 MiB/s in all: four streams each at the cap would take a quarter of that
    assert time.monotonic() - t0 >= 0.9


async def test_cancelled_range_streams_resume_each_range_from_its_journal(tmp_path, monkeypatch):
    size = 96 * MB
    digest, a, b, relay, landed = await cut_ranges_copy(tmp_path, size, 3, "48M")
    assert all(n > 0 for n in landed) and sum(landed) < size
    ctx = Ctx()
    res = await relay._one(ctx, a, "f.bin", b, "f.bin", size, None, None, streams=3)
    assert res["resumed_from"] == sum(landed) and res["bytes_sent"] == size - sum(landed)
    assert any(f"resuming at {human(sum(landed))}" in line and "(3 ranges)" in line
               for line in ctx.lines), ctx.lines
    assert hashlib.sha256((tmp_path / "B" / "f.bin").read_bytes()).hexdigest() == digest


def test_default_streams_follow_the_size_and_the_cpus():
    assert default_streams(100 * MB, cpus=16) == 1
    assert default_streams(1_000_000_000, cpus=16) == 2
    assert default_streams(17_000_000_000, cpus=16) == 8
    assert default_streams(17_000_000_000, cpus=2) == 1
    assert split_ranges(70 * MB, 4) == [[0, 16 * MB], [16 * MB, 32 * MB], [32 * MB, 48 * MB],
                                        [48 * MB, 70 * MB]]
    assert split_ranges(5, 4) == [[0, 5]]


async def test_ranges_left_by_a_cut_resume_on_the_in_process_path(tmp_path, monkeypatch):
    """A ranges copy cut mid-way, resumed where only the in-process streams are available
    (SPECDECK_RELAY_PATH=asyncssh): each unfinished range is written in place from its
    journal, one after the other, and the whole file checks out."""
    size = 64 * MB
    digest, a, b, relay, per_range = await cut_ranges_copy(tmp_path, size, 2, "32M")
    landed = sum(per_range)
    monkeypatch.setenv("SPECDECK_RELAY_PATH", "asyncssh")
    ctx = Ctx()
    res = await relay._one(ctx, a, "f.bin", b, "f.bin", size, None, None, streams=2)
    assert res["resumed_from"] == landed and res["bytes_sent"] == size - landed
    assert any("in-process streams (SPECDECK_RELAY_PATH=asyncssh)" in line for line in ctx.lines)
    assert hashlib.sha256((tmp_path / "B" / "f.bin").read_bytes()).hexdigest() == digest
