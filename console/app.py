"""The console app: wiring only.

Widgets post messages and receive attributes; this module routes one to the other and starts
App-owned workers (:meth:`SpecdeckApp._work`) that run :mod:`console.services` coroutines,
which call core and post result messages. Runner events reach the app through
:class:`console.bridge.EventBridge` (the runner's ``emit``). One
``Worker.StateChanged`` handler turns every worker failure into a notification.

The store has one owning thread: the App's event loop runs on the thread that opened it
(:func:`run_console`, or the test), and every store call happens on that loop.

Quitting never stops runs: detached runs keep going in their capsules on the hosts; the
app journals which ones and :func:`run_console` prints them once the screen is restored.
Runs inside the console (a relay) would be interrupted: quitting asks first.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Iterable

from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from console import messages as m
from console.bridge import EventBridge
from console.commands import COMMANDS, help_sections
from console.screens.adopt import AdoptModal
from console.screens.confirm import ConfirmModal, run_text, stop_text
from console.screens.help import HelpScreen, glyph_sections
from console.screens.journal import JournalScreen, meanwhile_summary
from console.screens.report import ReportScreen
from console.services import Services
from console.widgets.gpu_pane import GpuPane
from console.widgets.hosts_bar import HostsBar
from console.widgets.item_detail import ItemDetail
from console.widgets.keys_footer import KeysFooter
from console.widgets.log_pane import LogPane
from console.widgets.metrics_pane import MetricsPane
from console.widgets.plan_list import PlanPane
from console.widgets.tau_table import TauPane
from core.errors import SpecdeckError
from core.hosts import bulk
from core.plans.plan import Plan, params_summary
from core.runs import life
from core.state.records import Run
from core.session import Session, open_store

STOP_GRACE_S = 30.0
MARK_ASKS = {
    "done": ("Mark done without running?",
             "{id} is {where}. Mark it done without running it? Items that need it can then "
             "run (needed by: {dependents}); u undoes.", "Mark done"),
    "skipped": ("Skip without running?",
                "{id} is {where}. Skip it? Nothing runs it; items that need its output wait "
                "(needed by: {dependents}), items only `after:` it go ahead; u undoes.", "Skip"),
}
"""The confirmations of d and s on an action item: title, body, confirm button."""


def _until_closed(handler):
    """Drop a late message once the main screen is gone (a worker's result or a runner event
    that lands while the app shuts down) instead of failing on the missing widgets."""

    @functools.wraps(handler)
    def wrapper(self: "SpecdeckApp", message):
        try:
            return handler(self, message)
        except NoMatches:
            if self._main_screen is not None and self._main_screen.is_attached:
                raise
            return None

    return wrapper
PANES = {"plan": "#plan-options", "log": "#log", "metrics": "#metrics",
         "tau": "#tau-table", "detail": "#detail", "gpus": "#gpus"}
"""Each pane's focus target, in the order of the number keys 1-6."""
BOXES = {"plan": "#plan", "detail": "#detail", "log": "#logpane", "metrics": "#metrics",
         "tau": "#tau", "gpus": "#gpus"}
"""Each pane's outer box (what is shown, hidden, sized or zoomed)."""
CYCLE = ("plan", "detail", "log", "metrics", "tau", "gpus")
"""The focus cycle (tab / shift+tab): left to right, top to bottom."""
TAB_LABELS = {"plan": "plan", "log": "log", "metrics": "curves", "tau": "tau", "detail": "item",
              "gpus": "gpus"}
RIGHT = ("log", "metrics", "tau", "gpus")
"""The panes of the right-hand column (on a small terminal, the one beside the plan)."""
WIDE = (110, 32)
"""The smallest terminal (columns, rows) that shows every pane at once; below it the plan
shares the screen with one pane at a time, chosen by focus (tabs on top say which)."""
HEARTBEAT_S = 5.0
"""Seconds between the console's marks in the store (see Services.open_session)."""


class SpecdeckApp(App[int]):
    """The specdeck console. Build it with :func:`make_app`."""

    CSS_PATH = str(Path(__file__).with_name("app.tcss"))  # absolute: subclasses live elsewhere
    TITLE = "specdeck"
    BINDINGS = [
        Binding("r", "run_item", "Run"),
        Binding("R", "run_again", "Run again", show=False),
        Binding("A", "run_all", "Run all"),
        Binding("x", "stop_run", "Stop"),
        Binding("a", "adopt", "Adopt", show=False),
        Binding("e", "journal", "Journal"),
        Binding("c", "report", "Report", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("z", "zoom", "Zoom"),
        Binding("tab", "cycle_pane(1)", "Next pane", show=False, priority=True),
        Binding("shift+tab", "cycle_pane(-1)", "Prev pane", show=False, priority=True),
        Binding("escape", "unzoom", "Restore", show=False),
        Binding("ctrl+r", "reload", "Reload", show=False),
        *[Binding(str(i), f"focus_pane('{p}')", f"Focus {p}", show=False)
          for i, p in enumerate(PANES, 1)],
        Binding("q", "quit", "Quit"),
    ]

    def notify(self, message: str, *, title: str = "", **kwargs) -> None:
        """Every notification passes the terminal sanitizer (messages quote hosts' output,
        file names, plan text) and is shown without markup interpretation; the commands it
        suggests run as printed (:func:`console.cli.conventions.runnable`)."""
        from console.cli.conventions import runnable
        from core.text import sanitize

        kwargs.setdefault("markup", False)
        super().notify(runnable(sanitize(str(message), max_len=2000)),
                       title=sanitize(str(title), max_len=200), **kwargs)

    def action_help_quit(self) -> None:
        """ctrl+c never quits (a reflex would leave in the middle of something): it says in
        plain words which keys do (Textual's own message is markup, and notifications here
        are shown as plain text)."""
        keys = [key for key, active in self.active_bindings.items()
                if active.binding.action in ("quit", "app.quit")]
        self.notify(f"Press {' or '.join(keys) or 'q'} to quit (runs on hosts keep going)",
                    title="Do you want to quit?")

    def __init__(self, session: Session, bridge: EventBridge, *,
                 probe_hosts: bool = True, reconcile: bool = True, gpu_every: float = 15.0,
                 autorun: bool = False):
        super().__init__()
        self._autorun = autorun
        self.session = session
        self.plan = session.plan
        self.runner = session.runner
        self.bridge = bridge
        self.services = Services(session, self.post_message, flush_logs=bridge.flush)
        self.statuses = session.statuses()
        self.selected: str | None = None
        self.pinned: dict[str, str] = {}
        """item id -> run id drawn on the metrics chart whatever is selected."""
        self.meanwhile: list[str] = []
        self.keep_going: list[dict] = []
        """Live runs left running when the console quit (run_console prints them)."""
        self._probe_hosts, self._reconcile, self._gpu_every = probe_hosts, reconcile, gpu_every
        self._metrics_runs: set[str] = set()
        self.tau_step: int | None = None
        """The training step the tau pane is filtered to (None: every eval result)."""
        self._metrics_dirty = False
        self._arm_items = {it.id for it in self.plan.items if it.arm}
        """Items run for an arm: their log lines (a loss) redraw the arms' lines."""
        self._arms_dirty = False
        self._started = False
        self._main_screen: Screen | None = None
        self._opening = True
        """Until SessionOpened: run ends and notices come from reconcile and are told in
        one summary instead of one toast each."""
        self.current = "plan"
        """The pane last focused (on a small terminal, the one shown beside the plan)."""
        self.beside = "log"
        """On a small terminal: the right-hand pane shown (log, metrics or tau)."""
        self.zoomed: str | None = None
        """The pane that fills the screen (z), or None."""
        self.following = False
        """Follow mode (A): the cursor and log follow each run as it starts; any key stops."""
        self._layout_key: tuple | None = None
        """What the layout was last computed for (see _apply_layout)."""

    # -- layout --------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield HostsBar(self.plan.name, list(self.plan.hosts), id="hosts")
        yield Static("", id="tabs")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield PlanPane(self.plan, self.statuses, id="plan")
                yield ItemDetail(self.plan, id="detail")
            with Vertical(id="right"):
                yield LogPane(id="logpane")
                yield MetricsPane(id="metrics")
                yield TauPane(id="tau")
                yield GpuPane(id="gpus")
        yield KeysFooter()

    def on_mount(self) -> None:
        self._main_screen = self.screen
        self._leave_on_signals()
        self.bridge.bind(self.post_message)
        for pane, title in (("#plan", "1 plan"), ("#detail", "5 item"), ("#logpane", "2 log"),
                            ("#metrics", "3 curves"), ("#tau", "4 tau vs baseline"),
                            ("#gpus", "6 gpus")):
            self.query_one(pane).border_title = title
        live = self.session.live_runs()
        for run in live:  # ▶, and no u (undo) while its run lives
            self.query_one(PlanPane).set_live(run.item_id, True)
        if live:  # reopened: the cursor on the most recent live run
            self.query_one(PlanPane).select(live[-1].item_id)
        self.query_one("#plan-options").focus()
        self.watch(self.screen, "focused", self._focus_moved, init=False)
        self._apply_layout()

    # -- layout --------------------------------------------------------------------------
    @property
    def compact(self) -> bool:
        """Too small for every pane at once (see WIDE)."""
        w, h = self.size
        return w < WIDE[0] or h < WIDE[1]

    def _pane_of(self, widget: Widget | None) -> str | None:
        boxes = {self.query_one(sel): name for name, sel in BOXES.items()}
        while widget is not None:
            if widget in boxes:
                return boxes[widget]
            widget = widget.parent if isinstance(widget.parent, Widget) else None
        return None

    def _focus_moved(self, widget: Widget | None) -> None:
        pane = self._pane_of(widget)
        if pane is not None and pane != self.current:
            self._set_current(pane)
            self._apply_layout()

    def _set_current(self, pane: str) -> None:
        self.current = pane
        if pane in RIGHT:
            self.beside = pane

    def _shows(self, name: str) -> bool:
        """Whether pane ``name`` has something to show (empty curves and tau give way)."""
        if name == "metrics":
            return self.query_one(MetricsPane).has_curves
        if name == "tau":
            c = self.query_one(TauPane).comparison
            return bool(c is not None and c.drafters)
        if name == "gpus":  # asked for (6, tab): shown, saying what it has (no nvidia-smi...)
            return self.query_one(GpuPane).has_gpus or self.current == "gpus"
        return True

    def _gpus_tabbed(self) -> bool:
        """The GPUs pane has a tab and a place in the focus cycle once a host was sampled
        (with GPU polling off it has nothing to say; 6 still shows it)."""
        return bool(self.query_one(GpuPane).samples) or self.current == "gpus"

    def _apply_layout(self) -> None:
        """Share the screen among the panes by the terminal's size and what they hold.

        Wide: the plan and the item on the left; on the right the log, and the curves and
        the tau table when they have something (each sized by its content, the log taking
        the rest). Small: the plan and one other pane (the focused one, tabs on top). Zoomed:
        the zoomed pane alone.
        """
        if self._main_screen is None:
            return
        w, h = self.size
        shown: set[str]
        if self.zoomed:
            shown = {self.zoomed}
        elif self.compact:
            shown = {"detail" if self.current == "detail" else "plan", self.beside}
        else:
            shown = {"plan", "detail", "log"} | {p for p in ("metrics", "tau", "gpus")
                                                 if self._shows(p)}
        pane = self.query_one(TauPane)
        tau_need = 4 + max(len(pane.ordered_rows) + 1, pane.query_one("#tau-bars").rows_needed)
        gpus_need = 2 + self.query_one(GpuPane).rows_needed
        key = (w, h, frozenset(shown), self.current, self.zoomed, tau_need, gpus_need)
        if key == self._layout_key:  # nothing moved: no style change, no layout pass
            return
        self._layout_key = key
        for name, sel in BOXES.items():
            box = self.query_one(sel)
            box.display = name in shown
        left, right = self.query_one("#left"), self.query_one("#right")
        left.display = bool(shown & {"plan", "detail"})
        right.display = bool(shown & set(RIGHT))
        if self.zoomed or not (left.display and right.display):
            left.styles.width = "1fr"
        else:
            left.styles.width = max(30, min(60, int(w * (0.4 if self.compact else 0.3))))
        detail = self.query_one("#detail")
        if "plan" in shown and "detail" in shown:  # under the plan: as tall as its content
            detail.styles.height = "auto"
            detail.styles.max_height = max(8, int((h - 2) * 0.55))
        else:
            detail.styles.height = "1fr"
            detail.styles.max_height = None
        metrics, tau = self.query_one("#metrics"), self.query_one("#tau")
        metrics.styles.height = "1fr"
        if "tau" in shown and len(shown & set(RIGHT)) > 1:
            tau.styles.height = max(8, min(tau_need, int((h - 2) * 0.4)))
        else:
            tau.styles.height = "1fr"
        gpus = self.query_one("#gpus")
        if "gpus" in shown and len(shown & set(RIGHT)) > 1:
            gpus.styles.height = max(4, min(gpus_need, int((h - 2) * 0.35)))
        else:
            gpus.styles.height = "1fr"
        self.screen.set_class(self.compact and not self.zoomed, "-compact")
        footer = self.query_one(KeysFooter)
        footer.compact = self.compact  # more keys fit on a narrow footer
        footer.tabs_name_keys = self.compact and not self.zoomed  # (the tabs say z and ?)
        self.call_after_refresh(footer.fit)
        tabs = self.query_one("#tabs", Static)
        tabs.display = self.compact and not self.zoomed
        if tabs.display:
            t = Text(no_wrap=True, overflow="ellipsis")
            for i, name in enumerate(PANES, 1):
                if name == "gpus" and not self._gpus_tabbed():
                    continue
                style = ("reverse bold" if name == self.current else
                         "bold" if name in shown else "bright_black")
                t.append(f" {i} {TAB_LABELS[name]} ", style=style)
            t.append("  tab: next pane · z: zoom · ?: help", style="bright_black")
            tabs.update(t, layout=False)

    def _show_pane(self, name: str) -> None:
        """Make pane ``name`` visible (on a small terminal, beside the plan), then focus it."""
        if not (self.compact or self.zoomed or self._shows(name) or name == "gpus"):
            self.notify({"metrics": "no curves: this item's runs logged no metrics (p pins "
                                    "another run's curves)",
                         "tau": "no eval results yet"}.get(name, f"{name} is empty"),
                        severity="warning")
            return
        self._set_current(name)
        if self.zoomed and self.zoomed != name:
            self.zoomed = name
        self._apply_layout()
        target = self.query_one(PANES[name])
        self.call_after_refresh(target.focus)

    def _freeze_heap(self) -> None:
        """Move the start-up heap (modules, Textual's and our widgets, the plan, caches) out
        of the cyclic GC's sight: a full collection then walks only what was made since,
        instead of stopping the UI for 55-70 ms in the middle of a log flood (measured by
        bench/ui.py, where these pauses were the worst frame gaps)."""
        gc.freeze()

    def on_ready(self) -> None:
        """After the first frame: load the selected item, recover the session, load tau,
        probe hosts (all in workers, so that the first frame waits for none of them)."""
        self._started = True
        self._load_selected()
        self._work(self._open, "session", "session")
        self.set_timer(FREEZE_HEAP_AFTER, self._freeze_heap)
        if self._autorun:
            self.action_run_all()
        self._load_tau()
        if self._probe_hosts:
            for name in self.plan.hosts:
                self._work(partial(self.services.probe_host, name, gpu=bool(self._gpu_every)),
                           f"probe:{name}", f"host:{name}")
            if self._gpu_every:
                self.set_interval(self._gpu_every, self._poll_gpus)
        self.set_interval(1.0, self._refresh_metrics_if_dirty)
        self.set_interval(HEARTBEAT_S, self._heartbeat)

    def _heartbeat(self) -> None:
        if not self._opening:  # open_session marks first (it reads the previous mark)
            self.services.heartbeat()

    async def _open(self) -> None:
        live = await self.services.open_session(reconcile=self._reconcile)
        if self._reconcile:
            # only now, so that first connections do not reconcile a second time what
            # open_session just did
            self.runner.reconcile_on_reconnect = True
        for run in live if self._reconcile else ():
            self._work(partial(self.services.attach, run), f"follow:{run.id}", "follow")

    async def on_unmount(self) -> None:
        self.bridge.unbind()
        await self.session.close()

    # -- workers -------------------------------------------------------------------------
    def _work(self, work, name: str, group: str, *, exclusive: bool = False) -> Worker:
        """Start an App-owned async worker (workers of a removed widget would be cancelled).

        ``work`` is an async callable (a ``partial``), called when the worker starts, so a
        worker cancelled before it starts (``exclusive``) leaves no coroutine un-awaited.
        Workers are async on the app's loop, not threads: the runner is asyncio code and the
        store belongs to this thread.
        """
        return self.run_worker(work, name=name, group=group, exclusive=exclusive,
                               exit_on_error=False)

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        if event.state != WorkerState.ERROR:
            return
        err = event.worker.error
        if isinstance(err, SpecdeckError):
            self.notify(err.message + (f"\n{err.hint}" if err.hint else ""), title=err.title,
                        severity="error", timeout=10)
        else:
            self.notify(f"{type(err).__name__}: {err}", title=f"{event.worker.name} failed",
                        severity="error", timeout=10)

    def _poll_gpus(self) -> None:
        for name in self.services.connected_hosts():
            self._work(partial(self.services.sample_gpu, name), f"gpu:{name}", f"gpu:{name}",
                       exclusive=True)

    def _load_selected(self) -> None:
        item_id = self.selected
        if item_id is None or not self._started:
            return
        self._work(partial(self.services.load_detail, item_id), "detail", "detail",
                   exclusive=True)
        self._work(partial(self.services.load_log, item_id), "log", "log", exclusive=True)
        self._load_metrics()

    def _load_metrics(self) -> None:
        self._metrics_dirty = False
        self._work(partial(self.services.load_metrics, self.selected, list(self.pinned.values())),
                   "metrics", "metrics", exclusive=True)

    def _load_tau(self, *, force: bool = False, step: int | None | bool = False) -> None:
        """Reload the tau pane (``step``: filter to that step, None: no filter; default:
        keep the current one)."""
        step = self.tau_step if step is False else step
        self._work(partial(self.services.load_tau, force=force, step=step), "tau", "tau",
                   exclusive=True)

    def _refresh_metrics_if_dirty(self) -> None:
        if self._metrics_dirty:
            self._load_metrics()
        if self._arms_dirty:
            self._arms_dirty = False
            self._work(self.services.load_arms, "arms", "arms", exclusive=True)

    # -- widgets -> app ------------------------------------------------------------------
    @on(PlanPane.ItemSelected)
    def _item_selected(self, event: PlanPane.ItemSelected) -> None:
        self.selected = event.item_id
        self._load_selected()

    @on(PlanPane.InspectRequested)
    def _inspect_requested(self, event: PlanPane.InspectRequested) -> None:
        self.selected = event.item_id
        self.action_inspect()

    @on(PlanPane.MarkRequested)
    def _mark_requested(self, event: PlanPane.MarkRequested) -> None:
        """d and s on an action item ask first (each changes what may run next); u undoes."""
        item = self.plan.item(event.item_id)
        if event.status in MARK_ASKS and not item.manual:
            title, body, confirm = MARK_ASKS[event.status]
            needed_by = [it.id for it in self.plan.items if item.id in it.needs]
            where = f"a {item.action.kind} action" + (f" on {item.action.host}"
                                                      if item.action.host else "")
            self.push_screen(ConfirmModal(title, body.format(
                id=item.id, where=where, dependents=", ".join(needed_by) or "none"),
                confirm=confirm), lambda yes: yes and self._mark(item.id, event.status))
            return
        self._mark(item.id, event.status)

    def _mark(self, item_id: str, status: str) -> None:
        self._work(partial(self.services.mark, item_id, status), f"mark:{item_id}", "mark")

    @on(PlanPane.PinToggled)
    def _pin_toggled(self, event: PlanPane.PinToggled) -> None:
        if event.item_id in self.pinned:
            del self.pinned[event.item_id]
        else:
            run = self.services.latest_run(event.item_id)
            if run is None:
                self.notify(f"{event.item_id} has no run to pin yet", severity="warning")
                return
            self.pinned[event.item_id] = run.id
        self.query_one(PlanPane).set_pinned(event.item_id, event.item_id in self.pinned)
        self._load_metrics()

    @on(MetricsPane.TauStepRequested)
    def _tau_step_requested(self, event: MetricsPane.TauStepRequested) -> None:
        self._load_tau(force=True, step=event.step)

    # -- runner events (bridge) -> widgets -----------------------------------------------
    @on(m.ItemStatusChanged)
    @_until_closed
    def _status_changed(self, msg: m.ItemStatusChanged) -> None:
        self.statuses[msg.item_id] = msg.status
        self.query_one(PlanPane).set_status(msg.item_id, msg.status)
        if self.selected and (msg.item_id == self.selected
                              or msg.item_id in self.plan.item(self.selected).deps):
            self._work(partial(self.services.load_detail, self.selected), "detail", "detail",
                       exclusive=True)

    @on(m.RunStarted)
    @_until_closed
    def _run_started(self, msg: m.RunStarted) -> None:
        self.query_one(PlanPane).set_live(msg.item_id, True)
        plan_pane = self.query_one(PlanPane)
        if (self.following and msg.item_id != self.selected and not msg.attached
                and msg.item_id in plan_pane.shown):  # (a filter may hide it)
            plan_pane.select(msg.item_id)  # ItemSelected loads its detail, log and curves
            self.selected = msg.item_id
        self.query_one(LogPane).run_started(msg.item_id, msg.run_id, msg.host)
        if msg.item_id == self.selected:
            self._work(partial(self.services.load_detail, msg.item_id), "detail", "detail",
                       exclusive=True)
            self._load_metrics()

    @on(m.RunEnded)
    @_until_closed
    def _run_ended(self, msg: m.RunEnded) -> None:
        self.query_one(PlanPane).set_live(msg.item_id, False)
        if not self._opening:
            self.services.heartbeat()  # this end was shown: the next console need not tell it
        # the last progress line ("verifying ...") would read as still going; the run's
        # log keeps the whole history
        self.query_one(ItemDetail).set_progress(msg.item_id, "")
        pane = self.query_one(LogPane)
        if pane.run_id == msg.run_id:
            pane.set_stream(msg.state)
        if msg.state != life.SUCCEEDED and not self._opening:
            how = (f"signal {msg.signal}" if msg.signal else
                   f"exit {msg.exit_code}" if msg.exit_code is not None else "no exit status")
            self.notify(f"{msg.item_id}: run {msg.run_id} {msg.state} ({how})"
                        + (f"\n{msg.error}" if msg.error else ""), title="Run ended",
                        severity="warning" if msg.state == life.STOPPED else "error")
        self._load_tau()
        if msg.run_id in self._metrics_runs:
            self._metrics_dirty = True

    @on(m.LogLinesArrived)
    @_until_closed
    def _log_lines(self, msg: m.LogLinesArrived) -> None:
        self.query_one(LogPane).append(msg.run_id, msg.lines, msg.dropped)
        if msg.item_id == self.selected or msg.run_id in self._metrics_runs:
            self._metrics_dirty = True
        if msg.item_id in self._arm_items:
            self._arms_dirty = True

    @on(m.LogStreamChanged)
    @_until_closed
    def _stream_changed(self, msg: m.LogStreamChanged) -> None:
        pane = self.query_one(LogPane)
        if pane.item_id == msg.item_id:
            pane.set_stream(msg.state)

    @on(m.HostStateChanged)
    @_until_closed
    def _host_changed(self, msg: m.HostStateChanged) -> None:
        self.query_one(HostsBar).set_state(msg.host, msg.state, msg.reason)
        self.query_one(LogPane).host_state(msg.host, msg.state)

    @on(m.NoticePosted)
    @_until_closed
    def _notice(self, msg: m.NoticePosted) -> None:
        if self._opening:
            return
        self.notify(msg.message, severity={"error": "error", "warning": "warning"}.get(
            msg.level, "information"))

    @on(m.ProgressReported)
    @_until_closed
    def _progress(self, msg: m.ProgressReported) -> None:
        self.query_one(ItemDetail).set_progress(msg.item_id, msg.message)

    # -- worker results -> widgets -------------------------------------------------------
    @on(m.SessionOpened)
    @_until_closed
    def _session_opened(self, msg: m.SessionOpened) -> None:
        self._opening = False
        if msg.changes:  # reconcile drained logs and ended runs: show the selected item anew
            self._load_selected()
        self.meanwhile, title, all_ok = meanwhile_summary(msg.changes, msg.meanwhile)
        if self.meanwhile:
            lines = self.meanwhile
            self.notify("\n".join(lines[:6]) + ("\n…" if len(lines) > 6 else "")
                        + "\n(e: journal)", title=title,
                        severity="information" if all_ok else "warning", timeout=15)

    @on(m.ItemDetailLoaded)
    @_until_closed
    def _detail_loaded(self, msg: m.ItemDetailLoaded) -> None:
        if msg.item_id == self.selected:
            item = self.plan.item(msg.item_id)
            self.query_one(ItemDetail).show(msg.item_id, msg.status, msg.runs, msg.live,
                                            {n: self.statuses.get(n, "pending")
                                             for n in item.deps},
                                            msg.history[-1].reason if msg.history else "",
                                            watcher=msg.watcher, costs=msg.costs)

    @on(m.CheckFinished)
    @_until_closed
    def _check_finished(self, msg: m.CheckFinished) -> None:
        self.query_one(ItemDetail).set_check(msg.item_id, msg.state, msg.reason)

    @on(m.LogLoaded)
    @_until_closed
    def _log_loaded(self, msg: m.LogLoaded) -> None:
        if msg.item_id == self.selected:
            self.query_one(LogPane).show_run(msg.item_id, msg.run, msg.lines)

    @on(m.MetricsLoaded)
    @_until_closed
    def _metrics_loaded(self, msg: m.MetricsLoaded) -> None:
        self._metrics_runs = {r["run_id"] for r in msg.runs}
        pane = self.query_one(MetricsPane)
        had = pane.has_curves
        pane.set_runs(msg.runs)
        if pane.has_curves != had:
            self._apply_layout()

    @on(m.TauLoaded)
    @_until_closed
    def _tau_loaded(self, msg: m.TauLoaded) -> None:
        self.tau_step = msg.step
        self.query_one(TauPane).set_comparison(msg.comparison, step=msg.step, costs=msg.costs)
        self._apply_layout()

    @on(m.ArmsLoaded)
    @_until_closed
    def _arms_loaded(self, msg: m.ArmsLoaded) -> None:
        self.query_one(PlanPane).set_arm_figures(msg.figures)
        self.query_one(TauPane).set_arms(msg.comparison)

    @on(m.GpuSampled)
    @_until_closed
    def _gpu_sampled(self, msg: m.GpuSampled) -> None:
        self.query_one(HostsBar).set_gpus(msg.host, msg.gpus)
        pane = self.query_one(GpuPane)
        pane.idle_util = self.plan.telemetry.idle_util
        pane.set_sample(msg.host, msg.sample, msg.history)
        self._apply_layout()

    @on(m.JournalLoaded)
    @_until_closed
    def _journal_loaded(self, msg: m.JournalLoaded) -> None:
        self.push_screen(JournalScreen(self.meanwhile, msg.events))

    @on(m.ReportLoaded)
    @_until_closed
    def _report_loaded(self, msg: m.ReportLoaded) -> None:
        self.push_screen(ReportScreen(msg.report, msg.since_seen))

    # -- actions (keys, palette) ---------------------------------------------------------
    def action_inspect(self) -> None:
        """Show the selected item's detail (enter): never runs anything."""
        if self.selected:
            self._show_pane("detail")

    def action_run_item(self, again: bool = False) -> None:
        """Run the selected item after a confirmation naming what starts where."""
        item_id = self.selected
        if item_id is None:
            return
        item, status = self.plan.item(item_id), self.statuses.get(item_id, "pending")
        if item.manual:
            self.notify(f"{item_id} is a manual item: do it, then mark it done (d)")
            return
        if status == "in_progress" and self.services.live_run(item_id):
            self.notify(f"{item_id} is running; its log is on the right (x stops it)")
            return
        would = self.session.run_preview(item_id)
        title, body = run_text(item, params_summary(item), would.detached, would.attempt, status,
                               would.start_note)
        again = again or status in ("done", "skipped", "stopped")
        self.push_screen(ConfirmModal(title, body, confirm="Run"),
                         lambda yes: yes and self.start_item(item_id, again))

    def start_item(self, item_id: str, again: bool) -> None:
        self._work(partial(self.services.run_item, item_id, again=again), f"run:{item_id}",
                   "runs")

    def action_run_again(self) -> None:
        self.action_run_item(again=True)

    def action_run_all(self) -> None:
        """Run every item that can run, in dependency order (the plan's `run --all`); the
        cursor and the log follow each run as it starts until a key is pressed."""
        self.notify("running every item whose needs are done (manual items wait for you); "
                    "following each run as it starts: any key stops following")
        self._set_following(True)
        self._work(self._run_all, "run:all", "runs", exclusive=True)

    async def _run_all(self) -> None:
        try:
            await self.services.run_all()
        finally:
            self._set_following(False)

    def _set_following(self, on_: bool) -> None:
        self.following = on_
        if self._main_screen is not None and self._main_screen.is_attached:
            self.query_one("#plan").border_subtitle = (
                "following runs · any key stops" if on_ else "")

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and self.following:
            self._set_following(False)
        await super().on_event(event)
        if isinstance(event, events.Resize):  # (App._on_resize stops it: no on_resize)
            self._apply_layout()

    def action_stop_run(self) -> None:
        item_id = self.selected
        live = self.services.live_run(item_id) if item_id else None
        if live is None:
            self.notify(f"{item_id or 'nothing'}: no live run to stop", severity="warning")
            return
        self.push_screen(ConfirmModal("Stop run?", stop_text(live, STOP_GRACE_S), confirm="Stop"),
                         lambda yes: yes and self._work(
                             partial(self.services.stop_run, live.id, STOP_GRACE_S),
                             f"stop:{live.id}", "stop"))

    def action_adopt(self) -> None:
        """Adopt a run started outside specdeck (PID, Slurm job, tmux) as the item's run."""
        item_id = self.selected
        if item_id is None:
            return
        item = self.plan.item(item_id)
        if item.manual or self.services.live_run(item_id):
            self.notify(f"{item_id}: " + ("a manual item has no run to adopt" if item.manual
                                          else "already has a live run (x stops it)"),
                        severity="warning")
            return
        self.push_screen(AdoptModal(item_id, item.action.host or "?"),
                         lambda spec: spec and self._work(
                             partial(self.services.adopt, item_id, spec), f"adopt:{item_id}",
                             "runs"))

    def action_mark(self, status: str) -> None:
        if self.selected:
            self._mark_requested(PlanPane.MarkRequested(self.selected, status))

    def action_filter(self) -> None:
        self.query_one(PlanPane).action_filter()

    def action_pin(self) -> None:
        self.query_one(PlanPane).action_pin()

    def action_search_log(self) -> None:
        self.query_one(LogPane).action_search()

    def action_toggle_follow(self) -> None:
        self.query_one(LogPane).action_toggle_follow()

    def action_next_metric(self) -> None:
        self.query_one(MetricsPane).action_cycle(1)

    def action_tau_at_step(self) -> None:
        pane = self.query_one(MetricsPane)
        pane.focus()
        pane.action_tau_step()

    def action_sort_tau(self) -> None:
        self.query_one(TauPane).action_sort(1)

    def action_mark_drafter(self) -> None:
        self.query_one(TauPane).action_toggle_mark()

    def action_journal(self) -> None:
        self._work(partial(self.services.load_journal), "journal", "journal", exclusive=True)

    def action_report(self) -> None:
        self._work(partial(self.services.load_report), "report", "report", exclusive=True)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(help_sections() + glyph_sections()))

    def action_reload(self) -> None:
        self.statuses = self.services.statuses()
        for item_id, status in self.statuses.items():
            self.query_one(PlanPane).set_status(item_id, status)
        self._load_selected()
        self._load_tau()

    def action_zoom(self) -> None:
        """Make the focused pane fill the screen, or restore the layout."""
        if self.zoomed:
            self.zoomed = None
        else:
            self.zoomed = self._pane_of(self.screen.focused) or self.current
        self._apply_layout()
        focused = self.screen.focused
        if focused is not None:
            self.call_after_refresh(focused.scroll_visible, animate=False)

    def action_unzoom(self) -> None:
        if self.zoomed:
            self.zoomed = None
            self._apply_layout()
        elif self.current == "detail":  # escape in the item pane: back to the plan
            self._show_pane("plan")

    def action_cycle_pane(self, step: int) -> None:
        """Focus the next (or previous) pane in CYCLE, showing it if the layout hid it; on
        a wide terminal panes with nothing to show are skipped."""
        if self.screen is not self._main_screen:
            self.screen.focus_next() if step > 0 else self.screen.focus_previous()
            return
        i = CYCLE.index(self.current) if self.current in CYCLE else 0
        for k in range(1, len(CYCLE) + 1):
            name = CYCLE[(i + step * k) % len(CYCLE)]
            if name == "gpus" and not self._gpus_tabbed():
                continue
            if self.compact or self.zoomed or self._shows(name):
                self._show_pane(name)
                return

    def action_focus_pane(self, pane: str) -> None:
        self._show_pane(pane)

    async def action_quit(self) -> None:
        inproc = self.services.in_process_runs()
        if inproc:
            names = ", ".join(f"{r.item_id} ({r.id})" for r in inproc)
            self.push_screen(ConfirmModal(
                "Quit?", f"These runs happen inside this console and will be interrupted "
                f"(run them again to resume): {names}. Runs on hosts keep going.",
                confirm="Quit"), lambda yes: yes and self._leave())
            return
        self._leave()

    def _leave(self, code: int = 0) -> None:
        self.keep_going = self.services.close_session()
        self.exit(code)

    LEAVE_SIGNALS = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGHUP: 128 + signal.SIGHUP}
    """A kill or a closed terminal leaves as ``q`` does (the close journaled, runs on hosts
    kept going), exiting with the shell's status for that signal (143, 129)."""

    def _leave_on_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig, code in self.LEAVE_SIGNALS.items():
            try:
                loop.add_signal_handler(sig, partial(self._leave, code))
            except (ValueError, RuntimeError, NotImplementedError):
                pass  # not the main thread (tests): nothing to catch there

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for c in COMMANDS:
            yield SystemCommand(c.title, f"{c.help} · key {c.keys}",
                                partial(self.run_action, c.action))
        yield from (s for s in super().get_system_commands(screen) if s.title != "Quit")


FREEZE_HEAP_AFTER = 1.0
"""Seconds after the first frame when the start-up heap is frozen (see _freeze_heap)."""
CONSOLE_BULK_NICE = 10
"""Niceness of the console's bulk work (relay pump threads, ssh clients, local hashing)."""


def make_app(plan: Plan, store, *, hosts=None, probe_hosts: bool = True,
             reconcile: bool = True, gpu_every: float = 15.0,
             bridge: EventBridge | None = None, autorun: bool = False) -> SpecdeckApp:
    """The console on ``plan`` with a real Runner over ``store`` (the factory tests use).

    Args:
        plan: The validated plan.
        store: A :class:`core.state.store.Store` opened on this thread.
        hosts: Pre-built hosts by name (default: from the plan).
        probe_hosts: Connect every host on start (and poll GPUs every ``gpu_every`` s; 0: never).
        reconcile: Reconcile live runs with their hosts on start, then follow those still
            running (False: leave live runs as the store has them).
        bridge: The event bridge (default: a new one).
    """
    bridge = bridge or EventBridge()
    # Relays started from the console move bytes below the UI thread's priority.
    bulk.set_background_nice(CONSOLE_BULK_NICE)
    session = Session.open(plan, store=store, emit=bridge, hosts=hosts)
    return SpecdeckApp(session, bridge, probe_hosts=probe_hosts, reconcile=reconcile,
                       gpu_every=gpu_every, autorun=autorun)


def keep_going_text(plan: Plan, runs: "list[Run]") -> str:
    if not runs:
        return ""
    names = "\n".join(f"  {r.item_id}: run {r.id} on {r.host}" for r in runs)
    where = plan.path or plan.name
    return (f"still running on their hosts (quitting never stops runs):\n{names}\n"
            f"`specdeck attach {where}` follows them; `specdeck ui {where}` shows them.")


def run_console(plan: Plan, state: str | None = None, *, autorun: bool = False) -> int:
    """Open the console on ``plan`` (state: the store path; default per plan). Returns 0.

    ``autorun``: run every runnable item once the console is up (``specdeck demo``)."""
    store = open_store(plan, state)
    try:
        app = make_app(plan, store, autorun=autorun)
        code = app.run()
        text = keep_going_text(plan, app.keep_going)
        if text:
            from console.cli.conventions import runnable

            print(runnable(text), file=sys.stderr)
        return code or 0
    finally:
        store.close()
