"""The tau pane opens on the decision (issue 48 §3): the plan's ``decide:`` drafters' rows first,
their verdict above the cursor row's (named as the cursor's), and one row per drafter (the
same weights under ``train-v5@120`` and ``v5``: one row named with both)."""

from __future__ import annotations

from console.widgets.tau_table import TauPane
from core.plans.planfile import load_plan
from core.tau.table import measured
from core.state.store import Store
from tests.ui.conftest import running, settle
from tests.unit.test_compare_decide import EVALS, WATCHED

PLAN = """\
name: decide
hosts:
  ev: {{local: true, workdir: {root}/ev}}
items:
  - id: eval-v5
    content: Evaluate v5
    action: {{kind: shell, host: ev, params: {{command: "true"}}}}
  - id: review
    content: Read the tau table and decide
    needs: [eval-v5]
{decide}"""


def _plan(tmp_path, decide: str):
    path = tmp_path / "decide.yaml"
    path.write_text(PLAN.format(root=tmp_path, decide=decide))
    store = Store(":memory:")
    store.add_eval_results(WATCHED + EVALS)
    return load_plan(path), store


async def test_the_pane_opens_on_the_decision_and_says_which_line_is_the_cursors(tmp_path):
    plan, store = _plan(tmp_path, "    decide: [[v5, v4]]\n")
    async with running(plan, store) as (app, pilot, _):
        tau = app.query_one(TauPane)
        order = [(r.prompt, r.drafter) for r in tau.ordered_rows if r.group == 0]
        assert order[:4] == [("Σ macro", "v5"), ("Σ pooled", "v5"),
                             ("Σ macro", "v4"), ("Σ pooled", "v4")]
        assert {d for _, d in order} == {"v5", "v4", "train-v5@60", "baseline"}  # one v5 row
        first = tau.ordered_rows[0]
        assert first.aliases == ("train-v5@120",)
        shown = str(tau.table.get_row_at(0)[1])
        assert shown == "v5 = train-v5@120"
        decision = tau.comparison.decision[0].verdict_text
        line = str(tau.query_one("#tau-verdict").render())
        assert line.startswith(f"decision: {decision}\n") and decision.startswith("v5 is better than v4")
        assert "cursor row, v5 = train-v5@120: v5 is better than baseline" in line
        # the cursor moves to another drafter: the decision stays first, the cursor's line follows
        table = tau.query_one("#tau-table")
        table.focus()
        table.move_cursor(row=order.index(("Σ macro", "train-v5@60")), animate=False)
        await settle(pilot)
        line = str(tau.query_one("#tau-verdict").render())
        assert line.startswith(f"decision: {decision}\n")
        assert "cursor row, train-v5@60: train-v5@60 is better than baseline" in line
    store.close()


async def test_without_a_decision_the_pane_keeps_its_order_and_its_one_line(tmp_path):
    plan, store = _plan(tmp_path, "")
    async with running(plan, store) as (app, pilot, _):
        tau = app.query_one(TauPane)
        order = [r.drafter for r in tau.ordered_rows if r.prompt == "Σ macro"]
        assert order == ["train-v5@60", "v5", "baseline", "v4"]
        line = str(tau.query_one("#tau-verdict").render())
        assert line == tau.comparison.overall_of("train-v5@60").verdict_text
        # the title names what measured the figures (one harness here: every entry's)
        title = str(tau.query_one("#tau-title").render())
        harnesses = {measured(d.settings)["harness"] for d in tau.comparison.drafters}
        assert len(harnesses) == 1 and f"  {harnesses.pop()}  " in title, title
    store.close()
