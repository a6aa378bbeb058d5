"""The footer: the keys that fit whole, never one cut mid-word.

Textual's footer lays its keys out in one row and lets the last ones run under the command
palette's key, docked on the right: on an 80-column terminal it read ``? Hel▏^p palette``
with a stray letter after it. This one shows the keys that fit whole and hides the rest,
those the tabs line already names first (on a small terminal it says ``z: zoom · ?: help``),
then from the right (the pane's own keys come first; ``?`` lists every key, ``ctrl+p`` every
command).
"""

from __future__ import annotations

from rich.cells import cell_len
from textual.widget import Widget
from textual.widgets import Footer

NAMED_ELSEWHERE = ("zoom", "help")
"""Actions whose keys the tabs line names on a small terminal: hidden first there."""


def key_width(key: Widget) -> int:
    """The cells ``key`` takes in the row: its text, padding, border and margins."""
    styles = key.styles
    return cell_len(key.render().plain) + styles.gutter.width + styles.margin.width


def keys_shown(widths: list[int], room: int, first_hidden: set[int]) -> set[int]:
    """Which keys (indexes into ``widths``, in row order) fit whole in ``room`` cells: those
    in ``first_hidden`` go first, then the rightmost, until the rest fit."""
    shown = set(range(len(widths)))
    order = sorted(first_hidden) + [i for i in reversed(range(len(widths)))
                                    if i not in first_hidden]
    for i in order:
        if sum(widths[j] for j in shown) <= room:
            break
        shown.discard(i)
    return shown


class KeysFooter(Footer):
    """A :class:`~textual.widgets.Footer` that hides the keys it cannot show whole."""

    tabs_name_keys = False
    """Whether the tabs line names zoom and help (the app sets it on a small terminal): then
    their keys are the first to give way."""

    def compose(self):
        yield from super().compose()
        self.call_after_refresh(self.fit)

    def on_resize(self) -> None:
        self.call_after_refresh(self.fit)

    def fit(self) -> None:
        """Show the keys that fit in the row beside the palette's key; hide the others."""
        if not self.is_attached:
            return
        every = list(self.query("FooterKey"))  # (by name: Textual keeps the class private)
        keys = [k for k in every if not k.has_class("-command-palette")]
        palette = sum(key_width(k) for k in every if k.has_class("-command-palette"))
        # one cell spare: a docked key leaves the row's last cell to what runs under it
        room = self.size.width - palette - 1
        if room <= 0 or not keys:
            return
        first = {i for i, k in enumerate(keys)
                 if self.tabs_name_keys and k.action in NAMED_ELSEWHERE}
        shown = keys_shown([key_width(k) for k in keys], room, first)
        for i, k in enumerate(keys):
            if k.display != (i in shown):
                k.display = i in shown
