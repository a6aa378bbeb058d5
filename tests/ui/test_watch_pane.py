"""The item pane shows a train run's detached tau watcher (state, last step, queue), and the
console's "while you were away" summary tells what the watcher evaluated meanwhile."""

from __future__ import annotations

from console import messages as m
from console.screens.journal import meanwhile_summary
from console.widgets.item_detail import ItemDetail
from core.state.records import Event
from tests.ui.conftest import running, settle


async def test_item_pane_shows_the_watcher(campaign):
    plan, store = campaign
    run = "train-v5-0101-02"
    store.watcher_claim(run, "train-v5", "gpu", "/w/.specdeck/runs/x-watch", "/w/out")
    store.watcher_update(run, state="evaluating", current=60, last_step=40, queue=[80, 100])
    store.watch_ingest(run, "train-v5", 20, state="failed", error="boom")
    async with running(plan, store) as (app, pilot, seen):
        await pilot.press("down", "down")
        await settle(pilot)
        loaded = [x for x in seen if isinstance(x, m.ItemDetailLoaded)
                  and x.item_id == "train-v5"][-1]
        assert loaded.watcher.state == "evaluating" and loaded.watcher.queue == [80, 100]
        d = app.query_one(ItemDetail)
        assert d.watcher == loaded.watcher
        pane = d.query_one("#detail-body")
        body = " ".join(" ".join(line.text.split()) for line in
                        pane.render_lines(pane.region.reset_offset))
        assert "tau watch" in body and "evaluating (step 60) on gpu" in body
        assert "last step 40" in body and "queue 2" in body and "failed 20" in body


def test_meanwhile_summary_lists_watch_evals_without_counting_them_as_runs():
    lines, title, ok = meanwhile_summary([], [
        Event(id=1, at=0.0, kind="run_succeeded", item_id="t", run_id="r", message="succeeded"),
        Event(id=2, at=0.0, kind="watch_meanwhile", item_id="t", run_id="r",
              message="evaluated while specdeck was away: tau at steps 20, 40")])
    assert title == "While the console was closed: 1 succeeded" and ok
    assert any("tau at steps 20, 40" in x for x in lines)
