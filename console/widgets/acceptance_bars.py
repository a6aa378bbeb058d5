"""Per-position acceptance (p_k) of a few drafters as a horizontal bar chart with values.

One row per draft position k: each drafter's bar (its colour, eighth-block resolution) and
its value, drafters side by side so a position compares at a glance. Positions past the last
one any drafter accepts are summarised in one line. Drawn at render time, for the width the
pane has (it grows when zoomed).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

BAR_COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red")
_EIGHTHS = " ▏▎▍▌▋▊▉█"


def hbar(value: float, width: int) -> str:
    """A left-aligned bar of ``width`` cells for ``value`` in 0..1 (eighths of a cell)."""
    eighths = round(max(0.0, min(1.0, value)) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[part] if part else "")).ljust(width)


SEPARATORS = " @-_/."
"""Where a drafter's name breaks across lines by preference (``train-v5@`` / ``60``)."""


def name_lines(label: str, width: int) -> list[str]:
    """``label`` in lines of at most ``width`` cells, never cut: a name wider than its column
    wraps (after a separator where it has one), each line but the last ending in ``…``, so
    no piece reads as another drafter (``train-v5@60`` is never ``train-v5@6``)."""
    width = max(2, width)
    out, rest = [], label
    while len(rest) > width:
        head = rest[:width - 1]
        cut = max(head.rfind(c) for c in SEPARATORS) + 1
        cut = cut if cut > 0 else width - 1
        out.append(rest[:cut].rstrip() + "…")
        rest = rest[cut:].lstrip()
    return out + [rest]


def _columns(entries: list, width: int) -> tuple[int, int, int]:
    """(the position labels' width, each drafter's column, its bar) in ``width`` cells."""
    k_max = max(len(pp) for _, pp in entries)
    head = len(f"k{k_max}") + 1
    col = max(10, (width - head) // len(entries))
    return head, col, max(3, col - 6)


def chart(entries: list[tuple[str, tuple[float, ...]]], width: int) -> Text:
    """The chart for ``entries`` ([(drafter, p_1..p_K)]) in ``width`` cells (a drafter's
    name wider than its column wraps: :func:`name_lines`)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("p_k: share of rounds accepting draft slot k\n", style="bold")
    if not entries:
        t.append("no eval results", style="bright_black")
        return t
    entries = entries[: len(BAR_COLORS)]
    k_max = max(len(pp) for _, pp in entries)
    last = max((k for _, pp in entries for k, v in enumerate(pp) if v >= 0.0005), default=-1)
    shown = min(k_max, last + 1)
    head, col, bar_w = _columns(entries, width)
    names = [name_lines(label, col - 1) for label, _ in entries]
    for row in range(max(len(n) for n in names)):
        line = Text(" " * head)
        for i, lines in enumerate(names):
            line.append((lines[row] if row < len(lines) else "").ljust(col),
                        style=f"bold {BAR_COLORS[i]}")
        t.append_text(line)
        t.append("\n")
    for k in range(shown):
        t.append(f"k{k + 1}".ljust(head), style="bright_black")
        for i, (_, pp) in enumerate(entries):
            if k < len(pp):
                t.append(hbar(pp[k], bar_w), style=BAR_COLORS[i])
                t.append(f" {pp[k]:.2f} ".ljust(col - bar_w))
            else:
                t.append(" " * col)
        t.append("\n")
    if shown < k_max:
        t.append(f"k{shown + 1}–k{k_max}: 0.00 for every drafter", style="bright_black")
    return t


class AcceptanceBars(Static):
    """Per-position acceptance of a few drafters (the tau pane's chart)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.entries: list[tuple[str, tuple[float, ...]]] = []

    def set_drafters(self, entries: list[tuple[str, tuple[float, ...]]]) -> None:
        self.entries = list(entries)
        self.refresh(layout=True)

    @property
    def rows_needed(self) -> int:
        """Rows the chart needs (title, names, one per position, a summary line) at its
        width."""
        entries = self.entries[: len(BAR_COLORS)]
        if not entries:
            return 3
        _, col, _ = _columns(entries, self.size.width or 40)
        names = max(len(name_lines(label, col - 1)) for label, _ in entries)
        return 2 + names + max(len(pp) for _, pp in entries)

    def render(self) -> Text:
        return chart(self.entries, self.size.width or 40)
