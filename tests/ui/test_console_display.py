"""What the console shows is readable (issue 29, point 6): the selection is always on
screen (j, reopen), ctrl+c says how to quit in plain words, no key that changes state shares
its letter with a view toggle, the item pane gives values room, logs and events wrap alike,
events read as text, and the tau pane keeps verdicts, notes and drafter names whole."""

from __future__ import annotations

import re

import pytest

from console.widgets.plan_list import GLYPHS, PlanPane
from core.demo import open_workspace
from core.planfile import load_plan
from core.store import Store
from tests.ui.conftest import add_run, build, settle, T0


@pytest.fixture
def demo(tmp_path):
    """(plan, store) of the demo campaign's 15 items (long titles, long needs), no runs."""
    _, path, _ = open_workspace(str(tmp_path / "demo"), False, str(tmp_path / "s.db"))
    store = Store(":memory:")
    yield load_plan(path), store
    store.close()


def visible_lines(widget) -> list[str]:
    """The widget's lines as they are on screen now (its scroll position applied)."""
    return [widget.render_line(y).text for y in range(widget.size.height)]


def on_screen(pane: PlanPane, item_id: str) -> bool:
    """The item's title line (glyph, id) is among the plan list's visible lines."""
    title = re.compile(rf"^[{''.join(GLYPHS.values())}] {re.escape(item_id)} ")
    return any(title.match(ln) for ln in visible_lines(pane.options))


async def test_j_and_k_never_leave_the_selection_off_screen_at_120x40(demo):
    plan, store = demo
    app = build(plan, store)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        pane = app.query_one(PlanPane)
        seen = []
        for key in ["j"] * (len(plan.items) - 1) + ["k"] * (len(plan.items) - 1):
            await pilot.press(key)
            await settle(pilot)
            seen.append(pane.selected)
            assert on_screen(pane, pane.selected), (key, pane.selected,
                                                    visible_lines(pane.options))
        assert seen[len(plan.items) - 2] == plan.items[-1].id and seen[-1] == plan.items[0].id


async def test_reopen_scrolls_the_cursor_item_into_view(demo):
    plan, store = demo
    last = [it for it in plan.items if it.action][-1].id  # far down the list
    add_run(store, last, 1, "running", "eval", start=T0, seconds=0)
    app = build(plan, store, probe_hosts=False, reconcile=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        pane = app.query_one(PlanPane)
        assert pane.selected == last
        assert on_screen(pane, last), visible_lines(pane.options)
