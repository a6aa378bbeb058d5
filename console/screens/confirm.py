"""A yes/no modal that says exactly what will happen (``ConfirmModal(...) -> bool``)."""

from __future__ import annotations


from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from core.state.records import Run


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


def stop_text(run: "Run", grace_s: float) -> str:
    """What stopping ``run`` kills, and where."""
    if not run.host:  # an in-process action (relay, venv...) of this specdeck
        return (f"Stop run {run.id} of item {run.item_id}, running inside this "
                f"specdeck (pid {run.pid or '?'})?\n\nIts work is cancelled now and "
                "its ssh clients killed; a relay keeps its .part file, so running the item "
                "again resumes it. The item becomes failed (stopped).")
    if run.adopt:  # started outside specdeck, adopted (core.runs.adopt)
        what = run.adopt["what"]
        return (f"Stop run {run.id} of item {run.item_id} on host {run.host}: the "
                f"adopted {what}?\n\nSIGTERM to its process tree (scancel for a Slurm job, "
                f"the session for tmux), {grace_s:g} s grace, then SIGKILL. The item becomes "
                "failed (stopped).")
    return (f"Stop run {run.id} of item {run.item_id} on host {run.host}?\n\n"
            f"SIGTERM to its process group (pid {run.pid or '?'}) on {run.host}, "
            f"{grace_s:g} s grace, then SIGKILL. The item becomes failed (stopped); it can "
            "run again.")


ML_MODULES = {"train": "core.ml.train", "eval": "core.ml.eval", "extract_hidden": "core.ml.extract",
              "extract_weights": "core.ml.strip"}
"""The ``python -m`` module each ML kind runs on its host."""
RESOURCE_KEYS = ("gpu", "device", "nproc", "nodes", "cpus", "mem", "partition", "time")


def flat(value, prefix: str = "") -> list[tuple[str, object]]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``[("a.b", 1), ("c", [1, 2])]`` (empties dropped)."""
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out += flat(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return [] if value in (None, [], (), {}, "") else [(prefix, value)]


def plain(value) -> str:
    """A params value as an operator writes it: ``a.b=1, c=2`` for a mapping, ``x, y`` for a
    list, never a Python repr."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={plain(v)}" for k, v in flat(value))
    if isinstance(value, (list, tuple)):
        return ", ".join(plain(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def launch_facts(item, params: dict, detached: bool) -> list[tuple[str, str]]:
    """(label, text) rows naming what running ``item`` launches: kind, host, launcher,
    resources and command."""
    a = item.action
    kind = a.kind
    launcher = params.get("launcher") or ("detached capsule (setsid)" if detached
                                          else "inside this specdeck")
    rows = [("kind", kind), ("host", a.host or "this machine (specdeck itself)"),
            ("launcher", str(launcher))]
    if kind == "train":
        n = int(params.get("nproc_per_node") or 1)
        if launcher == "torchrun":
            nodes = [a.host] + list(params.get("nodes") or [])
            res = (f"{n * len(nodes)} GPU workers: nproc_per_node {n} × {len(nodes)} "
                   f"node{'s' if len(nodes) > 1 else ''} ({', '.join(nodes)})")
            if params.get("command"):  # the trainer's own command line is not wrapped
                res += "; your command runs as written (start its workers itself)"
        elif launcher == "slurm":
            sl = params.get("slurm") or {}
            res = "sbatch " + (plain({k: v for k, v in sl.items() if k != "extra"})
                               or "with the cluster's defaults")
            if sl.get("extra"):
                res += " " + " ".join(sl["extra"])
        else:
            res = "one process (uses the GPUs the host gives it)"
    else:
        found = [(k, v) for k, v in flat(params) if any(r in k.lower() for r in RESOURCE_KEYS)]
        res = plain(dict(found)) if found else ("one process" if detached and a.host
                                                else "none on a host")
    rows.append(("resources", res))
    if params.get("command"):
        cmd = params["command"] + (" " + " ".join(map(str, params["args"]))
                                   if params.get("args") else "")
    elif kind in ML_MODULES:
        skip = {"launcher", "nproc_per_node", "nodes", "slurm", "rdzv_port", "resume"}
        args = {k: v for k, v in params.items() if k not in skip}
        cmd = f"python -m {ML_MODULES[kind]}  " + plain(args)
    else:
        cmd = plain(params) or kind
    rows.append(("command", cmd))
    return rows


def run_text(item, params: dict, detached: bool, attempt: int, status: str,
             start: str | None = None) -> tuple[str, str]:
    """Title and body of the run confirmation: what will start, where, with what
    (``start``: what the new attempt does with the earlier ones, e.g. train's fresh start)."""
    title = (f"Run {item.id} again (attempt {attempt})?" if attempt > 1
             else f"Run {item.id} (attempt 1)?")
    why = {"done": "it is done; this is a new attempt", "failed": "its last attempt failed",
           "stopped": "it was stopped; nothing runs it again unless you do",
           "skipped": "it was skipped"}.get(status)
    width = 10
    lines = [f"{k:<{width}} {v}" for k, v in launch_facts(item, params, detached)]
    if attempt > 1:
        lines.append(f"{'attempt':<{width}} {attempt}" + (f" ({why})" if why else ""))
    if start:
        lines.append(f"{'starts':<{width}} {start}")
    return title, "\n".join(lines)
