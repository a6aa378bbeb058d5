"""What the console's workers do: calls into core (the Session's verbs, the store's reads),
results as messages.

Every coroutine here runs in a worker owned by the App (``SpecdeckApp._work``), never by a
widget, so that removing a widget cannot cancel a run. Each one calls core services and posts
one result message (:mod:`console.messages`); none touches a widget.

The store has one owning thread: the event loop's (the App runs on the thread that opened
the store, and these coroutines run on the App's loop). Store verbs are short transactions,
and reads that could grow are bounded here (``log_tail(max_lines)``,
``metric_series(max_points)``, the last ``JOURNAL_LIMIT`` events).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from textual.message import Message

from console import messages as m
from core.tau.table import build_comparison
from core.errors import HostUnreachable, InvalidInput, SpecdeckError
from core.plans.plan import Item
from core.runs import life
from core.state.records import Event, Run
from core.session import Session, at_step

LOG_TAIL = 2000
"""Lines of a stored log loaded when a run is shown (the pane keeps at most LogPane.MAX)."""
MAX_POINTS = 300
"""Points per metric series sent to the chart (the store thins evenly)."""
OVERLAY_RUNS = 4
"""Attempts of the selected item drawn together on the metrics chart."""
JOURNAL_LIMIT = 500
REPORT_WINDOW_S = 12 * 3600.0
"""The report screen's window when no console saw the store within it (``specdeck report``'s default)."""
RUN_END_KINDS = tuple(life.END_JOURNAL)
"""The journal entries of runs' ends (:data:`core.runs.life.END_JOURNAL`)."""
GPU_HISTORY = 24
"""Samples of each GPU's utilisation sent with a sample (the GPUs pane's sparkline)."""


def arm_figures(plan, statuses: dict[str, str], store, comp) -> dict[str, dict]:
    """Per arm of ``plan``: its state (:func:`core.plans.arms.arm_state`), items done, its
    latest loss (the last ``loss`` point of the latest run of its last item that logs one:
    its train item) and its drafter's macro tau (``comp``, the tau table of every stored
    result)."""
    from core.plans.arms import arm_labels, arm_state

    labels = {name: label for name, label, _ in arm_labels(plan)}
    macro = {o.drafter: o.macro for o in comp.overall} if comp is not None else {}
    out = {}
    for arm in plan.arms.arms:
        items = plan.arm_items(arm.name)
        loss = None
        for it in items:
            run = store.latest_run(it.id) if it.action else None
            points = store.metric_series(run.id, "loss") if run else []
            if points:
                loss = points[-1][1]
        states = [statuses.get(it.id, "pending") for it in items]
        out[arm.name] = {"state": arm_state(states), "done": states.count("done"),
                         "items": len(items), "loss": loss, "knob": arm.knob,
                         "tau": macro.get(labels.get(arm.name))}
    return out


class Services:
    """The console's view of core: one instance per app, used only from its loop.

    Args:
        session: The plan opened with its store and runner (events go to the app's
            :class:`~console.bridge.EventBridge`).
        post: Where result messages go (the app's ``post_message``).
        flush_logs: The bridge's ``flush`` (see :meth:`load_log`).
    """

    def __init__(self, session: Session, post: Callable[[Message], object], *,
                 flush_logs: Callable[[str], None] = lambda run_id: None):
        self.session = session
        self.plan = session.plan
        self.runner = session.runner
        self.store = session.store
        self.post = post
        self.flush_logs = flush_logs
        """Posts a run's lines the bridge still holds (they are stored already)."""
        self._tau_signature: tuple | None = None
        self._arms_cache: tuple | None = None
        """(eval rows' signature, their comparison, the arms compared): :meth:`_load_arms`."""

    # -- session -------------------------------------------------------------------------
    async def open_session(self, *, reconcile: bool = True) -> "list[Run]":
        """Tell what happened since a console last saw the store; return the runs still live.

        "Last saw" is the store's console mark (:meth:`heartbeat` moves it every few seconds
        and whenever the console shows a run's end), so an unclean exit (SSH drop, closed
        terminal, kill -9) costs at most the events of its last seconds that it did not show,
        and nothing it showed is told again. Each run is told once: its journal end (the
        last one, if several), or reconcile's change when a live run is found ended now.
        """
        mark = self.store.seen_mark()
        if mark is not None:
            since_id, since = mark.event_id, mark.at
        else:  # a store from before the mark: the last console session's open/close
            marks = self.store.events(kinds=("console_opened", "console_closed"),
                                      newest_first=True, limit=1)
            since_id = marks[0].id if marks else None
            since = marks[0].at if marks else None
        ends: dict[str, Event] = {}
        if since_id is not None:
            for e in self.store.events(since_id=since_id, kinds=RUN_END_KINDS):
                ends.pop(e.run_id, None)
                ends[e.run_id] = e
        self.store.journal("console_opened", f"console opened on plan {self.plan.name}")
        self.heartbeat()
        changes = await self.session.reconcile() if reconcile else []
        told = {c.run for c in changes}
        meanwhile = [e for rid, e in ends.items() if rid not in told]
        if since_id is not None:  # what tau watchers evaluated meanwhile (ingested just now)
            meanwhile += self.store.events(since_id=since_id, kinds=("watch_meanwhile",))
        self.heartbeat()
        self.away_since = since
        self.post(m.SessionOpened(changes, meanwhile, since))
        return self.session.live_runs()

    def heartbeat(self) -> None:
        """Mark the store seen by a console up to now."""
        self.store.mark_seen()

    def close_session(self) -> list[dict]:
        """Journal the close; return the live runs, which keep going on their hosts."""
        live = self.session.live_runs()
        names = ", ".join(f"{r.item_id} ({r.id} on {r.host})" for r in live)
        self.store.journal("console_closed", "console closed" +
                           (f"; still running: {names}" if live else ""))
        self.heartbeat()
        return live

    async def attach(self, run: "Run") -> None:
        """Follow a live run found on open until it ends (log lines flow as events)."""
        try:
            await self.runner.attach_run(run)
        except HostUnreachable as e:
            self.post(m.NoticePosted(run.item_id, f"{run.item_id}: cannot follow run "
                                     f"{run.id}: {e.message}", "warning"))

    # -- hosts ---------------------------------------------------------------------------
    async def probe_host(self, name: str, *, gpu: bool = True) -> None:
        """Connect a host (its state reaches the bar through HostStateChanged), then sample GPUs."""
        try:
            await self.runner.host(name)
        except HostUnreachable:
            h = self.runner.hosts[name]
            self.post(m.HostStateChanged(name, "unreachable", h.status.reason or "unreachable"))
            return
        if gpu:
            await self.sample_gpu(name)

    async def sample_gpu(self, name: str) -> None:
        """Sample a connected host's GPUs and disk (:mod:`core.capsules.telemetry`), store
        it (with the live train run on that host, whose alerts it may raise, once), and post
        it with each GPU's recent utilisation."""
        from core.capsules import telemetry

        host = self.runner.hosts[name]
        if host.status.state.value != "connected":
            return
        run = next((r for r in self.session.live_runs() if r.host == name and r.kind == "train"),
                   None)
        try:
            if run is not None and self.plan.telemetry.every:
                sample, raised = await telemetry.sample_for_run(host, self.store, run,
                                                                self.plan.telemetry, timeout=10)
                for a in raised:
                    self.post(m.NoticePosted(a.item, a.text, "warning"))
            else:
                sample = await telemetry.sample_host(host, ["."], timeout=10)
                telemetry.record(self.store, sample)
        except (HostUnreachable, asyncio.TimeoutError, OSError):
            self.post(m.GpuSampled(name, None))
            return
        data = sample.to_json()
        history = {g.index: [u for _, u, _ in self.store.gpu_history(name, g.index,
                                                                      limit=GPU_HISTORY)]
                   for g in sample.gpus}
        self.post(m.GpuSampled(name, data["gpus"] or None, data, history))

    # -- quick reads (short store queries on the loop's thread; no worker needed) ---------
    def item(self, item_id: str) -> Item:
        return self.plan.item(item_id)

    def statuses(self) -> dict[str, str]:
        return self.session.statuses()

    def live_run(self, item_id: str) -> "Run | None":
        return self.session.live_run(item_id)

    def latest_run(self, item_id: str) -> "Run | None":
        return self.session.latest_run(item_id)

    def connected_hosts(self) -> list[str]:
        return [n for n, h in self.runner.hosts.items() if h.status.state.value == "connected"]

    def in_process_runs(self) -> "list[Run]":
        """Live runs happening inside this console (a relay): quitting interrupts them."""
        out = []
        for r in self.session.live_runs():
            if r.owner != self.runner.owner:
                continue
            try:
                action = self.runner.action(self.plan.item(r.item_id))
            except SpecdeckError:
                continue
            if action is not None and not action.detached:
                out.append(r)
        return out

    # -- items ---------------------------------------------------------------------------

    async def load_detail(self, item_id: str) -> None:
        """Runs, status history and live run of one item, then its check() verdict."""
        item = self.item(item_id)
        status = self.session.statuses()[item_id]
        runs = self.session.runs_of(item_id)
        self.post(m.ItemDetailLoaded(item_id, status, runs, self.store.status_history(item_id),
                                     self.session.live_run(item_id),
                                     self.session.watcher_status(runs[-1].id if runs else None),
                                     self.session.costs() if any(h.price for h in self.plan.hosts.values())
                                     else None))
        if item.manual:
            if status == "done":
                self.post(m.CheckFinished(item_id, "done", "marked done by hand"))
            else:
                self.post(m.CheckFinished(item_id, "manual", "do it, then mark it done (d)"))
            return
        try:
            res = await asyncio.wait_for(self.runner.check(item), 15)
        except asyncio.TimeoutError:
            self.post(m.CheckFinished(item_id, "error", "check timed out (15 s)"))
        except SpecdeckError as e:
            self.post(m.CheckFinished(item_id, "error", e.message))
        else:
            self.post(m.CheckFinished(item_id, res.state, res.reason))

    async def load_log(self, item_id: str, run_id: str | None = None) -> None:
        """The item's live run (else its latest, or ``run_id``) and the tail of its log."""
        run = (self.store.run(run_id) if run_id else
               self.session.live_run(item_id) or self.session.latest_run(item_id))
        if run:
            # Lines the bridge still holds are in the store already: post them first, so
            # they land before the tail (and are ignored) instead of after it (twice).
            self.flush_logs(run.id)
        lines = self.store.log_tail(run.id, LOG_TAIL) if run else []
        self.post(m.LogLoaded(item_id, run, lines))

    async def load_metrics(self, item_id: str | None, pinned: list[str]) -> None:
        """Curves of the pinned runs plus the item's latest attempts that have metrics."""
        runs: list[Run] = []
        for rid in pinned:
            r = self.store.run(rid)
            if r:
                runs.append(r)
        if item_id:
            own = [r for r in self.session.runs_of(item_id) if r.id not in pinned]
            runs += own[-OVERLAY_RUNS:]
            runs += self._sibling_arm_runs(item_id, {r.id for r in runs})
        out = []
        for r in runs:
            names = self.store.metric_names(r.id)
            if not names:
                continue
            series, times = {}, {}
            for n in names:
                pts = self.store.metric_series(r.id, n, max_points=MAX_POINTS,
                                               with_time=True)
                series[n] = [(p[0], p[1]) for p in pts]
                times[n] = [p[2] for p in pts]
            out.append({"run_id": r.id, "label": f"{r.item_id}#{r.attempt}",
                        "started_at": r.started_at, "series": series,
                        "times": times})
        self.post(m.MetricsLoaded(item_id, out))

    def _sibling_arm_runs(self, item_id: str, have: set[str]) -> list[Run]:
        """An arm's item (``train[noise]``): the latest run of the same template's item of
        every other arm, so the curves pane overlays the arms (loss, tau over training)."""
        item = self.session.plan.item(item_id)
        if item.template is None:
            return []
        out = []
        for other in self.session.plan.items:
            if other.template == item.template and other.id != item_id:
                run = self.session.latest_run(other.id)
                if run is not None and run.id not in have:
                    out.append(run)
        return out

    async def load_tau(self, *, force: bool = False, step: int | None = None) -> None:
        """The comparison of every eval result in the store (posted only when rows changed).

        ``step``: only the drafters evaluated at that training step, with every baseline
        (:func:`core.session.at_step`, as ``specdeck compare --step``); raises
        :class:`InvalidInput` when nothing was evaluated at that step.
        """
        rows = self.session.eval_rows()
        signature = (len(rows), max((r.id for r in rows), default=0), step)
        if self.session.plan.arms is not None:
            self._load_arms(rows, signature[:2])
        if signature == self._tau_signature and not force:
            return
        if step is not None:
            rows = at_step(rows, step)
        self._tau_signature = signature
        comp = build_comparison(rows, decide=self.session.plan.decisions)
        spent = []
        if any(h.price for h in self.plan.hosts.values()):
            from core.runs.cost import cost_per_tau, run_items_of

            spent = cost_per_tau(self.plan, comp, self.session.costs(), run_items_of(rows, self.store.run))
        self.post(m.TauLoaded(comp, step, spent))

    async def load_arms(self) -> None:
        """The arms' lines again (a loss arrived): :meth:`_load_arms`."""
        rows = self.session.eval_rows()
        self._load_arms(rows, (len(rows), max((r.id for r in rows), default=0)))

    def _load_arms(self, rows, signature: tuple) -> None:
        """Each arm's state, loss and tau, and the arms compared (Holm): every load of tau
        (a run's end, a reload), whether or not the eval rows changed (a loss did); the
        comparison is built again only when they did."""
        from core.plans.arms import arm_labels
        from core.tau import arms

        plan = self.session.plan
        if self._arms_cache is None or self._arms_cache[0] != signature:
            comp = build_comparison(rows) if rows else None
            result = None
            if comp is not None and plan.arms.against:
                taus = arms.per_prompt(comp)
                if plan.arms.against in taus:
                    result = arms.compare_arms(taus, arm_labels(plan), plan.arms.against)
            self._arms_cache = (signature, comp, result)
        _, comp, result = self._arms_cache
        self.post(m.ArmsLoaded(arm_figures(plan, self.statuses(), self.store, comp), result))

    async def load_journal(self) -> None:
        events = self.store.events()
        self.post(m.JournalLoaded(events[-JOURNAL_LIMIT:]))

    async def load_report(self) -> None:
        """The morning report (core.runs.report) since a console last saw the store, or over
        the last :data:`REPORT_WINDOW_S` when none did (or that was longer ago)."""
        from core.runs import report

        now = time.time()
        away = getattr(self, "away_since", None)
        since = away if away is not None and now - REPORT_WINDOW_S <= away < now else now - REPORT_WINDOW_S
        self.post(m.ReportLoaded(report.build(self.session.plan, self.store, since, now),
                                 away is not None and since == away))

    # -- commands ------------------------------------------------------------------------
    async def run_item(self, item_id: str, *, again: bool = False) -> None:
        """Run an item whose needs are done (``again``: even if it is done, skipped or
        stopped; its needs are checked all the same, as ``specdeck run ITEM --again``)."""
        item = self.item(item_id)
        if item.manual:
            raise InvalidInput(f"{item_id} is a manual item: do it, then mark it done (d)")
        summary = await self.session.run([item_id], again=again)
        if item_id in summary.unreachable:
            raise HostUnreachable(item.action.host or "?", "see the hosts bar")

    async def adopt(self, item_id: str, spec) -> None:
        """Adopt a run started outside specdeck as the item's run, and follow it."""
        await self.session.adopt(item_id, spec)

    async def run_all(self) -> None:
        """Every item whose needs are done, in dependency order, until nothing more can run."""
        await self.session.run(None)

    async def stop_run(self, run_id: str, grace_s: float) -> None:
        """Stop a live run (its end reaches the app as RunEnded, like any other end)."""
        await self.session.stop(run_id, grace_s=grace_s)

    async def mark(self, item_id: str, status: str) -> None:
        self.session.mark(item_id, status, stop_hint="x")
