"""The settled-stop verdict (core.ml.measure.sequential): its error rate under optional stopping,
simulated over many seeds, and what it saves against the fixed-size eval. Pure Python."""

from __future__ import annotations

import math
import random

import pytest

from core.ml.measure import sequential as S

CAP = 200
ALPHA = 0.05
DELTA = 0.5


def _prompt(rng: random.Random, distance: float, block: int = 16) -> tuple[float, float]:
    """One prompt's tau for drafters a and b: the prompt's difficulty moves both (so they are
    paired), each has its own noise, and tau stays in 1..block as a real one does."""
    base = rng.uniform(2.0, 9.0)
    a = base + distance + rng.gauss(0.0, 1.0)
    b = base + rng.gauss(0.0, 1.0)
    return min(block, max(1.0, a)), min(block, max(1.0, b))


def _skewed(rng: random.Random, distance: float) -> tuple[float, float]:
    """Heavy-tailed, skewed differences of mean ``distance``: mostly small, now and then a prompt
    where one drafter runs away (a long code block it happens to know)."""
    base = rng.uniform(2.0, 6.0)
    jump = rng.expovariate(1 / 3.0) - 3.0 if rng.random() < 0.2 else 0.0  # mean 0, long right tail
    return base + distance + jump + rng.gauss(0.0, 0.5), base + rng.gauss(0.0, 0.5)


def _simulate(distance: float, seeds: int, draw=_prompt) -> tuple[dict, list[int]]:
    verdicts: dict = {}
    stops = []
    for seed in range(seeds):
        rng = random.Random(seed)
        seq = S.run((draw(rng, distance) for _ in range(CAP)), delta=DELTA, cap=CAP, alpha=ALPHA)
        verdicts[seq.verdict] = verdicts.get(seq.verdict, 0) + 1
        stops.append(seq.n)
    return verdicts, stops


@pytest.mark.parametrize("draw", [_prompt, _skewed], ids=["gaussian", "skewed"])
def test_equal_drafters_are_called_better_at_most_alpha_of_the_time(draw):
    """Two equal drafters, 400 seeds, looked at after every prompt: the false "better" (and
    "worse") rate stays at or below alpha (a fixed-n test repeated after each prompt would not)."""
    verdicts, _ = _simulate(0.0, 400, draw)
    assert verdicts.get(S.BETTER, 0) / 400 <= ALPHA, verdicts
    assert verdicts.get(S.WORSE, 0) / 400 <= ALPHA, verdicts
    assert verdicts.get(S.NO_DIFFERENCE, 0) / 400 > 0.5, verdicts  # and it mostly settles "no difference"


def test_repeated_fixed_n_test_would_fail_the_same_simulation():
    """The control: a 95 % normal interval recomputed after every prompt and stopped at the first
    exclusion of 0 calls equal drafters "better" far more often than alpha. The same draws as above,
    so the confidence sequence's rate is not luck of the seeds."""
    false = 0
    for seed in range(400):
        rng = random.Random(seed)
        diffs = []
        for _ in range(CAP):
            a, b = _prompt(rng, 0.0)
            diffs.append(a - b)
            n = len(diffs)
            if n < S.MIN_PROMPTS:
                continue
            m = sum(diffs) / n
            sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / (n - 1))
            if m - 1.96 * sd / math.sqrt(n) > 0:
                false += 1
                break
    assert false / 400 > 2 * ALPHA


def test_a_clear_difference_stops_under_half_the_fixed_design():
    """Drafters one tau apart (per-prompt difference sd about 1.4): always settled "better", on
    average in under half the fixed eval's prompts (in fact about a tenth)."""
    verdicts, stops = _simulate(1.0, 300)
    assert verdicts == {S.BETTER: 300}
    assert sum(stops) / len(stops) < CAP / 2
    assert sum(stops) / len(stops) < CAP / 5


def test_a_difference_as_large_as_delta_is_rarely_called_no_difference():
    """At a true difference of exactly delta, "no difference as large as delta" is wrong: at most alpha."""
    verdicts, _ = _simulate(DELTA, 300)
    assert verdicts.get(S.NO_DIFFERENCE, 0) / 300 <= ALPHA, verdicts
    assert verdicts.get(S.WORSE, 0) == 0, verdicts


def test_worse_is_found_and_the_report_names_prompts_and_fixed_cost():
    rng = random.Random(7)
    seq = S.run((_prompt(rng, -2.0) for _ in range(CAP)), delta=DELTA, cap=CAP)
    rep = seq.report("v5", "v4")
    assert rep["verdict"] == S.WORSE and seq.hi < 0
    assert rep["prompts"] == seq.n < CAP and rep["fixed_prompts"] == CAP
    assert rep["prompts_saved"] == CAP - seq.n
    assert rep["text"].startswith(f"v5 is worse than v4: settled after {seq.n} of {CAP} prompts")
    assert "Robbins" in rep["method"]


def test_no_verdict_before_min_prompts_and_none_kept_after_cap():
    seq = S.Sequential(DELTA, cap=12)
    for _ in range(S.MIN_PROMPTS - 1):
        assert seq.add(9.0, 2.0) is None  # huge, constant differences: still no verdict yet
    assert seq.add(9.0, 2.0) == S.BETTER
    assert seq.add(1.0, 9.0) == S.BETTER  # settled: kept
    tiny = S.run([(3.0, 3.0 + (0.5 if i % 2 else -0.5)) for i in range(12)], delta=0.01, cap=12)
    assert tiny.verdict is None and tiny.n == 12
    assert tiny.report()["verdict"] == S.UNSETTLED
    assert "not settled after 12 of 12 prompts" in tiny.text()


def test_the_set_only_narrows():
    rng = random.Random(3)
    seq = S.Sequential(0.01, cap=CAP)
    widths = []
    for _ in range(60):
        seq.add(*_prompt(rng, 0.3))
        if seq.n >= S.MIN_PROMPTS:
            widths.append(seq.hi - seq.lo)
    assert all(b <= a for a, b in zip(widths, widths[1:]))


@pytest.mark.parametrize("kw", [{"delta": 0.0}, {"delta": float("nan")}, {"alpha": 1.0}, {"cap": 0}])
def test_bad_settings_are_refused(kw):
    args = {"delta": DELTA, "cap": CAP, **kw}
    with pytest.raises(ValueError):
        S.Sequential(**args)
