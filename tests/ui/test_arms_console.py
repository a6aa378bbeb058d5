"""A plan with arms in the console: each arm's items together under a line naming the arm, its
state, latest loss and tau, and its knob (the cursor passes that line); the tau pane names the
cursor row's arm against the reference and the other arms, Holm-corrected; the curves pane
overlays every arm's run of the selected template."""

from __future__ import annotations

from console import messages as m
from console.widgets.metrics_pane import MetricsPane
from console.widgets.plan_list import PlanPane
from console.widgets.tau_table import TauPane
from core.plans.planfile import load_plan
from core.state.store import Store
from tests.ui.conftest import T0, add_run, eval_rows, pick, running, settle, train_log

PLAN = """\
name: arms
hosts:
  gpu: {{local: true, workdir: {root}/gpu}}
arms:
  against: v4
  each:
    noise: {{train: {{command: "train --noise fc_input"}}}}
    taps: {{train: {{command: "train --fc-layers taps"}}}}
items:
  - id: prep
    content: Shared features
    action: {{kind: shell, host: gpu, params: {{command: "true"}}}}
  - id: eval-v4
    content: v4, the reference
    action: {{kind: shell, host: gpu, params: {{command: "true"}}}}
  - id: train
    content: Train ${{arm}}
    arms: all
    needs: [prep]
    action: {{kind: shell, host: gpu, params: {{command: "train"}}}}
  - id: eval
    content: Evaluate ${{arm}}
    arms: all
    needs: [train]
    action: {{kind: eval, host: gpu, params: {{drafter: "drafters/${{arm}}", target: models/t, label: "${{arm}}"}}}}
"""


def _campaign(tmp_path):
    path = tmp_path / "arms.yaml"
    path.write_text(PLAN.format(root=tmp_path))
    store = Store(":memory:")
    log, met = train_log(400)
    add_run(store, "train[noise]", 1, "succeeded", "gpu", start=T0, seconds=60, log=log, metrics=met)
    log, met = train_log(400, decay=200.0)
    add_run(store, "train[taps]", 1, "succeeded", "gpu", start=T0, seconds=60, log=log, metrics=met)
    taus = {"v4": [[2, 3, 2, 3]] * 10,
            "noise": [[2, 3, 3, 3]] * 10,
            "taps": [[4, 4, 5, 4]] * 10}
    for label, t in taus.items():
        store.add_eval_results(eval_rows(f"eval-{label}-0101-01", label, "drafter", t))
    for item in ("prep", "eval-v4", "train[noise]", "train[taps]", "eval[taps]"):
        store.set_status(item, "done")
    return load_plan(path), store


async def test_arms_are_grouped_with_state_loss_tau_and_knob(tmp_path):
    plan, store = _campaign(tmp_path)
    async with running(plan, store) as (app, pilot, _):
        pane = app.query_one(PlanPane)
        opts = pane.options
        ids = [opts.get_option_at_index(i).id for i in range(opts.option_count)]
        assert ids == ["prep", "eval-v4", "arm:noise", "train[noise]", "eval[noise]",
                       "arm:taps", "train[taps]", "eval[taps]"]
        assert pane.shown == ["prep", "eval-v4", "train[noise]", "eval[noise]", "train[taps]",
                              "eval[taps]"]
        taps = str(opts.get_option("arm:taps").prompt)
        loss = 4.0 * 2.718281828459045 ** (-400 / 200.0) + 0.9
        assert taps.startswith("┌ arm taps  ● done 2/2")
        assert f"loss {loss:.3g}" in taps and "tau 4.25" in taps and "command=train --fc-layers taps" in taps
        noise = str(opts.get_option("arm:noise").prompt)
        assert "○ pending 1/2" in noise and "tau 2.75" in noise
        assert opts.get_option("arm:noise").disabled  # the cursor passes it
        # the cursor from eval-v4 goes down to train[noise], over the arm's line
        await pick(pilot, "eval-v4")
        opts.focus()
        await pilot.press("j")
        await settle(pilot)
        assert pane.selected == "train[noise]"
        # the curves: train[noise] selected, train[taps]'s run overlaid
        labels = [r["label"] for r in app.query_one(MetricsPane).runs]
        assert labels == ["train[noise]#1", "train[taps]#1"]
        # the tau pane: the cursor row's arm against v4 and the other arm, Holm-corrected
        tau = app.query_one(TauPane)
        assert [(p.a, p.b) for p in tau.arms.pairs] == [("noise", "v4"), ("taps", "v4"),
                                                        ("noise", "taps")]
        notes = {r.drafter: str(tau.table.get_row(r.key)[5]) for r in tau.ordered_rows
                 if r.prompt == "Σ macro"}
        assert notes["taps"] == "▲ better vs v4 (Holm) · command=train --fc-layers taps"
        assert notes["noise"] == "▲ better vs v4 (Holm) · command=train --noise fc_input"
        assert "v4" not in notes or notes["v4"] == ""  # the reference: no verdict of its own
        rows = [r.drafter for r in tau.ordered_rows]
        table = tau.query_one("#tau-table")
        table.focus()
        table.move_cursor(row=rows.index("taps"), animate=False)
        await settle(pilot)
        line = str(tau.query_one("#tau-verdict").render())
        assert "arm taps (command=train --fc-layers taps): taps is better than v4" in line
        assert "Holm p = 0.006" in line and "noise is worse than taps" in line
        # a loss logged by an arm's run: its line shows it within a second (no run's end needed)
        store.add_metrics("train[noise]-0101-01", [(500, "loss", 0.123)])
        app.post_message(m.LogLinesArrived("train[noise]", "train[noise]-0101-01",
                                           ['{"step": 500, "loss": 0.123}']))
        for _ in range(30):
            await pilot.pause(0.1)
            if "loss 0.123" in str(opts.get_option("arm:noise").prompt):
                break
        assert "loss 0.123" in str(opts.get_option("arm:noise").prompt)
    store.close()
