"""What every action kind is: typed params, a side-effect-free check, and a way to run.

Two shapes of action exist:

* **detached** (``detached = True``, the default): the work is a command that runs on the
  host inside a run capsule (``core.capsules.jobs``) and outlives specdeck. The runner calls
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

from core.capsules import jobs
from core.errors import ActionFailed
from core.capsules.jobs import Launch, Outcome

if TYPE_CHECKING:
    from core.hosts.base import Host
    from core.plans.plan import Item, Plan
    from core.state.records import Artefact, EvalRow, Event, Run, TauWatcher, WatchEntry

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
    """The item's host (connected), or None for an action without one (and while
    :meth:`Action.reconciling`)."""
    run_id: str | None
    """The run being started, followed or finished; None while only checking (and while
    :meth:`Action.reconciling`: :meth:`for_run` gives one run's context)."""
    poll: float = 0.1
    """Seconds between polls of a followed log."""
    resume: bool | None = None
    """The operator asked this new attempt to resume (True, ``run --resume``) or left it to
    the action (None: :meth:`Action.start_note` says what it does)."""
    watch: bool = True
    """Whether this specdeck evaluates tau alongside the runs it follows (the runner's
    ``watch`` option: a one-shot ``status`` does not)."""

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

    @abstractmethod
    def notice(self, message: str, level: str = "info") -> None:
        """Tell the operator something about this item (printed, shown, not journaled)."""

    @abstractmethod
    def journal(self, kind: str, message: str, *, host: str | None = None,
                data: dict | None = None) -> None:
        """Journal an event of this item (and of this run, when there is one)."""

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

    @abstractmethod
    def journaled(self, kind: str) -> "list[Event]":
        """This run's journal events of ``kind``, oldest first."""

    @abstractmethod
    def metric_series(self, name: str) -> list[tuple[int, float]]:
        """This run's ``(step, value)`` points of metric ``name``, in step order."""

    @abstractmethod
    def eval_rows(self) -> "list[EvalRow]":
        """This run's recorded eval rows (every step, drafters and baselines)."""

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
        """Copy a run's log into the store until the run ends (:func:`core.capsules.jobs.follow`)."""

    @abstractmethod
    async def skip_earlier_metrics(self, spec: Any) -> None:
        """Before a launch: metric files (TensorBoard) earlier runs left are not this run's."""

    @abstractmethod
    def for_run(self, run_id: str) -> "ActionContext":
        """This item's context for another of its runs (a hook called for the item, such as
        :meth:`Action.reconciling`, acting on one of them)."""

    # -- tau over training (core.actions.watch_eval): this run's watcher and steps -------
    @abstractmethod
    def tau_watcher(self) -> "TauWatcher | None":
        """This run's detached tau watcher, if one was claimed."""

    @abstractmethod
    def live_tau_watchers(self) -> "list[TauWatcher]":
        """This item's detached tau watchers that have not ended (of any of its runs)."""

    async def arm_notify(self, host: "Host", capsule: str, events: tuple[str, ...]) -> bool:
        """Make the program in ``capsule`` send ``events`` (those the plan's ``notify:``
        names) itself, from the host (core.runs.notify): True when armed."""
        return False

    @abstractmethod
    def claim_tau_watcher(self, host: str, capsule: str, ckpt_dir: str) -> bool:
        """Record this run's detached watcher once, ``starting``; False when it is known
        (another specdeck claimed it: it starts it)."""

    @abstractmethod
    def take_tau_watcher(self, from_states: tuple[str, ...], state: str) -> bool:
        """Move this run's watcher from one of ``from_states`` to ``state`` atomically: True
        for the one specdeck that did (so only it restarts the watcher)."""

    @abstractmethod
    def mark_tau_watcher(self, state: str, error: str | None = None) -> None:
        """Set this run's watcher's state (and its error, when given)."""

    @abstractmethod
    def record_tau_watcher_status(self, state: str, *, current: int | None,
                                  last_step: int | None, queue: list[int],
                                  error: str | None) -> None:
        """Record this run's watcher as its capsule says it is (every field: a step no
        longer evaluated, an error gone, are cleared)."""

    @abstractmethod
    def watch_entries(self) -> "list[WatchEntry]":
        """This run's watched checkpoints (one per step), in step order."""

    @abstractmethod
    def queue_watch_entry(self, step: int) -> bool:
        """Queue the tau eval of this run's checkpoint at ``step`` once (False: known)."""

    @abstractmethod
    def update_watch_entry(self, step: int, state: str, *, host: str | None = None,
                           capsule: str | None = None, tau: float | None = None,
                           error: str | None = None) -> None:
        """Set a watched step's state; the other fields when given (None: unchanged)."""

    @abstractmethod
    def record_watch_result(self, step: int, *, state: str, tau: float | None = None,
                            error: str | None = None, host: str | None = None,
                            capsule: str | None = None,
                            metrics: Iterable[tuple[int, str, float]] = (),
                            eval_rows: "list[EvalRow]" = ()) -> bool:
        """Store one detached eval's outcome with its metrics and eval rows, exactly once:
        False (nothing stored) when the step has its outcome already."""


class Action(ABC):
    """Base class of every action kind. Subclasses name their ``kind``, ``Params`` and
    ``summary`` in the class line (:meth:`__init_subclass__`).

    **Stateless between hooks.** The runner builds a fresh action (from the item's params)
    for every call, and specdeck may restart between any two hooks of a run: ``follow``,
    ``inspect``, ``stop`` and ``finish`` often run on an instance (and in a process) where
    ``prepare`` never ran. So no hook reads what another hook set on ``self``: each works
    from its params, its :class:`ActionContext`, the :class:`~core.state.records.Run` (what the
    runner stored: capsule, pid, job id, config) and what the command left on the host.
    What ``prepare`` finds that ``command`` needs is recorded with the run
    (:meth:`ActionContext.record_config`), never kept on the instance.
    """

    kind: ClassVar[str]
    Params: ClassVar[type]
    detached: ClassVar[bool] = True
    needs_host: ClassVar[bool] = True
    summary: ClassVar[str] = ""

    def __init_subclass__(cls, kind: str | None = None, params: type | None = None,
                          summary: str | None = None, **kw: Any) -> None:
        """A kind names itself in its class line: ``class Eval(Action, kind="eval",
        params=EvalParams, summary="...")`` sets ``kind``, ``Params`` and ``summary``."""
        super().__init_subclass__(**kw)
        for attr, value in (("kind", kind), ("Params", params), ("summary", summary)):
            if value is not None:
                setattr(cls, attr, value)

    def __init__(self, params: Any):
        self.params = params

    @classmethod
    def validate_plan(cls, params: Any, plan: "Plan", item: "Item") -> list[tuple[tuple, str]]:
        """Rules that need the whole plan (hosts named in params, other items). Reads the
        plan only: it runs while a plan file is read (``validate``), with no store or host."""
        return []

    async def check(self, ctx: ActionContext) -> CheckResult:
        """Is it already done, can it run, and why not. No side effects: it may run at any
        time on any instance (before a run, for the console's item pane), and what it finds
        is not kept for the hooks after it."""
        return CheckResult.ready()

    def start_note(self, runs: "list[Run]", checkpoints: "list[Artefact]",
                   resume: bool | None = None) -> str | None:
        """What a new attempt after ``runs`` does with them (train: starts fresh, or resumes
        from which checkpoint), for the run's confirmation and progress; None: nothing.
        A pure function of its arguments and the params."""
        return None

    # detached actions
    async def prepare(self, ctx: ActionContext) -> None:
        """Uploads and preflight before launching; raise ActionFailed to refuse.

        Runs once per run, in the launching process, with ``ctx.run_id`` set (the run is
        ``starting``). What it finds or puts on the host that ``command`` needs (the host's
        python, an uploaded file's path) is recorded with the run
        (:meth:`ActionContext.record_config`), not kept on ``self``: ``command`` may run on
        another instance. A restart after it leaves the run ``starting`` with nothing
        launched; reconcile ends it ``interrupted``."""

    def command(self, ctx: ActionContext) -> Launch:
        """The command to launch: built from the params, ``ctx`` and what ``prepare``
        recorded with the run (read back through ``ctx.runs()``), never from ``self``. No
        side effects; it may be asked again on a fresh instance and must say the same."""
        raise NotImplementedError(f"{self.kind} is not a detached action")

    async def finish(self, ctx: ActionContext, outcome: Outcome) -> dict:
        """Read what the run left and return the result record; raise ActionFailed on failure.

        Often the only hook called on its instance: reconcile calls it on a run that ended
        while no specdeck followed it, after a crash or in another process. So it reads
        only ``outcome`` (its capsule), the run's record and what the command left on the
        host, and may be called again for a run whose end was not stored."""
        if outcome.state != "succeeded":
            how = f"signal {outcome.signal}" if outcome.signal else f"exit code {outcome.exit_code}"
            if outcome.state == "lost":
                how = "the process vanished without an exit status (host rebooted?)"
            raise ActionFailed(f"item {ctx.item.id!r}: {self.kind} run {outcome.state} ({how})",
                               hint=f"`specdeck logs {ctx.plan.path or ctx.plan.name} {ctx.item.id}` shows its log")
        return {}

    # in-process actions
    async def run(self, ctx: ActionContext) -> dict:
        """An in-process action's whole work (the only hook it has); resumable, since
        specdeck can die at any point and the next run starts on a fresh instance from what
        is on the hosts (a relay's ``.part`` and journals)."""
        raise NotImplementedError(f"{self.kind} is a detached action")

    # -- hooks the runner calls on detached runs (override to launch, inspect, follow or
    # stop some other way: Slurm, torchrun over several nodes, an adopted process) ------
    def launcher_name(self) -> str:
        """The ``launcher`` recorded on the run: ``process`` unless the action says. A pure
        function of the params."""
        return "process"

    def metrics_regex(self) -> Any:
        """How log lines become metrics: a regex with named groups (``step`` among them), a
        parser with ``parse(line)`` (:mod:`core.capsules.metrics_sources`), or None (JSON lines).
        A pure function of the params (asked on whatever instance follows the log)."""
        return None

    def metrics_spec(self) -> Any:
        """The action's ``metrics:`` params (:class:`core.capsules.metrics_sources.MetricsParams`),
        read for metric files (TensorBoard) alongside the log; None for none. A pure
        function of the params."""
        return None

    async def launch(self, ctx: ActionContext, host: "Host", run_id: str,
                     launch: Launch) -> jobs.Launched:
        """Start ``launch`` (what ``command`` returned) detached; returns what
        :func:`core.capsules.jobs.start` returns (capsule, pid, pstart; job_id for Slurm), which the
        runner stores on the run: everything the later hooks need to find the run again is
        in that record or in the capsule, never on ``self``."""
        return await jobs.start(host, run_id, launch)

    async def inspect(self, ctx: ActionContext, host: "Host", run: "Run") -> jobs.CapsuleState:
        """Where a run stands on its host (running, ended, lost...). Reads only the host and
        ``run`` (its capsule, job id): it is asked on fresh instances, by reconcile, by
        ``status`` and by another specdeck."""
        return await jobs.inspect(host, run.capsule or jobs.capsule_path(host, run.id))

    async def follow(self, ctx: ActionContext, host: "Host", run: "Run", on_lines, *,
                     log_path: str | None = None, inspector=None) -> jobs.CapsuleState:
        """Follow a run's log into the store until it ends; returns how it ended.
        ``log_path`` / ``inspector``: another log file and end test (an adopted run's).
        Called at launch and again on every attach and reconcile (a fresh instance, maybe
        in another process): it works out what it needs from ``run`` and the host."""
        return await ctx.follow_log(host, run, on_lines, regex=self.metrics_regex(),
                                    inspector=inspector or (lambda: self.inspect(ctx, host, run)),
                                    log_path=log_path)

    async def stop(self, ctx: ActionContext, host: "Host", run: "Run",
                   grace_s: float) -> jobs.CapsuleState:
        """SIGTERM the run's process group, ``grace_s``, then SIGKILL; returns its end.
        Usually called on a fresh instance (``specdeck stop``, another specdeck): it finds
        what to stop from ``run`` and the host alone."""
        return await jobs.stop(host, run.capsule, grace_s=grace_s)

    async def stopping(self, ctx: ActionContext, run: "Run") -> None:
        """Called when ``run`` is asked to stop, before :meth:`stop`, on the item's action:
        end what the action keeps going alongside the run (train: its tau watcher is asked
        to end after its current eval). Reads what it needs from ``ctx``, never from this
        instance (after a restart it is a fresh one)."""

    async def reconciling(self, ctx: ActionContext, *, follow: bool,
                          hosts: "frozenset[str] | None" = None) -> None:
        """Called once per item each time the runner reconciles (``status``, a reconnect)
        or attaches (``follow``: until it ends), after the item's live runs were looked at:
        catch up what outlives the item's ended runs (train: their tau watchers), only on
        ``hosts`` when given. ``ctx.run_id`` and ``ctx.host`` are None (:meth:`ActionContext.
        for_run`, :meth:`ActionContext.connected`). One run's trouble is told, not raised."""
