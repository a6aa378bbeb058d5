"""core.tau.table on hand-computed numbers.

Block size 4 throughout (3 draft positions). A round's acceptance length t gives the streak
t - 1; per-position acceptance p_k = #{rounds with streak >= k} / #rounds.

Baseline ``base`` (prompts p1, p2):
  p1 rounds [1, 2, 3]  tau 2.0   streaks 0,1,2 -> pp [2/3, 1/3, 0]
  p2 rounds [2, 2]     tau 2.0   streaks 1,1   -> pp [1, 0, 0]
  macro 2.0, pooled (6 + 4) / 5 = 2.0
Drafter ``ours`` (same settings):
  p1 rounds [4, 4, 1]  tau 3.0   streaks 3,3,0 -> pp [2/3, 2/3, 2/3]
  p2 rounds [2]        tau 2.0   streak 1      -> pp [1, 0, 0]
  macro 2.5 (+0.5, 125 %), pooled (9 + 2) / 4 = 2.75 (+0.75, 137.5 %)
  per-position pooled over 4 rounds: [(2/3*3 + 1)/4, (2/3*3)/4, (2/3*3)/4] = [.75, .5, .5]
  (and 1 + .75 + .5 + .5 = 2.75 = pooled tau)
"""

from __future__ import annotations

import csv
import io
import json

import pytest

from core.tau.table import build_comparison, to_csv, to_json, to_markdown
from core.state.records import EvalRow

S = {"mode": "online", "block_size": 4, "tree_budget": None, "target": "qwen3-8b",
     "prompts": "mt-bench-v1", "definition": "tau = accepted + 1"}


def row(drafter, prompt, rounds, pp, *, role="drafter", tau="auto", settings=None, step=None,
        run="r1"):
    if tau == "auto":
        tau = sum(rounds) / len(rounds) if rounds else None
    return EvalRow(item_id="eval", run_id=run, drafter=drafter, role=role, prompt_id=prompt,
                   tau=tau, rounds=rounds, per_position=pp, settings=dict(settings or S),
                   step=step)


BASE = [row("base", "p1", [1, 2, 3], [2 / 3, 1 / 3, 0], role="baseline", run="rb"),
        row("base", "p2", [2, 2], [1, 0, 0], role="baseline", run="rb")]
OURS = [row("ours", "p1", [4, 4, 1], [2 / 3, 2 / 3, 2 / 3]),
        row("ours", "p2", [2], [1, 0, 0])]


def test_per_prompt_delta_and_percent():
    c = build_comparison(BASE + OURS)
    assert c.prompts == ("p1", "p2")
    p1 = c.cell("p1", "ours")
    assert (p1.tau, p1.baseline_tau, p1.delta, p1.pct_of_baseline) == (3.0, 2.0, 1.0, 150.0)
    assert p1.rounds == 3 and p1.mismatch == ()
    p2 = c.cell("p2", "ours")
    assert (p2.tau, p2.baseline_tau, p2.delta, p2.pct_of_baseline) == (2.0, 2.0, 0.0, 100.0)
    b1 = c.cell("p1", "base")
    assert b1.tau == 2.0 and b1.baseline_tau is None and b1.delta is None


def test_overall_macro_and_pooled():
    c = build_comparison(BASE + OURS)
    o = c.overall_of("ours")
    assert o.prompts == 2 and o.unmatched == ()
    assert o.macro == pytest.approx(2.5) and o.baseline_macro == pytest.approx(2.0)
    assert o.delta_macro == pytest.approx(0.5) and o.pct_macro == pytest.approx(125.0)
    assert o.pooled == pytest.approx(2.75) and o.baseline_pooled == pytest.approx(2.0)
    assert o.delta_pooled == pytest.approx(0.75) and o.pct_pooled == pytest.approx(137.5)
    b = c.overall_of("base")
    assert b.role == "baseline" and b.macro == pytest.approx(2.0) and b.delta_macro is None


def test_per_position_pooled_over_rounds():
    c = build_comparison(BASE + OURS)
    assert c.per_position["ours"] == pytest.approx((0.75, 0.5, 0.5))
    assert 1 + sum(c.per_position["ours"]) == pytest.approx(c.overall_of("ours").pooled)
    # baseline: p1 weighted by 3 rounds, p2 by 2: [(2+2)/5, 1/5, 0]
    assert c.per_position["base"] == pytest.approx((0.8, 0.2, 0.0))
    assert c.drafter("ours").baseline == "base"


def test_mismatched_settings_are_flagged_not_averaged():
    wide = {**S, "block_size": 8}
    rows = BASE + OURS + [row("ours", "p1", [5], [1, 1, 1, 1, 0, 0, 0], settings=wide, run="r2"),
                          row("other", "p1", [3], [1, 1, 0], settings={**S, "target": "qwen3-4b",
                                                                        "mode": "offline"})]
    c = build_comparison(rows)
    # the same label under other settings is its own entry, never averaged with "ours"
    assert [d.label for d in c.drafters] == ["base", "ours", "ours [block_size=8]", "other"]
    assert c.overall_of("ours").macro == pytest.approx(2.5)
    wide_d = c.drafter("ours [block_size=8]")
    assert wide_d.mismatch == ("block_size",) and wide_d.mismatch_values == {"block_size": [8, 4]}
    assert c.cell("p1", "ours [block_size=8]").mismatch == ("block_size",)
    assert c.overall_of("ours [block_size=8]").macro == 5.0
    # offline is another harness (an offline trajectory), derived for rows stored before it was recorded
    assert c.drafter("other").mismatch == ("mode", "target", "harness")
    assert c.drafter("other").mismatch_values["harness"] == ["offline trajectory", "in-process online"]
    assert c.flagged == {"ours [block_size=8]": ("block_size",), "other": ("mode", "target", "harness")}
    assert c.drafter("ours").mismatch == ()


def test_matching_baseline_is_preferred():
    wide = {**S, "block_size": 8}
    rows = BASE + [row("base8", "p1", [2], [1, 0], role="baseline", settings=wide),
                   row("ours", "p1", [6], [1, 1, 1, 1, 1], settings=wide)]
    c = build_comparison(rows)
    d = c.drafter("ours")
    assert d.baseline == "base8" and d.mismatch == ()
    assert c.cell("p1", "ours").delta == 4.0 and c.cell("p1", "ours").pct_of_baseline == 300.0


def test_unmatched_prompts_left_out_of_overall():
    rows = BASE + OURS + [row("ours", "p3", [4, 4], [1, 1, 1])]
    o = build_comparison(rows).overall_of("ours")
    assert o.unmatched == ("p3",) and o.prompts == 2 and o.macro == pytest.approx(2.5)
    assert build_comparison(rows).cell("p3", "ours").baseline_tau is None


def test_no_baseline_step_labels_missing_rounds_and_repeats():
    rows = [row("d", "p1", [2, 4], [1, 0.5, 0], step=1000),
            row("d", "p2", None, [1, 0, 0], tau=1.5, step=1000),
            row("d", "p1", [3], [1, 1, 0], step=2000),
            row("d", "p1", [4], [1, 1, 1], step=2000, run="r9")]
    c = build_comparison(rows)
    assert [d.label for d in c.drafters] == ["d@1000", "d@2000"]
    o = c.overall_of("d@1000")
    assert o.macro == pytest.approx(2.25) and o.pooled is None  # p2 has no rounds
    assert o.delta_macro is None and c.drafter("d@1000").baseline is None
    # a repeat: the later row wins, with a warning
    assert c.cell("p1", "d@2000").tau == 4.0
    assert any("measured again" in w for w in c.warnings)
    assert c.drafter("d@2000").run_ids == ("r1", "r9")
    # tau computed from rounds when the row has none
    assert build_comparison([row("x", "p", [1, 2], [0.5], tau=None)]).cell("p", "x").tau == 1.5


def test_empty():
    c = build_comparison([])
    assert c.drafters == () and c.cells == () and c.overall == ()
    assert to_markdown(c).startswith("| drafter | verdict |")  # the summary leads


def test_renderers():
    c = build_comparison(BASE + OURS + [row("ours", "p1", [5], [1, 1, 1, 1, 0, 0, 0],
                                            settings={**S, "block_size": 8})])
    data = json.loads(to_json(c))
    assert data["compared_settings"] == ["mode", "block_size", "tree_budget", "target", "prompts",
                                        "dtype", "accounting", "template", "temperature", "top_p", "top_k",
                                        "harness"]
    ours = [o for o in data["overall"] if o["drafter"] == "ours"][0]
    assert ours["pooled"] == pytest.approx(2.75) and ours["pct_pooled"] == pytest.approx(137.5)

    table = list(csv.DictReader(io.StringIO(to_csv(c))))
    p1 = [r for r in table if r["scope"] == "prompt" and r["drafter"] == "ours"
          and r["prompt_id"] == "p1"][0]
    assert (p1["tau"], p1["baseline_tau"], p1["delta"], p1["pct_of_baseline"]) == \
        ("3.0000", "2.0000", "1.0000", "150.00")
    pooled = [r for r in table if r["scope"] == "pooled" and r["drafter"] == "ours"][0]
    assert pooled["tau"] == "2.7500" and pooled["delta"] == "0.7500"
    flagged = [r for r in table if r["drafter"] == "ours [block_size=8]"]
    assert flagged and all(r["mismatch"] == "block_size" for r in flagged)

    md = to_markdown(c)
    assert "| p1 | ours | 3.000 | 2.000 | +1.000 | 150.0% |  |" in md
    # 2 prompts: the sign-flip test rejects no difference, so its interval is none ("–")
    assert ("| ours | ≈ no difference | 2.500 | +0.500 | 125.0% | – | 1.000 | 2 | "
            "2.750 | +0.750 | 137.5% |") in md
    assert "⚠ block_size 8≠4 vs base" in md
    assert "| ours | 0.750 | 0.500 | 0.500 |" in md


def test_drafter_and_baseline_with_one_label_stay_apart():
    rows = [row("same", "p1", [2], [1, 0, 0], role="baseline"),
            row("same", "p1", [3], [1, 1, 0])]
    c = build_comparison(rows)
    assert [d.label for d in c.drafters] == ["same (baseline)", "same"]
    assert c.drafter("same").baseline == "same (baseline)"
    assert c.cell("p1", "same").delta == 1.0


# -- uncertainty, paired verdicts, pairs, pivot ------------------------------------------
def _campaign(n_prompts=16, lift=1, seed=3):
    """Baseline, v4 and v5 on ``n_prompts`` prompts; v5's rounds are v4's plus ``lift`` on
    most rounds (a real difference), v4 and baseline differ only by noise."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n_prompts):
        p = f"q{i:02d}"
        easy = rng.randint(1, 3)
        base = [min(4, easy + rng.randint(0, 1)) for _ in range(12)]
        v4 = [min(4, easy + rng.randint(0, 1)) for _ in range(12)]
        v5 = [min(5, x + (lift if rng.random() < 0.8 else 0)) for x in v4]
        rows += [row("base", p, base, [0.5, 0.3, 0.1], role="baseline", run="rb"),
                 row("v4", p, v4, [0.5, 0.3, 0.1], run="r4"),
                 row("v5", p, v5, [0.7, 0.5, 0.3], run="r5")]
        rows.append(row("v5 ddtree-8", p, [x + 1 for x in v5], [0.8, 0.6, 0.4], run="r5",
                        settings={**S, "method": "ddtree", "tree_budget": 8}))
        rows.append(row("v4 ddtree-8", p, [x + 1 for x in v4], [0.6, 0.4, 0.2], run="r4",
                        settings={**S, "method": "ddtree", "tree_budget": 8}))
    return rows


def test_overall_has_intervals_rounds_and_a_verdict_against_the_baseline():
    c = build_comparison(_campaign())
    v5, v4, base = c.overall_of("v5"), c.overall_of("v4"), c.overall_of("base")
    for o in (v5, v4, base):
        lo, hi = o.macro_ci95
        assert lo < o.macro < hi and o.pooled_ci95[0] < o.pooled < o.pooled_ci95[1]
        assert o.rounds == 16 * 12
    assert v5.verdict == "better" and v5.delta_macro_ci95[0] > 0 and v5.p_value < 0.05
    assert v5.verdict_text.startswith("v5 is better than base (+")
    assert v4.verdict == "no_detectable_difference" and "prompts would detect +0.1" in \
        v4.verdict_text
    assert base.verdict is None and base.p_value is None
    assert v5.test.startswith("sign-flip permutation")
    # seeded: built again, the same intervals; another seed, other intervals
    assert build_comparison(_campaign()).overall_of("v5") == v5
    assert build_comparison(_campaign(), seed=1).overall_of("v5").macro_ci95 != v5.macro_ci95


def test_pair_with_its_ddtree_sibling_and_in_json():
    c = build_comparison(_campaign(), [("v5", "v4")])
    assert [(p.a, p.b) for p in c.pairs] == [("v5", "v4"), ("v5 ddtree-8", "v4 ddtree-8")]
    p = c.pairs[0]
    assert p.verdict == "better" and p.prompts == 16 and p.mismatch == ()
    assert p.delta_macro == pytest.approx(p.macro - p.b_macro)
    assert p.verdict_text.startswith("v5 is better than v4 (+") and "16 prompts" in p.verdict_text
    data = json.loads(to_json(c))
    keys = {"macro_ci95", "pooled_ci95", "rounds", "delta_macro_ci95", "p_value", "test",
            "verdict", "verdict_text"}
    assert keys <= set(data["pairs"][0]) and {"a", "b"} <= set(data["pairs"][0])
    v5 = [o for o in data["overall"] if o["drafter"] == "v5"][0]
    assert keys <= set(v5) and v5["verdict"] == "better" and len(v5["macro_ci95"]) == 2
    reversed_ = build_comparison(_campaign(), [("v4", "v5")]).pairs[0]
    assert reversed_.verdict == "worse" and reversed_.verdict_text.startswith("v4 is worse than v5")


def test_pair_of_different_settings_is_flagged_and_unknown_label_refused():
    from core.errors import InvalidInput

    rows = _campaign(8) + [row("v6", f"q{i:02d}", [3, 3], [1, 1, 0],
                               settings={**S, "block_size": 8, "dtype": "bfloat16"})
                           for i in range(8)]
    p = build_comparison(rows, [("v6", "v5")]).pairs[0]
    assert p.mismatch == ("block_size", "dtype")
    assert p.mismatch_values == {"block_size": [8, 4], "dtype": ["bfloat16", None]}
    assert p.verdict_text.startswith("⚠ settings differ (block_size 8≠4, dtype bfloat16≠None)")
    with pytest.raises(InvalidInput, match="no drafter 'v9'"):
        build_comparison(rows, [("v5", "v9")])


def test_few_prompts_are_never_a_verdict():
    c = build_comparison(_campaign(n_prompts=3))
    o = c.overall_of("v5")
    assert o.verdict == "no_detectable_difference" and o.p_value >= 0.25
    assert f"about {o.prompts_needed} prompts would detect +0.1" in o.verdict_text


def test_pivot_csv_and_chart():
    c = build_comparison(_campaign(4), [("v5", "v4")])
    pivot = to_markdown(c, pivot=True)
    lines = pivot.splitlines()
    assert lines[0] == "Verdicts:" and lines.index("| prompt | base | v4 | Δ | v4 ddtree-8 ⚠ "
                                                   "| Δ | v5 | Δ | v5 ddtree-8 ⚠ | Δ |") > \
        [i for i, ln in enumerate(lines) if ln.startswith("| drafter | verdict |")][0]
    head = [ln for ln in lines if ln.startswith("| prompt |")][0]
    # the DDTree rows have no DDTree baseline here: compared with the chain one, flagged
    assert head == ("| prompt | base | v4 | Δ | v4 ddtree-8 ⚠ | Δ | v5 | Δ | v5 ddtree-8 ⚠ | Δ |")
    q0 = [ln for ln in pivot.splitlines() if ln.startswith("| q00 |")][0].split(" | ")
    cell = c.cell("q00", "v5")
    assert q0[6] == f"{cell.tau:.3f}" and q0[7] == f"{cell.delta:+.3f}"
    assert "| 95 % CI |" in pivot and "| verdict | baseline |" in pivot
    assert "Verdicts:" in pivot and c.pairs[0].verdict_text in pivot
    assert "p_k: acceptance rate at draft position k" in pivot
    assert "v5 ddtree-8 │" in pivot  # one bar block per drafter
    table = list(csv.DictReader(io.StringIO(to_csv(c))))
    macro = [r for r in table if r["scope"] == "macro" and r["drafter"] == "v5"][0]
    o = c.overall_of("v5")
    assert float(macro["ci95_lo"]) == pytest.approx(o.macro_ci95[0], abs=1e-4)
    assert macro["verdict"] == o.verdict and macro["against"] == "base"
    pair = [r for r in table if r["scope"] == "pair"][0]
    assert (pair["drafter"], pair["against"]) == ("v5", "v4")


def test_per_position_from_rounds_when_rows_have_none():
    # block 4; rounds [1, 2, 4]: p1 = 2/3 (t > 1), p2 = 1/3, p3 = 1/3
    c = build_comparison([row("d", "p", [1, 2, 4], None)])
    assert c.per_position["d"] == pytest.approx((2 / 3, 1 / 3, 1 / 3))
    assert 1 + sum(c.per_position["d"]) == pytest.approx(c.overall_of("d").pooled)
