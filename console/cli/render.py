"""Terminal output for the CLI: colour on a TTY only, tables that wrap long columns.

Colour follows the usual rules: only when the stream is a terminal, never with ``NO_COLOR``
set (https://no-color.org) or ``TERM=dumb``. Tables are rich tables, so a long item title
or a long setting wraps inside its column instead of pushing the row apart; piped, they
take ``$COLUMNS`` (else 80) columns and carry no escape codes.
"""

from __future__ import annotations

import os
import sys

from core.text import sanitize

STATUS_STYLE = {"pending": "", "in_progress": "yellow", "done": "green", "failed": "red",
                "skipped": "dim", "succeeded": "green", "running": "yellow", "stopped": "red",
                "lost": "red", "interrupted": "red", "error": "red", "warning": "yellow"}
_ANSI = {"red": "31", "green": "32", "yellow": "33", "dim": "2", "bold": "1"}


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


def console(stream=None):
    from rich.console import Console

    stream = stream or sys.stdout
    on = colour_on(stream)
    return Console(file=stream, no_color=not on, color_system="auto" if on else None,
                   highlight=False, soft_wrap=False, emoji=False)


def table(headers: list[str], rows: list[list[str]], *, title: str | None = None,
          styles: list[str | None] | None = None, stream=None, wrap: set[int] = frozenset()
          ) -> None:
    """Print a table; columns in ``wrap`` (indexes) take the slack and wrap long text."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i, h in enumerate(headers):
        t.add_column(h, overflow="fold" if i in wrap else "ellipsis",
                     min_width=16 if i in wrap else None)
    for k, r in enumerate(rows):
        style = styles[k] if styles else None
        t.add_row(*(escape(sanitize(str(c))) for c in r),
                  style=STATUS_STYLE.get(style or "", style) or None)
    con = console(stream)
    if title:
        con.print(escape(sanitize(title)), overflow="fold")
    con.print(t)


def print_markdown_tables(md: str, stream=None) -> None:
    """Print Markdown text with its pipe tables drawn as wrapping tables (other lines as is)."""
    stream = stream or sys.stdout
    block: list[list[str]] = []

    def flush() -> None:
        if block:
            head, *rows = block
            rows = [r for r in rows if not all(set(c) <= set("-: ") and c for c in r)]
            table(head, [r + [""] * (len(head) - len(r)) for r in rows], stream=stream)
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
