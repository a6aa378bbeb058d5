"""The selected item: action, host, params, check() verdict, runs and attempts.

Attributes down only: the app calls :meth:`ItemDetail.show` with what a worker loaded and
:meth:`ItemDetail.set_check` when the check verdict arrives. Times are the stored run
times (no clock is read here), so a rendering is reproducible.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from console.screens.confirm import plain
from console.widgets.plan_list import GLYPHS, PRIORITY, STATUS_STYLE, status_text
from console.widgets.vim import scroll_keys
from core.plans.plan import Item, Plan, params_summary
from core.actions.watch_eval.status import describe as describe_watcher
from core.runs import life
from core.state.records import WatcherStatus
from core.text import sanitize

RUN_STYLE = {life.SUCCEEDED: "green", life.FAILED: "bold red", life.STOPPED: "magenta",
             life.LOST: "red", life.INTERRUPTED: "red", life.PREEMPTED: "yellow",
             life.RUNNING: "bold yellow",
             life.STARTING: "yellow"}
CHECK_STYLE = {"done": ("●", "green"), "ready": ("✓", "cyan"), "blocked": ("⊘", "yellow"),
               "error": ("✗", "red"), "checking": ("…", "bright_black"),
               "manual": ("✎", "magenta")}
"""check() verdicts: glyph and colour (the help's legend reads them from here)."""
MAX_RUNS = 8
KEY_WIDTH = 10
"""The widest key kept in the key column: a longer key (a param's name) gets a line of its
own with its value under it, so a long key never squeezes every value into a sliver."""


class Rows:
    """Key / value rows: short keys in a column as wide as the widest of them, a long key on
    its own line with its value indented under it (one :class:`~rich.console.Group`)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, object]] = []

    def add_row(self, key: str, value) -> None:
        self.rows.append((key, value))

    def render(self) -> Group:
        from rich.padding import Padding

        parts: list = []
        grid = None
        width = max([len(k) for k, _ in self.rows if len(k) <= KEY_WIDTH], default=0)
        for key, value in self.rows:
            if len(key) <= KEY_WIDTH:
                if grid is None:
                    grid = Table.grid(padding=(0, 1))
                    grid.add_column(style="bright_black", no_wrap=True, min_width=width)
                    grid.add_column(overflow="fold")
                    parts.append(grid)
                grid.add_row(key, value)
                continue
            grid = None
            parts.append(Text(key, style="bright_black", overflow="fold"))
            parts.append(Padding(value, (0, 0, 0, 3)))
        return Group(*parts)



def when(ts: float | None) -> str:
    """A local time nobody misreads: ``2026-01-01 13:22`` (ISO date, 24 h clock)."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "–"


def _duration(run: dict) -> str:
    if not run.ended_at or not run.started_at:
        return ""
    s = run.ended_at - run.started_at
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def run_line(run: dict) -> Text:
    """``#2 failed exit 1 · 3.2s · 2026-06-01 12:00`` (and the whole error, wrapped)."""
    state = run.state
    how = ""
    if run.signal:
        how = f" sig {run.signal}"
    elif run.exit_code not in (None, 0):
        how = f" exit {run.exit_code}"
    t = Text(overflow="fold")
    t.append(f"#{run.attempt} ", style="bold")
    t.append(f"{state}{how}", style=RUN_STYLE.get(state, ""))
    dur = _duration(run)
    t.append((f" · {dur}" if dur else "") + f" · {when(run.started_at)}",
             style="bright_black")
    if run.error and state != life.SUCCEEDED:
        t.append(f"\n   {sanitize(run.error, max_len=2000)}", style="red")
    return t


def cost_line(costs: Any, item: Any) -> str:
    """``USD 0.56 · arm v5 USD 0.80 · campaign USD 1.99`` (core.runs.cost)."""
    from core.runs.cost import arm_of, fmt

    arm = arm_of(item)
    return " · ".join([fmt(costs.items.get(item.id)) + (" (its host has no price:)"
                                                        if item.id not in costs.items and item.action
                                                        and item.action.host in costs.unpriced else "")]
                      + ([f"arm {arm} {fmt(costs.arms.get(arm))}"] if arm else [])
                      + [f"campaign {fmt(costs.total)}"])


class ItemDetail(VerticalScroll):
    """What the app knows about the selected item."""

    ALLOW_MAXIMIZE = True
    BINDINGS = scroll_keys()

    def __init__(self, plan: Plan, *, id: str | None = None):
        super().__init__(id=id)
        self.plan = plan
        self.item_id: str | None = None
        self.status = "pending"
        self.runs: list[dict] = []
        self.live: dict | None = None
        self.watcher: WatcherStatus | None = None
        self.costs = None
        self.check: tuple[str, str] = ("checking", "")
        self.needs: dict[str, str] = {}
        self.reason = ""
        self.progress: dict[str, str] = {}

    def compose(self):
        yield Static("", id="detail-progress")
        yield Static("", id="detail-body")

    # -- attributes down -----------------------------------------------------------------
    def show(self, item_id: str, status: str, runs: list[dict], live: dict | None,
             needs: dict[str, str], reason: str = "", watcher: WatcherStatus | None = None,
             costs: Any = None) -> None:
        """Show an item: its status (and why), runs (oldest first), live run, needs' statuses,
        the latest run's tau watcher, what it, its arm and the campaign cost (``costs``: a
        :class:`core.runs.cost.Sheet`, None when no host has a price)."""
        if item_id != self.item_id:
            self.check = ("checking", "")
        self.item_id, self.status, self.runs, self.live = item_id, status, runs, live
        self.watcher, self.costs = watcher, costs
        self.needs, self.reason = dict(needs), reason
        self._draw()

    def set_check(self, item_id: str, state: str, reason: str) -> None:
        if item_id == self.item_id:
            self.check = (state, reason)
            self._draw()

    def set_progress(self, item_id: str | None, message: str) -> None:
        """The latest progress line an action reported for ``item_id``.

        It has its own one-line widget, updated without a layout pass: progress can come
        several times a second while a log floods.
        """
        self.progress[item_id or ""] = message
        if item_id == self.item_id:
            self._draw_progress()

    def _draw_progress(self) -> None:
        line = self.query_one("#detail-progress", Static)
        text = self.progress.get(self.item_id or "")
        if not text:
            line.display = False
            return
        line.update(Text("▸ " + sanitize(text, max_len=200), style="cyan",
                         overflow="ellipsis"), layout=False)
        line.display = True

    def set_status(self, item_id: str, status: str) -> None:
        if item_id == self.item_id:
            self.status = status
            self._draw()

    # -- rendering -----------------------------------------------------------------------
    def _draw(self) -> None:
        if self.item_id is None:
            return
        item: Item = self.plan.item(self.item_id)
        head = Text()
        head.append(item.id, style="bold")
        head.append("  ")
        head.append_text(status_text(self.status))
        mark, color = PRIORITY.get(item.priority, ("·", ""))
        head.append(f"  {mark} {item.priority}", style=color)
        grid = Rows()
        if item.action is None or item.action.kind == "manual":
            note = params_summary(item).get("note") if item.action else None
            grid.add_row("action", Text("manual: do it, then mark it done (d)", style="magenta"))
            if note:
                grid.add_row("note", note)
        else:
            grid.add_row("action", Text.assemble((item.action.kind, "bold"), " on ",
                                                 (item.action.host, "cyan"))
                         if item.action.host else
                         Text.assemble((item.action.kind, "bold"), " in specdeck"))
            for k, v in params_summary(item).items():
                if v in (None, [], (), {}, ""):
                    continue
                grid.add_row(f" {k}", Text(sanitize(plain(v), max_len=2000)))
        if self.reason and not self.reason.startswith("run "):  # runs are listed below
            grid.add_row("why", Text(sanitize(self.reason, max_len=200), style="bright_black"))
        needs = Text()
        for n in item.needs:
            needs.append(f"{GLYPHS.get(self._status_of(n), '?')} {n} ",
                         style=STATUS_STYLE.get(self._status_of(n), ""))
        grid.add_row("needs", needs if item.needs else Text("–"))
        deps = self.plan.dependents(item.id)
        if deps:
            grid.add_row("then", Text(", ".join(deps), style="bright_black"))
        glyph, color = CHECK_STYLE.get(self.check[0], ("?", ""))
        label = {"checking": "checking…", "done": "done",
                 "manual": "by hand"}.get(self.check[0], self.check[0])
        grid.add_row("check", Text(f"{glyph} {label}" + (f": {self.check[1]}"
                                                         if self.check[1] else ""), style=color))
        if self.runs:
            shown = list(reversed(self.runs))[:MAX_RUNS]
            grid.add_row("runs", Group(*[run_line(r) for r in shown]))
            if len(self.runs) > MAX_RUNS:
                grid.add_row("", Text(f"… {len(self.runs) - MAX_RUNS} earlier attempts",
                                      style="bright_black"))
        else:
            grid.add_row("runs", Text("none yet", style="bright_black"))
        if self.costs is not None:
            grid.add_row("cost", Text(cost_line(self.costs, item), style="bright_black"))
        if self.status == "in_progress" and not self.live and not item.manual:
            grid.add_row("live", Text("no run specdeck knows (started outside it?): "
                                      "a adopts it; it is never launched twice", style="yellow"))
        if self.live:
            where = f"on {self.live.host}" if self.live.host else "in specdeck"
            grid.add_row("live", Text(f"{self.live.id} {where} "
                                      f"(pid {self.live.pid or '?'})", style="yellow"))
        w = self.watcher
        if w:
            line = describe_watcher(w)
            grid.add_row("tau watch", Text(sanitize(line + (f"\n{w.error}" if w.error
                                                            else ""), max_len=500),
                                           style="red" if w.state in ("failed", "lost")
                                           else "cyan"))
        body = Group(head, Text(sanitize(item.content), style="italic"), grid.render())
        self.query_one("#detail-body", Static).update(body)
        self._draw_progress()

    def _status_of(self, item_id: str) -> str:
        return self.needs.get(item_id, "pending")
