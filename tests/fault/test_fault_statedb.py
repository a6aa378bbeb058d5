"""Class 2: the state database. Whatever the file is (a directory, garbage, /dev/null,
read-only, unreadable, locked, on a full disk, written by a newer specdeck), every command
exits 2 with one message naming the path and what to do, and writes nothing to it.

A disk that fills once the file is open (issue 42 §5) is no bad input and no fault of any
run: the write is refused whole, stderr says the state disk is full and where, the run goes
on on its host (never failed for it), and its whole log is stored once there is space."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.fault.conftest import cli, digest, local_plan, rows, tmpfs, wait_for

ITEMS = """  - id: a
    content: say hi
    action: {kind: shell, host: here, params: {command: "echo hi"}}
"""
COMMANDS = [("status",), ("run", "a"), ("mark", "a", "done"), ("logs", "a")]


def _siblings(db):
    return sorted(p.name for p in db.parent.iterdir() if p.name.startswith(db.name))


def _fresh_db(tmp_path, plan):
    db = tmp_path / "state.db"
    assert cli("--state", db, "mark", plan, "a", "pending").returncode == 0  # (it creates one)
    return db


def _check_refused(res, db, before, words):
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert str(db) in res.stderr, res.stderr
    assert all(w in res.stderr for w in words), res.stderr
    assert "hint:" in res.stderr
    after = digest(db) if db.is_file() else None
    assert after == before


def _make(kind, tmp_path, plan):
    db = tmp_path / "state.db"
    if kind == "directory":
        db.mkdir()
        return db, ("is a directory",)
    if kind == "garbage":
        db.write_bytes(b"\x00garbage, not sqlite\n" * 100)
        return db, ("not an SQLite database",)
    if kind == "truncated-header":
        db.write_bytes(b"SQLite format 3\x00" + b"\xff" * 80)
        return db, ()
    if kind == "other-program":
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE photos (id INTEGER)")
        con.commit()
        con.close()
        return db, ("another program",)
    if kind == "newer-schema":
        db = _fresh_db(tmp_path, plan)
        con = sqlite3.connect(db)
        con.execute("INSERT INTO _sqlite_migrations (migration_set, name, applied_at) "
                    "VALUES ('specdeck', 'm999_from_the_future', 'x')")
        con.commit()
        con.close()
        return db, ("newer specdeck", "m999_from_the_future")
    if kind == "read-only":
        db = _fresh_db(tmp_path, plan)
        os.chmod(db, 0o444)
        return db, ("read-only",)
    if kind == "unreadable":
        db = _fresh_db(tmp_path, plan)
        os.chmod(db, 0)
        return db, ("cannot be read",)
    raise AssertionError(kind)


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("kind", ["directory", "garbage", "truncated-header", "other-program",
                                  "newer-schema", "read-only", "unreadable"])
def test_bad_state_file_is_refused_untouched(tmp_path, kind, cmd):
    plan = local_plan(tmp_path, ITEMS)
    db, words = _make(kind, tmp_path, plan)
    before = digest(db) if db.is_file() and os.access(db, os.R_OK) and kind != "unreadable" \
        else None
    if kind == "unreadable":
        os.chmod(db, 0o600)
        before = digest(db)
        os.chmod(db, 0)
    names = _siblings(db)
    res = cli("--state", db, *cmd[:1], plan, *cmd[1:])
    if kind == "unreadable":
        os.chmod(db, 0o600)
    _check_refused(res, db, before, words)
    assert _siblings(db) == names  # no -wal, -shm or journal appeared
    assert not (tmp_path / "wd").exists()  # nothing ran


def test_dev_null_is_refused(tmp_path):
    plan = local_plan(tmp_path, ITEMS)
    res = cli("--state", "/dev/null", "run", plan, "a")
    assert res.returncode == 2 and "/dev/null" in res.stderr and "regular file" in res.stderr
    assert not (tmp_path / "wd").exists()


def test_unwritable_directory_for_a_new_database(tmp_path):
    plan = local_plan(tmp_path, ITEMS)
    d = tmp_path / "ro"
    d.mkdir()
    os.chmod(d, 0o555)
    try:
        res = cli("--state", d / "new.db", "mark", plan, "a", "done")  # a command that creates
    finally:
        os.chmod(d, 0o755)
    assert res.returncode == 2 and str(d) in res.stderr and "not writable" in res.stderr
    assert list(d.iterdir()) == []


def test_full_disk_creating_the_database_leaves_nothing(tmp_path):
    plan = local_plan(tmp_path, ITEMS)
    db = tmp_path / "full.db"

    def no_space():  # every write past 0 bytes fails (EFBIG), as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "console.cli", "--state", str(db), "mark",
                          str(plan), "a", "done"],
                         preexec_fn=no_space, capture_output=True, text=True, env=env,
                         timeout=60)
    assert "Traceback" not in res.stderr
    assert res.returncode == 2, res.stderr
    assert str(db) in res.stderr and "free space" in res.stderr
    assert _siblings(db) == []


def test_locked_database_gives_up_with_a_message(tmp_path):
    plan = local_plan(tmp_path, ITEMS)
    db = _fresh_db(tmp_path, plan)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "c.execute('PRAGMA journal_mode=DELETE').fetchall()\n"
        "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = digest(db)
        t0 = time.monotonic()
        res = cli("--state", db, "mark", plan, "a", "done", timeout=90)
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 2, res.stderr
    assert str(db) in res.stderr and "locked" in res.stderr
    assert took < 40
    assert digest(db) == before


WAVES = """  - id: waves
    content: 300 lines, then three waves of 10,000
    action: {kind: shell, host: here, params: {command: "ulimit -f unlimited; seq 1 300 | sed s/^/line-0-/; sleep 1; for w in 1 2 3; do seq 1 10000 | sed s/^/line-$w-/; sleep 1; done"}}
"""


@pytest.mark.parametrize("later", ["attach", "status"])
def test_a_full_state_disk_loses_no_line_once_space_returns(tmp_path, later):
    """The disk of the state database fills during a run (a file size limit on specdeck,
    which its run lifts for itself): the run goes on on its host and stays live in the
    store, never failed for the state disk (issue 42 §5); its stored log stops short. Once
    there is space, `attach` (following the command to its end) or `status` (once it has
    ended) stores the rest from the host's log (the truth), exactly once, its item saying
    how the run ended."""
    plan = local_plan(tmp_path, WAVES)
    db = tmp_path / "state.db"
    assert cli("--state", db, "mark", plan, "waves", "pending").returncode == 0  # (creates it)
    limit = db.stat().st_size + 120_000  # room for the first lines, not for a wave

    def full_disk_soon():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's specdeck
    res = subprocess.run([sys.executable, "-m", "console.cli", "--state", str(db), "run",
                          str(plan), "waves", "-q"],
                         preexec_fn=full_disk_soon, capture_output=True, text=True, env=env,
                         timeout=120)
    assert "Traceback" not in res.stderr
    assert res.returncode == 1 and "disk I/O error" in res.stderr, res.stderr
    assert "a file size limit of" in res.stderr and "(`ulimit -f`)" in res.stderr, res.stderr
    assert "goes on on here" in res.stderr and res.stdout == "", res.stderr
    ((state, stored),) = rows(db, "SELECT state, log_lines FROM runs")
    # what the full disk let in: the run stays live (its end is its host's to say), its
    # stored log stops short
    assert state == "running" and stored < 30_300, res.stderr

    # space is back: `attach` follows the host's log to its end; `status` stores what the
    # ended command left; either again adds nothing
    if later == "status":
        ((capsule,),) = rows(db, "SELECT capsule FROM runs")
        wait_for(lambda: os.path.exists(f"{capsule}/exit"), 60, "its command's end")
    res = cli("--state", db, later, plan, timeout=120)
    assert res.returncode == 0, res.stderr
    for _ in range(2):
        assert cli("--state", db, "status", plan).returncode == 0
    assert rows(db, "SELECT state, log_lines FROM runs") == [("succeeded", 30_300)]
    log = cli("--state", db, "logs", plan, "waves").stdout.splitlines()
    want = [f"line-0-{i}" for i in range(1, 301)] + [
        f"line-{w}-{i}" for w in (1, 2, 3) for i in range(1, 10_001)]
    assert log == want  # every line, in order, once
    assert rows(db, "SELECT status FROM items WHERE item_id = 'waves'") == [("done",)]
    assert ("failed",) not in rows(db, "SELECT status FROM status_history")
    assert rows(db, "SELECT kind FROM events WHERE kind LIKE 'run_%' ORDER BY id") == [
        ("run_claimed",), ("run_succeeded",)]


FILLS = """  - id: waves
    content: 300 lines, three waves of 10,000, then a while more
    action: {kind: shell, host: here, params: {command: "seq 1 300 | sed s/^/line-0-/; sleep 1; for w in 1 2 3; do seq 1 10000 | sed s/^/line-$w-/; sleep 1; done; sleep 3"}}
"""
EXCEPTION_NAME = re.compile(r"Traceback|\b[A-Z][A-Za-z]*(Error|Exception|Warning)\b|StateDiskFull")
"""A Python exception's name, as a message that leaked one would show it."""


def _fill(disk, leave: int):
    """Another job's file taking all of ``disk`` but ``leave`` bytes."""
    st = os.statvfs(disk)
    filler = disk / "other-job.bin"
    filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - leave))
    return filler


@pytest.mark.slow
def test_a_full_state_disk_is_no_failure_of_the_run_going_on_on_its_host(tmp_path):
    """issue 42 §5, on a real full disk: the state database lives on a 2 MiB tmpfs that
    another job's file fills but for 200 KiB, and a shell item prints 30,300 lines. `run`
    says on stderr that the state disk is full, where (the file, its filesystem), that the
    run goes on on its host and how to reattach; it exits 1, prints nothing on stdout and
    names no Python exception. The item is never failed for it: once the file is gone,
    `status` says what the host says (running, or done once its command ended), and
    `attach` stores the whole log, once."""
    plan = local_plan(tmp_path, FILLS)
    with tmpfs(tmp_path / "state", "2m") as disk:
        db = disk / "s.db"
        assert cli("--state", db, "mark", plan, "waves", "pending").returncode == 0
        filler = _fill(disk, 200 * 1024)
        res = cli("--state", db, "run", plan, "waves", "-q", timeout=120)
        assert res.returncode == 1, res.stderr
        assert res.stdout == ""  # stdout is for what a script reads: nothing here
        assert not EXCEPTION_NAME.search(res.stderr), res.stderr
        for words in ("the state disk is full", f"state database {db}",
                      f"the tmpfs filesystem mounted at {disk}", "goes on on here",
                      f"specdeck attach {plan} waves", f"specdeck logs {plan} waves -f",
                      "not recorded: waves"):
            assert words in res.stderr, (words, res.stderr)
        ((state, stored, capsule),) = rows(db, "SELECT state, log_lines, capsule FROM runs")
        assert state == "running" and stored < 30_300  # the disk did fill, mid-log
        assert rows(db, "SELECT status FROM items") == [("in_progress",)]

        filler.unlink()  # space is back
        ended = os.path.exists(f"{capsule}/exit")  # before status asks the host
        res = cli("--state", db, "status", plan, "--json")
        assert res.returncode == 0, res.stderr
        (item,) = json.loads(res.stdout)["items"]
        now = (item["status"], item["run"]["state"])
        assert now == ("done", "succeeded") if ended else now in (
            ("in_progress", "running"), ("done", "succeeded")), now

        res = cli("--state", db, "attach", plan, "-q", timeout=120)
        assert res.returncode == 0 and not EXCEPTION_NAME.search(res.stderr), res.stderr
        for _ in range(2):
            assert cli("--state", db, "status", plan).returncode == 0
        assert rows(db, "SELECT state, log_lines FROM runs") == [("succeeded", 30_300)]
        log = cli("--state", db, "logs", plan, "waves").stdout.splitlines()
        assert log == [f"line-0-{i}" for i in range(1, 301)] + [
            f"line-{w}-{i}" for w in (1, 2, 3) for i in range(1, 10_001)]  # each once
        assert rows(db, "SELECT status FROM items") == [("done",)]
        assert ("failed",) not in rows(db, "SELECT status FROM status_history")


def test_a_write_the_state_disk_refuses_is_one_error_and_stores_nothing(tmp_path):
    """The store's one translation: on a full tmpfs a log piece is refused whole as
    StateDiskFull naming the file and its filesystem (its transaction rolled back: offset
    and log as they were, no transaction left open), and the same piece is stored once
    there is space; any other SQLite error stays itself."""
    from core.errors import StateDiskFull
    from core.state.store import Store

    with tmpfs(tmp_path / "state", "1m") as disk:
        store = Store(disk / "s.db")
        try:
            store.claim_run("r1", "a", "shell", "here", owner="test")
            filler = _fill(disk, 0)
            piece = b"".join(b"line %d of a wave\n" % i for i in range(20_000))
            with pytest.raises(StateDiskFull) as got:
                store.append_log("r1", 0, piece)
            e = got.value
            assert e.full and e.path == str(disk / "s.db") and e.cause == "database or disk is full"
            assert e.filesystem.startswith(f"the tmpfs filesystem mounted at {disk} (0 B free")
            assert str(e).startswith(f"the state disk is full: state database {disk / 's.db'}")
            assert f"free space on {disk}" in e.hint
            assert not store.db.conn.in_transaction
            run = store.run("r1")
            assert (run.log_offset, run.log_lines, store.log_bytes("r1")) == (0, 0, b"")

            filler.unlink()
            assert store.append_log("r1", 0, piece)
            assert store.log_bytes("r1") == piece and store.run("r1").log_lines == 20_000
            with pytest.raises(sqlite3.IntegrityError):  # a bug's error is no full disk
                store.claim_run("r1", "b", "shell", "here", owner="test")
        finally:
            store.close()


@pytest.mark.parametrize("ended", ["succeeded", "stopped", "failed", "lost"])
def test_a_log_left_behind_is_caught_up_whatever_the_run_ended(tmp_path, ended):
    """The host's log is the truth: a run journaled `log_behind` gets the lines its stored
    log lacks from the stored offset on (metrics with them), once, however it ended."""
    from tests.cli.conftest import specdeck

    plan = local_plan(tmp_path, """  - id: a
    content: ten lines and a metric
    action: {kind: shell, host: here, params: {command: "seq 1 9; echo '{\\"step\\": 1, \\"loss\\": 0.5}'"}}
""")
    db = tmp_path / "s.db"
    assert specdeck("--state", db, "run", plan, "a").returncode == 0
    ((run_id, offset),) = rows(db, "SELECT id, log_offset FROM runs")
    con = sqlite3.connect(db)  # as a full disk leaves it: 4 of its 10 lines stored
    with con:
        kept = con.execute("SELECT data FROM logs WHERE run_id = ?", [run_id]).fetchone()[0]
        con.execute("DELETE FROM logs WHERE run_id = ?", [run_id])
        con.execute("DELETE FROM metrics WHERE run_id = ?", [run_id])
        head = b"".join(kept.splitlines(keepends=True)[:4])
        con.execute("INSERT INTO logs (run_id, offset, length, lines, data, at) VALUES "
                    "(?, 0, ?, 4, ?, 0)", [run_id, len(head), head])
        con.execute("UPDATE runs SET state = ?, log_offset = ?, log_lines = 4 WHERE id = ?",
                    [ended, len(head), run_id])
        con.execute("INSERT INTO events (at, kind, item_id, run_id, host, message) VALUES "
                    "(0, 'log_behind', 'a', ?, 'here', 'test')", [run_id])
    con.close()
    for _ in range(2):
        assert specdeck("--state", db, "status", plan).returncode == 0
    assert rows(db, "SELECT state, log_lines, log_offset FROM runs") == [(ended, 10, offset)]
    assert specdeck("--state", db, "logs", plan, "a").stdout.splitlines()[:9] == [
        str(i) for i in range(1, 10)]
    assert rows(db, "SELECT step, name, value FROM metrics") == [(1, "loss", 0.5)]
    assert len(rows(db, "SELECT 1 FROM events WHERE kind = 'log_caught_up'")) == 1
