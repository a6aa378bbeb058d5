"""App-level messages: what the runner reported (through the bridge) and what workers found.

Names are past events (style.md practice 3). Widget-local messages (a key pressed in the
plan list, a row picked in the tau table) are nested in their widgets instead.

High-rate messages either carry batches (:class:`LogLinesArrived` holds every line the
bridge gathered for a run since its last flush) or define ``can_replace`` so that a queued
older copy is dropped (:class:`ProgressReported`, :class:`HostStateChanged`,
:class:`GpuSampled`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message

from core.state.records import Event, Run, RunChange, StatusChange, WatcherStatus


# -- from the runner (core.runs.events, via console.bridge) -----------------------------------
@dataclass
class ItemStatusChanged(Message):
    item_id: str
    status: str
    reason: str = ""


@dataclass
class RunStarted(Message):
    item_id: str
    run_id: str
    host: str | None
    pid: int | None = None
    attached: bool = False


@dataclass
class RunEnded(Message):
    item_id: str
    run_id: str
    state: str
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None


@dataclass
class LogLinesArrived(Message):
    """Lines of a run's log, batched by the bridge (at most one message per run per flush)."""

    item_id: str
    run_id: str
    lines: list[str]
    dropped: int = 0
    """Lines the bridge dropped from the front of the batch to bound memory (the store
    keeps them; the pane only shows its last lines anyway)."""


@dataclass
class LogStreamChanged(Message):
    """A run's log stream went ``reconnecting`` or back to ``following``."""

    item_id: str
    state: str
    detail: str = ""


@dataclass
class ProgressReported(Message):
    item_id: str | None
    message: str
    fields: dict[str, Any] = field(default_factory=dict)

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ProgressReported) and message.item_id == self.item_id


@dataclass
class HostStateChanged(Message):
    host: str
    state: str
    reason: str = ""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, HostStateChanged) and message.host == self.host


@dataclass
class NoticePosted(Message):
    item_id: str | None
    message: str
    level: str = "info"


# -- from the console's workers (console.services) ---------------------------------------
@dataclass
class SessionOpened(Message):
    """Reconcile and the journal's account of what happened while the console was closed."""

    changes: list[RunChange]
    """``Runner.reconcile()``'s changed runs."""
    meanwhile: list[Event]
    """Journal events (run ends) since the last console session."""
    since: float | None
    """When the last console session closed (None: never opened before)."""


@dataclass
class ItemDetailLoaded(Message):
    item_id: str
    status: str
    runs: list[Run]
    history: list[StatusChange]
    live: Run | None
    watcher: WatcherStatus | None = None
    """The latest run's detached tau watcher (core.actions.watch_eval.status.status_of)."""
    costs: Any = None
    """What the campaign's runs cost (a :class:`core.runs.cost.Sheet`), None when no host has a
    ``price:``."""


@dataclass
class CheckFinished(Message):
    item_id: str
    state: str
    """``done`` / ``ready`` / ``blocked`` / ``error``."""
    reason: str = ""


@dataclass
class LogLoaded(Message):
    item_id: str
    run: Run | None
    lines: list[str]


@dataclass
class MetricsLoaded(Message):
    item_id: str | None
    runs: list[dict]
    """``[{run_id, label, series: {name: [(step, value), ...]}}]``."""


@dataclass
class TauLoaded(Message):
    comparison: Any
    """A :class:`core.tau.table.Comparison`."""
    step: int | None = None
    """The training step the comparison is filtered to (None: every eval result)."""
    costs: list = field(default_factory=list)
    """Each drafter's training cost and cost per unit of tau gained over its baseline
    (:func:`core.runs.cost.cost_per_tau`; empty when no host has a ``price:``)."""


@dataclass
class ArmsLoaded(Message):
    """Each arm's figures and the arms compared (a plan with ``arms:``)."""

    figures: dict
    """``{arm: {"state", "done", "items", "loss", "tau", "knob"}}`` (:func:`console.services.arm_figures`)."""
    comparison: Any = None
    """A :class:`core.tau.arms.ArmsComparison` (None: no reference drafter measured yet)."""


@dataclass
class GpuSampled(Message):
    host: str
    gpus: list[dict] | None
    """``[{index, name, util, mem_used, mem_total, power, temp, processes}]`` (MiB, W, °C;
    None for a value nvidia-smi gave as [N/A]), or None when no GPU answered."""
    sample: dict | None = None
    """The whole sample (:class:`core.capsules.telemetry.HostSample` as JSON: disks, why no
    GPU answered), or None when the host did not answer."""
    history: dict[int, list] = field(default_factory=dict)
    """GPU index -> its recent utilisation %, oldest first."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GpuSampled) and message.host == self.host


@dataclass
class JournalLoaded(Message):
    events: list[Event]


@dataclass
class ReportLoaded(Message):
    """The morning report (core.runs.report) for the report screen."""

    report: Any
    since_seen: bool = False
    """Its window starts when a console last saw the store (else: the last 12 hours)."""
