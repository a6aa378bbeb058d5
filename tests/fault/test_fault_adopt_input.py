"""Class 4 (issue 28): adopt only what can be a run. A kernel thread (no command line) is
refused like PID 1; a PID, typed or in a pid file, is ASCII digits only and every bad content
is refused naming the pid file (exit 2, nothing recorded); an adopted log that is truncated
(copytruncate) or replaced (logrotate) is followed from its new start, with a notice, and no
line written after the rotation is lost."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.fault.conftest import cli, digest, popen_cli, rows, wait_for


def _plan(tmp_path: Path, adopt: dict | None = None) -> Path:
    wd = tmp_path / "wd"
    wd.mkdir(exist_ok=True)
    item = {"id": "t", "content": "started by hand", "status": "in_progress",
            "action": {"kind": "shell", "host": "gpu", "params": {"command": "touch LAUNCHED"}}}
    if adopt is not None:
        item["adopt"] = adopt
    p = tmp_path / "p.yaml"
    p.write_text(json.dumps({"name": "adopt-fault", "hosts": {"gpu": {"local": True,
                                                                       "workdir": str(wd)}},
                             "items": [item]}))
    return p


def _nothing_recorded(db: Path) -> None:
    if not db.exists():
        return
    assert rows(db, "SELECT count(*) FROM runs") == [(0,)]
    assert rows(db, "SELECT count(*) FROM status_history") == [(0,)]
    assert rows(db, "SELECT count(*) FROM events WHERE kind = 'adopted'") == [(0,)]


def _kernel_threads() -> list[int]:
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) > 1:
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if f.read():
                        continue
                with open(f"/proc/{d}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
            except OSError:
                continue
            found.append(int(d))
        if len(found) == 2:
            break
    return found


@pytest.fixture
def log(tmp_path):
    p = tmp_path / "wd" / "run.log"
    p.parent.mkdir(exist_ok=True)
    p.write_text("a line\n")
    return p


@pytest.mark.parametrize("nth", [0, 1])
def test_fault_kernel_thread_refused_like_pid_1(tmp_path, log, nth):
    found = _kernel_threads()
    if len(found) <= nth:
        pytest.skip("no kernel thread visible in this PID namespace")
    plan, db = _plan(tmp_path), tmp_path / "s.db"
    for pid in (1, found[nth]):
        res = cli("--state", db, "adopt", plan, "t", "--pid", pid, "--log", log)
        assert res.returncode == 2, (pid, res.stderr)
        assert f"pid {pid}" in res.stderr and ("kernel thread" in res.stderr or pid == 1), \
            res.stderr
    _nothing_recorded(db)
    assert log.read_text() == "a line\n"


BAD_PIDS = ["", "   ", "١٢٣", "²", "9" * 400, "99999999999", "-5", "+12", "1_000", "0x1f",
            "12 13", "0", "1", "4194305"]


@pytest.mark.parametrize("text", BAD_PIDS)
def test_fault_pid_typed_is_ascii_digits_only(tmp_path, log, text):
    plan, db = _plan(tmp_path), tmp_path / "s.db"
    res = cli("--state", db, "adopt", plan, "t", "--pid", text, "--log", log)
    assert res.returncode == 2, res.stderr
    assert "--pid" in res.stderr or "pid" in res.stderr, res.stderr
    _nothing_recorded(db)


BAD_PID_FILES = [b"", b" \n\t ", "١٢٣".encode(), "٤٥٦\n".encode(), b"9" * 40, b"9" * 400,
                 b"-5\n", b"0\n", b"1\n", b"\x00\xff\x13\x37", b"12\x0013", b"12 13\n",
                 b"0x1f", b"4194305"]


def _pid_file(tmp_path: Path, content) -> Path:
    p = tmp_path / "wd" / "v4.pid"
    p.parent.mkdir(exist_ok=True)
    if content == "fifo":
        os.mkfifo(p)
    elif content == "directory":
        p.mkdir()
    elif content == "missing":
        pass
    else:
        p.write_bytes(content)
    return p


@pytest.mark.parametrize("content", BAD_PID_FILES + ["fifo", "directory", "missing"],
                         ids=lambda c: repr(c)[:30])
def test_fault_bad_pid_file_named_nothing_recorded(tmp_path, log, content):
    pid_file = _pid_file(tmp_path, content)
    plan, db = _plan(tmp_path, {"pid_file": "v4.pid", "log": "run.log"}), tmp_path / "s.db"
    before = digest(pid_file) if pid_file.is_file() else None
    # `specdeck adopt PLAN ITEM` adopts what the item's adopt: names: bad input, exit 2;
    # `specdeck run` counts the item failed (exit 1): in both, nothing is recorded
    for command, code in (("adopt", 2), ("run", 1)):
        t0 = time.monotonic()
        res = cli("--state", db, command, plan, "t", timeout=60)
        assert time.monotonic() - t0 < 30  # a FIFO is never opened
        assert res.returncode == code, (command, res.stderr)
        assert f"pid_file {pid_file} on gpu: " in res.stderr, res.stderr
        _nothing_recorded(db)
    assert (digest(pid_file) if pid_file.is_file() else None) == before
    assert not (tmp_path / "wd" / "LAUNCHED").exists()


def _stored_lines(db: Path) -> list[str]:
    try:
        data = b"".join(r[0] for r in rows(db, "SELECT data FROM logs ORDER BY offset"))
    except sqlite3.OperationalError:  # the follower is still creating the state file
        return []
    return data.decode().splitlines()


def test_fault_rotated_log_followed_from_its_new_start(tmp_path):
    """copytruncate, then logrotate's rename-and-create: every line written after each
    rotation is stored, once, in order; a journal notice names the log each time."""
    wd = tmp_path / "wd"
    wd.mkdir()
    log = wd / "run.log"
    go = [wd / f"go{i}" for i in range(3)]
    script = (f"cd {wd}; for i in $(seq 1 10); do echo \"line $i\" >> run.log; done; "
              "while [ ! -e go0 ]; do sleep 0.02; done; "
              "for i in $(seq 11 20); do echo \"line $i\" >> run.log; done; "
              "while [ ! -e go1 ]; do sleep 0.02; done; "
              "for i in $(seq 21 30); do echo \"line $i\" >> run.log; sleep 0.01; done; "
              "while [ ! -e go2 ]; do sleep 0.02; done")
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True,
                            stdout=subprocess.DEVNULL)
    plan, db = _plan(tmp_path), tmp_path / "s.db"
    follower = None
    try:
        wait_for(lambda: log.exists() and log.read_text().count("\n") == 10, what="10 lines")
        follower = popen_cli("--state", db, "adopt", plan, "t", "--pid", proc.pid, "--log",
                             log, "--from-start", "-q")
        wait_for(lambda: db.exists() and len(_stored_lines(db)) == 10, what="10 stored")
        kept = (wd / "run.log.1")
        kept.write_bytes(log.read_bytes())  # copytruncate: copy, then truncate in place
        os.truncate(log, 0)
        go[0].touch()
        wait_for(lambda: len(_stored_lines(db)) == 20, what="20 stored")
        os.rename(log, wd / "run.log.2")  # logrotate: rename, create a new file
        log.write_bytes(b"")
        go[1].touch()
        wait_for(lambda: len(_stored_lines(db)) == 30, what="30 stored")
        go[2].touch()
        proc.wait(30)
        out, err = follower.communicate(timeout=60)
        assert "Traceback" not in err, err
        assert follower.returncode == 1, err  # the adopted run ended: its status unknown
    finally:
        for p in (proc, follower):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert _stored_lines(db) == [f"line {i}" for i in range(1, 31)]
    notes = [r[0] for r in rows(db, "SELECT message FROM events WHERE kind = 'log_rotated' "
                                    "ORDER BY id")]
    assert len(notes) == 2 and all(str(log) in n for n in notes), notes
    assert "truncated" in notes[0] and "replaced" in notes[1], notes
    assert rows(db, "SELECT state FROM runs") == [("lost",)]
    assert kept.read_text().splitlines() == [f"line {i}" for i in range(1, 11)]  # untouched
