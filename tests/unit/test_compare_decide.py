"""core.tau.table: a plan's ``decide:`` pairs lead the verdicts, and one drafter measured under
two names (the same weights sha256: tau over training's ``train-v5@120`` and the eval item's
``v5``) is one entry, not two rows with different intervals (issue 48 §3)."""

from __future__ import annotations

import pytest

from core.errors import InvalidInput
from core.state.records import EvalRow
from core.tau.table import build_comparison, summary_markdown, to_markdown, verdict_lines

S = {"mode": "online", "block_size": 4, "tree_budget": None, "target": "t", "prompts": "coding"}
V5, V4, BASE = "a" * 64, "b" * 64, "c" * 64
PROMPTS = [f"p{i}" for i in range(8)]


def rows(label, weights, taus, *, role="drafter", step=None, run="r", item="eval"):
    return [EvalRow(run_id=run, item_id=item, drafter=label, role=role, prompt_id=p, tau=t,
                    rounds=[round(t)] * 3, settings={**S, "weights": weights}, step=step)
            for p, t in zip(PROMPTS, taus)]


V5_TAUS = [2.5, 2.6, 2.4, 2.8, 2.7, 2.5, 2.9, 2.6]
BASELINE = rows("baseline", BASE, [1.0] * 8, role="baseline", run="rb", item="eval-v5")
WATCHED = (rows("train-v5", "d" * 64, [1.5] * 8, step=60, run="rw", item="train-v5")
           + rows("train-v5", V5, V5_TAUS, step=120, run="rw", item="train-v5"))
EVALS = (rows("v5", V5, V5_TAUS, run="r5", item="eval-v5") + BASELINE
         + rows("v4", V4, [2.0, 2.1, 1.9, 2.2, 2.0, 2.1, 2.3, 2.0], run="r4", item="eval-v4"))


def test_the_same_weights_under_two_names_are_one_entry_named_with_both():
    c = build_comparison(WATCHED + EVALS)
    labels = [d.label for d in c.drafters]
    assert labels == ["train-v5@60", "v5", "baseline", "v4"]  # train-v5@120 is v5
    v5 = c.drafter("v5")
    assert v5.aliases == ("train-v5@120",) and v5.step is None
    assert set(v5.run_ids) == {"r5", "rw"}
    assert [o.drafter for o in c.overall].count("v5") == 1
    assert len([x for x in c.cells if x.drafter == "v5"]) == 8  # one figure per prompt
    assert "| v5 = train-v5@120 |" in summary_markdown(c)
    assert "train-v5@120 |" not in summary_markdown(c).replace("v5 = train-v5@120 |", "")
    assert not c.warnings  # equal figures: nothing to say
    # different weights (an earlier checkpoint) stay apart
    assert c.drafter("train-v5@60").aliases == ()


def test_either_name_finds_the_merged_drafter_and_a_pair_of_one_drafter_is_refused():
    c = build_comparison(WATCHED + EVALS, [("train-v5@120", "v4")])
    assert [(p.a, p.b) for p in c.pairs] == [("v5", "v4")]
    with pytest.raises(InvalidInput, match="one drafter: the same weights"):
        build_comparison(WATCHED + EVALS, [("train-v5@120", "v5")])


def test_figures_that_differ_for_one_drafter_are_said_and_the_named_entry_wins():
    other = rows("train-v5", V5, [x + 0.5 for x in V5_TAUS], step=120, run="rw",
                 item="train-v5")
    c = build_comparison(other + EVALS)
    assert c.overall_of("v5").macro == pytest.approx(sum(V5_TAUS) / 8)
    assert any("v5 = train-v5@120 (the same weights): prompt p0 measured 2.500 and 3.000" in w
               for w in c.warnings), c.warnings


def test_rows_without_a_weights_digest_are_never_merged():
    plain = [EvalRow(run_id=r.run_id, item_id=r.item_id, drafter=r.drafter, role=r.role,
                     prompt_id=r.prompt_id, tau=r.tau, rounds=r.rounds, settings=dict(S),
                     step=r.step) for r in WATCHED + EVALS]
    labels = [d.label for d in build_comparison(plain).drafters]
    assert "train-v5@120" in labels and "v5" in labels


def test_the_decision_leads_the_verdicts():
    c = build_comparison(EVALS, decide=[("v5", "v4")])
    assert c.decisions == 1 and [(p.a, p.b) for p in c.decision] == [("v5", "v4")]
    assert c.deciding == ["v5", "v4"]
    lines = verdict_lines(c)
    assert lines[0] == c.decision[0].verdict_text and lines[0].startswith("v5 is better than v4")
    assert lines[1:] == [o.verdict_text for o in c.overall if o.verdict_text]
    md = to_markdown(c)
    assert md.startswith("Decision (the plan's decide:):\n- v5 is better than v4")
    assert md.index("Other verdicts:") < md.index("v5 is better than baseline")
    # a --pair already decided is not repeated; another one comes after the baselines' verdicts
    c2 = build_comparison(EVALS, [("v4", "baseline"), ("v5", "v4")], decide=[("v5", "v4")])
    assert [(p.a, p.b) for p in c2.pairs] == [("v5", "v4"), ("v4", "baseline")]
    assert verdict_lines(c2)[-1] == c2.pairs[1].verdict_text
    # without decide the verdicts are as they were: each drafter against its baseline first
    plain = build_comparison(EVALS, [("v5", "v4")])
    assert plain.decisions == 0 and verdict_lines(plain)[-1].startswith("v5 is better than v4")
    assert to_markdown(plain).startswith("Verdicts:")


def test_a_decision_not_measured_yet_is_a_warning_not_an_error():
    only_v5 = [r for r in EVALS if r.drafter != "v4"]
    c = build_comparison(only_v5, decide=[("v5", "v4")])
    assert c.decisions == 0 and c.pairs == ()
    assert "decide: v5 vs v4: no eval results for v4 yet" in c.warnings


def test_eval_rows_record_the_weights_they_measured():
    from core.actions.eval import eval_rows

    res = {"mode": "online", "block_size": 4, "accounting": "dflash-0.1.0",
           "drafter": {"weights": {"sha256": V5}, "fingerprint": V5[:16]},
           "per_prompt": [{"id": "p0", "tau": 2.0, "rounds": [2, 2]}],
           "ddtree": {"budget": 8, "per_prompt": [{"id": "p0", "tau": 2.5, "rounds": [3, 2]}]}}
    got = eval_rows("r", "eval-v5", res, "v5", "drafter", None)
    assert [(r.drafter, r.settings["weights"]) for r in got] == [("v5", V5), ("v5 ddtree-8", V5)]
    older = {**res, "drafter": {"fingerprint": V5[:16]}}  # results written before the digest
    assert eval_rows("r", "e", older, "v5", "drafter", None)[0].settings["weights"] == V5[:16]
    assert eval_rows("r", "e", {**res, "drafter": {}}, "v5", "drafter", None)[0].settings["weights"] is None
