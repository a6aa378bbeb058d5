"""The runner: executes plan items on their hosts and keeps the store true to the hosts.

It is the one service both faces use (the CLI and the console's workers). It owns the
:class:`~core.hosts.base.Host` objects (one per plan host, connected on first use) and
talks to the store; actions only see an :class:`~core.actions.base.ActionContext`.

Item status follows runs, and what is launched without being asked (``run --all``, ``A``, a
named item's needs), by the rules of :mod:`core.runs.life` (``RUN_TO_ITEM``, ``held``); a
run's end and a reconcile's moves are written by life (``life.end``, ``life.settle``).

A state disk that takes no more writes (:class:`~core.errors.StateDiskFull`) ends no run:
the item stays as the store has it, its run goes on on its host and stays live in the
store, and the next ``attach`` (or ``status``, once it ended) stores the rest of its log and
its end (:meth:`Runner._state_disk_full`).

:meth:`Runner.reconcile` re-derives every run the store thinks live from what is on its
host (the capsule, or the owning specdeck process for in-process runs), finishing runs that
ended while nobody watched. It runs on start, before status, and after every reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import time
from functools import partial
from typing import Any, Callable, Iterable

from core.runs import adopt, life, notify
from core.runs.alerts import Alerts
from core.capsules import jobs
from core.plans import shellvars
from core.actions import registry
from core.actions.base import Action, ActionContext, CheckResult, Outcome
from core.plans.adopt_spec import AdoptSpec
from core.errors import (ActionFailed, HostUnreachable, InvalidInput, SpecdeckError,
                         StateDiskFull)
from core.faults import describe_fault
from core.runs.events import (Event, HostStateChanged, LogLinesReceived, LogStreamChanged, Notice,
                         Progress, RunEnded, RunStarted, StatusChanged)
from core.hosts import Host, make_host
from core.hosts.base import HostState
from core.ml.formats import strictjson
from core.plans.plan import Item, Plan
from core.capsules.progress import describe
from core.state.records import (Artefact, EvalRow, Event as StoreEvent, Run, RunChange, RunSummary,
                          TauWatcher, WatchEntry)
from core.state.store import Store
from core.text import collapse_cr


class _Context(ActionContext):
    """The runner's :class:`ActionContext`: each verb is one store or runner call."""

    def __init__(self, runner: "Runner", item: Item, host: Host | None, run_id: str | None):
        self._runner = runner
        self._store = runner.store
        self.plan = runner.plan
        self.item = item
        self.host = host
        self.run_id = run_id
        self.poll = runner.poll
        self.watch = runner.watch

    def host_named(self, name: str) -> Host:
        return self._runner.hosts[name]

    async def connected(self, name: str) -> Host:
        return await self._runner.host(name)

    def progress(self, message: str, **fields: Any) -> None:
        self._runner.emit(Progress(self.item.id, message, fields))
        if self.in_process and self.run_id:
            self._journal(message, fields)

    in_process = False
    """Set for actions that run inside specdeck (relay, venv...): their progress is also
    their run's log, as a detached run's output is."""
    _logged_at = 0.0
    LOG_METER_EVERY = 10.0
    """Seconds between meter lines (bytes, rate, ETA) kept in the log; phase lines (no
    figures) and final ones are always kept."""

    def _journal(self, message: str, fields: dict) -> None:
        now = time.time()
        if fields and not fields.get("final") and now - self._logged_at < self.LOG_METER_EVERY:
            return
        if fields:
            self._logged_at = now
        line = f"[{time.strftime('%H:%M:%S', time.localtime(now))}] {message}"
        run = self._store.run(self.run_id)
        if run is not None and self._store.append_log(self.run_id, run.log_offset,
                                                      (line + "\n").encode()):
            self._runner.emit(LogLinesReceived(self.item.id, self.run_id, [line],
                                               from_progress=True))

    # -- reading -------------------------------------------------------------------------
    def runs(self, item_id: str | None = None) -> list[Run]:
        return self._store.runs_for_item(item_id or self.item.id)

    def live_run(self, item_id: str) -> Run | None:
        return self._store.live_run(item_id)

    def artefacts(self, item_id: str | None = None, kind: str | None = None) -> list[Artefact]:
        return self._store.artefacts(item_id or self.item.id, kind)

    def stop_requested(self, run_id: str) -> bool:
        return self._runner.stop_requested(run_id)

    # -- recording -----------------------------------------------------------------------
    def _this_run(self) -> str:
        if not self.run_id:
            raise SpecdeckError(f"item {self.item.id!r}: nothing is recorded while checking")
        return self.run_id

    def record_artefact(self, kind: str, path: str, step: int | None = None,
                        data: dict | None = None) -> bool:
        return self._store.add_artefact(self._this_run(), self.item.id, kind, path, step, data)

    def record_eval_rows(self, rows: list[EvalRow]) -> None:
        self._store.add_eval_results(rows)

    def record_metrics(self, rows: Iterable[tuple[int, str, float]]) -> None:
        self._store.add_metrics(self._this_run(), rows)

    def record_config(self, config: dict) -> None:
        self._store.update_run(self._this_run(), config=config)

    # -- acting on runs ------------------------------------------------------------------
    async def stop_run(self, run_id: str, *, grace_s: float) -> Outcome:
        return await self._runner.stop_run(run_id, grace_s=grace_s)

    async def follow_log(self, host: Host, run: Run, on_lines=None, *, regex=None,
                         inspector=None, log_path: str | None = None) -> jobs.CapsuleState:
        def on_state(state: str) -> None:
            self._runner.emit(LogStreamChanged(self.item.id, run.id, state, host.name,
                                               host.status.reason or host.status.state.value))

        return await jobs.follow(host, self._store, run.id, run.capsule, on_lines=on_lines,
                                 on_state=on_state, regex=regex, poll=self.poll,
                                 inspector=inspector, log_path=log_path)

    async def skip_earlier_metrics(self, spec: Any) -> None:
        from core.capsules.metrics_sources import tensorboard_source

        src = tensorboard_source(spec, self.host, self._store, self._this_run())
        if src is not None:
            await src.baseline()

    def notice(self, message: str, level: str = "info") -> None:
        self._runner.emit(Notice(self.item.id, message, level))

    def journal(self, kind: str, message: str, *, host: str | None = None,
                data: dict | None = None) -> None:
        self._store.journal(kind, message, item_id=self.item.id, run_id=self.run_id,
                            host=host, data=data)
        wanted = getattr(self._runner.plan, "notify", ())  # (a test's fake runner has no plan)
        if kind == "alert" and data and data.get("alert") in wanted:
            self._runner.alerts.send(self.item, self.run_id, data, message)

    async def arm_notify(self, host: Host, capsule: str, events: tuple[str, ...]) -> bool:
        return await notify.arm(self._store, host, capsule, self._runner.plan, self.item,
                                self._this_run(), events, run_end=False)

    def for_run(self, run_id: str) -> "_Context":
        if not any(r.id == run_id for r in self.runs()):
            raise SpecdeckError(f"item {self.item.id!r} has no run {run_id!r}")
        return _Context(self._runner, self.item, self.host, run_id)

    # -- what this run recorded ----------------------------------------------------------
    def journaled(self, kind: str) -> list[StoreEvent]:
        return [e for e in self._store.events(kinds=[kind]) if e.run_id == self._this_run()]

    def metric_series(self, name: str) -> list[tuple[int, float]]:
        return self._store.metric_series(self._this_run(), name)

    def eval_rows(self) -> list[EvalRow]:
        run_id = self._this_run()
        return [r for r in self._store.eval_results(self.item.id) if r.run_id == run_id]

    # -- tau over training ---------------------------------------------------------------
    def tau_watcher(self) -> TauWatcher | None:
        return self._store.watcher(self._this_run())

    def live_tau_watchers(self) -> list[TauWatcher]:
        return [w for w in self._store.watchers(live=True) if w.item_id == self.item.id]

    def claim_tau_watcher(self, host: str, capsule: str, ckpt_dir: str) -> bool:
        return self._store.watcher_claim(self._this_run(), self.item.id, host, capsule,
                                         ckpt_dir)

    def take_tau_watcher(self, from_states: tuple[str, ...], state: str) -> bool:
        return self._store.watcher_take(self._this_run(), from_states, state)

    def mark_tau_watcher(self, state: str, error: str | None = None) -> None:
        fields = {"error": error} if error is not None else {}
        self._store.watcher_update(self._this_run(), state=state, **fields)

    def record_tau_watcher_status(self, state: str, *, current: int | None,
                                  last_step: int | None, queue: list[int],
                                  error: str | None) -> None:
        self._store.watcher_update(self._this_run(), state=state, current=current,
                                   last_step=last_step, queue=queue, error=error)

    def watch_entries(self) -> list[WatchEntry]:
        return self._store.watch_entries(self._this_run())

    def queue_watch_entry(self, step: int) -> bool:
        return self._store.watch_add(self._this_run(), self.item.id, step)

    def update_watch_entry(self, step: int, state: str, *, host: str | None = None,
                           capsule: str | None = None, tau: float | None = None,
                           error: str | None = None) -> None:
        given = {"host": host, "capsule": capsule, "tau": tau, "error": error}
        self._store.watch_update(self._this_run(), step, state=state,
                                 **{k: v for k, v in given.items() if v is not None})

    def record_watch_result(self, step: int, *, state: str, tau: float | None = None,
                            error: str | None = None, host: str | None = None,
                            capsule: str | None = None,
                            metrics: Iterable[tuple[int, str, float]] = (),
                            eval_rows: list[EvalRow] = ()) -> bool:
        return self._store.watch_ingest(self._this_run(), self.item.id, step, state=state,
                                        tau=tau, error=error, host=host, capsule=capsule,
                                        metrics=metrics, eval_rows=eval_rows)


class Runner:
    """Runs items and reconciles runs.

    Args:
        plan: The validated plan.
        store: The state store (used from this thread only).
        emit: Called with every :class:`~core.runs.events.Event`.
        hosts: Pre-built hosts by name (tests); default: built from the plan.
        watch: Evaluate tau alongside the train runs it follows (``watch_eval``; the
            actions read it as ``ActionContext.watch``); a one-shot ``status`` does not,
            since it never waits for those evals.
    """

    def __init__(self, plan: Plan, store: Store, *, emit: Callable[[Event], None] | None = None,
                 hosts: dict[str, Host] | None = None, poll: float = 0.1, watch: bool = True):
        self.plan = plan
        self.watch = watch
        self.store = store
        if store.transitions is None:  # the store keeps what a run's life allows
            store.transitions = life.TRANSITIONS
        self._emit = emit or (lambda e: None)
        self.hosts: dict[str, Host] = hosts or {n: make_host(n, s, plan.dir)
                                           for n, s in plan.hosts.items()}
        self.poll = poll
        self.owner = life.owner_token()
        self._connect_locks: dict[str, asyncio.Lock] = {}
        self._stopping: set[str] = set()
        self.alerts = Alerts(plan, store, self.emit)
        """Alerts sent as notifications, telemetry around train runs (core.runs.alerts)."""
        self._in_process: dict[str, asyncio.Future] = {}
        """run id -> the task running an in-process action (a relay...) in this process."""
        self._host_states: dict[str, HostState] = {}
        self._reconciles: set[asyncio.Task] = set()
        """Reconciles started by a host's reconnect: kept (a task nobody references may be
        collected mid-run), forgotten when done, cancelled by :meth:`close`."""
        for h in self.hosts.values():
            h.on_status(self._host_status_changed)
        self.again: set[str] = set()
        """Items to run once more even though done (``specdeck run --again``, console R)."""
        self.detach = False
        """Start detached runs and leave them to their hosts instead of following them to
        their end (``specdeck run --detach``, as sbatch submits): such an item counts as
        ``started``; in-process actions (a relay) still run to their end here."""
        self.resume: set[str] = set()
        """Items whose next attempt resumes an earlier one (``specdeck run --resume``)."""

    # -- plumbing ------------------------------------------------------------------------
    def emit(self, event: Event) -> None:
        self._emit(event)

    def _host_status_changed(self, name: str, status) -> None:
        self.emit(HostStateChanged(None, name, status.state.value, status.reason))
        was, self._host_states[name] = self._host_states.get(name), status.state
        if (status.state == HostState.CONNECTED and self.reconcile_on_reconnect
                and was in (HostState.RECONNECTING, HostState.UNREACHABLE)):
            task = asyncio.get_event_loop().create_task(self._safe_reconcile(name))
            self._reconciles.add(task)
            task.add_done_callback(self._reconciles.discard)

    reconcile_on_reconnect = False
    """Reconcile a host's live runs each time it reconnects (the console turns this on)."""

    async def _safe_reconcile(self, host: str) -> None:
        try:
            await self.reconcile(hosts=[host], follow=False)
        except SpecdeckError:
            pass

    async def host(self, name: str) -> Host:
        """The named host, connected (raises HostUnreachable)."""
        if name not in self.hosts:
            raise SpecdeckError(f"plan {self.plan.name!r} has no host {name!r}")
        h = self.hosts[name]
        lock = self._connect_locks.setdefault(name, asyncio.Lock())
        async with lock:
            if h.status.state != HostState.CONNECTED:
                await h.connect()
        return h

    async def close(self) -> None:
        """End the reconciles a reconnect started, then close every contacted host."""
        await self.alerts.close()
        for task in list(self._reconciles):
            task.cancel()
        await asyncio.gather(*self._reconciles, return_exceptions=True)
        for h in self.hosts.values():
            if h.status.state == HostState.UNKNOWN and not h.status.reason:
                continue  # never contacted: nothing to close, nothing to report
            try:
                await h.close()
            except Exception:  # closing is best effort
                pass

    def statuses(self) -> dict[str, str]:
        return self.plan.statuses(self.store.item_statuses())

    def action(self, item: Item) -> Action | None:
        if item.action is None or item.action.params is None:
            return None
        return registry.get(item.action.kind)(item.action.params)

    def run_action(self, item: Item, run: "Run | None") -> Action | None:
        """The action a run goes through (an adopted run's: :class:`core.runs.adopt.Adopted`)."""
        return adopt.wrap(self.action(item), run)

    def set_status(self, item_id: str, status: str, reason: str = "",
                   run_id: str | None = None) -> None:
        """Record an item's status (and the run it is about) and tell whoever watches."""
        self.store.set_status(item_id, status, reason=reason, run_id=run_id)
        self.emit(StatusChanged(item_id, status, reason))

    def mark(self, item_id: str, status: str, reason: str = "marked by operator") -> None:
        self.plan.item(item_id)
        self.set_status(item_id, status, reason)

    def live_run(self, item_id: str) -> "Run | None":
        return self.store.live_run(item_id)

    # -- check ---------------------------------------------------------------------------
    async def check(self, item: Item) -> CheckResult:
        action = self.action(item)
        if action is None or item.manual:
            return CheckResult.blocked("manual item: do it, then mark it done")
        host = await self.host(item.action.host) if item.action.host else None
        return await action.check(_Context(self, item, host, None))

    # -- running -------------------------------------------------------------------------
    async def run_items(self, ids: Iterable[str] | None = None) -> RunSummary:
        """Run items (all when ``ids`` is None) whose needs are done, in dependency order.

        Independent items run concurrently. Returns the item ids by what became of them
        (:class:`~core.state.records.RunSummary`).
        """
        targets = self.plan.order(ids)
        named = set(ids) if ids is not None else set()
        summary: dict[str, list[str]] = {f.name: [] for f in dataclasses.fields(RunSummary)}
        pending = list(targets)
        running: dict[asyncio.Task, Item] = {}
        launched: set[str] = set()
        """Items launched by this call: naming an item asks for one launch, not a loop."""
        while pending or running:
            st = self.statuses()
            deferred = False
            for it in list(pending):
                if st[it.id] in ("done", "skipped") and it.id not in self.again:
                    pending.remove(it)
                    if it.id in named:
                        summary["done"].append(it.id)
                        self.emit(Notice(it.id, f"{it.id}: already {st[it.id]} (`specdeck run "
                                         f"{self.plan.path or self.plan.name} {it.id} --again` "
                                         "runs it again)"))
                    continue
                if it.manual:
                    pending.remove(it)
                    summary["manual"].append(it.id)
                    continue
                needs = self.unmet(it, st)
                why = None if needs else self.held(it, st[it.id],
                                                   asked=it.id in named - launched)
                if why:
                    pending.remove(it)
                    summary["held"].append(it.id)
                    self.emit(Notice(it.id, why, "warning"))
                    continue
                why = None if needs else adopt.unadopted(self.plan, it, st, self.store.live_run)
                if why and adopt.adopting(it, running.values()):
                    deferred = True  # a stop whose target is being adopted right now
                    continue
                if why:  # started outside specdeck: never launched twice
                    pending.remove(it)
                    summary["unadopted"].append(it.id)
                    self.emit(Notice(it.id, why, "warning"))
                    continue
                if not needs:
                    pending.remove(it)
                    launched.add(it.id)
                    running[asyncio.create_task(self.run_item(it))] = it
                    continue
                live = {p.id for p in pending} | {x.id for x in running.values()}
                if not any(n in live for n in needs):
                    pending.remove(it)
                    summary["waiting"].append(it.id)
                    self.emit(Notice(it.id, f"{it.id}: not run, waits on "
                                     + ", ".join(self._waits_on(it, n, st[n]) for n in needs)))
            if not running:
                for it in pending:
                    summary["waiting"].append(it.id)
                break
            try:
                done, _ = await asyncio.wait(list(running), return_when=asyncio.FIRST_COMPLETED,
                                             timeout=0.2 if deferred else None)
            except asyncio.CancelledError:
                # Ctrl-C / SIGTERM: the item tasks end here, while the store is still open
                # (in-process runs record "interrupted"; detached ones keep going on hosts).
                for t in running:
                    t.cancel()
                await asyncio.gather(*running, return_exceptions=True)
                raise
            for t in done:
                it = running.pop(t)
                try:
                    state = t.result()
                except HostUnreachable as e:
                    self.emit(Notice(it.id, str(e), "error"))
                    summary["unreachable"].append(it.id)
                    continue
                except StateDiskFull as e:  # no fault of the item: never failed for it
                    self._state_disk_full(it, e)
                    summary["unrecorded"].append(it.id)
                    continue
                except Exception as e:  # noqa: BLE001 - any fault ends the item, not the runner
                    state = self._item_failed(it, e)
                why = life.again(it, state, self.store.runs_for_item(it.id))
                if why:  # on_preempt: resume, or retries left (a preemption uses none)
                    self.emit(Notice(it.id, why, "warning"))
                    pending.insert(0, it)
                    continue
                started = self.detach and state == life.ITEM_WHILE_LIVE
                summary["done" if state == "done" else "started" if started else
                        "held" if state == "stopped" else "failed"].append(it.id)
        return RunSummary(**{k: tuple(v) for k, v in summary.items()})

    def unmet(self, item: Item, statuses: dict[str, str]) -> list[str]:
        """The ids the item waits on: ``needs`` not done, ``after`` neither done nor skipped."""
        return [n for n in item.deps
                if statuses[n] != "done" and not (statuses[n] == "skipped" and n not in item.needs)]

    def _waits_on(self, item: Item, dep: str, status: str) -> str:
        plan = self.plan.path or self.plan.name
        if status == "skipped":
            return (f"{dep} (skipped, and {item.id} needs its output: run it, or write "
                    f"`after: [{dep}]` in {item.id} if only the order matters)")
        if status == "stopped":
            return f"{dep} (stopped: `specdeck run {plan} {dep} --again` runs it again)"
        return f"{dep} ({status})"

    def held(self, item: Item, status: str, *, asked: bool = False) -> str | None:
        """Why ``run_items`` does not launch an item whose needs are met (:func:`life.held`),
        or None; an item asked ``--again`` never waits."""
        if item.id in self.again:
            return None
        return life.held(item, status, self.store.runs_for_item(item.id), asked=asked,
                         plan=self.plan.path or self.plan.name)

    def retries_left(self, item: Item) -> int:
        return life.retries_left(item.retries, self.store.runs_for_item(item.id))

    def _item_failed(self, item: Item, exc: Exception) -> str:
        """An unexpected fault before or around a run: the item fails with the message, and a
        run of it left live by this process ends failed."""
        msg = describe_fault(exc)
        self.emit(Notice(item.id, f"{item.id}: {msg}", "error"))
        try:
            live = self.store.live_run(item.id)
            if live is not None and live.owner == self.owner and live.id not in self._in_process:
                if live.capsule:
                    msg += (f" (specdeck stopped following it; its command may still run in "
                            f"{live.capsule} on {live.host})")
                    self._log_behind(live, msg)  # first: no end recorded without it
                return self._end(item, live.id, life.FAILED, error=msg)
            if live is None:
                self.set_status(item.id, "failed", msg)
        except Exception:  # noqa: BLE001 - the store itself may be the fault (disk full)
            pass
        return "failed"

    def _state_disk_full(self, item: Item, exc: StateDiskFull) -> None:
        """The state database's disk refused a write while ``item`` ran or started: say so,
        where, and what became of its run, and record nothing else (the disk is full).

        A launched run goes on on its host, and stays live in the store with its log stored
        up to the last piece that fitted: once there is space, ``attach`` follows it from
        there (``status`` stores the rest once its command ended), exactly once, and records
        its end as its host says. A run claimed but not launched is reconciled as any run
        whose specdeck went away (interrupted: it resumes)."""
        try:
            live = self.store.live_run(item.id)  # a read: a full disk still answers it
        except Exception:  # noqa: BLE001 - a state file that cannot even be read
            live = None
        what = life.after_disk_full(live, plan=self.plan.path or self.plan.name,
                                    item_id=item.id, mount=exc.mount, owner=self.owner)
        msg = f"{item.id}: {exc.message}; {what}"
        self.emit(Notice(item.id, msg, "error"))
        try:  # a small row may still fit: the journal keeps it for the console and status
            self.store.journal("state_disk_full", msg, item_id=item.id,
                               run_id=live.id if live else None,
                               host=live.host if live else None)
        except Exception:  # noqa: BLE001 - best effort: the disk is full, stderr has said it
            pass

    async def run_item(self, item: Item) -> str:
        """Run one item now (its needs are the caller's business). Returns its final status."""
        action = self.action(item)
        if action is None:
            raise SpecdeckError(f"item {item.id!r} is manual: mark it done when it is")
        live = self.store.live_run(item.id)
        if live is not None and self.detach:
            self.emit(Notice(item.id, f"{item.id}: run {live.id} is live already"))
            return self.statuses()[item.id]
        if live is not None:
            self.emit(Notice(item.id, f"{item.id}: run {live.id} is live; attaching"))
            await self.attach_run(live)
            return self.statuses()[item.id]
        statuses = self.statuses()
        from_plan = item.adopt is not None and adopt.from_plan(  # the plan says where it runs
            item, statuses[item.id], self.store.runs_for_item(item.id))
        why = None if from_plan else adopt.unadopted(self.plan, item, statuses,
                                                     self.store.live_run)
        if from_plan:
            try:
                return await self.adopt(item.id, item.adopt)
            except SpecdeckError as e:
                self.emit(Notice(item.id, f"{item.id}: cannot adopt the run its plan names: "
                                 f"{e.message} (ended? `specdeck mark PLAN {item.id} done`, or "
                                 "`pending` to launch it anew)", "error"))
                return "failed"
        if why:
            self.emit(Notice(item.id, why, "warning"))
            return self.statuses()[item.id]
        host = await self.host(item.action.host) if item.action.host else None
        ctx = _Context(self, item, host, None)
        chk = await action.check(ctx)
        again = item.id in self.again
        self.again.discard(item.id)
        if item.id in self.resume:
            ctx.resume = True
            self.resume.discard(item.id)
        if chk.state == "done" and not again:
            self.set_status(item.id, "done", f"check: {chk.reason or 'already done'}")
            return "done"
        if chk.state == "blocked":
            self.set_status(item.id, "failed", f"blocked: {chk.reason}")
            self.emit(Notice(item.id, f"{item.id}: cannot run: {chk.reason}", "error"))
            return "failed"
        run_id = self._new_run_id(item)
        launcher = action.launcher_name()
        run = self.store.claim_run(run_id, item.id, item.action.kind,
                                   item.action.host, owner=self.owner, launcher=launcher)
        if run is None:  # another process claimed it a moment ago
            live = self.store.live_run(item.id)
            if live:
                await self.attach_run(live)
            return self.statuses()[item.id]
        ctx.run_id = run_id
        self.set_status(item.id, life.ITEM_WHILE_LIVE, f"run {run_id}", run_id)
        if not action.detached:
            return await self._run_in_process(item, action, ctx, run_id)
        try:
            if not self.stop_requested(run_id):
                await action.prepare(ctx)
            if self.stop_requested(run_id):  # a stop while starting: nothing is created
                return self._end(item, run_id, life.STOPPED, error="stopped before it was launched")
            launch = action.command(ctx)
            # Plan vars used in shell text are read from the environment (core.plans.shellvars):
            # those its command uses.
            launch = dataclasses.replace(launch, env={
                **shellvars.plan_env(self.plan.vars, launch.command), **dict(launch.env)})
            if host is not None and launch.launcher == "process":
                await notify.arm(self.store, host, jobs.capsule_path(host, run_id), self.plan,
                                 item, run_id)
            launched = await action.launch(ctx, host, run_id, launch)
        except HostUnreachable as e:
            # The run ends here (never left `starting`); the item counts as unreachable. Its
            # command may have started before the host went away: the run keeps its capsule,
            # so `specdeck stop` finds what it left running.
            capsule = jobs.capsule_path(host, run_id)
            self.store.update_run(run_id, capsule=capsule)
            self._end(item, run_id, life.FAILED, error=f"{e} (while starting it; anything it "
                      f"started is in {capsule} on {host.name})")
            raise
        except ActionFailed as e:
            return self._end(item, run_id, "failed", error=str(e))
        except StateDiskFull:
            raise  # no fault of the run (Runner._state_disk_full)
        except Exception as e:  # noqa: BLE001 - a fault of the host, the disk or a library
            return self._end(item, run_id, "failed", error=describe_fault(e))
        self.store.update_run(run_id, state=life.RUNNING, pid=launched.pid,
                              pstart=launched.pstart, capsule=launched.capsule,
                              job_id=launched.job_id)
        self.emit(RunStarted(item.id, run_id, item.action.host, launched.pid))
        if self.detach:
            return self.statuses()[item.id]
        return await self._follow_and_finish(item, action, host, self.store.run(run_id))

    @staticmethod
    def _new_run_id(item: Item) -> str:
        return f"{item.id}-{time.strftime('%m%d-%H%M%S')}-{secrets.token_hex(2)}"

    async def adopt(self, item_id: str, spec: AdoptSpec, *, host_name: str | None = None,
                    follow: bool = True) -> str:
        """Make what ``spec`` names (a pid, a Slurm job, a tmux session started outside
        specdeck) the item's live run; follow it (``follow``) until it ends.

        Bad input (nothing there, another user's, specdeck's own, a missing log) raises
        :class:`~core.errors.InvalidInput` before anything is recorded (:mod:`core.runs.adopt`).
        Returns the item's status.
        """
        item = self.plan.item(item_id)
        host_name = host_name or (item.action.host if item.action else None)
        run_id = self._new_run_id(item)
        adopt.refuse(self.plan, item, self.action(item), host_name,
                     self.store.live_run(item.id))
        host = await self.host(host_name)
        info, capsule = await adopt.enter(host, spec, self.store.live_runs(), run_id)
        run = self.store.claim_run(run_id, item.id, item.action.kind, host_name,
                                   owner=self.owner, launcher=f"adopt:{info['how']}")
        if run is None:
            raise InvalidInput(f"item {item.id!r} got a live run meanwhile (another specdeck)")
        self.store.update_run(run_id, state=life.RUNNING,
                              pid=info.get("pid") or info.get("pane_pid"),
                              pstart=info.get("pstart"), capsule=capsule, job_id=info.get("job"),
                              adopt=strictjson.dumps(info), log_base=info["base"])
        self.store.journal("adopted", f"adopted {info['what']} as {run_id}", item_id=item.id,
                           run_id=run_id, host=host_name, data=info)
        where = (f"{info['log']} from byte {info['base']}" if info["log"]
                 else "the pane, from now on")
        self.set_status(item.id, life.ITEM_WHILE_LIVE, f"adopted {info['what']} as run {run_id}",
                        run_id)
        self.emit(Notice(item.id, f"{item.id}: adopted {info['what']} on {host_name} as run "
                         f"{run_id}; log: {where}"))
        if not follow:
            self.emit(RunStarted(item.id, run_id, host_name, info.get("pid"), attached=True))
            return self.statuses()[item.id]
        return await self.attach_run(self.store.run(run_id))

    def stop_requested(self, run_id: str) -> bool:
        """A stop of the run was asked for, by this process or another (a run still starting,
        or an adopted process found gone)."""
        return run_id in self._stopping or life.stop_requested(self.store.run(run_id))

    async def _launched(self, run: "Run", grace_s: float) -> "Run":
        """Wait until a starting run is launched (or not) by whoever is starting it; a
        launcher that died meanwhile is reconciled. The stop then ends what it created."""
        deadline = time.monotonic() + life.launch_wait_s(grace_s)
        while run.state == life.STARTING:
            if run.owner != self.owner and life.owner_alive(run.owner) is False:
                await self._reconcile_run(run, follow=False)
            elif time.monotonic() > deadline:
                raise SpecdeckError(f"run {run.id} is still starting; stop it again once "
                                    "it runs")
            else:
                await asyncio.sleep(0.05)
            run = self.store.run(run.id)
        return run

    async def _run_in_process(self, item: Item, action: Action, ctx: _Context, run_id: str) -> str:
        self.store.update_run(run_id, state=life.RUNNING, pid=os.getpid())
        ctx.in_process = True
        self.emit(RunStarted(item.id, run_id, item.action.host, os.getpid()))
        # Its own task, so that stop_run can cancel the action alone (the caller carries on)
        # while a cancellation of the caller (Ctrl-C, quitting) still interrupts it.
        work = asyncio.ensure_future(action.run(ctx))
        self._in_process[run_id] = work
        try:
            result = await work
        except HostUnreachable as e:  # the run failed; the item counts as unreachable (exit 3)
            self._end(item, run_id, "failed", error=str(e))
            raise
        except ActionFailed as e:
            return self._end(item, run_id, "failed", error=str(e))
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if run_id in self._stopping and not (me and me.cancelling()):
                return self._end(item, run_id, life.STOPPED, error="stopped by the operator")
            work.cancel()
            self._end(item, run_id, life.INTERRUPTED, error="specdeck stopped during the run")
            raise
        except StateDiskFull:
            raise  # no fault of the run (Runner._state_disk_full)
        except Exception as e:  # noqa: BLE001 - a fault of the host, the disk or a library
            return self._end(item, run_id, "failed", error=describe_fault(e))
        finally:
            self._in_process.pop(run_id, None)
        return self._end(item, run_id, life.SUCCEEDED, result=result, exit_code=0)

    def _end(self, item: Item, run_id: str, state: str, **how: Any) -> str:
        """End the run (:func:`life.end`: ``how`` its error, result, exit code, signal) and
        return its item's status."""
        life.end(self.store, self.emit, item.id, run_id, state, **how)
        return self.statuses()[item.id]

    async def _follow_and_finish(self, item: Item, action: Action, host: Host, run: "Run") -> str:
        run_id = run.id

        def lines(ls: list[str]) -> None:
            ls = [collapse_cr(x) for x in ls]  # a tqdm bar's redraws: one line
            self.emit(LogLinesReceived(item.id, run_id, ls))
            for ln in reversed(ls):  # one progress per chunk: the latest line that has one
                if ln.startswith("{"):
                    msg = describe(ln)
                    if msg:
                        self.emit(Progress(item.id, msg))
                        break

        ctx = _Context(self, item, host, run_id)
        work = action.follow(ctx, host, run, lines)
        st = await self._with_metric_files(item, action, host, run_id, work)
        return await self._finish(item, action, host, run_id, st)

    async def _with_metric_files(self, item: Item, action: Action, host: Host, run_id: str,
                                 work):
        """Await ``work`` while the run's metric files (TensorBoard) are read alongside."""
        from core.capsules.metrics_sources import alongside, tensorboard_source

        src = tensorboard_source(action.metrics_spec(), host, self.store, run_id)
        work = self.alerts.sampled(item, host, run_id, work)  # host telemetry (issue 44 §2)
        return await alongside(src, work, every=max(self.poll * 10, 0.5),
                               on_error=lambda m: self.emit(Notice(item.id, m, "warning")))


    async def _finish(self, item: Item, action: Action, host: Host, run_id: str,
                      st: jobs.CapsuleState) -> str:
        run = self.store.run(run_id)
        if not run.live:
            return self.statuses()[item.id]
        left = await self._leftovers(run)
        stopped = run_id in self._stopping or life.stop_requested(run)
        outcome = life.outcome_of(st, stopped=stopped, capsule=run.capsule or "", run_id=run_id)
        unread = life.after_failed_finish(outcome)  # its end if its results cannot be read
        ctx = _Context(self, item, host, run_id)
        try:
            result = await action.finish(ctx, outcome)
        except StateDiskFull:
            raise  # its end is recorded once there is space (the next reconcile)
        except Exception as e:  # noqa: BLE001 - ActionFailed, or a fault reading the results
            msg = str(e) if isinstance(e, ActionFailed) else describe_fault(e)
            status = self._end(item, run_id, unread, error=msg, exit_code=outcome.exit_code,
                               signal=outcome.signal)
        else:
            status = self._end(item, run_id, outcome.state, result=result,
                               exit_code=outcome.exit_code, signal=outcome.signal,
                               error=left or outcome.preempted)
        if self.plan.notify:  # after the end is recorded: a target never delays nor fails it
            ended = self.store.run(run_id)
            await notify.after_run(self.store, self.plan, item, run_id, ended.state, host,
                                   ended.capsule)
        return status

    async def _leftovers(self, run: "Run") -> str | None:
        """Processes a finished run left behind (a background or daemonised child), told."""
        if not run.capsule or not run.host:
            return None
        try:
            found = await jobs.leftovers(self.hosts[run.host], run.capsule)
        except Exception:  # noqa: BLE001 - best effort: the run's end is what matters
            return None
        if not found:
            return None
        plan = self.plan.path or self.plan.name
        msg = (jobs.describe_leftovers(found) + f"; `specdeck stop {plan} {run.item_id}` "
               "ends them")
        self.emit(Notice(run.item_id, f"{run.item_id}: {msg}", "warning"))
        self.store.journal("leftovers", msg, item_id=run.item_id, run_id=run.id,
                           host=run.host)
        return msg

    async def end_leftovers(self, item_id: str, *, grace_s: float = 10.0) -> tuple[dict | None, int]:
        """End the processes the item's latest (ended) run left running: (run, count)."""
        run = self.store.latest_run(item_id)
        if run is None or not run.capsule or not run.host:
            return run, 0
        try:
            host = await self.host(run.host)
            n = await jobs.end_leftovers(host, run.capsule, grace_s=grace_s)
        except HostUnreachable as e:
            self.emit(Notice(item_id, f"{item_id}: could not look for processes run "
                             f"{run.id} left behind: {e}", "warning"))
            return run, 0
        if n:
            self.store.journal("leftovers_ended", f"ended {n} leftover process(es)",
                               item_id=item_id, run_id=run.id, host=run.host)
        return run, n

    # -- attach, reconcile, stop ---------------------------------------------------------
    async def attach_run(self, run: "Run") -> str:
        """Follow a live run until it ends, then finish it."""
        item = self.plan.item(run.item_id)
        action = self.run_action(item, run)
        if run.state == life.STARTING or not run.capsule:
            return await self._reconcile_run(run, follow=True)
        host = await self.host(run.host)
        self.emit(RunStarted(item.id, run.id, run.host, run.pid, attached=True))
        return await self._follow_and_finish(item, action, host, run)

    async def catch_up_log(self, run: "Run") -> bool:
        """Store what a live detached run wrote to its log since it was last followed, up to
        the log's end now, and stop there (``specdeck logs``: the newest lines, as
        ``status`` shows the newest state). False for a run whose log is not on a host (an
        in-process action's: its specdeck stores it as it goes). Raises HostUnreachable."""
        item = self.plan.item(run.item_id)
        action = self.run_action(item, run)
        if action is None or not action.detached or not run.capsule or not run.host:
            return False
        host = await self.host(run.host)
        at_end = asyncio.Event()

        async def reached_end() -> jobs.CapsuleState:  # asked once a read came short
            at_end.set()
            return jobs.CapsuleState("running")

        info = adopt.info_of(run)
        await jobs.follow(host, self.store, run.id, run.capsule, regex=action.metrics_regex(),
                          poll=0, inspect_every=0, stop=at_end, inspector=reached_end,
                          log_path=info["log"] if info else None)
        return True

    async def attach(self, ids: Iterable[str] | None = None) -> list[str]:
        """Attach to every live run (of ``ids``) and follow them until they end."""
        runs = [r for r in self.store.live_runs() if ids is None or r.item_id in set(ids)]
        behind = [r for r in self.logs_behind() if ids is None or r.item_id in set(ids)]
        await asyncio.gather(*(self.attach_run(r) for r in runs),
                             self._reconciling(follow=True, ids=ids),
                             self.catch_up_logs(follow=True) if behind else asyncio.sleep(0))
        return [r.id for r in runs + behind]

    async def reconcile(self, *, hosts: Iterable[str] | None = None, follow: bool = False
                        ) -> list[RunChange]:
        """Re-derive each live run from its host. Returns the runs whose state changed.

        Runs whose host is unreachable are left as they are (reported as unknown).
        """
        changes: list[RunChange] = []
        for run in self.store.live_runs():
            if hosts is not None and run.host not in set(hosts):
                continue
            try:
                self.plan.item(run.item_id)
            except SpecdeckError:
                continue  # the item left the plan; keep its history untouched
            try:
                await self._reconcile_run(run, follow=follow)
            except HostUnreachable as e:
                changes.append(RunChange(run.id, run.item_id, run.state, "unknown",
                                         reason=str(e)))
                continue
            after = self.store.run(run.id)
            if after.state != run.state:
                changes.append(RunChange(run.id, run.item_id, run.state, after.state,
                                         exit_code=after.exit_code, signal=after.signal,
                                         error=after.error))
                self.emit(Notice(run.item_id, f"{run.item_id}: run {run.id} "
                                 f"{after.state} while specdeck was away"))
        await self._reconciling(follow=False, hosts=hosts)  # what outlives ended runs
        await self.catch_up_logs(hosts=hosts)
        if self.plan.notify:
            await self.alerts.catch_up(self.hosts, self.host)
        return changes

    async def _reconciling(self, *, follow: bool, ids: Iterable[str] | None = None,
                           hosts: Iterable[str] | None = None) -> None:
        """Each item's :meth:`Action.reconciling` hook (of ``ids``; on ``hosts``)."""
        ids = set(ids) if ids is not None else None
        hosts = frozenset(hosts) if hosts is not None else None
        for item in self.plan.items:
            action = self.action(item) if ids is None or item.id in ids else None
            if action is not None:
                await action.reconciling(_Context(self, item, None, None), follow=follow,
                                         hosts=hosts)

    async def _reconcile_run(self, run: "Run", *, follow: bool) -> str:
        item = self.plan.item(run.item_id)
        action = self.run_action(item, run)
        detached = None if action is None else action.detached  # None: no action any more
        host = ctx = st = capsule = None
        if detached:
            host = await self.host(run.host)
            ctx = _Context(self, item, host, run.id)
            st = await action.inspect(ctx, host, run)
            capsule = run.capsule or jobs.capsule_path(host, run.id)
        do = life.settle(self.store, self.emit, run, detached=detached, st=st, capsule=capsule,
                         me=self.owner, here=run.id in self._in_process)
        if do == life.FOLLOW and follow and detached:
            return await self.attach_run(self.store.run(run.id))
        if do == life.FOLLOW and follow:  # in another specdeck: its log as that one stores it
            return await self._follow_owned(item, run)
        if do != life.FINISH:
            return self.statuses()[item.id]
        # Ended (or lost) while nobody followed: drain the log, then finish.
        run = self.store.run(run.id)
        work = action.follow(ctx, host, run, lambda ls: None)
        st = await self._with_metric_files(item, action, host, run.id, work)
        return await self._finish(item, action, host, run.id, st)

    async def _follow_owned(self, item: Item, run: "Run") -> str:
        """Follow an in-process run that another specdeck owns (its relay, its venv): show
        its log as that process stores it, until it records the end (or dies)."""
        run_id = run.id
        self.emit(RunStarted(item.id, run_id, run.host, run.pid, attached=True))
        shown = self.store.run(run_id).log_offset or 0
        while True:
            cur = self.store.run(run_id)
            if (cur.log_offset or 0) > shown:
                data = self.store.log_bytes(run_id, shown)
                cut = data.rfind(b"\n") + 1
                if cut:
                    self.emit(LogLinesReceived(item.id, run_id,
                                               data[:cut].decode("utf-8", "replace").splitlines()))
                    shown += cut
            if not cur.live:
                self.emit(RunEnded(item.id, run_id, cur.state, cur.exit_code,
                                   cur.signal, cur.error))
                return self.statuses()[item.id]
            if life.owner_alive(cur.owner) is False:
                return self._end(item, run_id, life.INTERRUPTED, error=life.OWNER_GONE)
            await asyncio.sleep(max(self.poll, 0.1))

    async def _stop_in_process(self, item: Item, run: "Run", grace_s: float) -> Outcome:
        """Cancel an in-process action (a relay keeps its .part: a rerun resumes)."""
        run_id = run.id
        work = self._in_process.get(run_id)
        if work is None and life.owner_alive(run.owner) is False:
            # its specdeck died (killed, laptop closed): nothing runs any more
            self._end(item, run_id, life.INTERRUPTED, error="the specdeck running it is gone")
            run = self.store.run(run_id)
            return life.outcome_of_run(run)
        if work is None:
            raise SpecdeckError(
                f"run {run_id} runs inside another specdeck (pid {run.pid}, "
                f"{run.owner})", hint="stop that specdeck (Ctrl-C or q in its console)")
        self._stopping.add(run_id)
        self.store.journal("stop_requested", f"stop {run_id} (in-process)", item_id=item.id,
                           run_id=run_id)
        work.cancel()
        deadline = time.monotonic() + life.cancel_wait_s(grace_s)
        while self.store.run(run_id).live:
            if time.monotonic() > deadline:
                raise SpecdeckError(f"run {run_id} did not end {grace_s:g} s after its cancel")
            await asyncio.sleep(0.05)
        return life.outcome_of_run(self.store.run(run_id))

    DRAIN_TIMEOUT_S = 120.0

    async def _drain(self, item: Item, action: Action, host: Host, run: "Run",
                     st: jobs.CapsuleState) -> None:
        """Store the rest of an ended run's log (exactly once) before its end is recorded:
        a run stopped while nobody followed it keeps every line it wrote."""
        if not run.capsule:
            return

        async def ended() -> jobs.CapsuleState:
            return st

        ctx = _Context(self, item, host, run.id)
        try:
            await asyncio.wait_for(ctx.follow_log(host, run, regex=action.metrics_regex(),
                                                  inspector=ended), self.DRAIN_TIMEOUT_S)
        except asyncio.TimeoutError:
            self._log_behind(run, f"the end of its log could not be read from {run.host} "
                             f"within {self.DRAIN_TIMEOUT_S:g} s")
            self.emit(Notice(item.id, f"{item.id}: the end of run {run.id}'s log could not "
                             f"be read from {run.host} (`specdeck logs` has what was stored; "
                             "`status` or `attach` stores the rest later)", "warning"))

    # -- logs left behind ----------------------------------------------------------------
    def _log_behind(self, run: "Run", why: str) -> None:
        """Journal that a run's stored log may stop short of its host's (the host's log is
        the truth): :meth:`catch_up_logs` stores the rest, whatever the run's end."""
        self.store.journal("log_behind", f"its stored log stops at line {run.log_lines}: {why}",
                           item_id=run.item_id, run_id=run.id, host=run.host,
                           data={"offset": run.log_offset})

    def logs_behind(self) -> list["Run"]:
        """Runs whose stored log was journaled behind their host's and not caught up since."""
        return self.store.logs_behind()

    async def catch_up_logs(self, *, hosts: Iterable[str] | None = None,
                            follow: bool = False) -> list[str]:
        """Store what a run's host log holds beyond the stored offset (exactly once, its
        metrics with it) for every run :meth:`logs_behind` names, whatever state its run
        ended in; a run whose command still runs is followed to its end when ``follow``
        (``attach``), else left for later. Returns the ids of the runs caught up."""
        done = []
        for run in self.logs_behind():
            if run.live or not run.capsule or not run.host or (
                    hosts is not None and run.host not in set(hosts)):
                continue  # a live run's follower stores it; a capsule-less one has no log
            try:
                item = self.plan.item(run.item_id)
            except SpecdeckError:
                continue
            action = self.run_action(item, run)
            if action is None or not action.detached:
                continue
            try:
                host = await self.host(run.host)
                ctx = _Context(self, item, host, run.id)
                st = await action.inspect(ctx, host, run)
                if st.state == "running" and not follow:
                    continue  # its torn last line is not final yet: attach follows it
                before = run.log_lines
                if st.state == "running":
                    self.emit(Notice(item.id, f"{item.id}: run {run.id} ended {run.state} "
                                     f"in specdeck, but its command still runs on {run.host}: "
                                     "following its log to the end"))
                    st = await ctx.follow_log(host, run, regex=action.metrics_regex(),
                                              inspector=partial(action.inspect, ctx, host, run))
                else:
                    await self._drain(item, action, host, run, st)
            except HostUnreachable:
                continue
            except Exception as e:  # noqa: BLE001 - the store may still be full: next time
                self.emit(Notice(item.id, f"{item.id}: run {run.id}'s log could not be caught "
                                 f"up yet: {describe_fault(e)}", "warning"))
                continue
            after = self.store.run(run.id)
            msg = life.caught_up(run.host, before, after, st)
            self.store.journal("log_caught_up", msg, item_id=item.id, run_id=run.id,
                               host=run.host)
            self.emit(Notice(item.id, f"{item.id}: run {run.id}: {msg}"))
            latest = self.store.latest_run(item.id)
            if (self.statuses()[item.id] == life.ITEM_WHILE_LIVE and latest.id == run.id):
                # its end was stored but not its item's (the same fault): say it now
                self.set_status(item.id, life.RUN_TO_ITEM[after.state],
                                life.ended_reason(run.id, after.state, None), run.id)
            done.append(run.id)
        return done

    async def stop_run(self, run_id: str, *, grace_s: float = 30.0) -> Outcome:
        """Stop a live run: SIGTERM to its group, ``grace_s``, SIGKILL. Ends it as stopped."""
        run = self.store.run(run_id)
        if run is None or not run.live:
            raise SpecdeckError(f"run {run_id} is not live")
        item = self.plan.item(run.item_id)
        action = self.run_action(item, run)
        if action is not None and not action.detached:
            return await self._stop_in_process(item, run, grace_s)
        self._stopping.add(run_id)
        self.store.update_run(run_id, error=life.STOP_REQUESTED)
        self.store.journal("stop_requested", f"stop {run_id} (grace {grace_s}s)",
                           item_id=item.id, run_id=run_id, host=run.host)
        if run.state == life.STARTING:  # never mark lost what its start is creating
            run = await self._launched(run, grace_s)
            if not run.live:
                return life.outcome_of_run(run)
            action = self.run_action(item, run)
        host = await self.host(run.host)
        ctx = _Context(self, item, host, run_id)
        await self.action(item).stopping(ctx, run)  # the item's, for an adopted run too
        if run.capsule and self.plan.notify:
            with contextlib.suppress(Exception):  # the stop matters, not how it is told
                await notify.mark_stopping(host, run.capsule)
        st = await action.stop(ctx, host, run, grace_s)
        if st.state == "running":
            raise SpecdeckError(f"run {run_id} on {run.host} did not stop after SIGKILL")
        await self._drain(item, action, host, self.store.run(run_id), st)
        # Finish it here; a follower (this process's or another's) finishing it too is a
        # no-op, since ending a run is idempotent in the store.
        await self._finish(item, action, host, run_id, st)
        return life.outcome_of_run(self.store.run(run_id))
