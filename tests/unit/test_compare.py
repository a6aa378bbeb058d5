"""core.compare on hand-computed numbers.

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

from core.compare import build_comparison, to_csv, to_json, to_markdown

S = {"mode": "online", "block_size": 4, "tree_budget": None, "target": "qwen3-8b",
     "prompts": "mt-bench-v1", "definition": "tau = accepted + 1"}


def row(drafter, prompt, rounds, pp, *, role="drafter", tau="auto", settings=None, step=None,
        run="r1"):
    if tau == "auto":
        tau = sum(rounds) / len(rounds) if rounds else None
    return {"item_id": "eval", "run_id": run, "drafter": drafter, "role": role,
            "prompt_id": prompt, "tau": tau, "rounds": rounds, "per_position": pp,
            "settings": dict(settings or S), "step": step}


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
    assert c.drafter("other").mismatch == ("mode", "target")
    assert c.flagged == {"ours [block_size=8]": ("block_size",), "other": ("mode", "target")}
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
    assert to_markdown(c).startswith("| prompt |")


def test_renderers():
    c = build_comparison(BASE + OURS + [row("ours", "p1", [5], [1, 1, 1, 1, 0, 0, 0],
                                            settings={**S, "block_size": 8})])
    data = json.loads(to_json(c))
    assert data["compared_settings"] == ["mode", "block_size", "tree_budget", "target", "prompts"]
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
    assert "| ours | 2 | 2.500 | +0.500 | 125.0% | 2.750 | +0.750 | 137.5% |  |" in md
    assert "⚠ block_size 8≠4 vs base" in md
    assert "| ours | 0.750 | 0.500 | 0.500 |" in md


def test_drafter_and_baseline_with_one_label_stay_apart():
    rows = [row("same", "p1", [2], [1, 0, 0], role="baseline"),
            row("same", "p1", [3], [1, 1, 0])]
    c = build_comparison(rows)
    assert [d.label for d in c.drafters] == ["same (baseline)", "same"]
    assert c.drafter("same").baseline == "same (baseline)"
    assert c.cell("p1", "same").delta == 1.0
