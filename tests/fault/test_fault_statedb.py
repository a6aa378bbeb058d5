"""Class 2: the state database. Whatever the file is (a directory, garbage, /dev/null,
read-only, unreadable, locked, on a full disk, written by a newer specdeck), every command
exits 2 with one message naming the path and what to do, and writes nothing to it."""

from __future__ import annotations

import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.fault.conftest import cli, digest, local_plan, rows, wait_for

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
    which its run lifts for itself): the run's end is recorded, its log stops short. Once
    there is space, `attach` (following the command to its end) or `status` (once it has
    ended) stores the rest from the host's log (the truth), exactly once, its item saying
    how the run ended."""
    from tests.cli.conftest import SPECDECK, specdeck

    plan = local_plan(tmp_path, WAVES)
    db = tmp_path / "state.db"
    assert cli("--state", db, "mark", plan, "waves", "pending").returncode == 0  # (creates it)
    limit = db.stat().st_size + 120_000  # room for the first lines, not for a wave

    def full_disk_soon():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([str(SPECDECK), "--state", str(db), "run", str(plan), "waves", "-q"],
                         preexec_fn=full_disk_soon, capture_output=True, text=True, env=env,
                         timeout=120)
    assert "Traceback" not in res.stderr
    assert res.returncode == 1 and "disk I/O error" in res.stderr, res.stderr
    ((state, stored),) = rows(db, "SELECT state, log_lines FROM runs")
    # what the full disk let in: the run ended failed (the case), or, when not even
    # its end fitted, left running for the next specdeck to reconcile
    assert state in ("failed", "running") and stored < 30_300, res.stderr

    # space is back: `attach` follows the host's log to its end; `status` stores what the
    # ended command left; either again adds nothing
    if later == "status":
        ((capsule,),) = rows(db, "SELECT capsule FROM runs")
        wait_for(lambda: os.path.exists(f"{capsule}/exit"), 60, "its command's end")
    res = specdeck("--state", db, later, plan, timeout=120)
    assert res.returncode == 0, res.stderr
    for _ in range(2):
        assert specdeck("--state", db, "status", plan).returncode == 0
    final = {"failed": ("failed", "failed"), "running": ("succeeded", "done")}[state]
    assert rows(db, "SELECT state, log_lines FROM runs") == [(final[0], 30_300)]
    log = specdeck("--state", db, "logs", plan, "waves").stdout.splitlines()
    want = [f"line-0-{i}" for i in range(1, 301)] + [
        f"line-{w}-{i}" for w in (1, 2, 3) for i in range(1, 10_001)]
    assert log == want  # every line, in order, once
    assert rows(db, "SELECT status FROM items WHERE item_id = 'waves'") == [(final[1],)]
    if state == "failed":
        assert later == "status" or "stored the rest of its log" in res.stderr
        assert [k for (k,) in rows(db, "SELECT kind FROM events WHERE kind LIKE 'log_%' "
                                       "ORDER BY id")] == ["log_behind", "log_caught_up"]


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
