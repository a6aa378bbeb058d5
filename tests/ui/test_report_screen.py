"""Issue 47 §5: the console's report screen (``c``): the morning report of the campaign, the
same entries ``specdeck report`` lists, in order, with the cost."""

from __future__ import annotations

import time

from console.screens.report import ReportScreen
from tests.ui.conftest import add_run, running, settle


async def test_c_opens_the_report_of_what_happened_meanwhile(campaign):
    plan, store = campaign
    now = time.time()
    add_run(store, "train-v5", 3, "failed", "gpu1", start=now - 3600, seconds=1800, exit_code=1)
    store.alert_once("disk_low", "disk /data: 3.1 GiB free", item_id="train-v5", host="gpu1")
    async with running(plan, store) as (app, pilot, _):
        await pilot.press("c")
        await settle(pilot)
        assert isinstance(app.screen, ReportScreen)
        rep = app.screen.report
        assert [(e.kind, e.item) for e in rep.entries] == [
            ("run_started", "train-v5"), ("run_ended", "train-v5"), ("disk", "train-v5")]
        assert not app.screen.since_seen  # no console saw this store before: the last 12 hours
        shown = str(app.screen.query_one("#report-text").render())
        assert "train-v5 #3 failed (exit 1) after 30m00s" in shown and "DISK" in shown
        assert "1 run(s) started, 1 ended" in shown and "cost:" in shown
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ReportScreen)
