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


async def test_the_item_detail_says_what_the_item_and_the_campaign_cost(tmp_path):
    from console.widgets.item_detail import ItemDetail
    from core.plans.planfile import load_plan
    from core.state.store import Store
    from tests.ui.conftest import pick

    path = tmp_path / "p.yaml"
    path.write_text(f"""name: priced
hosts:
  gpu: {{local: true, workdir: {tmp_path}/gpu, price: {{per_gpu_hour: 2.0, gpus: 4}}}}
  free: {{local: true, workdir: {tmp_path}/free}}
items:
  - id: train
    content: train it
    action: {{kind: shell, host: gpu, params: {{command: "true"}}}}
  - id: look
    content: look
    action: {{kind: shell, host: free, params: {{command: "true"}}}}
""")
    plan, store = load_plan(path), Store(":memory:")
    now = time.time()
    add_run(store, "train", 1, "failed", "gpu", start=now - 7200, seconds=1800, exit_code=1)
    add_run(store, "train", 2, "succeeded", "gpu", start=now - 3600, seconds=3600)
    add_run(store, "look", 1, "succeeded", "free", start=now - 600, seconds=60)
    def detail(app) -> str:
        body = app.query_one(ItemDetail).query_one("#detail-body")
        lines = [line.text for line in body.render_lines(body.region.reset_offset)]
        return " ".join(" ".join(lines).split())  # the pane wraps: compared as words

    async with running(plan, store, select="train") as (app, pilot, _):
        shown = detail(app)
        assert "USD 12.00 · campaign USD 12.00" in shown, shown  # 1.5 h x 8.0/h
        await pick(pilot, "look")
        assert "– (its host has no price:) · campaign USD 12.00" in detail(app)
    store.close()


async def test_the_tau_pane_says_each_drafters_cost_per_tau_gained(tmp_path):
    from console.widgets.tau_table import TauPane
    from core.plans.planfile import load_plan
    from core.state.records import EvalRow
    from core.state.store import Store
    from tests.unit.test_cost import CAMPAIGN

    path = tmp_path / "p.yaml"
    path.write_text(CAMPAIGN.format(wd=tmp_path))
    plan, store = load_plan(path), Store(":memory:")
    now = time.time()
    for item, hours in (("train-a", 1.0), ("train-b", 2.0), ("train-base", 4.0), ("eval-a", 0.0), ("eval-b", 0.0)):
        add_run(store, item, 1, "succeeded", "gpu", start=now - 5 * 3600, seconds=hours * 3600)
    for label, item, gain in (("a", "eval-a", 1.0), ("b", "eval-b", -0.5)):
        run = f"{item}-0101-01"
        store.add_eval_results([row for p in ("p1", "p2", "p3") for row in (
            EvalRow(run, item, label, "drafter", p, 2.0 + gain, [2], None, {}, None),
            EvalRow(run, item, "base", "baseline", p, 2.0, [2], None, {}, None))])
    async with running(plan, store) as (app, pilot, _):
        pane = app.query_one(TauPane)
        await settle(pilot)
        assert set(pane.costs) == {"a", "b"}
        shown = {}
        table = pane.table
        for i, row in enumerate(pane.ordered_rows):
            table.move_cursor(row=i)
            await pilot.pause()
            shown.setdefault(row.drafter, pane.verdict_line().plain)
        assert "cost: USD 10.00 of training, USD 10.00 per +1 tau over the baseline" in shown["a"], shown["a"]
        assert "cost: USD 20.00 of training, no tau gained over the baseline" in shown["b"], shown["b"]
    store.close()
