"""What the store hands out: frozen records, never its rows.

The store (:mod:`core.store`) owns these: it builds them from its tables (JSON columns
decoded) and takes :class:`EvalRow` to record. Everything outside the store reads
attributes (``run.state``), so a misspelt field is an AttributeError at the line that
misspells it, not a KeyError or a silent ``None`` somewhere later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

LIVE_STATES = ("starting", "running")
"""A run in one of these has not ended (the store's queries use the same tuple)."""
ENDED_STATES = ("succeeded", "failed", "stopped", "lost", "interrupted")


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) and value else None


def _from_row(cls, row: dict, decoded: tuple[str, ...]):
    names = {f.name for f in fields(cls)}
    kw = {k: (_json(v) if k in decoded else v) for k, v in row.items() if k in names}
    return cls(**kw)


@dataclass(frozen=True)
class Run:
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
    """The run capsule directory on its host (log, pid, exit; see core.jobs)."""
    launcher: str | None = None
    job_id: str | None = None
    owner: str | None = None
    """``host:pid:start`` of the specdeck process that started it (core.runner)."""
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
    """How an adopted run is found (core.adopt), or None for a run specdeck launched."""
    log_base: int = 0
    """The byte of the followed file where the stored log starts (adopted runs)."""

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @classmethod
    def from_row(cls, row: dict) -> "Run":
        run = _from_row(cls, row, ("result", "config", "adopt"))
        fix = {k: 0 for k in ("log_offset", "log_lines", "log_base") if getattr(run, k) is None}
        return replace(run, **fix) if fix else run


@dataclass(frozen=True)
class Artefact:
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

    @classmethod
    def from_row(cls, row: dict) -> "Artefact":
        return _from_row(cls, row, ("data",))


@dataclass(frozen=True)
class EvalRow:
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

    @classmethod
    def from_row(cls, row: dict) -> "EvalRow":
        return _from_row(cls, row, ("rounds", "per_position", "settings"))

    def to_row(self) -> dict:
        """The columns to insert (JSON ones encoded; ``id`` left to the database)."""
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "id"}
        for k in ("rounds", "per_position", "settings"):
            if row[k] is not None and not isinstance(row[k], str):
                row[k] = json.dumps(row[k])
        return row
