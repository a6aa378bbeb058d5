"""``c``: the morning report (core.runs.report): what happened since a console last saw the
campaign, in order (runs, checkpoints, tau, alerts, preemptions, disk and GPU incidents), tau
over training with its best point, and the cost; the same text ``specdeck report`` prints."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from console.widgets.vim import scroll_keys
from core.text import sanitize

STYLE = {"preemption": "bold red", "alert": "bold yellow", "disk": "bold yellow", "gpu": "bold yellow",
         "checkpoint_evaluated": "cyan", "run_started": "bright_black"}
"""How a timeline line is coloured, by the kind of entry it shows (core.runs.report.KINDS)."""


class ReportScroll(VerticalScroll):
    BINDINGS = scroll_keys()


def styled(report) -> Text:
    """The report's plain text (core.runs.report.text_lines), each timeline line coloured by
    what it tells: a run that ended otherwise than succeeded in red."""
    from core.runs.report import text_lines

    out = Text()
    for kind, line in text_lines(report):
        style = STYLE.get(kind or "", "")
        if kind == "run_ended":
            style = "green" if " succeeded (" in line else "bold red"
        out.append(sanitize(line) + "\n", style=style)
    return out


class ReportScreen(ModalScreen[None]):
    """Args: report: a :class:`core.runs.report.Report`; since_seen: its window starts when a
    console last saw the store."""

    BINDINGS = [Binding("escape,q,c", "dismiss", "Close")]

    def __init__(self, report, since_seen: bool = False):
        super().__init__()
        self.report = report
        self.since_seen = since_seen

    def compose(self) -> ComposeResult:
        why = ("since a console last saw this campaign" if self.since_seen
               else "the last 12 hours (no console saw it since)")
        with ReportScroll(id="report-box"):
            yield Static(Text(f"report: {why}  (escape closes; `specdeck report PLAN --since 12h "
                              "--markdown` for a chat message)", style="bold"))
            yield Static(styled(self.report), id="report-text")

    def on_mount(self) -> None:
        self.query_one("#report-box").focus()

    def action_dismiss(self) -> None:
        self.dismiss(None)
