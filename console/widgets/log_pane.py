"""The log pane: one run's log, live, with follow, search and a visible stream state.

Memory is bounded: the :class:`~textual.widgets.Log` keeps the last :data:`MAX_LINES`
lines (the store has the whole log; ``specdeck logs`` prints it). Lines are sanitized
(:func:`core.text.sanitize`): remote output never reaches the terminal raw.

The title line says which run this is and how its stream is doing: ``following``,
``reconnecting…`` (the host dropped and the follower retries), ``host unreachable``,
``lost`` (the run's process vanished) or how it ended.

JSON records are shown as the CLI says them (one formatter, :mod:`core.capsules.progress`: a progress
record as ``codemodel: 58/300 steps, 11,700 tokens/s, ETA 0m21s``), their other fields as
``key value`` pairs (nested records flattened to ``layers[0].type full``: never a Python
repr), wrapped to the pane's width (:func:`pretty_json`); other lines are shown as written,
and a line wider than the pane wraps the same way (:func:`wrap_line`, continuations
indented): nothing is cut at its edge.

Keys (when the pane has focus): ``f`` follow on/off, ``/`` search, ``n`` / ``N`` next /
previous match, escape closes the search; j/k, g/G, ctrl+d/u scroll.
"""

from __future__ import annotations

import textwrap
from collections import deque

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.actions import SkipAction
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input, Log, Static

from console.widgets.vim import scroll_keys
from core.capsules.progress import record_text
from core.runs import life
from core.state.records import Run
from core.text import sanitize

MAX_LINES = 5000
STATE_STYLE = {"following": "green", "reconnecting": "bold yellow", "unreachable": "bold red",
               life.LOST: "bold red", life.SUCCEEDED: "green", life.FAILED: "bold red",
               life.STOPPED: "magenta", life.INTERRUPTED: "red", life.PREEMPTED: "yellow",
               "ended": "bright_black",
               life.STARTING: "yellow", life.RUNNING: "yellow"}
"""The log stream's states (following, reconnecting...) and a run's (:mod:`core.runs.life`)."""


CONTINUATION = "    "
"""How a wrapped line's continuation starts (JSON records and long lines alike)."""


def wrap_line(line: str, width: int) -> list[str]:
    """``line`` as lines of at most ``width`` columns: at spaces where it has them, its own
    leading indentation kept, continuations indented by :data:`CONTINUATION`; a line that
    fits is returned as written."""
    from rich.cells import cell_len

    width = max(20, width)
    if cell_len(line) <= width:
        return [line]
    return textwrap.wrap(line, width, subsequent_indent=CONTINUATION, break_on_hyphens=False,
                         replace_whitespace=False, expand_tabs=True) or [line]


def pretty_json(line: str, width: int) -> list[str] | None:
    """A JSON object line as a person reads it (:func:`core.capsules.progress.record_text`: the
    summary the CLI prints, ``codemodel: 58/300 steps, 11,700 tokens/s, ETA 0m21s``, then
    the other fields, ``· loss 2.341``) wrapped to ``width`` (continuations indented); None
    when the line is not a JSON object."""
    text = record_text(line)
    if text is None:
        return None
    return textwrap.wrap(text, max(20, width), subsequent_indent=CONTINUATION,
                         break_on_hyphens=False) or [line.strip()]


class LogView(Log):
    """The log itself, with vim motion."""

    BINDINGS = scroll_keys()


class LogPane(Vertical):
    """Title, log and search box."""

    ALLOW_MAXIMIZE = True
    BINDINGS = [
        Binding("f", "toggle_follow", "Follow"),
        Binding("slash", "search", "Search"),
        Binding("n", "next_match(1)", "Next", show=False),
        Binding("N", "next_match(-1)", "Prev", show=False),
        Binding("escape", "close_search", "Close search", show=False),
    ]

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.run_id: str | None = None
        self.item_id: str | None = None
        self.host: str | None = None
        self.stream = "–"
        self.follow = True
        self.query_text = ""
        self.matches: list[int] = []
        self.match_index = -1
        self.dropped = 0
        self._raw: deque[str] = deque(maxlen=MAX_LINES)
        """The shown run's last lines as written (sanitized), to wrap again on a resize."""
        self._wrapped_at: int | None = None
        """The width the shown lines were last wrapped to (None: no line shown yet)."""

    def compose(self) -> ComposeResult:
        yield Static("no run selected", id="log-title")
        yield LogView(max_lines=MAX_LINES, auto_scroll=True, id="log")
        yield Input(placeholder="search this log (enter: find, n/N: next/prev)", id="log-search")

    def on_mount(self) -> None:
        self.query_one("#log-search").display = False

    def on_resize(self) -> None:
        """The layout gave the pane another size: the lines are wrapped to the new width
        (after the layout), and a following log stays at its end."""
        self.call_after_refresh(self._rewrap)

    def _rewrap(self) -> None:
        if self._wrapped_at is not None and self._wrap_width() != self._wrapped_at:
            raw = list(self._raw)
            self._raw.clear()
            self.log.clear()
            self.log.write_lines(self._shown_lines(raw, sanitized=True))
            if self.query_text:
                self.find(self.query_text)
        if self.follow:
            self.log.scroll_end(animate=False, immediate=True)

    @property
    def log(self) -> Log:
        return self.query_one("#log", Log)

    # -- attributes down -----------------------------------------------------------------
    def show_run(self, item_id: str, run: Run | None, lines: list[str]) -> None:
        """Show ``run`` (None: the item has no run yet) starting with its stored tail."""
        self.item_id = item_id
        self.run_id = run.id if run else None
        self.host = run.host if run else None
        self.stream = ("following" if run and run.live
                       else (run.state if run else "–"))
        self.dropped = 0
        self.matches, self.match_index = [], -1
        self._raw.clear()
        self._wrapped_at = None
        log = self.log
        log.clear()
        if lines:
            log.write_lines(self._shown_lines(lines[-MAX_LINES:]))
        if self.follow:
            log.scroll_end(animate=False, immediate=True)
        self._title()

    def append(self, run_id: str, lines: list[str], dropped: int = 0) -> bool:
        """Add lines of ``run_id`` (ignored unless it is the run shown). Returns True if shown."""
        if run_id != self.run_id:
            return False
        self.dropped += dropped
        self.log.write_lines(self._shown_lines(lines[-MAX_LINES:]),
                             scroll_end=self.follow and None)
        return True

    def set_stream(self, state: str) -> None:
        self.stream = state
        self._title()

    def run_started(self, item_id: str, run_id: str, host: str | None) -> None:
        """A new run of the shown item: switch to it with an empty log."""
        if item_id == self.item_id and run_id != self.run_id:
            self.show_run(item_id, Run(run_id, item_id, host=host, state=life.RUNNING), [])

    def host_state(self, host: str, state: str) -> None:
        """The shown run's host changed state (reconnecting / unreachable / connected)."""
        if host != self.host or self.stream not in ("following", "reconnecting", "unreachable"):
            return
        self.set_stream({"connected": "following"}.get(state, state))

    # -- rendering -----------------------------------------------------------------------
    def _wrap_width(self) -> int:
        return (self.log.scrollable_content_region.width or 80) - 1

    def _shown_lines(self, lines: list[str], *, sanitized: bool = False) -> list[str]:
        """Sanitized lines (kept, see ``_raw``); JSON records pretty-printed, and every line
        wrapped to the pane's width."""
        width = self._wrap_width()
        if not sanitized:
            lines = [sanitize(x) for x in lines]
        self._raw.extend(lines)
        out: list[str] = []
        for x in lines:
            shown = pretty_json(x, width) if x[:1] == "{" else None
            if shown is None:  # (len: cheap; a wide character takes two cells)
                shown = wrap_line(x, width) if 2 * len(x) > width else [x]
            out += shown
        if lines:
            self._wrapped_at = width
        return out

    def _title(self) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        if self.run_id is None:
            t.append(f"{self.item_id}: no run yet" if self.item_id else "no run selected",
                     style="bright_black")
        else:
            t.append(self.run_id, style="bold")
            if self.host:
                t.append(f" @{self.host}", style="cyan")
            label = {"reconnecting": "reconnecting…", "unreachable": "host unreachable"}.get(
                self.stream, self.stream)
            t.append(f"  {label}", style=STATE_STYLE.get(self.stream, ""))
        t.append("  follow " + ("on" if self.follow else "off"),
                 style="green" if self.follow else "bright_black")
        if self.query_text:
            where = (f"{self.match_index + 1}/{len(self.matches)}" if self.matches
                     else "no match")
            t.append(f"  /{self.query_text} {where}", style="bold cyan")
        self.query_one("#log-title", Static).update(t, layout=False)

    # -- keys ----------------------------------------------------------------------------
    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        self.log.auto_scroll = self.follow
        if self.follow:
            self.log.scroll_end(animate=False)
        self._title()

    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.display = True
        box.focus()

    def action_close_search(self) -> None:
        box = self.query_one("#log-search", Input)
        if not box.display and not self.query_text:
            raise SkipAction()  # nothing to close: escape restores a zoom (the app's)
        box.display = False
        self.query_text, self.matches, self.match_index = "", [], -1
        self.log.focus()
        self._title()

    @on(Input.Submitted, "#log-search")
    def _search(self, event: Input.Submitted) -> None:
        event.stop()
        self.find(event.value)
        self.log.focus()

    def find(self, text: str) -> None:
        """Find ``text`` (case-insensitive); stop following and jump to the last match."""
        self.query_text = text
        needle = text.lower()
        self.matches = [i for i, line in enumerate(self.log.lines) if needle and
                        needle in line.lower()]
        self.match_index = len(self.matches) - 1 if self.matches else -1
        if self.matches and self.follow:
            self.action_toggle_follow()
        self._jump()

    def action_next_match(self, step: int) -> None:
        if self.matches:
            self.match_index = (self.match_index + step) % len(self.matches)
            self._jump()

    def _jump(self) -> None:
        if self.match_index >= 0:
            y = self.matches[self.match_index]
            self.log.scroll_to(y=max(0, y - self.log.size.height // 2), animate=False)
        self._title()
