"""One line at the top: the plan, and each host's connection state and GPU use.

Attributes down: the app calls :meth:`HostsBar.set_state` on every
``HostStateChanged`` and :meth:`HostsBar.set_gpus` with what ``nvidia-smi`` answered
(nothing is shown for hosts where it does not answer).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

STATE = {"unknown": ("◌", "bright_black"), "connected": ("●", "green"),
         "reconnecting": ("◐", "bold yellow"), "unreachable": ("✗", "bold red")}


def gpu_text(gpus: list[dict]) -> Text:
    """``gpu 45% 10.0/80G`` for one GPU, ``4 gpus 61% 200/320G`` for several (mean util)."""
    utils = [g["util"] for g in gpus if g.get("util") is not None]  # None: [N/A]
    used = sum(g.get("mem_used") or 0 for g in gpus) / 1024
    total = sum(g.get("mem_total") or 0 for g in gpus) / 1024
    head = "gpu" if len(gpus) == 1 else f"{len(gpus)} gpus"
    util = sum(utils) / len(utils) if utils else None
    style = ("bright_black" if util is None else "bold red" if util >= 90 else
             ("yellow" if util >= 50 else "green"))
    return Text.assemble((f" {head} ", "bright_black"),
                         ("n/a" if util is None else f"{util:.0f}%", style),
                         (f" {used:.1f}/{total:.0f}G", "bright_black"))


class HostsBar(Static):
    """The plan name and one badge per host."""

    def __init__(self, plan_name: str, hosts: list[str], *, id: str | None = None):
        super().__init__(id=id)
        self.plan_name = plan_name
        self.states: dict[str, tuple[str, str]] = {h: ("unknown", "") for h in hosts}
        self.gpus: dict[str, list[dict]] = {}

    def on_mount(self) -> None:
        self._draw()

    def set_state(self, host: str, state: str, reason: str = "") -> None:
        self.states[host] = (state, reason)
        if state != "connected":
            self.gpus.pop(host, None)
        self._draw()

    def set_gpus(self, host: str, gpus: list[dict] | None) -> None:
        if gpus:
            self.gpus[host] = gpus
        else:
            self.gpus.pop(host, None)
        self._draw()

    def _draw(self) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" specdeck ", style="bold reverse")
        t.append(f" {self.plan_name} ", style="bold")
        for host, (state, reason) in self.states.items():
            glyph, style = STATE.get(state, ("?", ""))
            t.append(" │ ", style="bright_black")
            t.append(f"{glyph} {host}", style=style)
            if state != "connected":
                t.append(f" {state}", style=style)
                if reason:
                    t.append(f" ({reason[:40]})", style="bright_black")
            if host in self.gpus:
                t.append_text(gpu_text(self.gpus[host]))
        self.update(t, layout=False)  # one line, fixed by the stylesheet
