"""vim motion for every list or text that scrolls: ``j`` / ``k``, ``g`` / ``G``,
``ctrl+d`` / ``ctrl+u``.

Each function returns the bindings for one family of Textual widgets (they name their cursor
and scroll actions differently); the console's lists and scrollers add them to their own.
"""

from __future__ import annotations

from textual.binding import Binding


def _vim(down: str, up: str, first: str, last: str, page_down: str, page_up: str
         ) -> list[Binding]:
    return [Binding("j", down, "Down", show=False), Binding("k", up, "Up", show=False),
            Binding("g", first, "First", show=False), Binding("G", last, "Last", show=False),
            Binding("ctrl+d", page_down, "Page down", show=False),
            Binding("ctrl+u", page_up, "Page up", show=False)]


def option_list_keys() -> list[Binding]:
    """For an OptionList (the cursor moves)."""
    return _vim("cursor_down", "cursor_up", "first", "last", "page_down", "page_up")


def table_keys() -> list[Binding]:
    """For a DataTable (the cursor moves)."""
    return _vim("cursor_down", "cursor_up", "scroll_top", "scroll_bottom", "page_down",
                "page_up")


def scroll_keys() -> list[Binding]:
    """For a scrolling view without a cursor (a log, a detail, help)."""
    return _vim("scroll_down", "scroll_up", "scroll_home", "scroll_end", "page_down", "page_up")
