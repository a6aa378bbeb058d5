"""The plan pane: the items as a todo list (status glyph, id, priority, needs, content).

Attributes down: the app sets statuses (:meth:`PlanPane.set_status`) and live runs.
Messages up: :class:`PlanPane.ItemSelected` when the highlight moves,
:class:`PlanPane.InspectRequested` on enter (enter never runs anything: ``r`` does, after
a confirmation), :class:`PlanPane.MarkRequested` for ``d`` / ``s`` /
``u``, :class:`PlanPane.PinToggled` for ``p``. The pane never calls the runner.

``/`` opens a filter: words match id, content, status, priority, kind and host
(case-insensitive, all words must match); escape clears it.

A plan with arms (:mod:`core.plans.arms`) shows each arm's items together under a line of
its own (not an item: the cursor passes it), where the arms' templates begin: the arm's
state and items done, its latest loss and tau (:meth:`PlanPane.set_arm_figures`, from the
app) and the knob it changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.padding import Padding
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.actions import SkipAction
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from console.glyphs import GLYPHS
from console.widgets.vim import option_list_keys
from core.text import sanitize
from core.plans.plan import Item, Plan

MARKS = {"✎": ("magenta", "manual item: you do it, then mark it done (d)"),
         "▶": ("bold yellow", "a run of this item is live"),
         "⌖": ("cyan", "its curves are pinned on the chart (p)"),
         "⇠": ("bright_black", "needs (and after): the items it waits for")}
"""The other glyphs of an item's line (the help's legend reads them from here)."""
STATUS_STYLE = {"pending": "bright_black", "in_progress": "bold yellow", "done": "green",
                "failed": "bold red", "stopped": "cyan", "skipped": "dim"}
"""``stopped`` is an operator's decision, not a crash: its own glyph, never red."""
PRIORITY = {"high": ("▲", "red"), "medium": ("■", "yellow"), "low": ("▼", "blue")}


def status_text(status: str) -> Text:
    """``● done`` in the status colour."""
    return Text(f"{GLYPHS.get(status, '?')} {status}", style=STATUS_STYLE.get(status, ""))


def item_prompt(item: Item, status: str, *, live: bool = False, pinned: bool = False) -> Group:
    """Glyph, id, priority, needs; then the content, wrapped under the id."""
    mark, pcolor = PRIORITY.get(item.priority, ("·", ""))
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(GLYPHS.get(status, "?"), style=STATUS_STYLE.get(status, ""))
    t.append(" ")
    t.append(item.id, style="bold")
    t.append(f" {mark}", style=pcolor)
    for glyph, on_ in (("✎", item.manual), ("▶", live), ("⌖", pinned)):
        if on_:
            t.append(f" {glyph}", style=MARKS[glyph][0])
    if item.deps:
        t.append("  ⇠ " + sanitize(",".join(item.deps), max_len=200), style=MARKS["⇠"][0])
    content = Text(sanitize(item.content), style="dim" if status in ("done", "skipped") else "")
    return Group(t, Padding(content, (0, 0, 0, 2)))


def arm_prompt(name: str, fig: dict, statuses: list[str]) -> Text:
    """``┌ arm noise  ● done 4/4  loss 1.23  tau 2.11  noise.target=fc_input``."""
    from core.plans.arms import arm_state

    state = fig.get("state") or arm_state(statuses)
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("┌ arm ", style="bright_black")
    t.append(name, style="bold magenta")
    t.append(f"  {GLYPHS.get(state, '?')} {state} {statuses.count('done')}/{len(statuses)}",
             style=STATUS_STYLE.get(state, ""))
    for key in ("loss", "tau"):
        if fig.get(key) is not None:
            t.append(f"  {key} {fig[key]:.3g}", style="bold")
    knob = "; ".join(fig.get("knob") or ())
    if knob:
        t.append("  " + sanitize(knob, max_len=200), style="cyan")
    return t


def display_order(plan: Plan, items: list[Item]) -> list[Item | str]:
    """``items`` in plan order, except that each arm's items come together under its name
    (a ``str``), placed where the first of them is."""
    out: list[Item | str] = []
    placed: set[str] = set()
    for it in items:
        if it.arm is None:
            out.append(it)
        elif it.arm not in placed:
            placed.add(it.arm)
            out.append(it.arm)
            out += [x for x in items if x.arm == it.arm]
    return out


def matches(item: Item, status: str, words: list[str]) -> bool:
    hay = " ".join([item.id, item.content, status, item.priority,
                    item.action.kind if item.action else "manual",
                    (item.action.host or "") if item.action else ""]).lower()
    return all(w in hay for w in words)


class PlanList(OptionList):
    """The option list of items (one option per item, its id as option id).

    The highlighted item is always in view: a move scrolls to it, and so does every change
    of the list's size (the item pane beside it grows and shrinks with the selected item's
    detail, after the move) and the first layout (a reopened console's cursor)."""

    BINDINGS = option_list_keys()

    def on_resize(self) -> None:
        self.call_after_refresh(self.scroll_to_highlight)


class PlanPane(Vertical):
    """Filter box plus item list."""

    ALLOW_MAXIMIZE = True
    BINDINGS = [
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("d", "mark('done')", "Done"),
        Binding("s", "mark('skipped')", "Skip"),
        Binding("u", "mark('pending')", "Undo"),
        Binding("p", "pin", "Pin curve", show=False),
    ]

    @dataclass
    class ItemSelected(Message):
        item_id: str

    @dataclass
    class InspectRequested(Message):
        """Enter on an item: show its detail (never a run)."""

        item_id: str

    @dataclass
    class MarkRequested(Message):
        item_id: str
        status: str

    @dataclass
    class PinToggled(Message):
        item_id: str

    def __init__(self, plan: Plan, statuses: dict[str, str], *, id: str | None = None):
        super().__init__(id=id)
        self.plan = plan
        self.statuses = dict(statuses)
        self.live: set[str] = set()
        self.pinned: set[str] = set()
        self.filter_text = ""
        self._shown: list[str] = []
        self._announced: str | None = None
        self.arm_figures: dict[str, dict] = {}

    def compose(self) -> ComposeResult:
        yield Static("", id="plan-summary")
        yield Input(placeholder="filter: words in id, content, status, host…", id="plan-filter")
        yield PlanList(id="plan-options")

    def on_mount(self) -> None:
        self.query_one("#plan-filter").display = False
        self._rebuild()

    # -- attributes down -----------------------------------------------------------------
    @property
    def options(self) -> PlanList:
        return self.query_one(PlanList)

    @property
    def selected(self) -> str | None:
        opt = self.options.highlighted_option
        return opt.id if opt else None

    @property
    def shown(self) -> list[str]:
        """Ids of the items the filter lets through, in plan order."""
        return list(self._shown)

    def set_status(self, item_id: str, status: str) -> None:
        self.statuses[item_id] = status
        self._refresh_item(item_id)
        self._summary()
        if item_id == self.selected:
            self.refresh_bindings()  # u comes and goes with the status

    def set_live(self, item_id: str, live: bool) -> None:
        (self.live.add if live else self.live.discard)(item_id)
        self._refresh_item(item_id)
        if item_id == self.selected:
            self.refresh_bindings()

    def set_pinned(self, item_id: str, pinned: bool) -> None:
        (self.pinned.add if pinned else self.pinned.discard)(item_id)
        self._refresh_item(item_id)

    def set_filter(self, text: str) -> None:
        self.filter_text = text
        self._rebuild()

    def set_arm_figures(self, figures: dict[str, dict]) -> None:
        """Each arm's state, loss, tau and knob (:func:`console.services.arm_figures`)."""
        self.arm_figures = dict(figures)
        for name in figures:
            self._refresh_arm(name)

    def select(self, item_id: str) -> None:
        if item_id in self._shown:
            self.options.highlighted = self.options.get_option_index(item_id)
            self.options.call_after_refresh(self.options.scroll_to_highlight)

    # -- rendering -----------------------------------------------------------------------
    def _prompt(self, item: Item) -> Group:
        return item_prompt(item, self.statuses.get(item.id, "pending"), live=item.id in self.live,
                           pinned=item.id in self.pinned)

    def _arm_prompt(self, name: str) -> Text:
        return arm_prompt(name, self.arm_figures.get(name, {}),
                          [self.statuses.get(it.id, "pending") for it in self.plan.arm_items(name)])

    def _refresh_arm(self, name: str) -> None:
        if f"arm:{name}" in self._arms_shown:
            self.options.replace_option_prompt(f"arm:{name}", self._arm_prompt(name))

    def _refresh_item(self, item_id: str) -> None:
        if item_id in self._shown:
            item = self.plan.item(item_id)
            self.options.replace_option_prompt(item_id, self._prompt(item))
            if item.arm is not None:
                self._refresh_arm(item.arm)

    _arms_shown: frozenset[str] = frozenset()

    def _rebuild(self) -> None:
        words = self.filter_text.lower().split()
        keep = self.selected
        items = [it for it in self.plan.items
                 if matches(it, self.statuses.get(it.id, "pending"), words)]
        rows = display_order(self.plan, items)
        self._shown = [it.id for it in rows if not isinstance(it, str)]
        self._arms_shown = frozenset(f"arm:{r}" for r in rows if isinstance(r, str))
        ol = self.options
        ol.set_options([Option(self._arm_prompt(r), id=f"arm:{r}", disabled=True)
                        if isinstance(r, str) else Option(self._prompt(r), id=r.id)
                        for r in rows])
        if keep in self._shown:
            ol.highlighted = ol.get_option_index(keep)
        elif self._shown:
            ol.highlighted = ol.get_option_index(self._shown[0])
        self._summary()

    def _summary(self) -> None:
        counts: dict[str, int] = {}
        for it in self.plan.items:
            s = self.statuses.get(it.id, "pending")
            counts[s] = counts.get(s, 0) + 1
        t = Text()
        for s in GLYPHS:
            if counts.get(s):
                t.append(f"{GLYPHS[s]} {counts[s]}  ", style=STATUS_STYLE[s])
        if self.filter_text:
            t.append(f"/{self.filter_text} ({len(self._shown)}/{len(self.plan.items)})",
                     style="bold cyan")
        self.query_one("#plan-summary", Static).update(t, layout=False)

    # -- messages up ---------------------------------------------------------------------
    @on(OptionList.OptionHighlighted, "#plan-options")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        # (redrawing an item's line highlights it again: only a move is news)
        if event.option_id and event.option_id != self._announced:
            self._announced = event.option_id
            self.refresh_bindings()
            self.post_message(self.ItemSelected(event.option_id))

    @on(OptionList.OptionSelected, "#plan-options")
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_id:
            self.post_message(self.InspectRequested(event.option_id))

    @on(Input.Changed, "#plan-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.set_filter(event.value)

    @on(Input.Submitted, "#plan-filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        event.stop()
        self.options.focus()

    def action_filter(self) -> None:
        box = self.query_one("#plan-filter", Input)
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#plan-filter", Input)
        if not box.display and not self.filter_text:
            raise SkipAction()  # nothing to clear: escape restores a zoom (the app's)
        box.value = ""
        box.display = False
        self.set_filter("")
        self.options.focus()

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """``u`` (undo: back to pending) is in the footer only where there is something to
        undo: the selected item is done, skipped, failed, stopped, or in progress with no
        live run (started outside specdeck)."""
        if action == "mark" and parameters == ("pending",):
            status = self.statuses.get(self.selected or "", "pending")
            return status != "pending" and not (status == "in_progress"
                                                 and self.selected in self.live)
        return True

    def action_mark(self, status: str) -> None:
        if self.selected:
            self.post_message(self.MarkRequested(self.selected, status))

    def action_pin(self) -> None:
        if self.selected:
            self.post_message(self.PinToggled(self.selected))
