"""Training curves of one or more runs, overlaid (textual-plotext).

The plot widget (and plotext, a fifth of the console's import time) is mounted when the first
curves arrive, not before the first frame.

The app sets :attr:`MetricsPane.runs` (``[{run_id, label, series: {name: [(step, value)]}}]``,
loaded from the store by a worker, each series already thinned). Metric names group into
families: ``acc[0]``, ``acc[1]``… are the family ``acc`` (per-position accuracy), drawn as
one curve per position. ``m`` / ``M`` step through the families (loss first, then the
accuracy families, then lr, then the rest).
"""

from __future__ import annotations

import re

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Static

MAX_CURVES = 8
_INDEXED = re.compile(r"^(.*)\[(\d+)\]$")


def family_of(name: str) -> str:
    mm = _INDEXED.match(name)
    return mm.group(1) if mm else name


def families(names: set[str]) -> list[str]:
    """Families in display order: loss, accuracies, lr, the rest (alphabetical within)."""
    fams = sorted({family_of(n) for n in names})

    def rank(f: str) -> tuple[int, str]:
        lf = f.lower()
        if "loss" in lf:
            return (0, f)
        if "acc" in lf:
            return (1, f)
        if lf == "lr" or lf.endswith("lr") or "learning_rate" in lf:
            return (2, f)
        return (3, f)

    return sorted(fams, key=rank)


def curves(runs: list[dict], family: str) -> list[tuple[str, list[int], list[float]]]:
    """(label, steps, values) of every curve of ``family`` across ``runs`` (at most MAX_CURVES)."""
    out = []
    for r in runs:
        names = sorted((n for n in r["series"] if family_of(n) == family),
                       key=lambda n: (len(n), n))
        for n in names:
            pts = r["series"][n]
            if not pts:
                continue
            label = r["label"] if n == family else f"{r['label']} {n[len(family):]}"
            out.append((label, [p[0] for p in pts], [p[1] for p in pts]))
    return out[:MAX_CURVES]


class MetricsPane(Vertical):
    """Title with the family and runs, and the chart."""

    ALLOW_MAXIMIZE = True
    can_focus = True
    BINDINGS = [Binding("m", "cycle(1)", "Next metric"),
                Binding("M", "cycle(-1)", "Prev metric", show=False)]

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.runs: list[dict] = []
        self.family: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("no curves", id="metrics-title")

    @property
    def families(self) -> list[str]:
        names: set[str] = set()
        for r in self.runs:
            names |= set(r["series"])
        return families(names)

    # -- attributes down -----------------------------------------------------------------
    def set_runs(self, runs: list[dict]) -> None:
        self.runs = runs
        fams = self.families
        if self.family not in fams:
            self.family = fams[0] if fams else None
        self._draw()

    def action_cycle(self, step: int) -> None:
        fams = self.families
        if fams:
            i = fams.index(self.family) if self.family in fams else 0
            self.family = fams[(i + step) % len(fams)]
            self._draw()

    # -- rendering -----------------------------------------------------------------------
    def _plot(self):
        plots = self.query("#metrics-plot")
        if plots:
            return plots.first()
        from textual_plotext import PlotextPlot  # deferred: see the module docstring

        plot = PlotextPlot(id="metrics-plot")
        self.mount(plot)
        return plot

    def _draw(self) -> None:
        if self.family is None and not self.query("#metrics-plot"):
            self.query_one("#metrics-title", Static).update(Text(
                "no curves: this item's runs logged no metrics (p pins a run's curves)",
                style="bright_black", no_wrap=True, overflow="ellipsis"))
            return
        plot = self._plot()
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        title = Text(no_wrap=True, overflow="ellipsis")
        if self.family is None:
            title.append("no curves: this item's runs logged no metrics (p pins a run's "
                         "curves)", style="bright_black")
        else:
            fams = self.families
            for f in fams:
                title.append(f" {f} ", style="reverse bold" if f == self.family else "bright_black")
            title.append("  m: next", style="bright_black")
            for label, xs, ys in curves(self.runs, self.family):
                plt.plot(xs, ys, label=label, marker="braille")
            plt.xlabel("step")
        self.query_one("#metrics-title", Static).update(title, layout=False)
        plot.display = self.family is not None
        plot.refresh()
