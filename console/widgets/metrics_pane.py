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

Bookkeeping series (``elapsed_s``, ``eta_s``, ``tokens``, ``epoch``) are not metric tabs
until ``b`` shows them. ``v`` cycles an EMA smoothing (off, 0.6, 0.9, 0.97), ``l`` a log y
axis, ``w`` the x axis between the training step and the wall clock (the run's own
``elapsed_s`` when it logs it, else when each point was stored, from the run's start). A
legend under the tabs names each curve in its colour.

Tau over training (``core.actions.watch_eval``): a run with a ``tau`` series gets a second
chart next to the loss in the default view, tau against step with the baseline drafter's tau
(``tau_baseline``, its latest value) as a horizontal line labelled ``baseline``; the ``tau``
family draws the same chart alone. ``t`` asks for a step (enter alone: the latest evaluated
one; ``all``: every step) and posts :class:`MetricsPane.TauStepRequested`: the app then
shows that step's eval results in the tau pane.

The title names each view key with what it does (``m next metric  v smooth  l log y ...``,
:func:`view_keys`: as many as fit whole beside the tabs; the footer and ``?`` list them all).
"""

from __future__ import annotations

import re

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.actions import SkipAction
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, Static

MAX_CURVES = 8
COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red", "white", "bright_black")
"""Curve colours, in plotext's and Rich's common names (the legend uses the same)."""
BOOKKEEPING = frozenset({"elapsed_s", "eta_s", "tokens", "epoch"})
"""Series that count time or work rather than measure the model: out of the default tabs."""
SMOOTHING = (0.0, 0.6, 0.9, 0.97)
TAU = "tau"
BASELINE = "tau_baseline"
"""Drawn as the tau chart's reference line, never as a family of its own."""
TAU_CI = ("tau_ci95_lo", "tau_ci95_hi")
"""Each tau point's 95 % interval (core.actions.watch_eval): drawn around the tau curve, not a
family."""
BASELINE_COLOR = "gray+"
_INDEXED = re.compile(r"^(.*)\[(\d+)\]$")


def family_of(name: str) -> str:
    mm = _INDEXED.match(name)
    return mm.group(1) if mm else name


def families(names: set[str], *, bookkeeping: bool = False) -> list[str]:
    """Families in display order: loss, tau, accuracies, lr, the rest (alphabetical within);
    bookkeeping series last, and only when ``bookkeeping``."""
    fams = sorted({family_of(n) for n in names} - {BASELINE, *TAU_CI})
    if not bookkeeping:
        fams = [f for f in fams if f not in BOOKKEEPING]

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
        return (5, f) if f in BOOKKEEPING else (4, f)

    return sorted(fams, key=rank)


def ema(values: list[float], alpha: float) -> list[float]:
    """Exponential moving average (TensorBoard's: ``s = alpha * s + (1 - alpha) * v``),
    debiased so the first points are not pulled towards zero."""
    if not alpha:
        return list(values)
    out, s = [], 0.0
    for i, v in enumerate(values, 1):
        s = alpha * s + (1 - alpha) * v
        out.append(s / (1 - alpha ** i))
    return out


def wall_seconds(run: dict, name: str) -> list[float] | None:
    """Seconds since the run started for each point of series ``name``: from the run's
    ``elapsed_s`` at the same step when it logs it, else from when each point was stored."""
    steps = [p[0] for p in run["series"].get(name) or ()]
    elapsed = dict(run["series"].get("elapsed_s") or ())
    if elapsed and all(st in elapsed for st in steps):
        return [float(elapsed[st]) for st in steps]
    times = (run.get("times") or {}).get(name)
    if not times or any(t is None for t in times):
        return None
    t0 = run.get("started_at") or min(times)
    return [max(0.0, t - t0) for t in times]


TIME_UNITS = ((7200.0, 3600.0, "h"), (120.0, 60.0, "min"), (0.0, 1.0, "s"))


def curves(runs: list[dict], family: str, *, wall: bool = False, smooth: float = 0.0,
           log_y: bool = False) -> list[tuple[str, list[float], list[float]]]:
    """(label, xs, ys) of every curve of ``family`` across ``runs`` (at most MAX_CURVES): x the
    step, or seconds since the run started (``wall``; curves without times are left out); y
    EMA-smoothed by ``smooth``; points <= 0 dropped for a log axis."""
    out = []
    for r in runs:
        names = sorted((n for n in r["series"] if family_of(n) == family),
                       key=lambda n: (len(n), n))
        for n in names:
            pts = r["series"][n]
            if not pts:
                continue
            xs = wall_seconds(r, n) if wall else [p[0] for p in pts]
            if xs is None:
                continue
            ys = ema([p[1] for p in pts], smooth)
            if log_y:
                keep = [(x, y) for x, y in zip(xs, ys) if y > 0]
                xs, ys = [k[0] for k in keep], [k[1] for k in keep]
            label = r["label"] if n == family else f"{r['label']} {n[len(family):]}"
            out.append((label, xs, ys))
    return out[:MAX_CURVES]


def time_unit(curves_: list[tuple[str, list[float], list[float]]]) -> tuple[float, str]:
    """The divisor and name of the unit that suits the longest wall-clock x."""
    hi = max((max(xs) for _, xs, _ in curves_ if xs), default=0.0)
    return next((div, name) for lim, div, name in TIME_UNITS if hi >= lim)


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


BAR_KEYS = ("m", "t", "v", "l", "w", "b")
"""The view keys the title names, in this order (the first that fit are shown), each with its
binding's description (``t``, tau at a step: when the runs evaluated tau)."""


def view_keys(bindings, room: int, *, tau: bool) -> Text:
    """``m next metric  v smooth  l log y ...``: each of :data:`BAR_KEYS` with what it does
    (its binding's description), as many as fit whole in ``room`` cells, in order (the
    footer and ``?`` list every key): never a key without its word, nor a word cut."""
    words = {b.key: b.description.lower() for b in bindings}
    t = Text(style="bright_black")
    for k in BAR_KEYS:
        if k not in words or (k == "t" and not tau):
            continue
        unit = f"{k} {words[k]}"
        if t.cell_len + (2 if t.plain else 0) + len(unit) > room:
            break
        if t.plain:
            t.append("  ")
        t.append(k, style="bold")
        t.append(f" {words[k]}")
    return t


def draw_tau(plt, runs: list[dict], legend: list[tuple[str, str]] | None = None) -> None:
    """Tau against step of every run, and each baseline as a horizontal line (``legend``
    collects (label, colour))."""
    xs_all: list[int] = []
    legend = [] if legend is None else legend
    for i, (label, xs, ys) in enumerate(curves(runs, TAU)):
        color = COLORS[i % len(COLORS)]
        plt.plot(xs, ys, marker="braille", color=color)
        legend.append((f"tau {label}", color))
        xs_all += xs
    ci = False
    for name in TAU_CI:  # the interval of every point, as two thin lines
        for _label, xs, ys in curves(runs, name):
            plt.plot(xs, ys, marker="·", color=BASELINE_COLOR)
            ci = True
    if ci:
        legend.append(("95 % CI", "bright_black"))
    if xs_all:
        lo, hi = min(xs_all), max(xs_all)
        for label, value in baselines(runs):
            plt.plot([lo, hi], [value, value], marker="braille", color=BASELINE_COLOR)
            legend.append((f"{label} {value:.2f}", "bright_black"))
    plt.xlabel("step")


class MetricsPane(Vertical):
    """Title with the family and runs, and the chart (the loss and tau side by side when the
    runs evaluated tau)."""

    ALLOW_MAXIMIZE = True
    can_focus = True
    BINDINGS = [Binding("m", "cycle(1)", "Next metric"),
                Binding("M", "cycle(-1)", "Prev metric", show=False),
                # (not s: s skips a plan item, one pane away; a view toggle never shares
                # its letter with a key that changes state)
                Binding("v", "smoothing", "Smooth"),
                Binding("l", "log_y", "Log y"),
                Binding("w", "wall_clock", "Step/time"),
                Binding("b", "bookkeeping", "Bookkeeping", show=False),
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
        self.smooth = 0.0
        self.log_y = False
        self.wall = False
        self.bookkeeping = False
        self._charts: dict = {}
        """The two plot widgets once mounted (``metrics-plot``, ``metrics-tau``)."""
        self._heading: tuple[Text, Text] | None = None
        """The title's tabs and view state, and the legend, as last drawn (a resize fits the
        view keys between them again)."""

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
        return families(names, bookkeeping=self.bookkeeping)

    @property
    def has_curves(self) -> bool:
        return bool(self.families)

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

    def action_smoothing(self) -> None:
        i = SMOOTHING.index(self.smooth) if self.smooth in SMOOTHING else 0
        self.smooth = SMOOTHING[(i + 1) % len(SMOOTHING)]
        self._draw()

    def action_log_y(self) -> None:
        self.log_y = not self.log_y
        self._draw()

    def action_wall_clock(self) -> None:
        self.wall = not self.wall
        self._draw()

    def action_bookkeeping(self) -> None:
        self.bookkeeping = not self.bookkeeping
        if self.family not in self.families:
            self.family = self.families[0] if self.families else None
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
        if not box.display:
            raise SkipAction()  # nothing to close: escape restores a zoom (the app's)
        box.display = False
        self.focus()

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
        state = [f"ema {self.smooth:g}" if self.smooth else "", "log y" if self.log_y else "",
                 "x: wall clock" if self.wall else ""]
        title.append("  " + " · ".join(x for x in state if x) if any(state) else "",
                     style="bold cyan")
        legend: list[tuple[str, str]] = []
        if self.family == TAU:
            draw_tau(plt, self.runs, legend)
        else:
            drawn = curves(self.runs, self.family, wall=self.wall, smooth=self.smooth,
                           log_y=self.log_y)
            div, unit = time_unit(drawn) if self.wall else (1.0, "")
            for i, (label, xs, ys) in enumerate(drawn):
                color = COLORS[i % len(COLORS)]
                plt.plot([x / div for x in xs], ys, marker="braille", color=color)
                legend.append((label, color))
            plt.xlabel(f"time since start ({unit})" if self.wall else "step")
            if self.wall and not drawn:
                legend.append(("no wall-clock times for these points (w: step)", "yellow"))
        if self.log_y:
            plt.yscale("log")
        key = Text(no_wrap=True, overflow="ellipsis")
        for label, color in legend + (self._side_legend if self.split else []):
            key.append("━ ", style=color)
            key.append(f"{label}  ")
        self._heading = (title, key)
        self._show_heading()
        plot.display = True
        plot.refresh()

    def on_resize(self) -> None:
        self._show_heading()

    def _show_heading(self) -> None:
        """The tabs and view state, the view keys that fit beside them, and the legend."""
        if self._heading is None or self.family is None:
            return
        tabs, legend = self._heading
        title = tabs.copy()
        room = (self.content_region.width or 80) - title.cell_len - 2
        keys = view_keys(self.BINDINGS, room, tau=has_tau(self.runs))
        if keys.plain:
            title.append("  ")
            title.append_text(keys)
        title.append("\n")
        title.append_text(legend)
        self.query_one("#metrics-title", Static).update(title, layout=False)

    def _draw_side(self, show: bool) -> None:
        """The tau chart next to the main one (hidden when not ``show``)."""
        side = self._plot("metrics-tau")
        side.display = show
        plt = side.plt
        plt.clear_data()
        plt.clear_figure()
        self._side_legend: list[tuple[str, str]] = []
        if show:
            draw_tau(plt, self.runs, self._side_legend)
            if self.log_y:
                plt.yscale("log")
        side.refresh()
