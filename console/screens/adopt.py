"""``a``: adopt a run started outside specdeck as the selected item's run (PID, Slurm job or
tmux session, and its log); ``AdoptModal(...) -> AdoptSpec | None``."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Static

from core.plans.adopt_spec import AdoptSpec, spec_from_text


class AdoptModal(ModalScreen["AdoptSpec | None"]):
    """Ask what to adopt. Args: item_id, host: the item and the host the run is on."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, item_id: str, host: str):
        super().__init__()
        self.item_id, self.host = item_id, host

    def compose(self) -> ComposeResult:
        with Vertical(id="adopt-box"):
            yield Static(f"Adopt a run as {self.item_id}'s", id="adopt-title")
            yield Static(f"A run started outside specdeck on {self.host}: its log is followed "
                         "from now on, its end detected, and x stops it.", id="adopt-body",
                         markup=False)
            yield Input(placeholder="pid 12345  |  slurm 678  |  tmux SESSION", id="adopt-what")
            yield Input(placeholder=f"log file on {self.host} (default: the PID's stdout, the "
                        "job's StdOut, the pane)", id="adopt-log")
            yield Checkbox("store the log from its start", id="adopt-from-start")
            yield Static("", id="adopt-error", markup=False)
            with Horizontal(id="adopt-buttons"):
                yield Button("Adopt", variant="primary", id="adopt-yes")
                yield Button("Cancel", id="adopt-no")

    def on_mount(self) -> None:
        self.query_one("#adopt-what", Input).focus()

    @on(Input.Submitted, "#adopt-what")
    def _what_done(self) -> None:
        self.query_one("#adopt-log", Input).focus()

    @on(Input.Submitted, "#adopt-log")
    @on(Button.Pressed, "#adopt-yes")
    def _submit(self) -> None:
        try:
            spec = spec_from_text(self.query_one("#adopt-what", Input).value,
                                  self.query_one("#adopt-log", Input).value,
                                  self.query_one("#adopt-from-start", Checkbox).value)
        except ValueError as e:
            self.query_one("#adopt-error", Static).update(str(e))
            return
        self.dismiss(spec)

    @on(Button.Pressed, "#adopt-no")
    def action_cancel(self) -> None:
        self.dismiss(None)
