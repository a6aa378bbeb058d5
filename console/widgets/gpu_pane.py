"""The GPUs pane: each sampled host's GPUs, one row each, and its free disk.

Attributes down: the app calls :meth:`GpuPane.set_sample` with each host's sample (the
JSON form of :class:`core.capsules.telemetry.HostSample`) and the recent utilisation of each
of its GPUs, oldest first (a sparkline). A host without ``nvidia-smi`` gets a line saying so;
nothing else changes. The hosts bar keeps its one-line summary per host.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

SPARK = "▁▂▃▄▅▆▇█"
HISTORY = 24
"""Samples of history drawn per GPU."""


def spark(values: list[float | None]) -> str:
    """Utilisation % (0-100) as block characters, ``·`` where a sample had none."""
    out = []
    for v in values[-HISTORY:]:
        out.append("·" if v is None else SPARK[min(len(SPARK) - 1, int(v / 100 * len(SPARK)))])
    return "".join(out)


def _num(v, fmt: str, unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{fmt}}{unit}"


def host_lines(host: str, sample: dict, history: dict[int, list[float | None]],
               *, idle_util: float = 5.0, now: float | None = None) -> list[Text]:
    """The pane's lines for one host: a head (GPUs, disk, age), then one row per GPU."""
    now = time.time() if now is None else now
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append(host, style="bold")
    gpus = sample.get("gpus") or []
    if gpus:
        head.append(f" · {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}", style="bright_black")
    else:
        head.append(f" · {sample.get('no_gpus') or 'no GPU answered'} (no GPU telemetry)",
                    style="yellow")
    for d in sample.get("disks") or []:
        head.append(f" · disk {d['free'] / 2**30:.1f} GiB free of {d['total'] / 2**30:.0f} GiB "
                    f"({d.get('mount') or d['path']})", style="bright_black")
        break
    age = now - sample.get("at", now)
    head.append(f" · {age:.0f}s ago" if age >= 1 else " · now", style="bright_black")
    lines = [head]
    for g in gpus:
        t = Text(no_wrap=True, overflow="ellipsis")
        util = g.get("util")
        style = ("bright_black" if util is None else "bold red" if util < idle_util else
                 "green" if util >= 50 else "yellow")
        name = str(g.get("name") or "").removeprefix("NVIDIA ")
        t.append(f"{g['index']:>2} ", style="bold")
        t.append(f"{name[:20]:<20} ")
        t.append(f"{_num(util, '>3.0f', ' %'):>5}", style=style)
        t.append(f" {spark(history.get(g['index'], [])):<{HISTORY}} ", style=style)
        used, total = g.get("mem_used"), g.get("mem_total")
        t.append(f"{_num(used and used / 1024, '.1f')}/{_num(total and total / 1024, '.1f')}G ")
        t.append(f"{_num(g.get('power'), '.0f', ' W'):>6} {_num(g.get('temp'), '.0f', '°C'):>5}",
                 style="bright_black")
        procs = g.get("processes") or []
        if procs:
            shown = ", ".join(f"{p.get('pid')} {str(p.get('name') or '').rsplit('/', 1)[-1]}"
                              + (f" {p['used_mib'] / 1024:.1f}G" if p.get("used_mib") else "")
                              for p in procs[:3])
            t.append(f"  {shown}" + (f" +{len(procs) - 3}" if len(procs) > 3 else ""))
        else:
            t.append("  no process", style="bright_black")
        lines.append(t)
    return lines


class GpuPane(VerticalScroll, can_focus=True):
    """One block per sampled host (module doc)."""

    ALLOW_MAXIMIZE = True

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.samples: dict[str, dict] = {}
        self.history: dict[str, dict[int, list[float | None]]] = {}
        self.idle_util = 5.0

    def compose(self):
        yield Static("no host sampled yet (hosts are sampled while the console runs)",
                     id="gpus-body")

    @property
    def has_gpus(self) -> bool:
        """Some host answered with GPUs (the pane then takes its room on a wide terminal)."""
        return any(s.get("gpus") for s in self.samples.values())

    @property
    def rows_needed(self) -> int:
        return sum(1 + len(s.get("gpus") or []) for s in self.samples.values()) or 1

    def set_sample(self, host: str, sample: dict | None,
                   history: dict[int, list[float | None]] | None = None) -> None:
        """Show ``host``'s latest sample (None: it did not answer; its block is dropped)."""
        if sample is None:
            self.samples.pop(host, None)
            self.history.pop(host, None)
        else:
            self.samples[host] = sample
            self.history[host] = history or {}
        self._draw()

    def text(self) -> Text:
        if not self.samples:
            return Text("no host sampled yet (hosts are sampled while the console runs)",
                        style="bright_black")
        out = Text()
        for i, (host, sample) in enumerate(self.samples.items()):
            for j, line in enumerate(host_lines(host, sample, self.history.get(host, {}),
                                                idle_util=self.idle_util)):
                if i or j:
                    out.append("\n")
                out.append_text(line)
        return out

    def _draw(self) -> None:
        self.query_one("#gpus-body", Static).update(self.text())
