"""Issue 45 §3: the draft length to serve, from measured rounds and a round's cost."""

from __future__ import annotations

import math
import random

import pytest

from core.ml.measure import tau as taulib
from core.ml.measure.draftlen import Cost, advise, engine_settings, lines, parse_cost, tokens_per_round


def test_tokens_per_round_is_one_plus_the_sum_of_p_k_up_to_k():
    rounds = [[1, 3, 8, 5], [2, 2, 7]]
    pp = taulib.summarize(rounds, 8)["per_position_acceptance"]
    for k in range(1, 8):
        assert tokens_per_round(rounds, k) == pytest.approx(1 + sum(pp[:k]))
    # at the full block it is pooled tau; at k = 1 each round commits 1 or 2
    assert tokens_per_round(rounds, 7) == pytest.approx(taulib.pooled_tau(rounds))
    assert tokens_per_round(rounds, 1) == pytest.approx((1 + 2 + 2 + 2 + 2 + 2 + 2) / 7)
    assert tokens_per_round([], 3) is None


def test_speedup_is_tokens_over_cost_and_the_best_k_trades_them():
    # every round accepts 3 drafts: tokens/round = min(4, k + 1), flat from k = 3 on
    rounds = [[4] * 20 for _ in range(6)]
    free = advise(rounds, 8, Cost(1.0, 0.0), resamples=200)
    assert [r["tokens_per_round"] for r in free["rows"]] == [2, 3, 4, 4, 4, 4, 4]
    assert free["best"]["k"] == 3  # ties at higher k go to the shortest draft
    assert free["best"]["within"] == [3, 4, 5, 6, 7]
    costly = advise(rounds, 8, Cost(1.0, 0.25), resamples=200)
    s = {r["k"]: r["speedup"] for r in costly["rows"]}
    assert s[1] == pytest.approx(2 / 1.25) and s[3] == pytest.approx(4 / 1.75) and s[7] == pytest.approx(4 / 2.75)
    assert costly["best"]["k"] == 3


def test_intervals_cover_the_point_and_shrink_with_more_prompts():
    rng = random.Random(7)

    def draw(n):
        return [[min(8, 1 + int(rng.expovariate(0.4))) for _ in range(30)] for _ in range(n)]

    few, many = advise(draw(5), 8, resamples=400), advise(draw(80), 8, resamples=400)
    for a in (few, many):
        for r in a["rows"]:
            lo, hi = r["speedup_ci"]
            assert lo <= r["speedup"] <= hi
    width = [a["rows"][3]["speedup_ci"][1] - a["rows"][3]["speedup_ci"][0] for a in (few, many)]
    assert width[1] < width[0]
    # the same rounds and seed give the same interval
    again = advise([[3, 4, 1], [8, 2]], 8, seed=3, resamples=300)
    assert again == advise([[3, 4, 1], [8, 2]], 8, seed=3, resamples=300)


def test_bad_costs_and_rounds_are_refused_by_name():
    for bad in ("", "1,2,3", "x", "base=1,speed=2", "nan,0"):
        with pytest.raises(ValueError):
            parse_cost(bad)
    assert parse_cost("1.0,0.02") == Cost(1.0, 0.02) == parse_cost("per_token=0.02")
    with pytest.raises(ValueError, match="cost.base"):
        Cost(0.0, 0.1)
    with pytest.raises(ValueError, match="per_token"):
        Cost(1.0, -0.1)
    with pytest.raises(ValueError, match="1..8"):
        advise([[9]], 8)
    with pytest.raises(ValueError, match="drafts nothing"):
        advise([[1]], 1)
    assert advise([[]], 8)["best"] is None


def test_engine_settings_and_the_text_name_the_advised_length():
    assert engine_settings(5) == {"vllm": {"num_speculative_tokens": 5},
                                  "sglang": {"--speculative-num-draft-tokens": 6},
                                  "llama.cpp": {"--spec-draft-n-max": 5}}
    a = advise([[4, 5, 2]] * 4, 8, Cost(1.0, 0.1), resamples=100)
    text = "\n".join(lines(a, "v5: "))
    assert text.startswith("v5: draft length (cost = 1 + 0.1*k")
    assert f"best k={a['best']['k']}" in text and f"num_speculative_tokens={a['best']['k']}" in text
    assert all(math.isfinite(r["speedup"]) for r in a["rows"])
