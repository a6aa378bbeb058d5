"""What the store hands out: frozen records, never its rows.

The store (:mod:`core.state.store`) owns these: it builds them from its tables (JSON columns
decoded) and takes :class:`EvalRow` to record. Everything outside the store reads
attributes (``run.state``), so a misspelt field is an AttributeError at the line that
misspells it, not a KeyError or a silent ``None`` somewhere later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, dataclass_transform

from core.ml.formats import strictjson

LIVE_STATES = ("starting", "running")
"""A run in one of these has not ended (the store's queries use the same tuple)."""
ENDED_STATES = ("succeeded", "failed", "stopped", "lost", "interrupted", "preempted")


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) and value else None


@dataclass_transform(frozen_default=True)
def record(*json_fields: str):
    """Class decorator: a frozen dataclass whose ``json_fields`` are JSON in the table."""
    def make(cls):
        cls.JSON_FIELDS = json_fields
        return dataclass(frozen=True)(cls)
    return make


class Record:
    """A record built from a table row: its columns by name, JSON columns decoded."""

    JSON_FIELDS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_row(cls, row: dict):
        names = {f.name for f in fields(cls)}
        return cls(**{k: (_json(v) if k in cls.JSON_FIELDS else v)
                      for k, v in row.items() if k in names})


@record("result", "config", "adopt")
class Run(Record):
    """One attempt at an item: a detached command, an in-process action or an adopted one."""

    id: str
    item_id: str
    kind: str | None = None
    """The action kind it ran (``shell``, ``train``...)."""
    host: str | None = None
    """The plan host it runs on; None for an in-process action without one."""
    attempt: int = 1
    """1 for the item's first run, one more for each run after it."""
    state: str = "starting"
    """``starting``, ``running`` (live), or how it ended (:data:`ENDED_STATES`)."""
    pid: int | None = None
    pstart: str | None = None
    """The process's start time (with ``pid``, tells it from a later process of that pid)."""
    capsule: str | None = None
    """The run capsule directory on its host (log, pid, exit; see core.capsules.jobs)."""
    launcher: str | None = None
    job_id: str | None = None
    owner: str | None = None
    """``host:pid:start`` of the specdeck process that started it (core.runs.runner)."""
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    log_offset: int = 0
    log_lines: int = 0
    result: Any = None
    """What the action's finish returned (decoded JSON), or None."""
    error: str | None = None
    config: Any = None
    """What it was launched with, for ``specdeck diff`` (decoded JSON), or None."""
    adopt: dict | None = None
    """How an adopted run is found (core.runs.adopt), or None for a run specdeck launched."""
    log_base: int = 0
    """The byte of the followed file where the stored log starts (adopted runs)."""

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


    @classmethod
    def from_row(cls, row: dict) -> "Run":
        run = super().from_row(row)
        fix = {k: 0 for k in ("log_offset", "log_lines", "log_base") if getattr(run, k) is None}
        return replace(run, **fix) if fix else run


@dataclass(frozen=True)
class RunSummary:
    """What :meth:`core.runs.runner.Runner.run_items` did with the items it was asked to run:
    their ids by what became of them, in the order they came to it."""

    done: tuple[str, ...] = ()
    """Ran and succeeded, or already done (a named one)."""
    failed: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()
    """Its host could not be reached (``run`` exits 3)."""
    waiting: tuple[str, ...] = ()
    """Not run: waits on needs that did not become done."""
    manual: tuple[str, ...] = ()
    """Waits for the operator (a manual item)."""
    unadopted: tuple[str, ...] = ()
    """in_progress with no run specdeck knows: never launched twice (core.runs.adopt)."""
    started: tuple[str, ...] = ()
    """Left running detached (``run --detach``)."""
    held: tuple[str, ...] = ()
    """Stopped, or failed and not asked for again (:meth:`core.runs.runner.Runner.held`)."""
    unrecorded: tuple[str, ...] = ()
    """The state database's disk took no more writes while it ran or started
    (:class:`~core.errors.StateDiskFull`): not failed; a launched run goes on on its host and
    stays live in the store (``attach`` stores the rest once there is space; ``run`` exits 1)."""


@dataclass(frozen=True)
class RunChange:
    """A live run that :meth:`core.runs.runner.Runner.reconcile` found changed on its host (or
    could not reach: ``now`` is ``unknown`` and ``reason`` says why)."""

    run: str
    """The run's id."""
    item: str
    was: str
    """Its state in the store before."""
    now: str
    """Its state now, or ``unknown`` (its host unreachable)."""
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None
    reason: str | None = None
    """Why it is unknown (its host could not be reached)."""

    @property
    def why(self) -> str | None:
        """The error it ended with, or why its state is unknown."""
        return self.error or self.reason


@record("data")
class Artefact(Record):
    """A file a run produced (a checkpoint, an eval result) at a path on its host."""

    run_id: str
    item_id: str
    kind: str
    """``checkpoint`` (a training step's weights) or another kind an action records."""
    path: str
    step: int | None = None
    """The training step it was saved at, when it has one."""
    at: float | None = None
    data: Any = None
    id: int | None = None



@record("rounds", "per_position", "settings")
class EvalRow(Record):
    """One prompt's acceptance result of one drafter in one eval run."""

    run_id: str
    item_id: str
    drafter: str
    """The label the drafter is compared under (``item@step`` for tau over training)."""
    role: str
    """``drafter`` or ``baseline``."""
    prompt_id: str
    tau: float | None = None
    rounds: Any = None
    per_position: Any = None
    settings: dict | None = None
    step: int | None = None
    at: float | None = None
    id: int | None = None


    def to_row(self) -> dict:
        """The columns to insert (JSON ones encoded; ``id`` left to the database)."""
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "id"}
        for k in self.JSON_FIELDS:
            if row[k] is not None and not isinstance(row[k], str):
                row[k] = strictjson.dumps(row[k])
        return row


@record("data")
class Event(Record):
    """One line of the store's append-only journal."""

    id: int
    """Its place in the journal (ids only grow)."""
    at: float
    kind: str
    """``run_claimed``, ``run_succeeded``..., ``alert``, ``console_opened``...: what happened."""
    message: str = ""
    """What the journal says, for a person."""
    item_id: str | None = None
    run_id: str | None = None
    """The run it is about (None for a console's or a host's event)."""
    host: str | None = None
    data: Any = None



@record()
class StatusChange(Record):
    """An item's status as it was set (the status history)."""

    item_id: str
    status: str
    at: float
    run_id: str | None = None
    """The run whose start or end set it, if any."""
    reason: str = ""
    id: int | None = None


@record()
class SeenMark(Record):
    """Where a console last saw the journal: the event id it had seen, and when."""

    name: str
    event_id: int
    at: float


@record()
class MetricPoint(Record):
    """One stored value of a run's metric at a step (``time``: when it was stored or logged)."""

    step: int
    name: str
    value: float
    time: float


@record("queue")
class TauWatcher(Record):
    """The detached tau watcher of one train run (:mod:`core.actions.watch_eval.detached`)."""

    run_id: str
    item_id: str
    host: str
    """The plan host it runs on (the training host, or the eval host)."""
    capsule: str
    """Its run capsule there (log, status.json, results/step_N.json)."""
    ckpt_dir: str
    state: str = "starting"
    """starting, watching, evaluating, ending, or how it ended (ended, stopped, failed, lost)."""
    current: int | None = None
    """The step it is evaluating now."""
    last_step: int | None = None
    queue: list | None = None
    """Steps waiting for their eval."""
    error: str | None = None
    started_at: float | None = None
    at: float | None = None
    """When the row last changed."""


@record()
class WatcherStatus(Record):
    """A run's detached tau watcher as ``status --json`` and the item pane show it: its row
    and the steps evaluated (:func:`core.actions.watch_eval.status.status_of`)."""

    host: str
    state: str
    """As :attr:`TauWatcher.state`."""
    current: int | None
    """The step it is evaluating now."""
    last_step: int | None
    queue: list[int]
    """Steps waiting for their eval."""
    evaluated: list[int]
    """Steps whose tau is stored."""
    failed: list[int]
    """Steps whose eval failed."""
    error: str | None
    capsule: str
    deleted: list[int] = field(default_factory=list)
    """Checkpoints its retention deleted (``watch_eval.keep_checkpoints``)."""
    freed_bytes: int = 0
    """The bytes those deletions freed."""


@record()
class WatchEntry(Record):
    """One checkpoint's tau eval in tau over training (:mod:`core.actions.watch_eval`)."""

    id: str
    run_id: str
    item_id: str
    step: int
    state: str = "pending"
    """pending, running, done, failed or skipped."""
    host: str | None = None
    """Where it was evaluated."""
    capsule: str | None = None
    tau: float | None = None
    at: float | None = None
    error: str | None = None
