"""compare on a sampled campaign: seeds nested in prompts (docs/evaluation.md §2, "Sampling").

At a temperature > 0 each prompt is measured ``samples`` times (one row per seed). Prompts stay
the unit: a prompt's tau is the mean of its seeds, and the intervals, the paired test and the
verdict are over prompts, a drafter and its baseline paired by prompt.
"""

from __future__ import annotations

import random

import pytest

from core.tau import stats
from core.actions.eval import eval_rows
from core.tau.table import COMPARED_SETTINGS, build_comparison, sampling_note, to_markdown
from core.state.records import EvalRow

S = {"mode": "online", "block_size": 8, "tree_budget": None, "target": "t", "prompts": "coding",
     "temperature": 0.7, "top_p": 0.95, "top_k": 0, "seed": 0, "samples": 5}
PROMPTS, SEEDS = 8, 5


def row(drafter, prompt, sample, tau, *, role="drafter", settings=None):
    st = dict(settings or S)
    if sample:
        st["sample"] = sample
    rounds = [round(tau)] * 4
    return EvalRow(item_id="eval", run_id="r1", drafter=drafter, role=role, prompt_id=prompt, tau=tau,
                   rounds=rounds, settings=st)


def campaign(gain: float, settings=None, base_settings=None):
    """Prompts of different difficulty, seed noise within each; the drafter ``gain`` above the baseline."""
    rng = random.Random(7)
    rows, means = [], {"ours": [], "base": []}
    for i in range(PROMPTS):
        level = 2.0 + 0.5 * i
        for name, role, add, st in (("base", "baseline", 0.0, base_settings), ("ours", "drafter", gain, settings)):
            taus = [level + add + rng.gauss(0, 0.6) for _ in range(SEEDS)]
            rows += [row(name, f"p{i}", k, t, role=role, settings=st) for k, t in enumerate(taus)]
            means[name].append(sum(taus) / SEEDS)
    return rows, means


def test_the_sampling_settings_are_compared():
    assert {"temperature", "top_p", "top_k"} <= set(COMPARED_SETTINGS)


def test_seeds_are_nested_in_prompts_and_the_verdict_is_over_prompts():
    rows, means = campaign(0.8)
    c = build_comparison(rows)
    o = c.overall_of("ours")
    assert o.prompts == PROMPTS and o.samples == SEEDS and o.verdict == stats.BETTER
    assert f"{PROMPTS} prompts × {SEEDS} seeds" in o.verdict_text
    cell = c.cell("p3", "ours")
    assert cell.samples == SEEDS and cell.tau == pytest.approx(means["ours"][3])
    assert cell.rounds == 4 * SEEDS  # every seed's rounds
    # the paired statistic is over the prompts' seed means, exactly
    want = stats.paired(means["ours"], means["base"], name="ours|base")
    assert o.delta_macro == pytest.approx(want.delta) and o.delta_macro_ci95 == want.ci95
    assert o.p_value == want.p_value
    assert o.macro == pytest.approx(sum(means["ours"]) / PROMPTS)
    assert not c.warnings  # seeds are not repeats
    assert "mean over its seeds" in to_markdown(c)
    assert sampling_note(c.drafter("ours")) == "T 0.7, top-p 0.95, 5 seeds per prompt"


def test_no_difference_stays_no_difference_with_many_seeds():
    """Flattened, 40 rows would look like 40 prompts; nested, 8 prompts decide (prompts_needed says so)."""
    rows, _ = campaign(0.05)
    o = build_comparison(rows).overall_of("ours")
    assert o.prompts == PROMPTS and o.verdict == stats.NONE and o.prompts_needed is not None


def test_temperature_differences_are_flagged_and_old_greedy_rows_stay_comparable():
    greedy = {**S, "temperature": 0, "top_p": 1.0, "samples": 1}
    rows, _ = campaign(0.8, base_settings=greedy)
    c = build_comparison(rows)
    assert c.drafter("ours").mismatch == ("temperature", "top_p")
    assert "settings differ" in c.overall_of("ours").verdict_text
    old = {k: v for k, v in S.items() if k not in ("temperature", "top_p", "top_k", "seed", "samples")}
    new = {**old, "temperature": 0.0, "top_p": 1.0, "top_k": 0}  # a greedy row that records them
    c = build_comparison([row("base", "p0", 0, 2.0, role="baseline", settings=old),
                          row("ours", "p0", 0, 3.0, settings=new)])
    assert c.drafter("ours").mismatch == () and sampling_note(c.drafter("ours")) == "T 0"


def test_a_prompt_and_sample_measured_again_is_a_repeat():
    rows = [row("ours", "p0", 1, 2.0), row("ours", "p0", 1, 3.0), row("ours", "p0", 0, 1.0)]
    c = build_comparison(rows)
    assert c.cell("p0", "ours").tau == pytest.approx(2.0)  # (1.0 + 3.0) / 2: the later row of sample 1
    assert any("p0 sample 1 measured again" in w for w in c.warnings)


def test_eval_rows_of_a_sampled_result_nest_in_compare():
    res = {"mode": "online", "block_size": 4, "accounting": "dflash-0.1.0", "temperature": 0.7, "top_p": 1.0,
           "top_k": 0, "seed": 3, "samples": 2, "target": {"fingerprint": "t"}, "prompts": {"sha256": "h"},
           "per_prompt": [{"id": "a", "sample": 0, "seed": 11, "tau": 2.0, "rounds": [2, 2]},
                          {"id": "b", "sample": 0, "seed": 12, "tau": 1.0, "rounds": [1]},
                          {"id": "a", "sample": 1, "seed": 13, "tau": 3.0, "rounds": [3, 3]},
                          {"id": "b", "sample": 1, "seed": 14, "tau": 2.0, "rounds": [2]}]}
    rows = eval_rows("r", "it", res, "v5", "drafter", None)
    assert [r.settings.get("sample", 0) for r in rows] == [0, 0, 1, 1]
    assert rows[0].settings["temperature"] == 0.7 and rows[0].settings["samples"] == 2
    c = build_comparison(rows)
    assert c.cell("a", "v5").tau == pytest.approx(2.5) and c.cell("a", "v5").samples == 2
    assert c.overall_of("v5").prompts == 2 and c.overall_of("v5").macro == pytest.approx(2.0)
    assert "sample" not in c.drafter("v5").settings


def test_two_sampled_result_files_compare_per_prompt_with_seeds_averaged():
    from core.ml.measure.compare import compare_results

    def result(taus_by_prompt, temperature=0.7):
        rows = [{"id": pid, "sample": k, "tau": float(t), "rounds": [t, t]}
                for pid, taus in taus_by_prompt.items() for k, t in enumerate(taus)]
        return {"mode": "online", "block_size": 8, "temperature": temperature, "samples": 2, "per_prompt": rows}

    out = compare_results(result({"a": [3, 5], "b": [2, 2]}), result({"a": [2, 2], "b": [1, 3]}))
    assert out["ok"] and out["overall"]["num_prompts"] == 2
    assert {r["id"]: r["ours"] for r in out["per_prompt"]} == {"a": 4.0, "b": 2.0}
    assert out["overall"]["ours"]["tau"] == pytest.approx(3.0) and out["overall"]["delta"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="temperature"):
        compare_results(result({"a": [3, 5]}), result({"a": [2, 2]}, temperature=0))
