"""What every action kind is: typed params, a side-effect-free check, and a way to run.

Two shapes of action exist:

* **detached** (``detached = True``, the default): the work is a command that runs on the
  host inside a run capsule (``core.jobs``) and outlives specdeck. The runner calls
  :meth:`Action.prepare` (uploads, preflight), launches :meth:`Action.command` detached,
  follows its log into the store, and calls :meth:`Action.finish` with the outcome. After a
  crash, reconcile calls ``finish`` alone on the run it finds ended, so ``finish`` must
  only read what the command left on the host.
* **in-process** (``detached = False``): the work happens inside specdeck itself (a relay
  streaming through the console, a manual tick, stopping another run). :meth:`Action.run`
  does it; it must be resumable, since specdeck can die at any point.

``check()`` answers "already done / can it run / why not" and must not change anything.

A detached run goes through the hooks below (``launch``, ``inspect``, ``follow``, ``stop``,
``metrics_regex``...), each with a default here: an action overrides the ones it does
another way (Slurm, torchrun over several hosts, an adopted process). Every method gets an
:class:`ActionContext`: what the action may read and record, by name; never the runner or
the store.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Literal

from core import jobs
from core.errors import ActionFailed
from core.jobs import Launch, Outcome

if TYPE_CHECKING:
    from core.hosts.base import Host
    from core.plan import Item, Plan
    from core.records import Artefact, EvalRow, Run

__all__ = ["Action", "ActionContext", "CheckResult", "Launch", "Outcome"]


@dataclass(frozen=True)
class CheckResult:
    state: Literal["done", "ready", "blocked"]
    reason: str = ""

    @classmethod
    def done(cls, reason: str = "") -> "CheckResult":
        return cls("done", reason)

    @classmethod
    def ready(cls, reason: str = "") -> "CheckResult":
        return cls("ready", reason)

    @classmethod
    def blocked(cls, reason: str) -> "CheckResult":
        return cls("blocked", reason)


class ActionContext(ABC):
    """What an action may use, and all it may use; the runner provides it.

    Never the runner or the store: reads of what earlier runs recorded and writes of what
    this run produced go through the named verbs below.
    """

    plan: "Plan"
    item: "Item"
    host: "Host | None"
    """The item's host (connected), or None for an action without one."""
    run_id: str | None
    """The run being started, followed or finished; None while only checking."""
    poll: float = 0.1
    """Seconds between polls of a followed log."""
    resume: bool | None = None
    """The operator asked this new attempt to resume (True, ``run --resume``) or left it to
    the action (None: :meth:`Action.start_note` says what it does)."""

    # -- hosts ---------------------------------------------------------------------------
    @abstractmethod
    def host_named(self, name: str) -> "Host":
        """A plan host by name, as built (not necessarily connected)."""

    @abstractmethod
    async def connected(self, name: str) -> "Host":
        """A plan host by name, connected (raises HostUnreachable)."""

    # -- telling -------------------------------------------------------------------------
    @abstractmethod
    def progress(self, message: str, **fields: Any) -> None:
        """Report progress (printed by the CLI, shown by the console, journaled sparsely)."""

    # -- reading what runs recorded ------------------------------------------------------
    @abstractmethod
    def runs(self, item_id: str | None = None) -> "list[Run]":
        """The runs of an item (default: this one), oldest attempt first."""

    @abstractmethod
    def live_run(self, item_id: str) -> "Run | None":
        """The item's live (starting or running) run, if any."""

    @abstractmethod
    def artefacts(self, item_id: str | None = None, kind: str | None = None
                  ) -> "list[Artefact]":
        """What an item's runs produced (default: this item's), by step."""

    @abstractmethod
    def stop_requested(self, run_id: str) -> bool:
        """Whether a stop of ``run_id`` was asked for (here or by another specdeck)."""

    # -- recording what this run produced ------------------------------------------------
    @abstractmethod
    def record_artefact(self, kind: str, path: str, step: int | None = None,
                        data: dict | None = None) -> bool:
        """Record an artefact of this run once (False when it was known already)."""

    @abstractmethod
    def record_eval_rows(self, rows: "list[EvalRow]") -> None:
        """Record this run's per-prompt eval results."""

    @abstractmethod
    def record_metrics(self, rows: Iterable[tuple[int, str, float]]) -> None:
        """Record ``(step, name, value)`` points of this run."""

    @abstractmethod
    def record_config(self, config: dict) -> None:
        """Record the configuration this run was launched with (``specdeck diff``)."""

    # -- acting on runs ------------------------------------------------------------------
    @abstractmethod
    async def stop_run(self, run_id: str, *, grace_s: float) -> Outcome:
        """Stop another live run (the stop action)."""

    @abstractmethod
    async def follow_log(self, host: "Host", run: "Run", on_lines=None, *, regex=None,
                         inspector=None, log_path: str | None = None) -> jobs.CapsuleState:
        """Copy a run's log into the store until the run ends (:func:`core.jobs.follow`)."""

    @abstractmethod
    async def skip_earlier_metrics(self, spec: Any) -> None:
        """Before a launch: metric files (TensorBoard) earlier runs left are not this run's."""

    @abstractmethod
    def checkpoint_watcher(self, run: "Run", spec: Any) -> Any:
        """A :class:`core.watch.Watcher` evaluating ``run``'s checkpoints as they appear."""

    watching: bool = True
    """Whether this specdeck evaluates tau alongside the runs it follows (a one-shot
    ``status`` does not)."""

    @abstractmethod
    def notice(self, message: str, level: str = "info") -> None:
        """Tell the operator something about this item (printed, shown, not journaled)."""

    @abstractmethod
    async def start_tau_watcher(self, run: "Run", spec: Any, ckpt_dir: str | None) -> None:
        """Start (once) ``run``'s detached tau watcher on its host (:mod:`core.watch_detached`)."""

    @abstractmethod
    async def follow_tau_watcher(self, run_id: str, spec: Any, done: Any, *, wait: bool,
                                 every: float) -> None:
        """Ingest the detached watcher's results until ``done`` is set (and, with ``wait``,
        until it evaluated the run's last checkpoint)."""


class Action(ABC):
    """Base class of every action kind. Subclasses set ``kind`` and ``Params``."""

    kind: ClassVar[str]
    Params: ClassVar[type]
    detached: ClassVar[bool] = True
    needs_host: ClassVar[bool] = True
    summary: ClassVar[str] = ""

    def __init__(self, params: Any):
        self.params = params

    @classmethod
    def validate_plan(cls, params: Any, plan: "Plan", item: "Item") -> list[tuple[tuple, str]]:
        """Rules that need the whole plan (hosts named in params, other items)."""
        return []

    async def check(self, ctx: ActionContext) -> CheckResult:
        """Is it already done, can it run, and why not. No side effects."""
        return CheckResult.ready()

    def start_note(self, runs: "list[Run]", checkpoints: "list[Artefact]",
                   resume: bool | None = None) -> str | None:
        """What a new attempt after ``runs`` does with them (train: starts fresh, or resumes
        from which checkpoint), for the run's confirmation and progress; None: nothing."""
        return None

    # detached actions
    async def prepare(self, ctx: ActionContext) -> None:
        """Uploads and preflight before launching; raise ActionFailed to refuse."""

    def command(self, ctx: ActionContext) -> Launch:
        raise NotImplementedError(f"{self.kind} is not a detached action")

    async def finish(self, ctx: ActionContext, outcome: Outcome) -> dict:
        """Read what the run left and return the result record; raise ActionFailed on failure."""
        if outcome.state != "succeeded":
            how = f"signal {outcome.signal}" if outcome.signal else f"exit code {outcome.exit_code}"
            if outcome.state == "lost":
                how = "the process vanished without an exit status (host rebooted?)"
            raise ActionFailed(f"item {ctx.item.id!r}: {self.kind} run {outcome.state} ({how})",
                               hint=f"`specdeck logs {ctx.plan.path or ctx.plan.name} {ctx.item.id}` shows its log")
        return {}

    # in-process actions
    async def run(self, ctx: ActionContext) -> dict:
        raise NotImplementedError(f"{self.kind} is a detached action")

    # -- hooks the runner calls on detached runs (override to launch, inspect, follow or
    # stop some other way: Slurm, torchrun over several nodes, an adopted process) ------
    def launcher_name(self) -> str:
        """The ``launcher`` recorded on the run: ``process`` unless the action says."""
        return "process"

    def metrics_regex(self) -> Any:
        """How log lines become metrics: a regex with named groups (``step`` among them), a
        parser with ``parse(line)`` (:mod:`core.metrics_sources`), or None (JSON lines)."""
        return None

    def metrics_spec(self) -> Any:
        """The action's ``metrics:`` params (:class:`core.metrics_sources.MetricsParams`),
        read for metric files (TensorBoard) alongside the log; None for none."""
        return None

    async def launch(self, ctx: ActionContext, host: "Host", run_id: str,
                     launch: Launch) -> jobs.Launched:
        """Start ``launch`` detached; returns what :func:`core.jobs.start` returns (capsule,
        pid, pstart; job_id for Slurm)."""
        return await jobs.start(host, run_id, launch)

    async def inspect(self, ctx: ActionContext, host: "Host", run: "Run") -> jobs.CapsuleState:
        """Where a run stands on its host (running, ended, lost...)."""
        return await jobs.inspect(host, run.capsule or jobs.capsule_path(host, run.id))

    async def follow(self, ctx: ActionContext, host: "Host", run: "Run", on_lines, *,
                     log_path: str | None = None, inspector=None) -> jobs.CapsuleState:
        """Follow a run's log into the store until it ends; returns how it ended.
        ``log_path`` / ``inspector``: another log file and end test (an adopted run's)."""
        return await ctx.follow_log(host, run, on_lines, regex=self.metrics_regex(),
                                    inspector=inspector or (lambda: self.inspect(ctx, host, run)),
                                    log_path=log_path)

    async def stop(self, ctx: ActionContext, host: "Host", run: "Run",
                   grace_s: float) -> jobs.CapsuleState:
        """SIGTERM the run's process group, ``grace_s``, then SIGKILL; returns its end."""
        return await jobs.stop(host, run.capsule, grace_s=grace_s)
