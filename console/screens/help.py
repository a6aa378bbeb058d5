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
                table.add_row(keys, desc)
            parts += [table, Text("")]
        with VerticalScroll(id="help-box"):
            yield Static(Text("specdeck keys  (ctrl+p: every command; escape closes)",
                              style="bold"))
            yield Static(Group(*parts), id="help-table")

    def action_dismiss(self) -> None:
        self.dismiss(None)
