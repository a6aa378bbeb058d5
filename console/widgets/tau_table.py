"""The tau comparison pane: prompt x drafter vs baseline, sortable, and per-position bars.

The app sets a :class:`core.tau.table.Comparison` (:meth:`TauPane.set_comparison`). The table
lists each drafter's overall figures (``Σ macro``, ``Σ pooled``) first, then one row per
prompt x drafter: tau, delta and % of its baseline. Entries whose settings differ from their
baseline's are flagged (⚠ and the differing keys) on every row, never blended.

The decision first: when the plan names the pairs it decides (``decide:``), their drafters'
rows come first and their verdicts lead the lines under the title, above the cursor row's
(named as such). A drafter measured under two names (the same weights) is one row,
``v5 = train-v5@120``.

Uncertainty: a drafter's ``Σ macro`` row carries its verdict against the baseline in the note
column (▲ better, ▼ worse, ≈ noise: no detectable difference) and each overall row its 95 %
interval (the last column: zoom the pane to see it). The lines under the title say the
cursor row drafter's verdict in words, with the interval, prompts and rounds, and what makes
it incomparable (wrapped, never cut). The title names the harness that measured the figures
(``in-process online``; each harness when entries differ, which also flags them), and when
anything was sampled the temperatures the figures were measured at (``T 0.7``, or
``T 0 / T 0.7`` when entries differ), and a sampled
drafter's line its top-p, top-k and seeds per prompt (greedy figures need no mark).

Nothing is cut: each column is as wide as its widest value (a drafter's name, a note), from
the comparison alone (a table's look never depends on when it idles); the per-position
chart beside the table shows only when the table leaves it room (zoomed, it always does).

A plan with arms (:meth:`TauPane.set_arms`): each arm's ``Σ macro`` row notes its verdict
against the arms' reference, Holm-corrected for the whole family, and the knob it changes
(``▲ better vs v4 (Holm) · fc_layers=taps``); the lines under the title add the cursor row's
arm against the reference and every other arm, with each interval at its Holm level.

Keys: ``o`` sorts by the next column (``O`` reverses; clicking a header sorts by it),
``space`` marks a drafter for the per-position chart. The chart shows the marked drafters,
or the cursor row's drafter and its baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from console.widgets.acceptance_bars import AcceptanceBars
from console.widgets.vim import table_keys
from core.tau.table import (Comparison, family_tag, fmt_ci, fmt_delta, fmt_pct, fmt_tau, measured,
                            mismatch_note, sampling_note, shown_label)
from core.tau.stats import BETTER, NONE, WORSE
from core.text import sanitize

COLUMNS = {"prompt": 8, "drafter": 13, "tau": 5, "Δ": 6, "% base": 6, "note": 8, "95% CI": 10}
"""Columns and their narrowest widths (:func:`column_widths` widens them to their values)."""
CELL_PAD = 2
"""What a DataTable adds to each column's width (one cell of padding either side)."""
BARS_MIN = 24
"""The narrowest per-position chart worth showing beside the table."""
SORTABLE = ("prompt", "drafter", "tau", "Δ", "% base")
MARKS = {BETTER: ("▲ better", "bold green"), WORSE: ("▼ worse", "bold red"),
         NONE: ("≈ noise", "bright_black")}
"""The verdict against the baseline, as the note of a drafter's ``Σ macro`` row."""


@dataclass
class _Row:
    key: str
    group: int
    """0 for overall rows, 1 for per-prompt rows (groups stay apart when sorting)."""
    prompt: str
    drafter: str
    role: str
    tau: float | None
    delta: float | None
    pct: float | None
    mismatch: tuple[str, ...]
    ci: tuple[float, float] | None = None
    """95 % interval of ``tau`` (overall rows)."""
    verdict: str | None = None
    """Against the baseline (``Σ macro`` rows of drafters with a baseline)."""
    aliases: tuple[str, ...] = ()
    """The drafter's other names (overall rows: :attr:`core.tau.table.Drafter.aliases`)."""

    def sort_value(self, column: str):
        v = {"prompt": self.prompt, "drafter": self.drafter, "tau": self.tau, "Δ": self.delta,
             "% base": self.pct}[column]
        if isinstance(v, str):
            return (0, v.lower())
        return (0, v) if v is not None else (1, 0.0)


def rows_of(c: Comparison) -> list[_Row]:
    """Overall rows (the decision's drafters first: a plan's ``decide:``), then per prompt."""
    rows = []
    lead = {label: i for i, label in enumerate(c.deciding)}
    for o in sorted(c.overall, key=lambda o: lead.get(o.drafter, len(lead))):
        also = c.drafter(o.drafter).aliases
        rows.append(_Row(f"macro\0{o.drafter}", 0, "Σ macro", o.drafter, o.role, o.macro,
                         o.delta_macro, o.pct_macro, o.mismatch, o.macro_ci95, o.verdict, also))
        rows.append(_Row(f"pooled\0{o.drafter}", 0, "Σ pooled", o.drafter, o.role, o.pooled,
                         o.delta_pooled, o.pct_pooled, o.mismatch, o.pooled_ci95, aliases=also))
    for x in c.cells:
        rows.append(_Row(f"{x.prompt_id}\0{x.drafter}", 1, x.prompt_id, x.drafter, x.role,
                         x.tau, x.delta, x.pct_of_baseline, x.mismatch))
    return rows


def arm_notes(arms) -> dict[str, Text]:
    """Per arm drafter (:class:`core.tau.arms.ArmsComparison`): its Holm-corrected verdict
    against the reference and the knob it changes, e.g. ``▲ better vs v4 (Holm) · fc_layers=taps``."""
    out = {}
    for p in arms.pairs if arms is not None else ():
        if p.b == arms.against:
            mark, style = MARKS.get(p.verdict, ("", ""))
            t = Text(f"{mark} vs {p.b} (Holm)", style=style)
            if p.knob_a:
                t.append(" · " + sanitize("; ".join(p.knob_a), max_len=200), style="cyan")
            out[p.a] = t
    return out


def note_of(r: _Row, arms: dict[str, Text] | None = None) -> Text:
    """The note column: what makes the row incomparable, or its verdict, or ``baseline``;
    an arm's ``Σ macro`` row without a baseline: its verdict against the arms' reference
    (``arms``: :func:`arm_notes`)."""
    if arms and r.prompt == "Σ macro" and r.drafter in arms and not r.mismatch and not r.verdict:
        return arms[r.drafter]
    if r.mismatch:
        return Text("⚠ " + ",".join(r.mismatch), style="bold yellow")
    if r.verdict in MARKS:
        return Text(*MARKS[r.verdict])
    return Text("baseline" if r.role == "baseline" else "", style="italic")


def drafter_text(r: _Row) -> str:
    return sanitize(" = ".join((r.drafter, *r.aliases)), max_len=200) + (" ⚠" if r.mismatch else "")


def column_widths(rows: list[_Row], arms: dict[str, Text] | None = None) -> dict[str, int]:
    """Each column as wide as its widest value (at least :data:`COLUMNS`): the prompt, the
    drafter's name and the note are never cut."""
    from rich.cells import cell_len

    widths = dict(COLUMNS)
    for r in rows:
        widths["prompt"] = max(widths["prompt"], cell_len(sanitize(str(r.prompt), max_len=200)))
        widths["drafter"] = max(widths["drafter"], cell_len(drafter_text(r)))
        widths["note"] = max(widths["note"], note_of(r, arms).cell_len)
    return widths


class TauTable(DataTable):
    BINDINGS = table_keys()


class TauPane(Vertical):
    """Title, table and per-position chart."""

    ALLOW_MAXIMIZE = True
    BINDINGS = [Binding("o", "sort(1)", "Sort"),
                Binding("O", "reverse", "Reverse", show=False),
                Binding("space", "toggle_mark", "Mark drafter", show=False)]

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.comparison: Comparison | None = None
        self.sort_column: str | None = None
        """None: the comparison's own order (overall rows, then prompt by prompt)."""
        self.reverse = True
        self.marked: list[str] = []
        self.step: int | None = None
        """The training step the comparison was filtered to (None: all eval results)."""
        self._rows: list[_Row] = []
        self._widths: dict[str, int] = dict(COLUMNS)
        self._verdict_shown: str | None = None
        self.arms = None
        """The plan's arms compared (:class:`core.tau.arms.ArmsComparison`), None: no arms."""
        self.costs: dict[str, dict] = {}
        """Drafter label -> its cost entry (:meth:`set_comparison`)."""

    def set_arms(self, arms) -> None:
        """Each arm against the reference and each other, Holm-corrected: the lines under
        the title name the cursor row's arm's comparisons (:meth:`verdict_line`)."""
        changed = arms != self.arms
        self.arms = arms
        if self.comparison is not None and changed:
            self._fill()

    def compose(self) -> ComposeResult:
        yield Static("no eval results yet", id="tau-title")
        yield Static("", id="tau-verdict")
        with Horizontal(id="tau-body"):
            yield TauTable(id="tau-table", cursor_type="row", zebra_stripes=True)
            yield AcceptanceBars(id="tau-bars")

    def on_mount(self) -> None:
        self._columns(dict(COLUMNS))

    def _columns(self, widths: dict[str, int]) -> None:
        table = self.table
        table.clear(columns=True)
        for col, width in widths.items():
            table.add_column(col, key=col, width=width)
        self._widths = widths

    def on_resize(self) -> None:
        self._place_chart()

    def table_width(self, *, ci: bool = False) -> int:
        """Columns the table needs to show every value whole (``ci``: with the interval,
        the last column, which may scroll out of view)."""
        cols = [w for c, w in self._widths.items() if ci or c != "95% CI"]
        return sum(w + CELL_PAD for w in cols) + 2  # and the scrollbar

    def _place_chart(self) -> None:
        """The chart beside the table only when the table keeps every column up to the note
        whole next to it; else the table takes the whole pane (z: zoomed, there is room)."""
        room = self.content_region.width - self.table_width()
        bars = self.query_one("#tau-bars")
        compact = self.screen.has_class("-compact") if self.is_attached else False
        bars.display = compact or room >= BARS_MIN

    @property
    def table(self) -> DataTable:
        return self.query_one("#tau-table", DataTable)

    @property
    def ordered_rows(self) -> list[_Row]:
        return list(self._rows)

    # -- attributes down -----------------------------------------------------------------
    def set_comparison(self, c: Comparison, *, step: int | None = None, costs: list | None = None) -> None:
        """Show ``c`` (filtered to training ``step``); ``costs``: each drafter's training cost and
        cost per unit of tau gained (core.runs.cost.cost_per_tau), said under its verdict."""
        self.comparison = c
        self.step = step
        self.costs = {x["drafter"]: x for x in costs or ()}
        self.marked = [d for d in self.marked if d in {x.label for x in c.drafters}]
        self._fill()

    def sort_by(self, column: str, reverse: bool | None = None) -> None:
        if column not in SORTABLE:
            raise ValueError(f"cannot sort by {column!r}; one of {', '.join(SORTABLE)}")
        self.sort_column = column
        if reverse is not None:
            self.reverse = reverse
        self._fill()

    # -- rendering -----------------------------------------------------------------------
    def _fill(self) -> None:
        c = self.comparison
        table = self.table
        current = self._current_key()
        if c is None:
            return
        col = self.sort_column
        rows = rows_of(c)
        if col is None:
            order = {p: i for i, p in enumerate(c.prompts)}
            rows.sort(key=lambda r: (r.group, order.get(r.prompt, 0) if r.group else 0))
        else:
            rows = self._sorted(rows, col)
        self._rows = rows
        notes = arm_notes(self.arms)
        widths = column_widths(rows, notes)
        if widths != self._widths:
            self._columns(widths)
            self._place_chart()
        table.clear()
        for r in rows:
            note = note_of(r, notes)
            name_style = "italic" if r.role == "baseline" else ("yellow" if r.mismatch else "")
            delta_style = "green" if (r.delta or 0) > 0 else ("red" if (r.delta or 0) < 0 else "")
            table.add_row(
                Text(sanitize(str(r.prompt), max_len=200), style="bold" if r.group == 0 else ""),
                Text(drafter_text(r), style=name_style),
                Text(fmt_tau(r.tau), justify="right"),
                Text(fmt_delta(r.delta), justify="right", style=delta_style),
                Text(fmt_pct(r.pct), justify="right"), note,
                Text(fmt_ci(r.ci) if r.ci else "", justify="right"), key=r.key)
        if current and current in {r.key for r in rows}:
            table.move_cursor(row=[r.key for r in rows].index(current), animate=False)
        self._title()
        self._chart()

    def _sorted(self, rows: list[_Row], col: str) -> list[_Row]:
        present = [r for r in rows if r.sort_value(col)[0] == 0]
        present.sort(key=lambda r: r.sort_value(col)[1], reverse=self.reverse)
        rows = present + [r for r in rows if r.sort_value(col)[0] == 1]  # missing values last
        rows.sort(key=lambda r: r.group)  # stable: overall rows stay on top
        return rows

    def _current_key(self) -> str | None:
        if not self._rows:
            return None
        i = self.table.cursor_row
        return self._rows[i].key if 0 <= i < len(self._rows) else None

    def _current_row(self) -> _Row | None:
        key = self._current_key()
        return next((r for r in self._rows if r.key == key), None)

    def _title(self) -> None:
        c = self.comparison
        t = Text(no_wrap=True, overflow="ellipsis")
        if c is None or not c.drafters:
            t.append("no eval results yet", style="bright_black")
        else:
            arrow = "↓" if self.reverse else "↑"
            t.append(f"{len(c.drafters)} drafters × {len(c.prompts)} prompts", style="bold")
            if self.step is not None:
                t.append(f" at step {self.step}", style="bold cyan")
            harnesses = sorted({(d.measured or measured(d.settings))["harness"] for d in c.drafters})
            t.append(f"  {' / '.join(harnesses)}", style="cyan")  # what measured them (one line)
            temps = sorted({sampling_note(d).split(",")[0] for d in c.drafters})  # "T 0", "T 0.7"
            if temps != ["T 0"]:  # sampled figures say so (a greedy table stays as it always was)
                t.append(f"  {' / '.join(temps)}", style="bold magenta")
            order = f"{self.sort_column} {arrow}" if self.sort_column else "by prompt"
            t.append(f"  sort {order} (o)", style="bright_black")
            if c.flagged:  # (the cursor row's own note is under the title, whole)
                t.append(f"  ⚠ {len(c.flagged)} not comparable", style="bold yellow")
        self.query_one("#tau-title", Static).update(t, layout=False)
        verdict = self.query_one("#tau-verdict", Static)
        line = self.verdict_line()
        if line.plain != self._verdict_shown:  # a layout pass: its height may change
            self._verdict_shown = line.plain
            verdict.update(line)

    def verdict_line(self) -> Text:
        """The cursor row drafter's figures with their interval, and its verdict in words
        (after what makes it incomparable, if anything does): wrapped, never cut."""
        t = Text(overflow="fold")
        c, row = self.comparison, self._current_row()
        if c is None or row is None:
            return t
        for p in c.decision:  # what the plan decides first, whatever the cursor is on
            t.append("decision: ", style="bold")
            t.append(p.verdict_text + "\n", style=MARKS.get(p.verdict, ("", ""))[1]
                     if p.verdict != NONE else "")
        if c.decision:
            t.append(f"cursor row, {shown_label(c.drafter(row.drafter))}: ", style="bold")
        o = c.overall_of(row.drafter)
        if family_tag(c.drafter(row.drafter)):
            t.append(f"{row.drafter} is a DFlash-2 drafter (convolutions and candidate selector)\n", style="cyan")
        note = mismatch_note(c.drafter(row.drafter))
        if note and not (o.verdict_text or "").startswith("⚠"):
            t.append(note + "\n", style="bold yellow")
        sampled = sampling_note(c.drafter(row.drafter))
        if sampled != "T 0":
            t.append(f"{row.drafter} sampled at {sampled}\n", style="magenta")
        if o.verdict_text:
            style = MARKS.get(o.verdict, ("", ""))[1]
            t.append(o.verdict_text, style=style if o.verdict != NONE else "")
        else:
            t.append(f"{o.drafter}: macro {fmt_tau(o.macro)} (95 % CI {fmt_ci(o.macro_ci95)}), "
                     f"{o.prompts} prompts, {o.rounds or '–'} rounds", style="italic")
        for p in self.arms.pairs if self.arms is not None else ():
            if row.drafter in (p.a, p.b):
                knob = "; ".join(p.knob_a)
                t.append(f"\narm {p.a}" + (f" ({knob})" if knob else "") + ": ", style="bold")
                t.append(sanitize(p.text()), style=MARKS.get(p.verdict, ("", ""))[1]
                         if p.verdict != NONE else "")
        spent = self.costs.get(row.drafter)
        if spent:
            from core.runs.cost import fmt

            per = (f"{fmt(spent['per_tau'])} per +1 tau over the baseline" if spent["per_tau"]
                   else "no tau gained over the baseline")
            t.append(f"\ncost: {fmt(spent['cost'])} of training, {per}", style="bright_black")
        return t

    def _chart(self) -> None:
        c = self.comparison
        if c is None:
            return
        labels = list(self.marked)
        if not labels:
            row = self._current_row()
            if row:
                labels = [row.drafter]
                base = c.drafter(row.drafter).baseline
                if base:
                    labels.append(base)
            elif c.drafters:
                labels = [c.drafters[0].label]
        self.query_one("#tau-bars", AcceptanceBars).set_drafters(
            [(lb, c.drafter(lb).per_position) for lb in labels])

    # -- keys and events -----------------------------------------------------------------
    @on(DataTable.RowHighlighted, "#tau-table")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if self._current_row() is not None:
            self._title()
            self._chart()

    @on(DataTable.HeaderSelected, "#tau-table")
    def _header(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        col = str(event.column_key.value)
        if col in SORTABLE:
            self.sort_by(col, reverse=not self.reverse if col == self.sort_column else None)

    def action_sort(self, step: int) -> None:
        i = SORTABLE.index(self.sort_column) if self.sort_column in SORTABLE else -1
        self.sort_by(SORTABLE[(i + step) % len(SORTABLE)])

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self._fill()

    def action_toggle_mark(self) -> None:
        row = self._current_row()
        if row is None:
            return
        if row.drafter in self.marked:
            self.marked.remove(row.drafter)
        else:
            self.marked.append(row.drafter)
        self._chart()
