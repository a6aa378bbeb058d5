"""SVG snapshots of the console (pytest-textual-snapshot): the main screen at 80x24, 120x40
and 200x60, zoomed panes, modals.

The campaign state has fixed run ids and times and the clock is UTC, so a rendering depends
on nothing but the code: no clock, no tmp path (hosts show by name), no GPU sampling.
Update baselines with ``pytest tests/ui/test_snapshots.py --snapshot-update`` after looking
at the SVGs.
"""

from __future__ import annotations

import pytest

from console.widgets.plan_list import PlanPane
from tests.ui.conftest import add_run, add_tau_watch, build, settle, T0

SIZE = (120, 40)


def select(item_id: str, *keys: str):
    async def run_before(pilot) -> None:
        await settle(pilot)
        pilot.app.query_one(PlanPane).select(item_id)
        await settle(pilot)
        if keys:
            await pilot.press(*keys)
            await settle(pilot)
    return run_before


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_screen(snap_compare, campaign, utc, size):
    """Plan, the selected training item with its log (JSON records wrapped), its two
    attempts' loss curves, and the tau table with a flagged drafter (block size 16 against a
    block-8 baseline). At 80x24 the plan and the log share the screen (tabs name the other
    panes) and the log shows at least 8 lines; wider, every pane is on screen."""
    plan, store = campaign
    assert snap_compare(build(plan, store), terminal_size=size, run_before=select("train-v5"))


def test_zoomed_curves(snap_compare, campaign, utc):
    """z on the curves at 120x40: the chart fills the screen (EMA 0.6 on, legend below the
    tabs)."""
    plan, store = campaign
    assert snap_compare(build(plan, store), terminal_size=SIZE,
                        run_before=select("train-v5", "3", "v", "z"))


def test_zoomed_tau_table(snap_compare, campaign, utc):
    """z on the tau table at 120x40: every row, and the per-position acceptance of the
    cursor row's drafter (v5) and its baseline as bars with values."""
    plan, store = campaign
    assert snap_compare(build(plan, store), terminal_size=SIZE,
                        run_before=select("train-v5", "4", "j", "j", "z"))


def test_run_confirmation(snap_compare, campaign, utc):
    """r on a done item: the confirmation names kind, host, launcher, resources, command and
    the attempt it will be."""
    plan, store = campaign
    assert snap_compare(build(plan, store), terminal_size=SIZE,
                        run_before=select("train-v5", "r"))


def test_accuracy_curves_and_sorted_tau(snap_compare, campaign, utc):
    """Per-position accuracy curves (m) and the tau table sorted by tau (o o o)."""
    plan, store = campaign

    async def run_before(pilot) -> None:
        await select("train-v5")(pilot)
        await pilot.press("3", "m", "4", "o", "o", "o")
        await settle(pilot)

    assert snap_compare(build(plan, store), terminal_size=SIZE, run_before=run_before)


def test_tau_over_training(snap_compare, campaign, utc):
    """A train run whose checkpoints were evaluated (watch_eval): the loss and tau against
    step side by side, the baseline's tau as a line, and the tau table filtered to the latest
    evaluated step (t, enter)."""
    plan, store = campaign
    add_tau_watch(store)
    assert snap_compare(build(plan, store), terminal_size=SIZE,
                        run_before=select("train-v5", "3", "t", "enter"))


def test_stop_confirmation(snap_compare, campaign, utc):
    """The stop modal names the run, the item, the host and the process group."""
    plan, store = campaign
    add_run(store, "cleanup", 1, "running", "gpu1", start=T0 + 9000, seconds=0,
            log="removing feats/old/shard-0001\n")
    store.set_status("cleanup", "in_progress")
    app = build(plan, store, reconcile=False)
    assert snap_compare(app, terminal_size=SIZE, run_before=select("cleanup", "x"))
