"""The store: exactly-once log chunks, one live run per item, two processes on one file."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3

from core.state.store import Store


def test_append_log_is_exactly_once():
    s = Store(":memory:")
    run = s.claim_run("r1", "item", "shell", "h", owner="me")
    assert run.attempt == 1 and run.state == "starting"
    assert s.append_log("r1", 0, b"a\nb\n", [(1, "loss", 2.0)])
    assert not s.append_log("r1", 0, b"a\nb\n")  # replay after a reconnect: refused
    assert not s.append_log("r1", 10, b"x\n")  # a gap: refused
    assert s.append_log("r1", 4, b"c\n\xff\xfe bad utf8\n")
    assert s.log_bytes("r1") == b"a\nb\nc\n\xff\xfe bad utf8\n"
    assert s.log_bytes("r1", 2) == b"b\nc\n\xff\xfe bad utf8\n"
    assert s.run("r1").log_offset == 18 and s.run("r1").log_lines == 4
    assert s.log_tail("r1", 2) == ["c", "\ufffd\ufffd bad utf8"]
    assert s.metric_series("r1", "loss") == [(1, 2.0)]


def test_one_live_run_per_item_and_attempts():
    s = Store(":memory:")
    assert s.claim_run("r1", "it", "shell", "h", owner="o")
    assert s.claim_run("r2", "it", "shell", "h", owner="o") is None  # attach instead
    assert s.end_run("r1", "failed", exit_code=7)
    assert not s.end_run("r1", "succeeded")  # idempotent: the first end wins
    r2 = s.claim_run("r2", "it", "shell", "h", owner="o")
    assert r2.attempt == 2
    kinds = [e.kind for e in s.events()]
    assert kinds == ["run_claimed", "run_failed", "run_claimed"]


def _claim(path, i, q):
    s = Store(path)
    q.put(s.claim_run(f"r{i}", "same", "shell", "h", owner=str(i)) is not None)


def test_two_processes_claim_one_item_once(tmp_path):
    path = str(tmp_path / "s.db")
    Store(path).close()
    q = mp.Queue()
    procs = [mp.Process(target=_claim, args=(path, i, q)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    wins = [q.get() for _ in procs]
    assert wins.count(True) == 1
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_status_history_and_migrations_idempotent(tmp_path):
    path = tmp_path / "s.db"
    s = Store(path)
    s.set_status("a", "in_progress", reason="run r1")
    s.set_status("a", "done")
    s.close()
    s = Store(path)  # reopening applies no migration twice
    assert s.item_statuses() == {"a": "done"}
    assert [h.status for h in s.status_history("a")] == ["in_progress", "done"]
