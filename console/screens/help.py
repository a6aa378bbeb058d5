"""``?``: every key binding of the console, by where it works."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from console.widgets.vim import scroll_keys


class HelpScroll(VerticalScroll):
    BINDINGS = scroll_keys()


class HelpScreen(ModalScreen[None]):
    """Args: sections: ``[(where, [(keys, description), ...]), ...]``."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, sections: list[tuple[str, list[tuple[str, str]]]]):
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        parts: list = []
        for where, rows in self.sections:
            parts.append(Text(where, style="bold underline"))
            table = Table.grid(padding=(0, 2), expand=True)
            table.add_column(style="bold cyan", no_wrap=True, width=16)
            table.add_column(ratio=1)
            for keys, desc in rows:
                table.add_row(keys if isinstance(keys, Text) else Text(keys), desc)
            parts += [table, Text("")]
        with HelpScroll(id="help-box"):
            yield Static(Text("specdeck keys  (ctrl+p: every command; escape closes)",
                              style="bold"))
            yield Static(Group(*parts), id="help-table")

    def on_mount(self) -> None:
        self.query_one("#help-box").focus()

    def action_dismiss(self) -> None:
        self.dismiss(None)


def glyph_sections() -> list[tuple[str, list[tuple[Text, str]]]]:
    """What every glyph on screen means, read from the widgets' own tables (so a glyph added
    there shows here)."""
    from console.widgets.hosts_bar import STATE
    from console.widgets.item_detail import CHECK_STYLE, RUN_STYLE
    from console.widgets.plan_list import GLYPHS, MARKS, PRIORITY, STATUS_STYLE

    items = [(Text(g, style=STATUS_STYLE[s]), f"item {s.replace('_', ' ')}")
             for s, g in GLYPHS.items()]
    items += [(Text(g, style=c), f"priority {p}") for p, (g, c) in PRIORITY.items()]
    items += [(Text(g, style=c), d) for g, (c, d) in MARKS.items()]
    checks = [(Text(g, style=c), f"check: {s}" + {
        "ready": " (it can run now)", "blocked": " (it cannot run yet; the reason follows)",
        "done": " (already done, nothing to run)", "error": " (the check itself failed)",
        "checking": " (asking the host)", "manual": " (a manual item: you do it)"}.get(s, ""))
        for s, (g, c) in CHECK_STYLE.items()]
    runs = [(Text("#N", style="bold"), "attempt number of a run"),
            *[(Text(s, style=c), f"run state {s}") for s, c in RUN_STYLE.items()]]
    runs += [(Text("▸", style="cyan"), "the latest progress line of the item's live run"),
             (Text("follow on", style="green"), "log title: the log stays at its newest line "
              "(f toggles)")]
    hosts = [(Text(g, style=c), f"host {s}") for s, (g, c) in STATE.items()]
    tau = [(Text("⚠", style="bold yellow"), "settings differ from the baseline's: not "
            "comparable (the differing keys follow)"),
           (Text("Σ macro", style="bold"), "mean of the per-prompt tau"),
           (Text("Σ pooled", style="bold"), "tau over every round of every prompt"),
           (Text("█", style="cyan"), "per-position acceptance p_k (bar and value)"),
           (Text("Δ  % base"), "difference from the baseline's tau, and tau as % of it")]
    curves = [(Text("━", style="cyan"), "legend: the colour of each curve (run#attempt)"),
              (Text(" loss ", style="reverse bold"), "the metric family shown (m / M)")]
    return [("Glyphs: items (plan pane)", items), ("Glyphs: check verdicts (item pane)", checks),
            ("Glyphs: runs (item pane, log title)", runs), ("Glyphs: hosts (top bar)", hosts),
            ("Glyphs: tau pane", tau), ("Glyphs: curves", curves)]
