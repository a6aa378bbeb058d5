"""Events the runner emits while it works: plain dataclasses, no I/O.

The CLI prints them; the console's bridge turns them into Textual messages. Names are past
events (style.md practice 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    item_id: str | None


@dataclass(frozen=True)
class StatusChanged(Event):
    status: str
    reason: str = ""


@dataclass(frozen=True)
class RunStarted(Event):
    run_id: str
    host: str | None
    pid: int | None = None
    attached: bool = False


@dataclass(frozen=True)
class RunEnded(Event):
    run_id: str
    state: str
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class LogLinesReceived(Event):
    run_id: str
    lines: list[str] = field(default_factory=list)
    from_progress: bool = False
    """The lines are an in-process action's progress, already reported as Progress events
    (the CLI, which prints those, skips them; the console's log pane shows them)."""


@dataclass(frozen=True)
class LogStreamChanged(Event):
    """A run's log stream went ``reconnecting`` (its host dropped) or back to ``following``."""

    run_id: str
    state: str
    host: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class Progress(Event):
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HostStateChanged(Event):
    host: str
    state: str
    reason: str = ""


@dataclass(frozen=True)
class Notice(Event):
    """Something the operator should read (reconcile findings, alerts)."""

    message: str
    level: str = "info"
