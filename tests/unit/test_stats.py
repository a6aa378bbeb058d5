"""core.tau.stats against synthetic evals whose truth is known.

A prompt has a per-position acceptance probability ``a``; a round accepts draft positions
one by one with probability ``a`` until the first rejection (block 16: at most 15), so its
acceptance length is 1 + accepted and its expectation is ``tau(a) = sum_{k<16} a^k``. The
prompt population is a fixed list of ``a`` values drawn uniformly, so the true macro tau is
the mean of ``tau(a)`` over the list, and the true difference between two drafters is the
mean of their ``tau`` differences. Each trial draws its prompts from the population and its
rounds from the model, with its own seed, so every rate below is reproducible.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from core.tau import stats

BLOCK = 16
POP = [0.35 + 0.5 * i / 39 for i in range(40)]  # per-prompt acceptance rates
TRIALS = 200


def tau_of(a: float) -> float:
    return sum(a ** k for k in range(BLOCK))


def draw_round(rng: random.Random, a: float) -> int:
    n = 1
    while n < BLOCK and rng.random() < a:
        n += 1
    return n


def draw_rounds(rng, a, n_rounds):
    return [draw_round(rng, a) for _ in range(n_rounds)]


def prompt_tau(rounds):
    return sum(rounds) / len(rounds)


def paired_trial(seed, n_prompts, lift, n_rounds=24):
    """Both drafters on the same prompts; A's acceptance rate is B's plus ``lift``."""
    rng = random.Random(seed)
    rates = [rng.choice(POP) for _ in range(n_prompts)]
    a = [prompt_tau(draw_rounds(rng, min(0.99, r + lift), n_rounds)) for r in rates]
    b = [prompt_tau(draw_rounds(rng, r, n_rounds)) for r in rates]
    return stats.paired(a, b, name=f"trial{seed}")


def true_delta(lift):
    return sum(tau_of(min(0.99, r + lift)) - tau_of(r) for r in POP) / len(POP)


def se_band(rate: float, trials: int) -> float:
    return 3 * math.sqrt(rate * (1 - rate) / trials)


def test_real_difference_is_called_better_at_32_prompts():
    lift = 0.05
    assert 0.5 < true_delta(lift) < 0.6  # about +0.56 tau: the size of the v4 -> v5 question
    results = [paired_trial(seed, 32, lift, n_rounds=32) for seed in range(TRIALS)]
    better = sum(r.verdict == stats.BETTER for r in results) / TRIALS
    assert better >= 0.95, better
    assert not any(r.verdict == stats.WORSE for r in results)
    r = results[0]
    text = r.text("v5", "v4")
    assert text.startswith("v5 is better than v4 (+") and "95 % CI +" in text
    assert "32 prompts" in text and r.test.startswith("sign-flip permutation")


def test_equal_drafters_are_no_detectable_difference():
    results = [paired_trial(1000 + seed, 16, 0.0) for seed in range(TRIALS)]
    none = sum(r.verdict == stats.NONE for r in results) / TRIALS
    assert none >= 0.90, none
    # the test holds its level: false calls either way near 5 %, not more
    assert 1 - none <= 0.05 + se_band(0.05, TRIALS)
    text = results[0].text("v5", "v4")
    assert text.startswith("v5 vs v4: no detectable difference (") and "prompts would detect +0.1" \
        in text


def test_three_prompts_never_decide_and_say_how_many_would():
    # with 3 prompts the smallest two-sided sign-flip p is 2/8: even a real +0.45 is undecided
    r = paired_trial(7, 3, 0.08)
    assert r.p_value >= 0.25 and r.verdict == stats.NONE
    assert r.prompts_needed is not None and r.prompts_needed > 3
    assert f"about {r.prompts_needed} prompts would detect +0.1" in r.text("v5", "v4")


def test_delta_interval_covers_the_true_difference_at_the_nominal_rate():
    lift = 0.05
    truth = true_delta(lift)
    hits = sum(lo <= truth <= hi for lo, hi in
               (paired_trial(5000 + s, 16, lift).ci95 for s in range(TRIALS * 2)))
    cov = hits / (TRIALS * 2)
    assert abs(cov - stats.LEVEL) <= se_band(stats.LEVEL, TRIALS * 2), cov


@pytest.mark.parametrize("n_prompts", [8, 16])
def test_macro_interval_covers_the_true_mean_at_the_nominal_rate(n_prompts):
    truth = sum(tau_of(a) for a in POP) / len(POP)
    hits = 0
    trials = TRIALS * 2
    for seed in range(trials):
        rng = random.Random(9000 + seed)
        taus = [prompt_tau(draw_rounds(rng, rng.choice(POP), 24)) for _ in range(n_prompts)]
        lo, hi = stats.mean_ci(taus, rng=stats.rng_for("macro", seed))
        hits += lo <= truth <= hi
    cov = hits / trials
    assert abs(cov - stats.LEVEL) <= se_band(stats.LEVEL, trials), cov


@pytest.mark.parametrize("n_rounds", [12, 60])  # rounds drawn / their sum's normal law
def test_pooled_interval_covers_the_true_pooled_tau(n_rounds):
    # a fixed number of rounds per prompt: the true pooled tau is the population mean again
    truth = sum(tau_of(a) for a in POP) / len(POP)
    trials = TRIALS
    hits = 0
    for seed in range(trials):
        rng = random.Random(20000 + seed)
        groups = [draw_rounds(rng, rng.choice(POP), n_rounds) for _ in range(12)]
        lo, hi = stats.pooled_ci(groups, rng=stats.rng_for("pooled", seed), b=1000)
        hits += lo <= truth <= hi
    cov = hits / trials
    # prompts then rounds: never narrower than nominal (the second stage only widens)
    assert cov >= stats.LEVEL - se_band(stats.LEVEL, trials), cov


def test_intervals_are_seeded_and_reproducible():
    taus = [2.1, 2.7, 3.3, 1.9, 2.5, 3.0]
    a = stats.mean_ci(taus, rng=stats.rng_for("v5", "macro"))
    assert a == stats.mean_ci(taus, rng=stats.rng_for("v5", "macro"))
    assert a != stats.mean_ci(taus, rng=stats.rng_for("v5", "macro", seed=1))
    assert a[0] < sum(taus) / len(taus) < a[1]
    p1 = stats.paired(taus, [t - 0.3 for t in taus], name="x")
    p2 = stats.paired(taus, [t - 0.3 for t in taus], name="x")
    assert p1 == p2 and p1.ci95 == pytest.approx((0.3, 0.3)) and p1.verdict == stats.BETTER
    assert stats.mean_ci([2.0]) is None and stats.pooled_ci([[1, 2, 3]]) is None
    assert stats.paired([], []).verdict == stats.NONE


def test_sign_flip_p_exact_matches_brute_force_and_random_agrees():
    rng = random.Random(4)
    for n in (1, 2, 5, 9, 12):
        d = [rng.gauss(0.3, 1) for _ in range(n)]
        obs = abs(sum(d)) * (1 - 1e-12)
        brute = sum(abs(sum(x * s for x, s in zip(d, signs))) >= obs
                    for signs in itertools.product((1, -1), repeat=n)) / 2 ** n
        assert stats.sign_flip_p(d) == pytest.approx(brute)
    d = [rng.gauss(0.2, 1) for _ in range(stats.EXACT_MAX)]
    exact = stats.sign_flip_p(d)
    stats_max, stats.EXACT_MAX = stats.EXACT_MAX, 0
    try:
        approx = stats.sign_flip_p(d, rng=stats.rng_for("mc"), permutations=20000)
    finally:
        stats.EXACT_MAX = stats_max
    assert abs(approx - exact) < 0.015, (approx, exact)
    assert stats.sign_flip_p([0.5] * 6) == pytest.approx(2 / 64)
    assert stats.sign_flip_p([0.0, 0.0]) == 1.0


@pytest.mark.parametrize("df,q", [(1, 12.706), (2, 4.303), (4, 2.776), (7, 2.365),
                                  (15, 2.131), (30, 2.042)])
def test_t_quantiles(df, q):
    assert stats.t_quantile(0.975, df) == pytest.approx(q, abs=1e-3)
    assert stats.t_quantile(0.025, df) == pytest.approx(-q, abs=1e-3)


def test_prompts_to_detect():
    # sd 0.2 per-prompt difference, +0.1 to detect: (1.96 + 0.84)^2 * 4 + 1.92 = 33.3
    assert stats.prompts_to_detect(0.2, 0.1) == 34
    assert stats.prompts_to_detect(0.4, 0.1) > stats.prompts_to_detect(0.2, 0.1)
    assert stats.prompts_to_detect(float("nan")) is None



@pytest.mark.parametrize("diffs, says", [
    # the demo's v5 vs baseline: 8 prompts that agree almost exactly, a CI inside +-0.1
    ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.02, 0.14], "the 95 % CI excludes a difference of 0.1 either way"),
    # the demo's train-v5@30: a CI past -0.1, yet p short of 0.05 (the sign-flip test's steps at 8 prompts)
    ([-0.2, -0.12, -0.1, -0.1, -0.05, 0.0, 0.0, 0.0],
     "8 prompts should detect a difference of 0.1 (about {n} would), yet this one is short of p < 0.05: "
     "more prompts would settle it"),
])
def test_no_difference_with_enough_prompts_never_asks_for_fewer(diffs, says):
    """When the prompts needed to detect 0.1 are no more than those measured, "about 6 prompts
    would detect +0.1" (after 8) would read as advice to measure less: the verdict says what the
    interval shows instead."""
    a = [1.30, 1.25, 1.40, 1.22, 1.35, 1.28, 1.31, 1.26]
    r = stats.paired(a, [x - d for x, d in zip(a, diffs)])
    assert r.verdict == stats.NONE and r.prompts_needed is not None and r.prompts_needed <= 8
    text = r.text("v5", "baseline")
    assert text.endswith(says.format(n=r.prompts_needed)), text
    assert "prompts would detect" not in text


# -- the verdict and its interval agree (issue 48 §2) -------------------------------------
def hostile_pairs(rng: random.Random, count: int):
    """``count`` paired samples (a, b) of 2 to 40 prompts: smooth, tied (tau in steps of
    1/8 or 0.05), mostly zero, with outliers, all alike, and with NaN / inf prompts mixed in
    (left out), at spreads from 0.005 to 3 and shifts either side of 0."""
    for i in range(count):
        n = rng.randint(2, 40)
        shift, sd = rng.uniform(-0.6, 0.6) * rng.choice([0.05, 0.3, 1.0]), rng.choice([0.005, 0.1, 0.5, 3])
        kind = i % 6
        if kind == 0:
            diffs = [rng.gauss(shift, sd) for _ in range(n)]
        elif kind == 1:
            step = rng.choice([0.125, 0.05])
            diffs = [round(rng.gauss(shift, sd) / step) * step for _ in range(n)]
        elif kind == 2:
            diffs = [0.0 if rng.random() < 0.7 else rng.gauss(shift, sd) for _ in range(n)]
        elif kind == 3:
            diffs = [rng.gauss(shift, sd) + (rng.random() < 0.15) * rng.choice([-1, 1]) * rng.uniform(5, 20)
                     for _ in range(n)]
        elif kind == 4:
            diffs = [rng.choice([0.0, shift, 0.25])] * n
        else:
            diffs = [rng.gauss(shift, sd) for _ in range(n)]
        b = [rng.uniform(1.0, 6.0) for _ in range(n)]
        a = [x + d for x, d in zip(b, diffs)]
        if kind == 5:
            for j in rng.sample(range(n), k=min(n, 3)):
                (a if rng.random() < 0.5 else b)[j] = rng.choice([math.nan, math.inf, -math.inf])
        yield a, b


def test_the_verdict_and_its_interval_never_contradict():
    """1,000 paired samples: ``better`` exactly when p < 0.05 and the mean is above 0, and then
    the interval (and its printed ends) lies above 0; ``worse`` likewise below; no difference:
    the interval holds 0; under MIN_PROMPTS prompts no interval and no verdict. The interval
    always holds the mean difference."""
    rng = random.Random(48)
    seen = {stats.BETTER: 0, stats.WORSE: 0, stats.NONE: 0, None: 0}
    for k, (a, b) in enumerate(hostile_pairs(rng, 1000)):
        r = stats.paired(a, b, name=f"prop{k}")
        where = (k, r.prompts, r.delta, r.ci95, r.p_value, r.verdict)
        if r.prompts < stats.MIN_PROMPTS:
            assert r.ci95 is None and r.verdict == stats.NONE, where
            assert "no 95 % CI under 6 prompts" in r.text("a", "b") or r.prompts == 0, where
            seen[None] += 1
            continue
        lo, hi = r.ci95
        assert lo <= r.delta <= hi, where
        assert (r.verdict != stats.NONE) == (r.p_value < stats.ALPHA), where
        shown_lo, shown_hi = (float(x) for x in stats.fmt_ci(r.ci95, signed=True).split(".."))
        if r.verdict == stats.BETTER:
            assert r.delta > 0 and lo > 0 and shown_lo > 0, where
        elif r.verdict == stats.WORSE:
            assert r.delta < 0 and hi < 0 and shown_hi < 0, where
        else:
            assert lo <= 0 <= hi and shown_lo <= 0 <= shown_hi, where
        seen[r.verdict] += 1
    assert min(seen.values()) >= 60, seen  # every case was met, many times


@pytest.mark.parametrize("n", [6, 8, 11, 13])
def test_the_interval_ends_are_the_tests_own_limits(n):
    """The shifts the exact sign-flip test does not reject run from the J-th smallest to the
    J-th largest mean of a subset of the prompts, J = ceil(0.05 * 2^(n-1) - 1) (a pattern is
    as extreme as the data exactly when the prompts it flips average beyond the shift):
    brute force over every subset agrees with the bisection to 1/1,000 of a standard error."""
    rng = random.Random(100 + n)
    for trial in range(5):
        d = [rng.gauss(0.2, 0.4) + (trial == 4) * rng.choice([0, 0, 3]) for _ in range(n)]
        means = sorted(sum(x for j, x in enumerate(d) if mask >> j & 1) / bin(mask).count("1")
                       for mask in range(1, (1 << n) - 1))
        j = math.ceil(stats.ALPHA * 2 ** (n - 1) - 1)
        lo, hi = stats.paired(d, [0.0] * n).ci95
        se = statistics.stdev(d) / math.sqrt(n)
        assert means[j - 1] - 1e-12 <= lo <= means[j - 1] + 1e-3 * se, (lo, means[j - 1])
        assert means[-j] - 1e-3 * se <= hi <= means[-j] + 1e-12, (hi, means[-j])
        assert lo == stats.sign_flip_ci(d)[0] and hi == stats.sign_flip_ci(d)[1]


def test_random_patterns_give_one_p_per_shift_and_the_interval_inverts_them():
    """Past EXACT_MAX prompts the p-value and the interval come from the same seeded sign
    patterns: the interval's ends are not rejected, shifts just beyond them are, and the
    p-value is the one sign_flip_p gives with that seed."""
    rng = random.Random(7)
    a = [rng.uniform(2, 5) for _ in range(60)]
    b = [x - rng.gauss(0.2, 0.4) for x in a]
    r = stats.paired(a, b, name="mc")
    diffs = [x - y for x, y in zip(a, b)]
    assert r.p_value == stats.sign_flip_p(diffs, rng=stats.rng_for("mc", "test"))
    assert r.verdict == stats.BETTER and 0 < r.ci95[0] < r.delta < r.ci95[1]
    beyond = 2 * 3 * r.sd / math.sqrt(60) / 2 ** stats.BISECTIONS

    def p_at(s):
        return stats.sign_flip_p([x - s for x in diffs], rng=stats.rng_for("mc", "test"))
    for end, out in ((r.ci95[0], -beyond), (r.ci95[1], beyond)):
        assert p_at(end) >= stats.ALPHA > p_at(end + out), (end, p_at(end), p_at(end + out))
    assert stats.paired(a, b, name="mc") == r


def test_the_demos_contradiction_is_gone():
    """The demo printed "no detectable difference (-0.08, 95 % CI -0.14..-0.02, 8 prompts,
    p = 0.062)": a bootstrap interval that excluded 0 beside a test that did not reject it.
    On 8 differences like those (p = 0.062) the interval now reaches 0; made a little more
    one-sided (p < 0.05), it leaves 0 on the verdict's side."""
    a = [1.30, 1.25, 1.40, 1.22, 1.35, 1.28, 1.31, 1.26]
    diffs = [-0.2, -0.12, -0.1, -0.1, -0.05, 0.0, 0.0, 0.0]
    r = stats.paired([x + d for x, d in zip(a, diffs)], a)
    assert r.p_value == pytest.approx(0.0625) and r.verdict == stats.NONE
    assert r.ci95[0] < -0.1 and r.ci95[1] >= 0, r.ci95
    assert "95 % CI -0.14..+0.00" in r.text("v5", "baseline")
    r = stats.paired([x + d for x, d in zip(a, diffs[:5] + [-0.01] * 3)], a)
    assert r.p_value < stats.ALPHA and r.verdict == stats.WORSE and r.ci95[1] < 0, r


def test_under_six_prompts_there_is_no_interval_and_no_verdict():
    """With 5 prompts the smallest two-sided p is 2/32 > 0.05: no difference, however large,
    can be rejected, so the test's interval is the whole line; it is given as none."""
    r = stats.paired([3.0, 3.1, 2.9, 3.2, 3.05], [1.0, 1.1, 0.9, 1.2, 1.05])
    assert r.ci95 is None and r.verdict == stats.NONE and r.p_value == pytest.approx(2 / 32)
    assert "(+2.00, no 95 % CI under 6 prompts, 5 prompts, p = 0.062)" in r.text("v5", "v4")
    assert stats.sign_flip_ci([1.0, 2.0, 3.0]) is None
    r6 = stats.paired([3.0, 3.1, 2.9, 3.2, 3.05, 3.0], [1.0, 1.1, 0.9, 1.2, 1.05, 1.0])
    assert r6.verdict == stats.BETTER and r6.ci95[0] > 0


def test_alike_and_zero_differences():
    assert stats.paired([2.0] * 8, [2.0] * 8).ci95 == (0.0, 0.0)
    r = stats.paired([2.5] * 8, [2.0] * 8)
    assert r.ci95 == (0.5, 0.5) and r.verdict == stats.BETTER and r.p_value == 2 / 256
    nan = stats.paired([2.5] * 8 + [math.nan], [2.0] * 8 + [1.0])
    assert nan.prompts == 8 and nan.ci95 == r.ci95


def test_interval_ends_that_round_to_zero_keep_their_sign():
    assert stats.fmt_ci((0.0031, 0.08), signed=True) == "+0.0031..+0.08"
    assert stats.fmt_ci((-0.004, 0.0), signed=True) == "-0.004..+0.00"
    assert stats.fmt_ci((2.31, 2.7)) == "2.31..2.70"
