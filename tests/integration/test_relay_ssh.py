"""relay on two real sshd hosts: 127.0.0.2 -> specdeck -> 127.0.0.3."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import HostUnreachable
from core.plans.planfile import parse_plan
from core.runs.runner import Runner
from core.state.store import Store
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.integration
MB = 1 << 20


def make_file(path: Path, size: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            block = os.urandom(min(left, 8 * MB))
            h.update(block)
            f.write(block)
            left -= len(block)
    return h.hexdigest()


def relay_plan(tmp_path: Path, a: str, b: str, src: str, dst: str, **extra) -> Path:
    p = tmp_path / "relay.yaml"
    p.write_text(json.dumps({
        "name": "relay",
        "hosts": {"kpro6": {"ssh": a, "workdir": str(tmp_path / "A")},
                  "ct129": {"ssh": b, "workdir": str(tmp_path / "B")}},
        "items": [{"id": "copy", "content": "relay the checkpoint",
                   "action": {"kind": "relay", "params": {"src": f"kpro6:{src}",
                                                          "dst": f"ct129:{dst}", **extra}}}]}))
    return p


def last_result(state: Path) -> dict:
    s = Store(state)
    run = s.latest_run("copy")
    return run.result if run.result else {}


@pytest.fixture
def two_hosts(sshd_factory):
    return sshd_factory(2)


def test_300mb_relay_matches_sha256_and_check_says_done(two_hosts, tmp_path):
    a, b = two_hosts
    digest = make_file(tmp_path / "A" / "ckpt" / "step_40000.pt", 300 * MB)
    plan = relay_plan(tmp_path, a.alias, b.alias, "ckpt/step_40000.pt", "in/step_40000.pt",
                      sha256=digest)
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "copy", env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "B" / "in" / "step_40000.pt"
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest
    assert not out.with_name(out.name + ".part").exists()
    assert "MB/s" in res.stderr and "ETA" in res.stderr
    # a big file takes OpenSSH's client (host keys checked against the same known_hosts)
    assert "data path: kpro6 (openssh aes128-gcm) -> specdeck -> ct129 (openssh" in res.stderr
    # a second plan run finds it done by check() without sending a byte
    run_cli("mark", plan, "copy", "pending", env=env)
    res = run_cli("run", plan, "copy", env=env)
    assert res.returncode == 0 and "check: " in res.stderr and "sha256 recorded" in res.stderr


def test_kill_mid_transfer_then_rerun_resumes_from_part(two_hosts, tmp_path):
    a, b = two_hosts
    size = 300 * MB
    digest = make_file(tmp_path / "A" / "big.bin", size)
    plan = relay_plan(tmp_path, a.alias, b.alias, "big.bin", "big.bin", bwlimit="150M")
    state = tmp_path / "s.db"
    env = {**os.environ, "SPECDECK_STATE": str(state), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "console.cli", "run", str(plan), "copy"], env=env,
                            stderr=subprocess.PIPE, text=True)
    part = tmp_path / "B" / "big.bin.part"
    for line in proc.stderr:
        if "MB/s" in line and part.exists() and part.stat().st_size > size // 3:
            break
    proc.kill()
    proc.wait()
    have = part.stat().st_size
    assert 0 < have < size
    res = run_cli("run", plan, "copy", env={"SPECDECK_STATE": str(state)}, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "resuming at" in res.stderr
    result = last_result(state)
    chunk = 1 * MB
    assert result["resumed_from"] >= have - 2 * chunk
    assert result["bytes_sent"] < (size - have) + 2 * chunk
    assert hashlib.sha256((tmp_path / "B" / "big.bin").read_bytes()).hexdigest() == digest
    # the killed run was recorded as interrupted, the rerun as attempt 2
    s = Store(state)
    assert [r.state for r in s.runs_for_item("copy")] == ["interrupted", "succeeded"]


@pytest.mark.parametrize("stopped", ["kpro6", "ct129"])
async def test_sshd_stopped_mid_transfer_then_resume(two_hosts, tmp_path, stopped):
    """Either end's sshd killed mid-transfer: the item fails naming that host (the other
    end's client is stopped too), and the rerun resumes from what landed."""
    import asyncio

    a, b = two_hosts
    size = 120 * MB
    digest = make_file(tmp_path / "A" / "big.bin", size)
    plan_path = relay_plan(tmp_path, a.alias, b.alias, "big.bin", "big.bin", bwlimit="60M")
    plan = parse_plan(plan_path.read_text(), str(plan_path), path=plan_path)
    store = Store(tmp_path / "s.db")
    part = tmp_path / "B" / "big.bin.part"
    server = a if stopped == "kpro6" else b
    runner = Runner(plan, store)
    task = asyncio.create_task(runner.run_item(plan.item("copy")))
    while not (part.exists() and part.stat().st_size > size // 4):
        await asyncio.sleep(0.05)
        assert not task.done()
    server.stop()
    with pytest.raises(HostUnreachable):  # the item counts unreachable (the CLI exits 3)
        await asyncio.wait_for(task, 60)
    assert store.latest_run("copy").state == "failed"
    err = store.latest_run("copy").error
    assert "unreachable" in err and stopped in err, err
    have = part.stat().st_size
    await runner.close()
    server.start()
    runner = Runner(plan, store)
    assert await runner.run_item(plan.item("copy")) == "done"
    result = store.latest_run("copy").result
    assert result["resumed_from"] >= have - 2 * MB
    assert result["bytes_sent"] < size - have + 2 * MB
    assert hashlib.sha256((tmp_path / "B" / "big.bin").read_bytes()).hexdigest() == digest
    await runner.close()


@pytest.mark.parametrize("path", ["asyncssh", "bulk"])
def test_both_data_paths_copy_and_resume(two_hosts, tmp_path, path):
    """The asyncssh fallback and the ssh-client path (forced for a small file) give the same
    bytes, fresh and resumed from a .part."""
    a, b = two_hosts
    digest = make_file(tmp_path / "A" / "w.bin", 40 * MB + 12345)
    part = tmp_path / "B" / "w.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes((tmp_path / "A" / "w.bin").read_bytes()[: 7 * MB + 3])
    plan = relay_plan(tmp_path, a.alias, b.alias, "w.bin", "w.bin")
    env = {"SPECDECK_STATE": str(tmp_path / "s.db"), "SPECDECK_RELAY_PATH": path}
    res = run_cli("run", plan, "copy", env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert ("in-process streams (SPECDECK_RELAY_PATH=asyncssh)" in res.stderr) == (
        path == "asyncssh")
    assert ("(openssh aes128-gcm)" in res.stderr) == (path == "bulk")
    assert "resuming at" in res.stderr
    result = last_result(tmp_path / "s.db")
    assert result["resumed_from"] == 7 * MB + 3
    assert result["bytes_sent"] == 33 * MB + 12345 - 3
    assert hashlib.sha256((tmp_path / "B" / "w.bin").read_bytes()).hexdigest() == digest
    (tmp_path / "B" / "w.bin").unlink()
    (tmp_path / "B" / "w.bin.sha256").unlink()
    run_cli("mark", plan, "copy", "pending", env=env)
    res = run_cli("run", plan, "copy", env=env, timeout=120)  # fresh: the stream's hash
    assert res.returncode == 0, res.stderr
    assert "verified: sha256 of the bytes kpro6 sent" in res.stderr
    assert hashlib.sha256((tmp_path / "B" / "w.bin").read_bytes()).hexdigest() == digest


def test_flipped_byte_in_part_prefix_is_caught(two_hosts, tmp_path):
    a, b = two_hosts
    src = tmp_path / "A" / "w.bin"
    make_file(src, 8 * MB)
    part = tmp_path / "B" / "w.bin.part"
    part.parent.mkdir(parents=True)
    prefix = bytearray(src.read_bytes()[: 3 * MB])
    prefix[12345] ^= 0xFF
    part.write_bytes(bytes(prefix))
    plan = relay_plan(tmp_path, a.alias, b.alias, "w.bin", "w.bin")
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "copy", env=env)
    assert res.returncode == 1
    assert "sha256 mismatch" in res.stderr and "nothing was renamed" in res.stderr
    assert "rm " in res.stderr  # says what to do next
    assert not (tmp_path / "B" / "w.bin").exists()
    assert part.exists()


def test_model_directory_relays_file_by_file_with_manifest(two_hosts, tmp_path):
    a, b = two_hosts
    model = tmp_path / "A" / "drafter"
    digests = {name: make_file(model / name, size) for name, size in
               [("config.json", 300), ("model-00001-of-00002.safetensors", 3 * MB),
                ("model-00002-of-00002.safetensors", 2 * MB),
                ("model.safetensors.index.json", 500), ("sub/tokenizer.json", 1000)]}
    plan = relay_plan(tmp_path, a.alias, b.alias, "drafter", "models/drafter")
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "copy", env=env)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "B" / "models" / "drafter"
    for name, d in digests.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == d
    manifest = json.loads((tmp_path / "B" / "models" / "drafter.specdeck-relay"
                           / "manifest.json").read_text())
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == digests
    run_cli("mark", plan, "copy", "pending", env=env)
    res = run_cli("run", plan, "copy", env=env)
    assert "all 5 files, verified" in res.stderr


def _run_and_kill_at_half(tmp_path: Path, plan: Path, state: Path, size: int) -> None:
    """`specdeck run` in a subprocess, SIGKILLed once its progress passes about half."""
    env = {**os.environ, "SPECDECK_STATE": str(state), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "console.cli", "run", str(plan), "copy"], env=env,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r" (\d+\.\d)% ", line)
        if m and float(m.group(1)) >= 45:
            break
    proc.kill()
    proc.wait()
    # the orphaned ssh clients see their pipes close; let the remote writers settle
    journals = sorted((tmp_path / "B").glob("big.bin.part.r*"))
    seen = None
    while seen != (now := [j.read_bytes() for j in journals]):
        seen = now
        time.sleep(0.5)


def _landed(tmp_path: Path, src: bytes, ranges) -> tuple[list[int], list[int]]:
    """Per range: the resume point its journal holds, and how far .part really matches."""
    part = (tmp_path / "B" / "big.bin.part").read_bytes()
    journaled, really = [], []
    for i, (s, e) in enumerate(ranges):
        journal = tmp_path / "B" / f"big.bin.part.r{i}"
        lines = journal.read_text().split() if journal.exists() else []
        journaled.append(int(lines[-1]) if lines else s)
        n = s
        step = 1 << 16
        while n < e and part[n:n + step] == src[n:n + step]:
            n += step
        while n < e and n < len(part) and part[n] == src[n]:
            n += 1
        really.append(min(n, e))
    return journaled, really


def _four_streams_killed_at_half(two_hosts, tmp_path, size: int, bwlimit: str):
    """A ``size`` file A:big.bin relayed to B in 4 range streams at ``bwlimit``, SIGKILLed at
    about half: (its sha256, its bytes, the plan, the state db, the journal's ranges)."""
    a, b = two_hosts
    digest = make_file(tmp_path / "A" / "big.bin", size)
    plan = relay_plan(tmp_path, a.alias, b.alias, "big.bin", "big.bin", streams=4, bwlimit=bwlimit)
    state = tmp_path / "s.db"
    _run_and_kill_at_half(tmp_path, plan, state, size)
    ranges = json.loads((tmp_path / "B" / "big.bin.part.ranges").read_text())["ranges"]
    return digest, (tmp_path / "A" / "big.bin").read_bytes(), plan, state, ranges


def test_four_streams_killed_at_half_resume_every_range(two_hosts, tmp_path):
    """A 4-stream relay SIGKILLed at about half: the rerun resumes each range from its
    journal, re-sends at most one journal chunk per range, and the file's sha256 is equal."""
    from core.actions.relay import JOURNAL_CHUNK

    size = 320 * MB
    digest, src, plan, state, ranges = _four_streams_killed_at_half(two_hosts, tmp_path, size, "120M")
    assert len(ranges) == 4
    journaled, really = _landed(tmp_path, src, ranges)
    assert all(j > s for j, (s, _) in zip(journaled, ranges)), (journaled, ranges)
    assert all(j <= r for j, r in zip(journaled, really))
    resent = sum(r - j for j, r in zip(journaled, really))
    assert resent <= 4 * JOURNAL_CHUNK
    landed = sum(j - s for j, (s, _) in zip(journaled, ranges))
    assert size * 0.3 < landed < size
    res = run_cli("run", plan, "copy", env={"SPECDECK_STATE": str(state)}, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "(4 ranges)" in res.stderr and "4 range streams" in res.stderr
    result = last_result(state)
    assert result["resumed_from"] == landed and result["bytes_sent"] == size - landed
    assert hashlib.sha256((tmp_path / "B" / "big.bin").read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in (tmp_path / "B").iterdir()) == ["big.bin", "big.bin.sha256"]


def test_a_range_corrupted_on_the_destination_is_caught_by_the_final_hash(two_hosts, tmp_path):
    """Bit rot in a range's earlier chunks: the resume re-checks only each range's last journaled
    chunk against the source (a rot there is re-sent), so the final hash is what catches this."""
    size = 384 * MB  # 96 MB ranges: at half, each has journaled two chunks or more
    _, src, plan, state, ranges = _four_streams_killed_at_half(two_hosts, tmp_path, size, "60M")
    journaled, _ = _landed(tmp_path, src, ranges)
    from core.actions.relay import JOURNAL_CHUNK

    s2 = next(s for j, (s, _) in zip(journaled, ranges) if j - s >= 2 * JOURNAL_CHUNK)
    with (tmp_path / "B" / "big.bin.part").open("r+b") as f:  # bit rot in a landed range
        f.seek(s2 + 1234)
        f.write(bytes([src[s2 + 1234] ^ 0xFF]))
    res = run_cli("run", plan, "copy", env={"SPECDECK_STATE": str(state)}, timeout=300)
    assert res.returncode == 1, res.stderr
    assert "sha256 mismatch" in res.stderr and "nothing was renamed" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "B" / "big.bin").exists()
    assert (tmp_path / "B" / "big.bin.part").exists()
