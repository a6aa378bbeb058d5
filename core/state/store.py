"""The state store: SQLite through sqlite-utils (the only importer of sqlite_utils).

The plan YAML is intent; everything that happens lives here: item status history, runs,
their logs (as byte-offset chunks), an append-only event journal, metrics and eval results.

Decisions:

* **One owning thread.** A :class:`Store` is used from the thread that opened it (for the CLI
  and the console that is the asyncio event loop's thread); sqlite3's ``check_same_thread``
  enforces it. Transactions are short (one log chunk, one status change), so the loop is
  never blocked for long.
* **Several processes.** WAL mode plus a busy timeout let two specdeck processes share a
  state file; multi-step writes go in :meth:`Store.atomic` and claims that must not race
  (starting a run for an item) take ``BEGIN IMMEDIATE``.
* **Exactly-once logs.** :meth:`append_log` writes a chunk that starts at the run's stored
  offset and advances the offset in the same transaction; a chunk at any other offset is
  refused. A restart resumes from the stored offset, so no gap and no duplicate.
* **Schema changes** are ``sqlite_utils`` migrations, applied on open.
* **A full disk** is one error: every write goes through :meth:`Store._immediate` (or
  :meth:`Store.atomic`), which rolls the transaction back and raises
  :class:`~core.errors.StateDiskFull` for SQLite's full-disk and write I/O errors, naming the
  file and its filesystem, so no caller tells a full state disk from a bug by SQLite's words.
  (While opening, the same fault is the unusable-file error of :mod:`core.state.statefile`.)
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Collection, Iterable, Iterator, Mapping

from core.errors import RunMoveRefused

from core.state import points
from core.ml.formats import strictjson
from core.state.records import (ENDED_STATES, LIVE_STATES, Artefact, EvalRow, Event, MetricPoint, Run,
                          SeenMark, StatusChange, TauWatcher, WatchEntry)


def _import_sqlite_utils() -> None:
    """Import sqlite_utils without the pandas and numpy it imports when they are installed.

    ``sqlite_utils.db`` imports both (0.5-0.7 s, most of a CLI command's start-up) only to add
    their scalar types to the column types it infers from inserted values; the store writes
    plain Python values into tables whose columns it declares, so it never needs them. Hidden
    only when this process has not loaded them already (an ML process keeps sqlite_utils'
    full mapping), and only while sqlite_utils itself is imported.
    """
    hidden = [m for m in ("pandas", "numpy") if m not in sys.modules]
    for m in hidden:
        sys.modules[m] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import sqlite_utils  # noqa: F401
    finally:
        for m in hidden:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]


_import_sqlite_utils()

from sqlite_utils import Database  # noqa: E402
from sqlite_utils.migrations import Migrations  # noqa: E402

migrations = Migrations("specdeck")


@migrations()
def m001_initial(db: Database) -> None:
    db["items"].create({"item_id": str, "status": str, "updated_at": float, "reason": str},
                       pk="item_id")
    db["status_history"].create({"id": int, "item_id": str, "status": str, "at": float,
                                 "reason": str, "run_id": str}, pk="id")
    db["status_history"].create_index(["item_id"])
    db["runs"].create({
        "id": str, "item_id": str, "kind": str, "host": str, "attempt": int, "state": str,
        "pid": int, "pstart": str, "capsule": str, "launcher": str, "job_id": str,
        "owner": str, "started_at": float, "ended_at": float, "exit_code": int,
        "signal": str, "log_offset": int, "log_lines": int, "result": str, "error": str,
        "config": str,
    }, pk="id", not_null={"item_id", "state"}, defaults={"log_offset": 0, "log_lines": 0})
    db["runs"].create_index(["item_id", "attempt"], unique=True)
    db["runs"].create_index(["state"])
    db["logs"].create({"run_id": str, "offset": int, "length": int, "lines": int,
                       "data": bytes, "at": float}, pk=("run_id", "offset"))
    db["events"].create({"id": int, "at": float, "kind": str, "item_id": str, "run_id": str,
                         "host": str, "message": str, "data": str}, pk="id")
    db["metrics"].create({"run_id": str, "step": int, "name": str, "value": float,
                          "at": float}, pk=("run_id", "name", "step"))
    db["eval_results"].create({
        "id": int, "run_id": str, "item_id": str, "drafter": str, "role": str,
        "prompt_id": str, "tau": float, "rounds": str, "per_position": str,
        "settings": str, "step": int, "at": float}, pk="id")
    db["eval_results"].create_index(["item_id", "drafter"])
    db["artefacts"].create({"id": int, "run_id": str, "item_id": str, "kind": str,
                            "path": str, "step": int, "at": float, "data": str}, pk="id")
    db["artefacts"].create_index(["run_id", "path"], unique=True)


@migrations()
def m002_watch_evals(db: Database) -> None:
    db["watch_evals"].create({"id": str, "run_id": str, "item_id": str, "step": int,
                              "state": str, "host": str, "capsule": str, "tau": float,
                              "at": float, "error": str}, pk="id")
    db["watch_evals"].create_index(["run_id", "step"], unique=True)


@migrations()
def m003_adopted_runs(db: Database) -> None:
    # adopt: how an adopted run is found (JSON, core.runs.adopt); log_base: the byte of the
    # followed file where the stored log starts (an adopted log is followed from there).
    db["runs"].add_column("adopt", str)
    db["runs"].add_column("log_base", int, not_null_default=0)


@migrations()
def m004_console_seen(db: Database) -> None:
    """Where a console last saw the store: the journal id it had seen and when (a heartbeat,
    so that an unclean exit still leaves the mark)."""
    db["console_seen"].create({"name": str, "event_id": int, "at": float}, pk="name")


@migrations()
def m005_metric_sources(db: Database) -> None:
    db["metric_sources"].create({"run_id": str, "source": str, "offset": int, "at": float},
                                pk=("run_id", "source"))


@migrations()
def m006_watchers(db: Database) -> None:
    """Detached watch_eval watchers (core.actions.watch_eval): one per train run."""
    db["watchers"].create({"run_id": str, "item_id": str, "host": str, "capsule": str,
                           "ckpt_dir": str, "state": str, "current": int, "last_step": int,
                           "queue": str, "error": str, "started_at": float, "at": float},
                          pk="run_id")


@migrations()
def m007_telemetry(db: Database) -> None:
    """Host telemetry (core.capsules.telemetry): one row per look at a host (its disks and
    GPU processes as JSON, or why it has no GPUs), one per GPU in it (the history)."""
    db["host_samples"].create({"id": int, "host": str, "at": float, "run_id": str,
                               "no_gpus": str, "data": str}, pk="id")
    db["host_samples"].create_index(["host", "at"])
    db["gpu_samples"].create({"sample_id": int, "host": str, "gpu": int, "at": float,
                              "util": float, "mem_used": float, "mem_total": float,
                              "power": float, "temp": float}, pk=("sample_id", "gpu"))
    db["gpu_samples"].create_index(["host", "gpu", "at"])


@migrations()
def m008_notifications(db: Database) -> None:
    """Notifications (core.runs.notify): one row per event, so it is sent once however many
    specdecks see it. The target is described (scheme and host), never its URL."""
    db["notifications"].create({"key": str, "run_id": str, "item_id": str, "event": str,
                                "state": str, "target": str, "by": str, "error": str,
                                "at": float}, pk="key")


def default_state_path(plan_name: str) -> Path:
    """``$SPECDECK_STATE``, else ``$XDG_STATE_HOME/specdeck/<plan>.db``."""
    env = os.environ.get("SPECDECK_STATE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    return Path(base) / "specdeck" / f"{plan_name}.db"


def state_path_for(plan, explicit: str | None = None) -> Path:
    """Where a plan's state lives: ``--state``, else ``$SPECDECK_STATE``, else the plan's own
    ``state:``, else ``$XDG_STATE_HOME/specdeck/<plan>.db``."""
    if explicit:
        return Path(explicit)
    if not os.environ.get("SPECDECK_STATE") and plan.state:
        return Path(plan.state)
    return default_state_path(plan.name)


class Store:
    """Verb methods over the state database. The only code that knows table names.

    Args:
        path: The database file (created with its directory), or ``":memory:"``.
        transitions: A run's life (``core.runs.life.TRANSITIONS``, state -> the states it may
            move to): every write of a run's state is checked against it and a move it does
            not list is refused (:class:`~core.errors.RunMoveRefused`). The store sits below
            the runs, so it is handed the table (the runner and ``open_store`` do) rather
            than importing it; None checks nothing.
    """

    def __init__(self, path: str | Path = ":memory:", *,
                 transitions: Mapping[str, Collection[str]] | None = None):
        self.path = str(path)
        self.transitions = transitions
        self._opened = False
        """Open and migrated: from then on a write the disk refuses is StateDiskFull."""
        self._told: set[tuple[str, str]] = set()
        """(run, source) pairs whose dropped-points notice this process has seen journaled."""
        if self.path == ":memory:":
            self._open()
            return
        from core.state import statefile

        # Inspected read-only first: nothing is created, converted or migrated in a file
        # that is not a specdeck database this version knows (see core.state.statefile).
        statefile.preflight(self.path, [m.name for m in migrations._migrations], migrations.name)
        created = not os.path.exists(self.path)
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._open()
        except (sqlite3.Error, OSError) as e:
            with contextlib.suppress(Exception):
                self.db.close()
            if created:  # a half-created file (full disk) is not left behind
                for suffix in ("", "-wal", "-shm", "-journal"):
                    with contextlib.suppress(OSError):
                        os.remove(self.path + suffix)
            raise statefile.open_problem(self.path, e) from None

    def _open(self) -> None:
        conn = sqlite3.connect(self.path, timeout=self.OPEN_WAIT_S)
        # no sqlite_utils plugins: they are for its CLI's databases, not this one, and looking
        # them up scans every installed distribution's entry points (20+ ms a command)
        self.db = Database(conn, execute_plugins=False)
        if self.path != ":memory:":
            self._enable_wal()
        self.db.execute(f"PRAGMA busy_timeout = {int(self.OPEN_WAIT_S * 1000)}")
        self.db.execute("PRAGMA synchronous = NORMAL")
        with self._immediate():
            pass
        self._migrate()
        self.db.execute("PRAGMA busy_timeout = 30000")
        self._opened = True

    OPEN_WAIT_S = 10.0
    """How long opening waits for a lock another program holds (then: a clear error)."""

    def _enable_wal(self) -> None:
        # Switching a new file to WAL does not wait on the busy timeout: while another
        # process is opening the same new file it fails at once with "locked"; retry.
        deadline = time.monotonic() + self.OPEN_WAIT_S
        while True:
            try:
                self.db.enable_wal()
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _migrate(self) -> None:
        # Two processes opening a fresh file at once: the pending migrations are read and
        # applied under one write lock, so one that another process applied meanwhile is
        # seen as applied and never run twice (a re-run ``add_column`` fails).
        with self._immediate():
            migrations.apply(self.db)

    def close(self) -> None:
        self.db.close()

    @contextlib.contextmanager
    def atomic(self) -> Iterator[Database]:
        with self._disk_full_told():
            with self.db.atomic() as db:
                yield db

    @contextlib.contextmanager
    def _immediate(self) -> Iterator[None]:
        """A write transaction taken up front (no upgrade deadlock between processes)."""
        conn = self.db.conn
        if conn.in_transaction:
            yield
            return
        with self._disk_full_told():
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
                conn.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        """End the open transaction, if SQLite has not ended it already (a COMMIT or write
        the disk refused may leave it open or roll it back itself)."""
        if self.db.conn.in_transaction:
            self.db.conn.execute("ROLLBACK")
        self._told.clear()  # a notice journaled in it is gone too

    @contextlib.contextmanager
    def _disk_full_told(self) -> Iterator[None]:
        """A write the state disk refused becomes :class:`~core.errors.StateDiskFull` (once
        the store is open), its transaction rolled back; any other error stays itself."""
        try:
            yield
        except sqlite3.Error as e:
            from core.state import statefile

            full = (statefile.disk_full(self.path, e)
                    if self._opened and self.path != ":memory:" else None)
            if full is None:
                raise
            with contextlib.suppress(sqlite3.Error):
                self._rollback()
            raise full from e

    # -- items ---------------------------------------------------------------------------
    def item_statuses(self) -> dict[str, str]:
        return {r["item_id"]: r["status"] for r in self.db["items"].rows}

    def set_status(self, item_id: str, status: str, *, reason: str = "",
                   run_id: str | None = None) -> None:
        now = time.time()
        with self._immediate():
            self.db["items"].upsert({"item_id": item_id, "status": status, "updated_at": now,
                                     "reason": reason}, pk="item_id")
            self.db["status_history"].insert({"item_id": item_id, "status": status, "at": now,
                                              "reason": reason, "run_id": run_id})

    def status_history(self, item_id: str) -> list[StatusChange]:
        return [StatusChange.from_row(r) for r in
                self.db["status_history"].rows_where("item_id = ?", [item_id], order_by="id")]

    # -- runs ----------------------------------------------------------------------------
    def claim_run(self, run_id: str, item_id: str, kind: str, host: str | None, *,
                  owner: str, launcher: str = "process") -> Run | None:
        """Create a run for ``item_id`` unless it already has a live one.

        Returns the new run, or None when another live run exists (then attach to it).
        """
        with self._immediate():
            live = self.live_run(item_id)
            if live is not None:
                return None
            row = self.db.execute("SELECT MAX(attempt) FROM runs WHERE item_id = ?",
                                  [item_id]).fetchone()
            attempt = (row[0] or 0) + 1
            run = {"id": run_id, "item_id": item_id, "kind": kind, "host": host,
                   "attempt": attempt, "state": "starting", "owner": owner,
                   "launcher": launcher, "started_at": time.time(), "log_offset": 0,
                   "log_lines": 0}
            self.db["runs"].insert(run)
            self._event("run_claimed", item_id, run_id, host, f"attempt {attempt}")
        return self.run(run_id)

    def update_run(self, run_id: str, **fields: Any) -> None:
        for k in ("result", "config"):
            if k in fields and not isinstance(fields[k], (str, type(None))):
                fields[k] = strictjson.dumps(fields[k])
        with self._immediate():
            if "state" in fields:
                self._check_move(run_id, fields["state"])
            self.db["runs"].update(run_id, fields)

    def _check_move(self, run_id: str, to: str) -> None:
        """Refuse a move of the run's state that its life does not allow (inside the write's
        transaction: what is checked is what is replaced)."""
        if self.transitions is None:
            return
        row = self.db.execute("SELECT state FROM runs WHERE id = ?", [run_id]).fetchone()
        frm = row[0] if row else None
        allowed = self.transitions.get(frm, ()) if frm is not None else ()
        if to not in allowed:
            where = ", ".join(sorted(allowed)) or "nothing: it has ended"
            raise RunMoveRefused(
                f"run {run_id}: {frm or 'no such run'} -> {to} is not a move a run makes "
                f"(a {frm} run moves to {where}); nothing was written",
                hint="the allowed moves are core/runs/life.py's TRANSITIONS")

    def _runs(self, where: str, args: list, **kw: Any) -> list[Run]:
        return [Run.from_row(r) for r in self.db["runs"].rows_where(where, args, **kw)]

    def run(self, run_id: str) -> Run | None:
        rows = self._runs("id = ?", [run_id])
        return rows[0] if rows else None

    def live_run(self, item_id: str) -> Run | None:
        rows = self._runs(f"item_id = ? AND state IN {LIVE_STATES}", [item_id],
                          order_by="attempt DESC", limit=1)
        return rows[0] if rows else None

    def live_runs(self) -> list[Run]:
        return self._runs(f"state IN {LIVE_STATES}", [], order_by="started_at")

    def logs_behind(self) -> list[Run]:
        """Runs whose stored log was journaled behind their host's (``log_behind``) and not
        caught up since (``log_caught_up``)."""
        behind: dict[str, None] = {}
        for ev in self.events(kinds=("log_behind", "log_caught_up")):
            if ev.kind == "log_behind":
                behind[ev.run_id] = None
            else:
                behind.pop(ev.run_id, None)
        return [r for r in map(self.run, behind) if r is not None]

    def latest_run(self, item_id: str) -> Run | None:
        rows = self._runs("item_id = ?", [item_id], order_by="attempt DESC", limit=1)
        return rows[0] if rows else None

    def runs_for_item(self, item_id: str) -> list[Run]:
        return self._runs("item_id = ?", [item_id], order_by="attempt")

    def latest_runs(self) -> dict[str, Run]:
        """Each item's latest run, by item id."""
        return {r.item_id: r for r in self._runs("1 = 1", [], order_by="attempt")}

    def end_run(self, run_id: str, state: str, *, exit_code: int | None = None,
                signal: str | None = None, error: str | None = None,
                result: dict | None = None) -> bool:
        """Mark a live run ended. Returns False when it had already ended (idempotent)."""
        with self._immediate():
            run = self.run(run_id)
            if run is None or run.state in ENDED_STATES:
                return False
            self._check_move(run_id, state)
            fields: dict[str, Any] = {"state": state, "ended_at": time.time(),
                                      "exit_code": exit_code, "signal": signal, "error": error}
            if result is not None:
                fields["result"] = strictjson.dumps(result)
            self.db["runs"].update(run_id, fields)
            how = f"signal {signal}" if signal else f"exit {exit_code}"
            self._event(f"run_{state}", run.item_id, run_id, run.host,
                        f"{state} ({how})" + (f": {error}" if error else ""))
        return True

    # -- logs ----------------------------------------------------------------------------
    def append_log(self, run_id: str, offset: int, data: bytes,
                   metrics: Iterable[tuple[int, str, float]] = (),
                   artefacts: Iterable[tuple[str, str, int | None]] = ()) -> bool:
        """Store log bytes that start at ``offset`` and advance the run's offset.

        Returns False (storing nothing) when ``offset`` is not the run's stored offset, so a
        replayed chunk after a reconnect can never be stored twice.
        """
        if not data:
            return True
        nlines = data.count(b"\n")
        now = time.time()
        with self._immediate():
            row = self.db.execute("SELECT log_offset FROM runs WHERE id = ?", [run_id]).fetchone()
            if row is None or row[0] != offset:
                return False
            self.db.execute("INSERT INTO logs (run_id, offset, length, lines, data, at) "
                            "VALUES (?, ?, ?, ?, ?, ?)",
                            [run_id, offset, len(data), nlines, data, now])
            self.db.execute("UPDATE runs SET log_offset = ?, log_lines = log_lines + ? "
                            "WHERE id = ?", [offset + len(data), nlines, run_id])
            rows = [(run_id, step, name, value, now)
                    for step, name, value in self._storable(run_id, "log", metrics)]
            if rows:
                self.db.conn.executemany(
                    "INSERT OR REPLACE INTO metrics (run_id, step, name, value, at) "
                    "VALUES (?, ?, ?, ?, ?)", rows)
            arts = list(artefacts)
            if arts:
                item_id = self.db.execute("SELECT item_id FROM runs WHERE id = ?",
                                          [run_id]).fetchone()[0]
                for kind, path, step in arts:
                    self.add_artefact(run_id, item_id, kind, path, step)
        return True

    def log_bytes(self, run_id: str, start: int = 0) -> bytes:
        """The stored log from byte ``start`` on."""
        parts = [r[0] for r in self.db.execute(
            "SELECT data FROM logs WHERE run_id = ? AND offset + length > ? ORDER BY offset",
            [run_id, start])]
        blob = b"".join(parts)
        first = self.db.execute("SELECT MIN(offset) FROM logs WHERE run_id = ? AND "
                                "offset + length > ?", [run_id, start]).fetchone()[0]
        if first is not None and first < start:
            blob = blob[start - first:]
        return blob

    def log_stored_at(self, run_id: str) -> float | None:
        """When the run's last log bytes were stored (Unix seconds), or None: how old the
        stored copy of a live run's log is."""
        return self.db.execute("SELECT MAX(at) FROM logs WHERE run_id = ?",
                               [run_id]).fetchone()[0]

    def log_tail(self, run_id: str, max_lines: int = 1000) -> list[str]:
        """The last ``max_lines`` lines, decoded (invalid UTF-8 replaced)."""
        chunks: list[bytes] = []
        count = 0
        for (data,) in self.db.execute("SELECT data FROM logs WHERE run_id = ? "
                                       "ORDER BY offset DESC", [run_id]):
            chunks.append(data)
            count += data.count(b"\n")
            if count > max_lines:
                break
        from core.text import collapse_cr

        text = b"".join(reversed(chunks)).decode("utf-8", "replace")
        if not text:
            return []
        return [collapse_cr(x) for x in text.split("\n")[:-1]
                + ([] if text.endswith("\n") else [text.rsplit("\n", 1)[-1]])][-max_lines:]

    # -- journal -------------------------------------------------------------------------
    def _event(self, kind: str, item_id: str | None, run_id: str | None, host: str | None,
               message: str, data: dict | None = None) -> int:
        return self.db["events"].insert({
            "at": time.time(), "kind": kind, "item_id": item_id, "run_id": run_id,
            "host": host, "message": message,
            "data": strictjson.dumps(data) if data is not None else None}).last_pk

    def journal(self, kind: str, message: str, *, item_id: str | None = None,
                run_id: str | None = None, host: str | None = None,
                data: dict | None = None) -> int:
        with self._immediate():
            return self._event(kind, item_id, run_id, host, message, data)

    # -- notifications (core.runs.notify) -------------------------------------------------
    def claim_notification(self, key: str, **fields: Any) -> bool:
        """Record the event ``key`` as being sent; False when a row for it exists already
        (sent, or being sent, by another specdeck or reported by a host)."""
        with self._immediate():
            if self.db["notifications"].count_where("key = ?", [key]):
                return False
            self.db["notifications"].insert({"key": key, "at": time.time(), **fields})
            return True

    def set_notification(self, key: str, **fields: Any) -> None:
        with self._immediate():
            self.db["notifications"].update(key, {"at": time.time(), **fields})

    def notifications(self, run_id: str | None = None) -> list[dict]:
        where, args = ("run_id = ?", [run_id]) if run_id else (None, [])
        return list(self.db["notifications"].rows_where(where, args, order_by="at"))

    def events(self, *, since_id: int = 0, limit: int | None = None,
               kinds: Iterable[str] | None = None, newest_first: bool = False) -> list[Event]:
        """Journal rows after ``since_id`` (of ``kinds`` only), oldest first unless
        ``newest_first`` (then ``limit`` keeps the newest)."""
        where, args = "id > ?", [since_id]
        if kinds is not None:
            kinds = list(kinds)
            where += f" AND kind IN ({', '.join('?' * len(kinds))})"
            args += kinds
        return [Event.from_row(r) for r in self.db["events"].rows_where(
            where, args, limit=limit, order_by="id DESC" if newest_first else "id")]

    def events_between(self, since: float, until: float) -> list[Event]:
        """Journal rows made from ``since`` to ``until`` (Unix times), oldest first."""
        return [Event.from_row(r) for r in self.db["events"].rows_where(
            "at >= ? AND at <= ?", [since, until], order_by="at, id")]

    def last_event_id(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]

    def mark_seen(self, name: str = "console", event_id: int | None = None) -> int:
        """Record that a console has seen the journal up to ``event_id`` (default: all of it),
        now. The mark only moves forward. Returns the mark."""
        with self._immediate():
            latest = self.last_event_id()
            eid = latest if event_id is None else min(event_id, latest)
            row = self.db.execute("SELECT event_id FROM console_seen WHERE name = ?",
                                  [name]).fetchone()
            eid = max(eid, row[0] if row else 0)
            self.db["console_seen"].upsert({"name": name, "event_id": eid, "at": time.time()},
                                           pk="name")
        return eid

    def seen_mark(self, name: str = "console") -> SeenMark | None:
        """The last :meth:`mark_seen` (event id and time), or None if none was recorded."""
        rows = list(self.db["console_seen"].rows_where("name = ?", [name]))
        return SeenMark(**rows[0]) if rows else None

    # -- metrics -------------------------------------------------------------------------
    def add_metrics(self, run_id: str, rows: Iterable[tuple[int, str, float]],
                    source: str = "metrics") -> None:
        now = time.time()
        with self._immediate():
            self.db.conn.executemany(
                "INSERT OR REPLACE INTO metrics (run_id, step, name, value, at) "
                "VALUES (?, ?, ?, ?, ?)",
                [(run_id, s, n, v, now) for s, n, v in self._storable(run_id, source, rows)])

    def _storable(self, run_id: str, source: str, rows) -> list[tuple]:
        """The points of ``rows`` the database can hold (:mod:`core.state.points`); the others are
        dropped with one notice per run and source, so the log bytes they came with, and
        every good point, are stored all the same."""
        kept, dropped, why = points.bounded(rows)
        if dropped:
            self.metric_notice(run_id, source, f"metric points from {source} dropped: {why} "
                               f"({dropped} in this piece; the log lines are kept; later "
                               "drops from this source are not reported)")
        return kept

    def metric_notice(self, run_id: str, source: str, message: str) -> bool:
        """Journal ``message`` (kind ``metrics_dropped``) unless this run's ``source`` has
        had its notice already, by this process or another. True when it was journaled."""
        if (run_id, source) in self._told:
            return False
        data = strictjson.dumps({"source": source})
        with self._immediate():
            told = self.db.execute("SELECT 1 FROM events WHERE kind = 'metrics_dropped' AND "
                                   "run_id = ? AND data = ?", [run_id, data]).fetchone()
            if not told:
                run = self.db.execute("SELECT item_id, host FROM runs WHERE id = ?",
                                      [run_id]).fetchone() or (None, None)
                self._event("metrics_dropped", run[0], run_id, run[1], message,
                            {"source": source})
        self._told.add((run_id, source))
        return not told

    def metric_source_offset(self, run_id: str, source: str) -> int | None:
        """How far a metric source (a TensorBoard event file) has been stored."""
        row = self.db.execute("SELECT offset FROM metric_sources WHERE run_id = ? AND "
                              "source = ?", [run_id, source]).fetchone()
        return row[0] if row else None

    def metric_source_init(self, run_id: str, source: str, offset: int) -> None:
        """Start a source at ``offset`` unless it is known already."""
        with self._immediate():
            self.db.execute("INSERT OR IGNORE INTO metric_sources (run_id, source, offset, at) "
                            "VALUES (?, ?, ?, ?)", [run_id, source, offset, time.time()])

    def add_source_metrics(self, run_id: str, source: str, offset: int, new_offset: int,
                           rows: Iterable[tuple[int, str, float, float]]) -> bool:
        """Store ``(step, name, value, at)`` rows read from ``source`` bytes ``offset`` to
        ``new_offset`` and advance its offset, in one transaction. False (nothing stored)
        when the stored offset is not ``offset``: that piece is stored already."""
        now = time.time()
        with self._immediate():
            cur = self.metric_source_offset(run_id, source) or 0
            if cur != offset:
                return False
            self.db.conn.executemany(
                "INSERT OR REPLACE INTO metrics (run_id, step, name, value, at) "
                "VALUES (?, ?, ?, ?, ?)", [(run_id, s, n, v, now if at is None else at)
                                           for s, n, v, at in self._storable(run_id, source, rows)])
            self.db.execute("INSERT OR REPLACE INTO metric_sources (run_id, source, offset, at) "
                            "VALUES (?, ?, ?, ?)", [run_id, source, new_offset, time.time()])
        return True

    def metric_rows(self, run_id: str, names: Iterable[str] | None = None) -> list[MetricPoint]:
        """Every stored point of a run, by step then name."""
        where, args = "run_id = ?", [run_id]
        if names is not None:
            names = list(names)
            where += f" AND name IN ({', '.join('?' * len(names))})"
            args += names
        return [MetricPoint(*r) for r in
                self.db.execute(f"SELECT step, name, value, at FROM metrics WHERE {where} "
                                "ORDER BY step, name", args)]

    def metric_names(self, run_id: str) -> list[str]:
        return [r[0] for r in self.db.execute(
            "SELECT DISTINCT name FROM metrics WHERE run_id = ? ORDER BY name", [run_id])]

    def metric_series(self, run_id: str, name: str, *, max_points: int | None = None,
                      with_time: bool = False) -> list[tuple]:
        """(step, value) in step order (``with_time``: (step, value, stored at)); thinned
        evenly to ``max_points`` when given."""
        cols = "step, value, at" if with_time else "step, value"
        rows = [tuple(r) for r in self.db.execute(
            f"SELECT {cols} FROM metrics WHERE run_id = ? AND name = ? ORDER BY step",
            [run_id, name])]
        if max_points and len(rows) > max_points:
            stride = len(rows) / max_points
            rows = [rows[int(i * stride)] for i in range(max_points)] + [rows[-1]]
        return rows

    # -- eval results and artefacts ------------------------------------------------------
    def add_eval_results(self, rows: Iterable[EvalRow]) -> None:
        """Store eval rows; a row whose tau or step cannot be a number here (NaN, infinite,
        out of range) is dropped with one notice per run (``eval results``)."""
        now = time.time()
        with self._immediate():
            for r in rows:
                why = points.eval_row_problem(r)
                if why:
                    self.metric_notice(r.run_id, "eval results", f"eval row dropped: {why} "
                                       "(later ones of this run are not reported)")
                    continue
                row = r.to_row()
                row["at"] = row["at"] or now
                self.db["eval_results"].insert(row)

    def eval_results(self, item_id: str | None = None) -> list[EvalRow]:
        where, args = ("item_id = ?", [item_id]) if item_id else (None, [])
        return [EvalRow.from_row(r) for r in
                self.db["eval_results"].rows_where(where, args, order_by="id")]

    def add_artefact(self, run_id: str, item_id: str, kind: str, path: str,
                     step: int | None = None, data: dict | None = None) -> bool:
        """Record an artefact once; returns False when it was already known."""
        with self._immediate():
            exists = self.db.execute("SELECT 1 FROM artefacts WHERE run_id = ? AND path = ?",
                                     [run_id, path]).fetchone()
            if exists:
                return False
            if step is not None and points.step_of(step) is None:
                self.metric_notice(run_id, f"{kind} steps", f"{kind} {path}: step "
                                   f"{points.show(step)} is not an integer in SQLite's range; "
                                   f"recorded without a step (later ones are not reported)")
            step = points.step_of(step)
            self.db["artefacts"].insert({"run_id": run_id, "item_id": item_id, "kind": kind,
                                         "path": path, "step": step, "at": time.time(),
                                         "data": strictjson.dumps(data) if data else None})
            self._event("artefact", item_id, run_id, None, f"{kind} {path}")
        return True

    def artefacts(self, item_id: str, kind: str | None = None) -> list[Artefact]:
        where = "item_id = ?" + (" AND kind = ?" if kind else "")
        args = [item_id] + ([kind] if kind else [])
        return [Artefact.from_row(r) for r in
                self.db["artefacts"].rows_where(where, args, order_by="step, id")]

    # -- tau over training (watch_eval) --------------------------------------------------
    def watch_entries(self, run_id: str) -> list[WatchEntry]:
        return [WatchEntry.from_row(r) for r in
                self.db["watch_evals"].rows_where("run_id = ?", [run_id], order_by="step")]

    def watch_add(self, run_id: str, item_id: str, step: int) -> bool:
        """Queue a checkpoint's eval once; False when it is already known (or its step is
        out of SQLite's range: such a checkpoint is recorded without a step, never queued)."""
        if points.step_of(step) is None:
            return False
        with self._immediate():
            if self.db.execute("SELECT 1 FROM watch_evals WHERE run_id = ? AND step = ?",
                               [run_id, step]).fetchone():
                return False
            self.db["watch_evals"].insert({"id": f"{run_id}:{step}", "run_id": run_id,
                                           "item_id": item_id, "step": step, "state": "pending",
                                           "at": time.time()})
        return True

    def watch_update(self, run_id: str, step: int, **fields: Any) -> None:
        fields["at"] = time.time()
        if fields.get("tau") is not None and points.value_of(fields["tau"]) is None:
            fields["tau"] = None  # never a NaN or infinite tau (its eval rows say why)
        with self._immediate():
            self.db["watch_evals"].update(f"{run_id}:{step}", fields)


    def watch_ingest(self, run_id: str, item_id: str, step: int, *, state: str,
                     tau: float | None = None, error: str | None = None, host: str | None = None,
                     capsule: str | None = None, metrics: Iterable[tuple[int, str, float]] = (),
                     eval_rows: "list[EvalRow]" = ()) -> bool:
        """Store one detached eval's outcome with its metrics and eval rows, in one
        transaction, exactly once: False (nothing stored) when the step has its outcome
        already (another specdeck, or an earlier look, ingested it)."""
        if points.step_of(step) is None:
            self.metric_notice(run_id, "tau watcher", f"tau eval of step {points.show(step)} "
                               "not stored: the step is not an integer in SQLite's range")
            return False
        if tau is not None and points.value_of(tau) is None:
            tau = None  # the eval rows say why (dropped with their notice)
        with self._immediate():
            row = self.db.execute("SELECT state FROM watch_evals WHERE run_id = ? AND step = ?",
                                  [run_id, step]).fetchone()
            if row is not None and row[0] in ("done", "failed", "skipped"):
                return False
            self.db["watch_evals"].upsert({"id": f"{run_id}:{step}", "run_id": run_id,
                                           "item_id": item_id, "step": step, "state": state,
                                           "host": host, "capsule": capsule, "tau": tau,
                                           "error": error, "at": time.time()}, pk="id")
            if metrics:
                self.add_metrics(run_id, metrics, "tau watcher")
            if eval_rows:
                self.add_eval_results(list(eval_rows))
        return True

    def watcher_claim(self, run_id: str, item_id: str, host: str, capsule: str,
                      ckpt_dir: str) -> bool:
        """Record the detached watcher of a train run once; False when it is known."""
        with self._immediate():
            if self.watcher(run_id) is not None:
                return False
            now = time.time()
            self.db["watchers"].insert({"run_id": run_id, "item_id": item_id, "host": host,
                                        "capsule": capsule, "ckpt_dir": ckpt_dir,
                                        "state": "starting", "started_at": now, "at": now})
        return True

    def watcher(self, run_id: str) -> TauWatcher | None:
        rows = list(self.db["watchers"].rows_where("run_id = ?", [run_id]))
        return TauWatcher.from_row(rows[0]) if rows else None

    def watchers(self, *, live: bool = False) -> list[TauWatcher]:
        where = "state NOT IN ('ended', 'stopped', 'failed', 'lost')" if live else None
        return [TauWatcher.from_row(r)
                for r in self.db["watchers"].rows_where(where, order_by="started_at")]

    def watcher_take(self, run_id: str, from_states: Iterable[str], state: str) -> bool:
        """Move a watcher from one of ``from_states`` to ``state``, atomically: True for the
        one process that did (so only it restarts the watcher)."""
        states = list(from_states)
        with self._immediate():
            cur = self.db.execute(
                f"UPDATE watchers SET state = ?, at = ? WHERE run_id = ? AND state IN "
                f"({', '.join('?' * len(states))})", [state, time.time(), run_id, *states])
            return cur.rowcount == 1

    def watcher_update(self, run_id: str, **fields: Any) -> None:
        fields["at"] = time.time()
        if "queue" in fields and not isinstance(fields["queue"], (str, type(None))):
            fields["queue"] = strictjson.dumps(fields["queue"])
        with self._immediate():
            self.db["watchers"].update(run_id, fields)

    # -- host telemetry (core.capsules.telemetry) ------------------------------------------
    TELEMETRY_KEEP_S = 86400.0
    """Samples taken with no run (the console's look at an idle host) are kept this long;
    a run's are kept with it, as its metrics are."""

    def add_telemetry(self, sample, *, run_id: str | None = None) -> int:
        """Store one :class:`core.capsules.telemetry.HostSample` (of ``run_id``'s host)."""
        from dataclasses import asdict

        data = asdict(sample)
        gpus = data.pop("gpus")
        for g in gpus:  # the processes stay with the sample; the numbers get their rows
            g.pop("uuid", None)
        with self._immediate():
            self.db.execute("DELETE FROM gpu_samples WHERE sample_id IN (SELECT id FROM "
                            "host_samples WHERE run_id IS NULL AND at < ?)",
                            [time.time() - self.TELEMETRY_KEEP_S])
            self.db.execute("DELETE FROM host_samples WHERE run_id IS NULL AND at < ?",
                            [time.time() - self.TELEMETRY_KEEP_S])
            sid = self.db["host_samples"].insert({
                "host": sample.host, "at": sample.at, "run_id": run_id,
                "no_gpus": sample.no_gpus,
                "data": strictjson.dumps({**data, "gpus": gpus})}).last_pk
            self.db.conn.executemany(
                "INSERT INTO gpu_samples (sample_id, host, gpu, at, util, mem_used, mem_total, "
                "power, temp) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(sid, sample.host, g["index"], sample.at, points.value_of(g["util"]),
                  points.value_of(g["mem_used"]), points.value_of(g["mem_total"]),
                  points.value_of(g["power"]), points.value_of(g["temp"])) for g in gpus])
        return sid

    def gpu_history(self, host: str, gpu: int, *, since: float = 0.0,
                    limit: int | None = None) -> list[tuple[float, float | None, float | None]]:
        """``(at, utilisation %, memory used MiB)`` of one GPU of ``host`` from ``since``,
        oldest first (``limit``: the newest that many)."""
        rows = self.db.execute(
            "SELECT at, util, mem_used FROM gpu_samples WHERE host = ? AND gpu = ? AND at >= ? "
            "ORDER BY at DESC" + (f" LIMIT {int(limit)}" if limit else ""),
            [host, gpu, since]).fetchall()
        return [tuple(r) for r in reversed(rows)]

    def latest_telemetry(self, host: str) -> dict | None:
        """The newest sample of ``host`` as stored (``HostSample`` fields, JSON), with the
        run it was taken for; None when it was never sampled."""
        row = self.db.execute("SELECT data, run_id FROM host_samples WHERE host = ? "
                              "ORDER BY at DESC, id DESC LIMIT 1", [host]).fetchone()
        if row is None:
            return None
        import json

        return {**json.loads(row[0]), "run": row[1]}

    def alert_once(self, kind: str, message: str, *, item_id: str | None = None,
                   run_id: str | None = None, host: str | None = None) -> bool:
        """Journal an ``alert`` of ``kind`` for ``run_id`` unless that run has one of this kind
        already (raised by this process or another). True when journaled now."""
        data = strictjson.dumps({"alert": kind})
        with self._immediate():
            if self.db.execute("SELECT 1 FROM events WHERE kind = 'alert' AND run_id IS ? AND "
                               "data = ?", [run_id, data]).fetchone():
                return False
            self._event("alert", item_id, run_id, host, message, {"alert": kind})
        return True
