"""``e``: the journal, with what happened while the console was closed on top."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from console.widgets.vim import table_keys
from core.runs import life
from core.state.records import Event, RunChange
from core.text import sanitize

KIND_STYLE = {**{life.journal_kind(s): style for s, style in (
                  (life.SUCCEEDED, "green"), (life.FAILED, "bold red"), (life.LOST, "bold red"),
                  (life.INTERRUPTED, "red"), (life.STOPPED, "magenta"),
                  (life.PREEMPTED, "yellow"))},
              "run_requeued": "yellow",
              "stop_requested": "magenta",
              "console_opened": "bright_black", "console_closed": "bright_black"}


def meanwhile_summary(changes: list[RunChange], meanwhile: list[Event]) -> tuple[list[str], str, bool]:
    """Lines, a title (``While the console was closed: 1 failed, 2 succeeded``) and whether
    every run ended well, from reconcile's changes and the journal's run ends (one per run:
    Services.open_session tells each change once)."""
    lines = [f"{c.item}: run {c.run} {c.was} → {c.now}" + (f" ({c.why})" if c.why else "")
             for c in changes]
    lines += [f"{e.item_id}: {e.message}  [{e.run_id}]" for e in meanwhile]
    ends = [c.now for c in changes] + [life.ended_by(e.kind) for e in meanwhile
                                          if life.ended_by(e.kind)]
    counts = ", ".join(f"{ends.count(s)} {s}" for s in sorted(set(ends)))
    return lines, f"While the console was closed: {counts}", all(s == life.SUCCEEDED for s in ends)


class JournalTable(DataTable):
    BINDINGS = table_keys()


class JournalScreen(ModalScreen[None]):
    """Args: meanwhile: lines summarising the last session's gap; events: journal rows."""

    BINDINGS = [Binding("escape,q,e", "dismiss", "Close")]

    def __init__(self, meanwhile: list[str], events: list[Event]):
        super().__init__()
        self.meanwhile = meanwhile
        self.events = events

    def compose(self) -> ComposeResult:
        with Vertical(id="journal-box"):
            head = Text("journal", style="bold")
            if self.meanwhile:
                head.append("\nwhile the console was closed:\n", style="bold yellow")
                head.append("\n".join(f"  {x}" for x in self.meanwhile))
            else:
                head.append("  nothing happened while the console was closed",
                            style="bright_black")
            yield Static(head, id="journal-head")
            yield JournalTable(id="journal-table", cursor_type="row")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("when", "event", "item", "host", "message")
        for e in reversed(self.events):
            table.add_row(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at)),
                          Text(e.kind, style=KIND_STYLE.get(e.kind, "")),
                          e.item_id or "", e.host or "", sanitize(e.message or "", max_len=200))
        table.focus()

    def action_dismiss(self) -> None:
        self.dismiss(None)
