"""Terminal output for the CLI: colour on a TTY only, tables a person and a script can read.

Colour follows the usual rules: only when the stream is a terminal, never with ``NO_COLOR``
set (https://no-color.org) or ``TERM=dumb``. No table ever cuts a value (no ellipsis):

* on a terminal, a table is a rich table as wide as the terminal; a long item title or
  setting wraps inside its column, and a table too wide for it (``fit``) leaves out its
  lowest-priority columns (the rightmost, or in the order the table gives; never the first,
  the name, nor an id) and says which; an id (an item, a drafter: what a person types next)
  is never split across lines, the other columns shrink first;
* piped or redirected, a table is plain aligned columns, one row per line with every value
  whole (``status | grep failed`` sees each item's whole row), no escape codes.
"""

from __future__ import annotations

import os
import sys

from core.runs import life
from core.text import sanitize

STATUS_STYLE = {"pending": "", "in_progress": "yellow", "done": "green", "failed": "red",
                "skipped": "dim", life.SUCCEEDED: "green", life.RUNNING: "yellow",
                life.STOPPED: "cyan", life.LOST: "red", life.INTERRUPTED: "red", life.PREEMPTED: "yellow",
                "error": "red",
                "warning": "yellow"}
"""Item statuses, run states (:mod:`core.runs.life`) and notice levels."""
_ANSI = {"red": "31", "green": "32", "yellow": "33", "cyan": "36", "dim": "2", "bold": "1"}


def colour_on(stream=None) -> bool:
    stream = stream or sys.stdout
    if "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def paint(text: str, style: str, stream=None) -> str:
    """``text`` in ``style`` (a STATUS_STYLE key or colour name) when colour is on."""
    code = _ANSI.get(STATUS_STYLE.get(style, style))
    if not code or not colour_on(stream):
        return text
    return f"\x1b[{code}m{text}\x1b[0m"


def is_terminal(stream=None) -> bool:
    """Whether ``stream`` (default stdout) is a terminal a person reads."""
    try:
        return (stream or sys.stdout).isatty()
    except (AttributeError, ValueError):
        return False


def _console_class():
    from rich.console import Console

    class CliConsole(Console):
        """A closed pipe is the CLI's to handle (exit 141, :func:`console.cli.entry.main`):
        rich's own handler would exit 1 first."""

        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return CliConsole


def console(stream=None):
    stream = stream or sys.stdout
    on = colour_on(stream)
    return _console_class()(file=stream, no_color=not on, color_system="auto" if on else None,
                            highlight=False, soft_wrap=False, emoji=False)


GAP = 3
"""Columns between two table columns (rich's SIMPLE_HEAD padding; the plain layout's)."""
WRAP_MIN = 16
"""The narrowest a wrapping column gets."""


def _cells(headers: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    head = [sanitize(str(h)) for h in headers]
    return head, [[sanitize(str(c).replace("\n", " "), newlines=False) for c in r]
                  for r in rows]


def natural_widths(headers: list[str], rows: list[list[str]]) -> list[int]:
    """Each column's width with its header and every value whole, in terminal cells."""
    from rich.cells import cell_len

    return [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(headers)]


IDS = frozenset({0})
"""A table's id columns unless it says: the first, the name (a drafter, an item)."""


def fit_columns(headers: list[str], rows: list[list[str]], width: int, *,
                wrap: set[int] = frozenset(), ids: set[int] = IDS,
                drop: tuple[int, ...] | None = None) -> list[int]:
    """The columns (indexes) to show in ``width`` cells: every column whose values fit
    whole, leaving out first those ``drop`` names, in its order (default: the rightmost
    first, the lowest priority), never column 0 nor an id column (``ids``); a column in
    ``wrap`` counts as :data:`WRAP_MIN` wide (it wraps into what is left) and is, by
    default, left out only after the others."""
    need = [WRAP_MIN if i in wrap else w for i, w in enumerate(natural_widths(headers, rows))]
    keep = list(range(len(headers)))
    if drop is None:
        drop = tuple([i for i in reversed(keep) if i not in wrap] +
                     [i for i in reversed(keep) if i in wrap])
    order = [i for i in drop if i in keep and i != 0 and i not in ids]
    while order and sum(need[i] for i in keep) + GAP * (len(keep) - 1) > width:
        keep.remove(order.pop(0))
    return keep


def plain_table(headers: list[str], rows: list[list[str]], stream=None) -> None:
    """Aligned columns, one row per line, every value whole (for a pipe or a file)."""
    from rich.cells import cell_len

    stream = stream or sys.stdout
    widths = natural_widths(headers, rows)
    for r in [headers, *rows]:
        cells = [c + " " * (w - cell_len(c)) for c, w in zip(r, widths)]
        stream.write((" " * GAP).join(cells).rstrip() + "\n")


def table(headers: list[str], rows: list[list[str]], *, title: str | None = None,
          styles: list[str | None] | None = None, stream=None, wrap: set[int] = frozenset(),
          fit: bool = False, ids: set[int] = IDS, drop: tuple[int, ...] | None = None,
          more: str = "a wider terminal or --markdown shows them") -> None:
    """Print a table, every value whole: on a terminal columns in ``wrap`` (indexes) take
    the slack and wrap long text, others fold rather than cut, except the id columns
    (``ids``: what a person types next, an item id, a drafter), which are never split; with
    ``fit`` the columns that do not fit whole are left out (``drop`` says in which order,
    :func:`fit_columns`; said below it, with ``more``, what shows them); piped, plain
    aligned columns (:func:`plain_table`); rich's table loads only for a terminal."""
    stream = stream or sys.stdout
    headers, rows = _cells(headers, [list(r) + [""] * (len(headers) - len(r)) for r in rows])
    if not is_terminal(stream):
        if title:
            stream.write(title + "\n")
        plain_table(headers, rows, stream)
        return
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    con = console(stream)
    keep = (fit_columns(headers, rows, con.width, wrap=wrap, ids=ids, drop=drop) if fit
            else range(len(headers)))
    natural = natural_widths(headers, rows)
    # Columns that can all be whole beside the wrapping ones are kept whole (ids, states);
    # else the other columns fold (a very narrow terminal): never an ellipsis, and never a
    # split id ("strip-baseli" / "ne" reads as another item) while the ids fit at all.
    whole = sum(WRAP_MIN if i in wrap else natural[i] for i in keep) \
        + GAP * (len(keep) - 1) <= con.width
    firm = {i for i in keep if i in ids}  # whole while the others keep a cell each
    if sum(natural[i] if i in firm else 1 for i in keep) + GAP * (len(keep) - 1) > con.width:
        firm = set()
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i in keep:
        t.add_column(escape(headers[i]), overflow="fold", no_wrap=i in firm and not whole,
                     min_width=(WRAP_MIN if i in wrap else natural[i] if whole or i in firm
                                else None))
    for k, r in enumerate(rows):
        style = styles[k] if styles else None
        t.add_row(*(escape(r[i]) for i in keep),
                  style=STATUS_STYLE.get(style or "", style) or None)
    if title:
        con.print(escape(title), overflow="fold")
    con.print(t)
    left = [headers[i] or f"column {i + 1}" for i in range(len(headers)) if i not in keep]
    if left:
        con.print(escape(f"(left out at {con.width} columns: {', '.join(left)}; {more})"),
                  overflow="fold")


def print_markdown_tables(md: str, stream=None, *, fit: bool = False,
                          wrap_headers: tuple[str, ...] = ()) -> None:
    """Print Markdown text with its pipe tables drawn as tables (other lines as is; ``fit``:
    each table fit to the terminal as :func:`table` does; columns headed ``wrap_headers``
    wrap)."""
    stream = stream or sys.stdout
    block: list[list[str]] = []

    def flush() -> None:
        if block:
            head, *rows = block
            rows = [r for r in rows if not all(set(c) <= set("-: ") and c for c in r)]
            wrap = {i for i, h in enumerate(head) if h in wrap_headers}
            table(head, rows, stream=stream, fit=fit, wrap=wrap)
            block.clear()

    for line in md.rstrip("\n").split("\n"):
        s = line.strip()
        if s.startswith("|") and s.endswith("|"):
            block.append([c.strip() for c in s[1:-1].split("|")])
            continue
        flush()
        stream.write(sanitize(line, newlines=False) + "\n")
    flush()
    stream.flush()
