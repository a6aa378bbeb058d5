"""A yes/no modal that says exactly what will happen (``ConfirmModal(...) -> bool``)."""

from __future__ import annotations

import json

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmModal(ModalScreen[bool]):
    """Ask before doing something that cannot be undone.

    Args:
        title: A short heading ("Stop run?").
        body: What will happen, where: the run, the item, the host, the process group.
        confirm: The label of the button that does it.
    """

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n", "answer(False)", "No"),
                Binding("escape", "answer(False)", "Cancel")]

    def __init__(self, title: str, body: str, *, confirm: str = "Yes"):
        super().__init__()
        self.title_text = title
        self.body = body
        self.confirm_label = confirm

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(self.title_text, id="confirm-title")
            yield Static(self.body, id="confirm-body", markup=False)
            with Horizontal(id="confirm-buttons"):
                yield Button(f"{self.confirm_label} (y)", variant="error", id="confirm-yes")
                yield Button("Cancel (n)", variant="primary", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def stop_text(run: dict, grace_s: float) -> str:
    """What stopping ``run`` kills, and where."""
    if not run.get("host"):  # an in-process action (relay, venv...) of this specdeck
        return (f"Stop run {run['id']} of item {run['item_id']}, running inside this "
                f"specdeck (pid {run.get('pid') or '?'})?\n\nIts work is cancelled now and "
                "its ssh clients killed; a relay keeps its .part file, so running the item "
                "again resumes it. The item becomes failed (stopped).")
    if run.get("adopt"):  # started outside specdeck, adopted (core.adopt)
        what = json.loads(run["adopt"])["what"]
        return (f"Stop run {run['id']} of item {run['item_id']} on host {run['host']}: the "
                f"adopted {what}?\n\nSIGTERM to its process tree (scancel for a Slurm job, "
                f"the session for tmux), {grace_s:g} s grace, then SIGKILL. The item becomes "
                "failed (stopped).")
    return (f"Stop run {run['id']} of item {run['item_id']} on host {run['host']}?\n\n"
            f"SIGTERM to its process group (pid {run.get('pid') or '?'}) on {run['host']}, "
            f"{grace_s:g} s grace, then SIGKILL. The item becomes failed (stopped); it can "
            "run again.")
