"""Training curves of one or more runs, overlaid (textual-plotext).

The plot widgets (and plotext, a fifth of the console's import time) are not in the first
frame: plotext is imported in a thread right after it, and the charts are mounted hidden, so
that the first curves of a run cost a repaint, not a mount, a layout and an import on the UI
thread in the middle of a log flood (that was the console's worst frame, 55-70 ms).

The app sets :attr:`MetricsPane.runs` (``[{run_id, label, series: {name: [(step, value)]}}]``,
loaded from the store by a worker, each series already thinned). Metric names group into
families: ``acc[0]``, ``acc[1]``… are the family ``acc`` (per-position accuracy), drawn as
one curve per position. ``m`` / ``M`` step through the families (loss first, then tau, then
the accuracy families, then lr, then the rest).

Tau over training (``core.watch``): a run with a ``tau`` series gets a second chart next to
the loss in the default view, tau against step with the baseline drafter's tau
(``tau_baseline``, its latest value) as a horizontal line labelled ``baseline``; the ``tau``
family draws the same chart alone. ``t`` asks for a step (enter alone: the latest evaluated
one; ``all``: every step) and posts :class:`MetricsPane.TauStepRequested`: the app then
shows that step's eval results in the tau pane.
"""

from __future__ import annotations

import re

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, Static

MAX_CURVES = 8
TAU = "tau"
BASELINE = "tau_baseline"
"""Drawn as the tau chart's reference line, never as a family of its own."""
TAU_CI = ("tau_ci95_lo", "tau_ci95_hi")
"""Each tau point's 95 % interval (core.watch): drawn around the tau curve, not a family."""
BASELINE_COLOR = "gray+"
_INDEXED = re.compile(r"^(.*)\[(\d+)\]$")


def family_of(name: str) -> str:
    mm = _INDEXED.match(name)
    return mm.group(1) if mm else name


def families(names: set[str]) -> list[str]:
    """Families in display order: loss, tau, accuracies, lr, the rest (alphabetical within)."""
    fams = sorted({family_of(n) for n in names} - {BASELINE, *TAU_CI})

    def rank(f: str) -> tuple[int, str]:
        lf = f.lower()
        if "loss" in lf:
            return (0, f)
        if f == TAU:
            return (1, f)
        if "acc" in lf:
            return (2, f)
        if lf == "lr" or lf.endswith("lr") or "learning_rate" in lf:
            return (3, f)
        return (4, f)

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


def has_tau(runs: list[dict]) -> bool:
    return any(r["series"].get(TAU) for r in runs)


def tau_steps(runs: list[dict]) -> list[int]:
    """The steps at which tau was evaluated, in any of ``runs``, ascending."""
    return sorted({p[0] for r in runs for p in r["series"].get(TAU) or ()})


def baselines(runs: list[dict]) -> list[tuple[str, float]]:
    """(label, tau) of each distinct baseline: the latest ``tau_baseline`` of every run that
    has one; labelled ``baseline`` (``baseline <run>`` when the runs' baselines differ)."""
    found = [(r["label"], r["series"][BASELINE][-1][1]) for r in runs
             if r["series"].get(BASELINE)]
    values = sorted({v for _, v in found})
    if len(values) <= 1:
        return [("baseline", values[0])] if values else []
    seen: dict[float, str] = {}
    for label, v in found:
        seen.setdefault(v, f"baseline {label}")
    return [(label, v) for v, label in seen.items()]


def draw_tau(plt, runs: list[dict]) -> None:
    """Tau against step of every run, and each baseline as a horizontal line."""
    xs_all: list[int] = []
    for label, xs, ys in curves(runs, TAU):
        plt.plot(xs, ys, label=f"tau {label}", marker="braille")
        xs_all += xs
    for i, name in enumerate(TAU_CI):  # the interval of every point, as two thin lines
        for label, xs, ys in curves(runs, name):
            plt.plot(xs, ys, label="95 % CI" if i == 0 else None, marker="·",
                     color=BASELINE_COLOR)
    if xs_all:
        lo, hi = min(xs_all), max(xs_all)
        for label, value in baselines(runs):
            plt.plot([lo, hi], [value, value], label=label, marker="braille",
                     color=BASELINE_COLOR)
    plt.xlabel("step")


class MetricsPane(Vertical):
    """Title with the family and runs, and the chart (the loss and tau side by side when the
    runs evaluated tau)."""

    ALLOW_MAXIMIZE = True
    can_focus = True
    BINDINGS = [Binding("m", "cycle(1)", "Next metric"),
                Binding("M", "cycle(-1)", "Prev metric", show=False),
                Binding("t", "tau_step", "Tau at step"),
                Binding("escape", "close_step", "Close", show=False)]

    class TauStepRequested(Message):
        """Show the eval results of training step ``step`` in the tau pane (None: all)."""

        def __init__(self, step: int | None):
            super().__init__()
            self.step = step

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.runs: list[dict] = []
        self.family: str | None = None
        self._charts: dict = {}
        """The two plot widgets once mounted (``metrics-plot``, ``metrics-tau``)."""

    def compose(self) -> ComposeResult:
        yield Static("no curves", id="metrics-title")
        yield Input(placeholder="tau at step", id="metrics-step")

    def on_mount(self) -> None:
        self.query_one("#metrics-step").display = False
        self.call_after_refresh(self._prepare_charts)

    @work(thread=True, exclusive=True, group="metrics-import")
    def _prepare_charts(self) -> None:
        """Import plotext off the UI thread, then mount the (hidden) charts on it."""
        import textual_plotext  # noqa: F401 - warms the module cache

        self.app.call_from_thread(self._premount)

    def _premount(self) -> None:
        if not self._charts and self.is_mounted:
            self._plot(shown=False)

    @property
    def split(self) -> bool:
        """Whether the default view shows tau next to the first family's chart."""
        fams = self.families
        return bool(fams) and self.family == fams[0] and self.family != TAU and has_tau(self.runs)

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

    def action_tau_step(self) -> None:
        """Ask for a step whose tau eval results the tau pane should show."""
        box = self.query_one("#metrics-step", Input)
        steps = tau_steps(self.runs)
        box.placeholder = (f"tau at step (enter: latest, {steps[-1]}; all: every step; "
                           f"evaluated: {', '.join(map(str, steps[-6:]))})" if steps else
                           "tau at step (a training step; all: every step)")
        box.value = ""
        box.display = True
        box.focus()

    def action_close_step(self) -> None:
        box = self.query_one("#metrics-step", Input)
        if box.display:
            box.display = False
            self.focus()
        elif self.screen.maximized is not None:
            self.screen.minimize()

    @on(Input.Submitted, "#metrics-step")
    def _step_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip().lower()
        steps = tau_steps(self.runs)
        if text in ("all", "*"):
            step = None
        elif not text:
            if not steps:
                self.notify("no tau evaluated yet on these runs: type a step", severity="warning")
                return
            step = steps[-1]
        else:
            try:
                step = int(text)
            except ValueError:
                self.notify(f"{event.value!r} is not a step (a number, or all)",
                            severity="warning")
                return
        event.input.display = False
        self.focus()
        self.post_message(self.TauStepRequested(step))

    # -- rendering -----------------------------------------------------------------------
    def _plot(self, id: str = "metrics-plot", *, shown: bool = True):
        if self._charts:
            box = self._charts["box"]
            if shown and not box.display:
                box.display = True
            return self._charts[id]
        from textual_plotext import PlotextPlot  # deferred: see the module docstring

        # both charts at once (mounting is deferred: a second lookup would miss the first)
        main, side = PlotextPlot(id="metrics-plot"), PlotextPlot(id="metrics-tau")
        side.display = False
        box = Horizontal(main, side, id="metrics-charts")
        box.display = shown  # premounted hidden: nothing on screen changes until curves come
        self.mount(box, before="#metrics-step")
        self._charts = {"metrics-plot": main, "metrics-tau": side, "box": box}
        return self._charts[id]

    def _draw(self) -> None:
        if self.family is None:
            self.query_one("#metrics-title", Static).update(Text(
                "no curves: this item's runs logged no metrics (p pins a run's curves)",
                style="bright_black", no_wrap=True, overflow="ellipsis"))
            if self._charts:  # nothing to draw: hide the charts (they keep their place)
                self._charts["metrics-plot"].display = False
                self._charts["metrics-tau"].display = False
            return
        plot = self._plot()
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        self._draw_side(self.split)
        title = Text(no_wrap=True, overflow="ellipsis")
        for f in self.families:
            title.append(f" {f} ", style="reverse bold" if f == self.family else "bright_black")
        title.append("  m: next", style="bright_black")
        if has_tau(self.runs):
            title.append("  t: tau at step", style="bright_black")
        if self.family == TAU:
            draw_tau(plt, self.runs)
        else:
            for label, xs, ys in curves(self.runs, self.family):
                plt.plot(xs, ys, label=label, marker="braille")
            plt.xlabel("step")
        self.query_one("#metrics-title", Static).update(title, layout=False)
        plot.display = True
        plot.refresh()

    def _draw_side(self, show: bool) -> None:
        """The tau chart next to the main one (hidden when not ``show``)."""
        side = self._plot("metrics-tau")
        side.display = show
        plt = side.plt
        plt.clear_data()
        plt.clear_figure()
        if show:
            draw_tau(plt, self.runs)
        side.refresh()
