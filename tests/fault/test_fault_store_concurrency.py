"""Class 8: the state database under concurrency. Many specdeck processes opening the same
new state file at once all end with the same schema: a migration another process applied
meanwhile is recognised, never run twice, and no opener fails."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import traceback

from core.state.store import Store, migrations

PROCS = 16
ROUNDS = 20


def _worker(n: int, tmp: str, barrier, errors) -> None:
    for rnd in range(ROUNDS):
        try:
            barrier.wait(timeout=120)
        except Exception:  # noqa: BLE001 - a broken barrier: another worker already failed
            return
        try:
            st = Store(f"{tmp}/r{rnd}.db")
            st.set_status(f"p{n}", "in_progress", reason=f"round {rnd}")
            st.journal("note", f"process {n} round {rnd}")
            assert st.item_statuses()[f"p{n}"] == "in_progress"
            st.close()
        except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
            errors.put(f"process {n} round {rnd}: {traceback.format_exc()}")


def _schema(db) -> tuple[list, list]:
    con = sqlite3.connect(db)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM _sqlite_migrations "
                                           "WHERE migration_set = 'specdeck' ORDER BY id")]
        sql = sorted(r[0] for r in con.execute("SELECT sql FROM sqlite_master WHERE sql "
                                               "IS NOT NULL"))
        return names, sql
    finally:
        con.close()


def test_fault_sixteen_processes_open_a_new_state_file_at_once(tmp_path):
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(PROCS)
    errors = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(n, str(tmp_path), barrier, errors))
             for n in range(PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found, "\n".join(found[:3])
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    known = [m.name for m in migrations._migrations]
    reference = _schema(Store(tmp_path / "reference.db").path)
    for rnd in range(ROUNDS):
        db = tmp_path / f"r{rnd}.db"
        names, sql = _schema(db)
        assert names == known, (rnd, names)  # each applied exactly once, in order
        assert sql == reference[1], rnd
        con = sqlite3.connect(db)
        statuses = dict(con.execute("SELECT item_id, status FROM items"))
        notes = con.execute("SELECT count(*) FROM events WHERE kind = 'note'").fetchone()[0]
        con.close()
        assert statuses == {f"p{n}": "in_progress" for n in range(PROCS)}, rnd
        assert notes == PROCS, rnd
