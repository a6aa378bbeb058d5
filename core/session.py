"""A plan opened for work: its state database and its runner, opened and closed together,
and the verbs both faces (the CLI and the console) work through.

The one way every face starts work on a plan (the CLI's commands, the console, the demo, the
benches)::

    async with Session.open(plan, state=path, emit=print_event) as s:
        await s.run(None)
        s.emit(Notice(None, "done"))

or, from synchronous code (a CLI command), :func:`run_in_session`, which also makes SIGTERM
act like Ctrl-C inside the event loop (:func:`core.faults.watch_signals_in_loop`).

A command that only looks (``status``, ``logs``, ``compare``, ``diff``, ``metrics``,
``export``) opens with :meth:`Session.read`: no runner, hence no host, is built until a verb
needs one (``status`` refreshing a live run), and ``compare`` never imports the runner.

Each rule the faces share has its home here, so that the CLI and the console cannot keep
copies that drift apart: no mark while a run is live (:meth:`Session.mark`); a run asked
for again goes through the same needs check as any run (:meth:`Session.run`); the tau step
filter (:func:`at_step`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable, Iterable, TypeVar

from core.errors import HostUnreachable, InvalidInput
from core.runs import life
from core.runs.events import Event
from core.plans.plan import Plan
from core.state.records import EvalRow, Run, RunChange, RunSummary, WatcherStatus
from core.state.store import Store, state_path_for

if TYPE_CHECKING:  # the runner loads only when a session builds one
    from core.plans.adopt_spec import AdoptSpec
    from core.runs.cost import Sheet
    from core.capsules.jobs import Outcome
    from core.runs.runner import Runner

T = TypeVar("T")

MARKS_REFUSED_WHILE_LIVE = ("done", "skipped", "pending")
"""Statuses an item with a live run cannot be marked: its run's end would contradict them
(``in_progress`` can: it is what the item is)."""


def open_store(plan: Plan, state: str | Path | None = None) -> Store:
    """The plan's state database: ``state`` if given, else where :func:`state_path_for` says,
    keeping what a run's life allows (:data:`core.runs.life.TRANSITIONS`)."""
    return Store(state_path_for(plan, str(state) if state is not None else None),
                 transitions=life.TRANSITIONS)


def _drop(event: Event) -> None:
    """The default event sink: nobody is watching."""


def at_step(rows: list[EvalRow], step: int) -> list[EvalRow]:
    """The eval rows of the drafters evaluated at training ``step`` (tau over training), with
    every baseline: a baseline is no checkpoint, so it is bound to no step and is what the
    step's drafters are compared with (``specdeck compare --step``, the console's tau pane).

    Raises :class:`InvalidInput` when no drafter was evaluated at ``step``, naming the steps
    that were: the baselines alone would read as an answer.
    """
    steps = sorted({r.step for r in rows if r.role != "baseline" and r.step is not None})
    if step not in steps:
        raise InvalidInput(
            f"no tau evaluated at step {step}",
            hint=(f"evaluated steps: {', '.join(map(str, steps[-12:]))}" if steps
                  else "no checkpoint has been evaluated yet (watch_eval)"))
    return [r for r in rows if r.role == "baseline" or r.step == step]


@dataclass(frozen=True)
class Overview:
    """Where a plan stands (``specdeck status``)."""

    statuses: dict[str, str]
    """Item id -> status, in plan order."""
    latest: dict[str, Run]
    """Item id -> its latest run (items without one are absent)."""
    alerts: list[Event]
    """The journal's alerts, oldest first."""
    watchers: dict[str, WatcherStatus]
    """Item id -> the tau watcher of its latest run (:meth:`Session.watcher_status`)."""
    hosts: dict[str, dict] = field(default_factory=dict)
    """Host name -> its latest telemetry sample (GPUs, disks; hosts never sampled absent)."""
    costs: "Sheet | None" = None
    """What the runs cost under the hosts' ``price:`` (core.runs.cost)."""


@dataclass(frozen=True)
class RunPreview:
    """What running an item now would start (the console's confirmation says it)."""

    attempt: int
    """The attempt number the run would have."""
    detached: bool
    """It runs detached on its host (it outlives the console), else inside this process."""
    start_note: str | None
    """Where a new attempt starts from (a train item: step 0 or which checkpoint), if said."""


class Session:
    """A plan with its store and runner. Close it (``await close()``, or ``async with``).

    Attributes:
        plan: The validated plan.
        store: Its state database (records to read; the rules are the verbs below).
    """

    def __init__(self, plan: Plan, store: Store, runner: "Runner | None", *, owns_store: bool,
                 emit: Callable[[Event], None] | None = None, hosts: dict | None = None,
                 runner_options: dict | None = None):
        self.plan = plan
        self.store = store
        self._runner = runner
        self._owns_store = owns_store
        self._emit = emit or _drop
        self._hosts = hosts
        self._runner_options = runner_options or {}

    @classmethod
    def open(cls, plan: Plan, *, state: str | Path | None = None, store: Store | None = None,
             emit: Callable[[Event], None] | None = None, hosts: dict | None = None,
             **runner_options) -> "Session":
        """Open ``plan``: its store (``store`` as given, else the one ``state`` names) and a
        runner emitting to ``emit`` (default: nowhere). A given store stays open on close."""
        session = cls.read(plan, state=state, store=store, emit=emit, hosts=hosts,
                           **runner_options)
        try:
            session.runner  # noqa: B018 - built now: a bad host spec fails the opening
        except BaseException:
            if session._owns_store:
                session.store.close()
            raise
        return session

    @classmethod
    def read(cls, plan: Plan, *, state: str | Path | None = None, store: Store | None = None,
             emit: Callable[[Event], None] | None = None, hosts: dict | None = None,
             **runner_options) -> "Session":
        """Open ``plan`` to look at it: its store only. The runner (and a Host per plan host)
        is built the first time a verb needs one (a live run to refresh, to follow)."""
        owns = store is None
        store = open_store(plan, state) if store is None else store
        return cls(plan, store, None, owns_store=owns, emit=emit, hosts=hosts,
                   runner_options=runner_options)

    @property
    def runner(self) -> "Runner":
        """The runner over the plan and store (built on first use by a :meth:`read` session)."""
        if self._runner is None:
            from core.runs.runner import Runner

            self._runner = Runner(self.plan, self.store, emit=self._emit, hosts=self._hosts,
                                  **self._runner_options)
        return self._runner

    def emit(self, event: Event) -> None:
        """Send an event to whoever watches the session (the CLI's printer, the console)."""
        self._emit(event)

    async def close(self) -> None:
        """Close the hosts the runner contacted, then the store (if the session opened it)."""
        try:
            if self._runner is not None:
                await self._runner.close()
        finally:
            if self._owns_store:
                self.store.close()

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- reading -------------------------------------------------------------------------
    def statuses(self) -> dict[str, str]:
        """Item id -> status, in plan order (the store's, else the plan's, else pending)."""
        return self.plan.statuses(self.store.item_statuses())

    def live_run(self, item_id: str) -> Run | None:
        return self.store.live_run(item_id)

    def live_runs(self) -> list[Run]:
        """Every live run, oldest start first."""
        return self.store.live_runs()

    def latest_run(self, item_id: str) -> Run | None:
        return self.store.latest_run(item_id)

    def runs_of(self, item_id: str) -> list[Run]:
        """The item's runs, first attempt first."""
        return self.store.runs_for_item(item_id)

    def watcher_status(self, run_id: str | None) -> WatcherStatus | None:
        """The tau watcher of a run (state, last step evaluated, queue...), or None."""
        from core.actions.watch_eval.status import status_of

        return status_of(self.store, run_id)

    def overview(self) -> Overview:
        """Statuses, latest runs, alerts and tau watchers, read in one go (``status``)."""
        latest = self.store.latest_runs()
        watchers = {i: w for i, r in latest.items() if (w := self.watcher_status(r.id))}
        from core.capsules.telemetry import latest_json

        return Overview(self.statuses(), latest, self.store.events(kinds=["alert"]), watchers,
                        latest_json(self.store, self.plan.hosts), self.costs())

    def costs(self, now: float | None = None, window: tuple[float, float] | None = None) -> "Sheet":
        """What every run cost so far under the hosts' ``price:`` (:mod:`core.runs.cost`); with
        ``window`` (``(since, until)``) only their hours inside it."""
        from core.runs.cost import sheet

        return sheet(self.plan, {it.id: self.runs_of(it.id) for it in self.plan.items}, now, window)

    def eval_rows(self, item_id: str | None = None, *, step: int | None = None
                  ) -> list[EvalRow]:
        """The stored eval results (of ``item_id``), oldest first; ``step``: as
        :func:`at_step` (raises :class:`InvalidInput` when nothing was evaluated there)."""
        rows = self.store.eval_results(item_id)
        return rows if step is None else at_step(rows, step)

    async def eval_result(self, item_id: str) -> tuple[Run, dict]:
        """The result.json of ``item_id``'s latest succeeded eval run, read from its host (the
        full result: tokens and rounds per prompt, provenance; the store keeps rows only)."""
        import json

        from core.ml.formats import resultfile

        item = self.plan.item(item_id)
        if item.action is None or item.action.kind != "eval":
            raise InvalidInput(f"item {item_id!r} is not an eval item", hint="give eval items")
        run = next((r for r in reversed(self.runs_of(item_id)) if r.state == life.SUCCEEDED), None)
        path = (run.result or {}).get("result") if run is not None else None
        if not isinstance(path, str):
            raise InvalidInput(f"item {item_id!r} has no succeeded eval run with a result.json yet",
                               hint=f"run it first (`specdeck run PLAN {item_id}`)")
        host = await self.runner.host(run.host)
        raw = await host.read_from(path, 0, 1 << 28)
        try:
            result = json.loads(raw) if raw else None
        except ValueError:
            result = None
        why = resultfile.problem(result) if isinstance(result, dict) else None
        if not isinstance(result, dict) or why:
            raise InvalidInput(f"{run.host}:{path} (item {item_id!r}, run {run.id}): "
                               f"{why or ('missing' if not raw else 'not a result.json')}",
                               hint=f"run {item_id} again (`specdeck run PLAN {item_id} --again`)")
        return run, result

    def run_preview(self, item_id: str) -> RunPreview:
        """What running ``item_id`` now would start (an action item)."""
        from core.actions import registry

        item = self.plan.item(item_id)
        runs = self.runs_of(item_id)
        attempt = max((r.attempt for r in runs), default=0) + 1
        action = self.runner.action(item)
        start = action.start_note(runs, self.store.artefacts(item_id, "checkpoint")
                                  ) if action is not None and runs else None
        return RunPreview(attempt, registry.get(item.action.kind).detached, start)

    # -- refreshing from the hosts -------------------------------------------------------
    async def reconcile(self, *, hosts: Iterable[str] | None = None) -> list[RunChange]:
        """Re-derive each live run from its host (:meth:`core.runs.runner.Runner.reconcile`)."""
        return await self.runner.reconcile(hosts=hosts)

    async def refresh(self) -> list[RunChange]:
        """A look's refresh (``status``): reconcile only when a run or a tau watcher is live
        or a stored log is behind its host's, and never wait for a tau-over-training eval.
        Nothing to refresh: no runner is built and no host contacted."""
        if not (self.store.live_runs() or self.store.watchers(live=True)
                or self.store.logs_behind()):
            return []
        self.runner.watch = False
        return await self.runner.reconcile()

    async def sample_hosts(self, *, timeout_s: float = 20.0) -> int:
        """Sample the host of each live train run once (GPUs, disks: stored, alerts raised
        once per run; the plan's ``telemetry:``), as ``status`` does. A host that does not
        answer is left out. Returns how many runs' hosts answered."""
        from core.capsules.telemetry import sample_for_run

        settings, done = self.plan.telemetry, 0
        for run in self.store.live_runs():
            if run.kind != "train" or not run.host or not settings.every:
                continue
            try:
                host = await self.runner.host(run.host)
                await sample_for_run(host, self.store, run, settings, timeout=timeout_s)
            except (HostUnreachable, TimeoutError, OSError):
                continue
            done += 1
        return done

    async def catch_up_log(self, run: Run, *, timeout_s: float) -> tuple[Run, str | None]:
        """A live run's newest log lines into the store (its state refreshed first, as
        :meth:`refresh` does), waiting at most ``timeout_s`` for its host. Returns the run as
        it now stands, and why its host did not hand the lines over (None: it did, or the
        run ended, or its log is this process's own)."""
        await self.reconcile(hosts=[run.host] if run.host else None)
        run = self.store.run(run.id)
        if not run.live:
            return run, None
        why = None
        try:
            await asyncio.wait_for(self.runner.catch_up_log(run), timeout_s)
        except HostUnreachable as e:
            why = str(e)
        except asyncio.TimeoutError:
            why = f"{run.host} did not hand the new lines over within {timeout_s:g} s"
        return self.store.run(run.id), why

    # -- acting --------------------------------------------------------------------------
    def mark(self, item_id: str, status: str, *, stop_hint: str) -> None:
        """Set an item's status by hand. Refused (:class:`InvalidInput`) while the item has a
        live run, for every status its run's end would contradict; ``stop_hint`` is how this
        face stops a run (a command, a key), said in the refusal."""
        self.plan.item(item_id)
        if status in MARKS_REFUSED_WHILE_LIVE and self.live_run(item_id):
            raise InvalidInput(f"item {item_id!r} has a live run; stop it first ({stop_hint})")
        self.runner.mark(item_id, status)

    async def run(self, ids: Iterable[str] | None, *, again: bool = False,
                  resume: bool = False, detach: bool = False) -> RunSummary:
        """Run items (all when ``ids`` is None) whose needs are done, in dependency order
        (:meth:`core.runs.runner.Runner.run_items`; its summary).

        ``again``: the named items run once more even when done, skipped or stopped; their
        needs are checked as for any run (an item whose needs are no longer done waits).
        ``resume``: a named train item's new attempt resumes the earlier one's checkpoint.
        ``detach``: detached runs are started and left to their hosts. Neither ``again``
        nor ``resume`` outlives the call (a rerun that waited is not launched by a later
        run of everything).
        """
        ids = list(ids) if ids is not None else None
        if (again or resume) and not ids:
            raise InvalidInput("--again and --resume apply to the items you name; name them")
        runner = self.runner
        runner.detach = detach
        if again:
            runner.again.update(ids)
        if resume:
            runner.resume.update(ids)
        try:
            return await runner.run_items(ids)
        finally:
            if again:
                runner.again.difference_update(ids)
            if resume:
                runner.resume.difference_update(ids)

    async def adopt(self, item_id: str, spec: "AdoptSpec", *, host_name: str | None = None) -> str:
        """Make the run ``spec`` (a :class:`core.plans.adopt_spec.AdoptSpec`) names the item's run and
        follow it to its end. Returns the item's status."""
        return await self.runner.adopt(item_id, spec, host_name=host_name)

    async def stop(self, run_id: str, *, grace_s: float) -> "Outcome":
        """Stop a live run: SIGTERM to its group, ``grace_s``, SIGKILL; it ends ``stopped``."""
        return await self.runner.stop_run(run_id, grace_s=grace_s)

    async def end_leftovers(self, item_id: str, *, grace_s: float) -> tuple[Run | None, int]:
        """End what the item's latest (ended) run left running: (that run, how many)."""
        return await self.runner.end_leftovers(item_id, grace_s=grace_s)

    async def attach(self, ids: Iterable[str] | None = None) -> list[str]:
        """Follow the live runs (of ``ids``) until they end; the ids of those followed."""
        return await self.runner.attach(ids)


def run_in_session(plan: Plan, work: Callable[[Session], Awaitable[T]], *,
                   state: str | Path | None = None,
                   emit: Callable[[Event], None] | None = None, read: bool = False) -> T:
    """``asyncio.run`` of ``work(session)`` on a session opened for it and closed after
    (``read``: :meth:`Session.read`, a runner only if a verb needs one).

    SIGTERM cancels the work like Ctrl-C does (runs inside this process are marked
    interrupted; detached runs keep going on their hosts).
    """
    from core.faults import watch_signals_in_loop

    async def go() -> T:
        watch_signals_in_loop()
        opener = Session.read if read else Session.open
        async with opener(plan, state=state, emit=emit) as session:
            return await work(session)

    return asyncio.run(go())
