"""Uncertainty for acceptance length: bootstrap intervals, a paired test with its interval and a verdict.

Pure Python (``random``, ``math``, ``statistics``): the console machine needs no numpy.

What is computed, and why:

* **Prompts are the unit.** Rounds of one prompt are not independent (a prompt that is easy
  for the drafter gives long rounds throughout), so every interval resamples *prompts*.
* **Macro tau** (mean of prompt taus): a bootstrap over prompts. Percentile intervals of a
  mean are too narrow with few prompts, so the tail probability is *expanded*
  (Hesterberg's expanded percentile bootstrap: the percentile level whose normal quantile is
  ``sqrt(n/(n-1)) * t_{n-1}``), which keeps the coverage near 95 % from about 5 prompts on.
* **Pooled tau** (all rounds' committed tokens over all rounds): a two-stage bootstrap,
  prompts with replacement and then rounds with replacement within each drawn prompt (the
  rounds are the unit the pooled figure averages over; the prompts carry the dependence).
* **Paired comparison** of two drafters on the prompts both were evaluated on: the mean of
  the per-prompt differences, a two-sided **sign-flip permutation test** of "no difference"
  (under the null each prompt's difference is as likely positive as negative: exact over all
  2^n sign patterns up to :data:`EXACT_MAX` prompts, else :data:`PERMUTATIONS` seeded random
  ones) and the interval *of that test*: the 95 % interval is the set of differences ``s`` the
  test does not reject at 0.05 when run on the differences minus ``s`` (a confidence set by
  inverting a test: Lehmann & Romano, *Testing Statistical Hypotheses*, on the duality of
  tests and confidence sets; Good, *Permutation Tests*, on intervals from permutation tests).
  Its ends are found by bisection on each side of the mean, every ``s`` tested with the same
  sign patterns, so p is a fixed function of ``s``; it falls away from the mean (a pattern is
  as extreme as the data exactly when the mean of the prompts it flips lies beyond ``s``:
  Hartigan's subset means, JASA 1969), but 0 is placed by p(0) itself, rounding or not.
  A bootstrap interval beside the test could exclude 0 while the test said "no difference"
  (the demo once printed ``no detectable difference (-0.08, 95 % CI -0.14..-0.02, 8 prompts,
  p = 0.062)``); the inverted one excludes 0 exactly when p < 0.05. Under
  :data:`MIN_PROMPTS` prompts no sign pattern is rare enough to reject any ``s``: the set is
  the whole line, given as no interval (``ci95`` None). docs/evaluation.md §6 says it for users.
* **Verdict**: ``better`` / ``worse`` exactly when p < 0.05 (the interval is then on that side
  of 0), else ``no_detectable_difference`` together with about how many prompts a paired test
  would need to detect a difference of ``detect`` (80 % power, from the differences' spread).

Everything is seeded (:data:`SEED` and a name per figure), so a table prints the same
intervals every time it is built from the same rows.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import repeat
from statistics import NormalDist, fmean, stdev
from typing import Callable, Sequence

from core.state.points import figure_of

LEVEL = 0.95
ALPHA = 0.05
SEED = 20260101
BOOTSTRAP = 2000
"""Bootstrap resamples per interval."""
PERMUTATIONS = 5000
"""Random sign patterns of the permutation test when exact enumeration is too long."""
EXACT_MAX = 22
"""Up to this many prompts the sign-flip test counts all 2^n sign patterns exactly."""
MIN_PROMPTS = 6
"""The fewest prompts with which the two-sided sign-flip test can reach p < 0.05 (2/64)."""
DETECT = 0.1
"""The tau difference a "how many prompts" estimate is for."""
POWER = 0.8
TEST = "sign-flip permutation (paired, two-sided)"

BETTER, WORSE, NONE = "better", "worse", "no_detectable_difference"
VERDICTS = (BETTER, WORSE, NONE)

_N = NormalDist()


def rng_for(*names: object, seed: int = SEED) -> random.Random:
    """A generator seeded by ``seed`` and the figure's names (independent of call order)."""
    return random.Random(":".join([str(seed), *map(str, names)]))


# -- t quantiles (exact for integer degrees of freedom) ----------------------------------
def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer ``df`` >= 1 (closed form, A&S 26.7.3-4)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:  # odd
        a = theta
        if df > 1:
            term, total = c, c
            for k in range(3, df - 1, 2):
                term *= c * c * (k - 1) / k
                total += term
            a += s * total
        a *= 2 / math.pi
    else:
        term, total = 1.0, 1.0
        for k in range(2, df - 1, 2):
            term *= c * c * (k - 1) / k
            total += term
        a = s * total
    return 0.5 + a / 2  # a = P(|T| < t) signed with t


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with integer ``df`` (bisection on :func:`t_cdf`)."""
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def expanded_tail(n: int, level: float = LEVEL) -> float:
    """The one-sided tail probability the expanded percentile bootstrap uses for ``n``."""
    if n < 2:
        return (1 - level) / 2
    z = math.sqrt(n / (n - 1)) * t_quantile(1 - (1 - level) / 2, n - 1)
    return _N.cdf(-z)


def _percentiles(samples: list[float], tail: float) -> tuple[float, float]:
    samples.sort()
    b = len(samples)
    lo = samples[max(0, min(b - 1, math.floor(tail * b)))]
    hi = samples[max(0, min(b - 1, math.ceil((1 - tail) * b) - 1))]
    return lo, hi


def _finite(values) -> list[float]:
    """The usable figures among ``values`` as floats: a NaN, infinite or absurdly large one
    (a hostile or broken result file) is left out here, so no statistic raises or turns NaN
    on it (the comparison names such rows: :func:`core.state.points.eval_row_problem`)."""
    return [x for x in map(figure_of, values) if x is not None]


# -- intervals ----------------------------------------------------------------------------
def mean_ci(values: Sequence[float], *, rng: random.Random | None = None,
            b: int = BOOTSTRAP, level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of the mean of ``values`` (bootstrap over them); None under 2 values."""
    vals = _finite(values)
    n = len(vals)
    if n < 2:
        return None
    rng = rng or rng_for("mean")
    if max(vals) == min(vals):
        return vals[0], vals[0]
    choices = rng.choices
    samples = [fmean(choices(vals, k=n)) for _ in range(b)]
    return _percentiles(samples, expanded_tail(n, level))


EXACT_ROUNDS = 30
"""Prompts with more rounds resample them through the normal law of their resampled sum."""


def pooled_ci(rounds: Sequence[Sequence[float]], *, rng: random.Random | None = None,
              b: int = BOOTSTRAP, level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of the pooled mean over every round of every prompt (two-stage bootstrap:
    prompts, then rounds within each drawn prompt); None under 2 prompts with rounds.

    The second stage draws the rounds themselves for prompts of up to
    :data:`EXACT_ROUNDS` rounds; for longer ones it draws the resampled sum from its normal
    law (mean ``n * m``, sd ``sqrt(n) * s``), which is what resampling many rounds gives and
    keeps a table of long evals quick."""
    groups = [g for g in map(_finite, rounds) if g]
    n = len(groups)
    if n < 2:
        return None
    rng = rng or rng_for("pooled")
    choices, rand, gauss = rng.choices, rng.random, rng.gauss
    # per prompt: (rounds, count, sum, sd of the resampled sum) or the rounds to draw from
    stats_ = []
    for g in groups:
        m = fmean(g)
        sd = math.sqrt(sum((x - m) ** 2 for x in g) / len(g) * len(g))
        stats_.append((g if len(g) <= EXACT_ROUNDS else None, len(g), m * len(g), sd))
    samples = []
    for _ in range(b):
        total = count = 0.0
        for _ in range(n):
            g, k, mean_sum, sd = stats_[int(rand() * n)]
            total += sum(choices(g, k=k)) if g is not None else gauss(mean_sum, sd)
            count += k
        samples.append(total / count)
    return _percentiles(samples, expanded_tail(n, level))


# -- the paired test ----------------------------------------------------------------------
def _signed_sums(xs: Sequence[float]) -> list[float]:
    """Sum of ``xs`` under every sign pattern; index bit j set: +xs[j], clear: -xs[j]."""
    sums = [0.0]
    for j, x in enumerate(xs):
        sums = [s - x for s in sums] + [s + x for s in sums]  # the new bit is the top one
    return sums


def _subset_sums(xs: Sequence[float]) -> list[tuple[float, int]]:
    """(sum, size) of every subset of ``xs``; index bit j set: xs[j] is in it."""
    subsets = [(0.0, 0)]
    for x in xs:
        subsets += [(s + x, k + 1) for s, k in subsets]
    return subsets


def _p_of_shift(d: list[float], mean: float, rng: random.Random,
                permutations: int) -> Callable[[float], float]:
    """``p(shift)``: the two-sided sign-flip p-value of "the mean difference is ``shift``",
    i.e. of the differences ``d - shift``; ``p(0)`` is :func:`sign_flip_p`.

    The statistic is the sum of the shifted differences, ``S = n * (mean - shift)``; a sign
    pattern is as extreme (ties included, to 1e-12 of ``|S|``) as the data exactly when the
    shifted differences it flips, or those it keeps, sum to at most 0 on the side of ``S``
    (the two sums add up to ``S``: a pattern is never counted twice). So p is twice the share
    of *subsets* of the prompts whose shifted sum is not on ``S``'s side, and it falls as the
    shift moves away from the mean (a subset counts once its mean is passed: Hartigan's
    subset means).

    Up to :data:`EXACT_MAX` differences every subset counts (meet in the middle: the sums of
    two halves' subsets, one sorted; a subset's shifted sum is its sum minus ``shift`` times
    its size, computed once); beyond, the *same* ``permutations`` seeded sign patterns serve
    every shift (grouped by plus signs minus minus signs, sums sorted). Either way ``p`` is a
    deterministic function of the shift that an interval can be read from
    (:func:`_inverted_interval`), and ``p(mean)`` is 1."""
    n = len(d)
    if n <= EXACT_MAX:
        half = n // 2
        left = _subset_sums(d[:half])
        # the right half's subsets ordered by (size, sum): a shift keeps each size's run in
        # order, so sorting the shifted sums only merges n/2 + 1 runs
        right = sorted((k, s) for s, k in _subset_sums(d[half:]))
        total = 1 << n

        def p(shift: float) -> float:
            gap = n * (mean - shift)
            if gap == 0:
                return 1.0
            tie, side = 5e-13 * abs(gap), 1.0 if gap > 0 else -1.0
            rs = sorted([side * (s - shift * k) for k, s in right])
            # subsets (left part + right part) whose shifted sum is at most `tie` on S's side
            hits = sum(map(bisect_right, repeat(rs), [tie - side * (s - shift * k) for s, k in left]))
            return 2 * hits / total
        return p
    chunks = [_signed_sums(d[i:i + 8]) for i in range(0, n, 8)]
    getbits = rng.getrandbits
    by_count: dict[int, list[float]] = {}
    for _ in range(permutations):
        bits = getbits(n)
        k = 2 * bits.bit_count() - n
        s = 0.0
        for table in chunks:
            s += table[bits & 255]
            bits >>= 8
        by_count.setdefault(k, []).append(s)
    groups = [(k, sorted(sums)) for k, sums in by_count.items()]

    def p(shift: float) -> float:
        observed = n * abs(mean - shift) * (1 - 1e-12)
        if observed == 0:
            return 1.0
        hits = 0
        for k, sums in groups:  # |s - shift * k| >= observed
            c = shift * k
            hits += len(sums) - bisect_left(sums, observed + c) + bisect_right(sums, c - observed)
        return (hits + 1) / (permutations + 1)
    return p


def sign_flip_p(diffs: Sequence[float], *, rng: random.Random | None = None,
                permutations: int = PERMUTATIONS) -> float:
    """Two-sided p-value of "the mean difference is 0" by flipping the signs of the
    differences: exact up to :data:`EXACT_MAX` of them, else seeded random sign patterns
    (:func:`_p_of_shift` at shift 0, what :func:`paired` reports beside its interval)."""
    d = _finite(diffs)
    if not d:
        return 1.0
    return _p_of_shift(d, fmean(d), rng or rng_for("signflip"), permutations)(0.0)


BISECTIONS = 12
"""Halvings of each end's bracket (first 3 standard errors of the mean difference wide, more
halvings when it had to widen): each end is found to within 3/2^12, about 1/1,400, of a
standard error, far below the two decimals it prints with, in about 13 tests a side."""


def _inverted_interval(p: Callable[[float], float], d: list[float], mean: float, p0: float,
                       alpha: float, permutations: int) -> tuple[float, float] | None:
    """The shifts the test behind ``p`` does not reject at ``alpha`` (``p(shift) >= alpha``),
    as the hull of those a bisection on each side of the mean finds; ``p0`` is ``p(0)``.

    Each end starts from a shift known not rejected (the mean, where ``p`` is 1, or 0 when
    ``p0 >= alpha`` and 0 is on that side) and steps outward, doubling, to one rejected; 0
    serves as that rejected shift when ``p0 < alpha`` and it is passed. The bisection then
    keeps one not-rejected end and one rejected, so whether ``p`` is monotone or not, the
    hull holds 0 exactly when ``p0 >= alpha``, and the mean always.

    None when no shift can be rejected: under :data:`MIN_PROMPTS` exact (the smallest p is
    2/2^n), or too few random patterns (the smallest p is 1/(permutations + 1)); the set of
    differences the test cannot tell from these data is then the whole line."""
    n = len(d)
    smallest_p = 2 / (1 << n) if n <= EXACT_MAX else 1 / (permutations + 1)
    if smallest_p >= alpha:
        return None
    if max(d) == min(d):  # every other shift leaves n equal non-zero differences: p = 2/2^n
        return d[0], d[0]
    start = 3 * stdev(d, mean) / math.sqrt(n)
    spread = math.fsum(abs(x - mean) for x in d)  # past it only the all-alike patterns tie
    ends = []
    for side in (-1.0, 1.0):
        inner = 0.0 if p0 >= alpha and side * (0.0 - mean) > 0 else mean
        step = start
        outer = inner + side * step
        for _ in range(80):
            if p0 < alpha and min(inner, outer) < 0.0 < max(inner, outer):
                outer = 0.0  # rejected: the interval stops short of 0
                break
            if p(outer) < alpha:
                break
            inner, step = outer, max(2 * step, spread)
            outer = inner + side * step
        else:
            return None
        for _ in range(BISECTIONS + math.ceil(math.log2(max(1.0, abs(outer - inner) / start)))):
            mid = (inner + outer) / 2
            if mid in (inner, outer):
                break
            if p(mid) < alpha:
                outer = mid
            else:
                inner = mid
        ends.append(inner)
    return ends[0], ends[1]


def sign_flip_ci(diffs: Sequence[float], *, rng: random.Random | None = None,
                 permutations: int = PERMUTATIONS, level: float = LEVEL
                 ) -> tuple[float, float] | None:
    """The ``level`` interval of the mean difference that inverts :func:`sign_flip_p`: the
    shifts ``s`` for which the test of ``diffs - s`` keeps "no difference" (p >= 1 - level).
    None under :data:`MIN_PROMPTS` differences (no shift can be rejected)."""
    d = _finite(diffs)
    if not d:
        return None
    mean = fmean(d)
    p = _p_of_shift(d, mean, rng or rng_for("signflip"), permutations)
    return _inverted_interval(p, d, mean, p(0.0), 1 - level, permutations)


def prompts_to_detect(sd: float | None, effect: float = DETECT, *, alpha: float = ALPHA,
                      power: float = POWER) -> int | None:
    """About how many prompts a paired test needs to detect a mean difference ``effect``
    when per-prompt differences spread with standard deviation ``sd`` (the normal formula
    with Guenther's small-sample correction ``+ z^2 / 2``)."""
    if sd is None or len(_finite([sd, effect])) < 2 or effect <= 0:
        return None
    za, zb = _N.inv_cdf(1 - alpha / 2), _N.inv_cdf(power)
    # under MIN_PROMPTS no sign pattern is rare enough: 2 / 2^n >= alpha
    return max(MIN_PROMPTS, math.ceil(((za + zb) * sd / effect) ** 2 + za * za / 2))


@dataclass(frozen=True)
class Paired:
    """A paired comparison of A with B over the prompts both have (A - B per prompt)."""

    prompts: int
    delta: float | None
    """Mean per-prompt difference A - B."""
    ci95: tuple[float, float] | None
    """95 % interval of ``delta`` inverting the sign-flip test behind ``p_value`` (the
    differences it does not reject); None under :data:`MIN_PROMPTS` prompts."""
    p_value: float | None
    verdict: str
    detect: float
    """The difference the prompts estimate is for."""
    prompts_needed: int | None
    """About how many prompts would detect ``detect`` (None when unknown)."""
    sd: float | None = None
    """Standard deviation of the per-prompt differences (None under 2 prompts)."""
    test: str = TEST

    def ci_text(self) -> str:
        """``"95 % CI +0.18..+0.66"``, or why there is none: under :data:`MIN_PROMPTS` prompts
        the test rejects no difference, so its interval is the whole line."""
        if self.ci95:
            return f"95 % CI {fmt_ci(self.ci95, signed=True)}"
        return f"no 95 % CI under {MIN_PROMPTS} prompts" if self.prompts < MIN_PROMPTS else "no interval"

    def text(self, a: str, b: str, seeds: int = 1) -> str:
        """The verdict in words, e.g. ``v5 is better than v4 (+0.42, 95 % CI +0.18..+0.66,
        16 prompts, p = 0.003)``; with ``seeds`` > 1 (sampled, seeds nested in prompts) the
        prompts say so: ``16 prompts x 20 seeds``."""
        if self.delta is None:
            return f"{a} vs {b}: no shared prompts to compare"
        ci = self.ci_text()
        p = f", p {fmt_p(self.p_value)}" if self.p_value is not None else ""
        nested = f" × {seeds} seeds" if seeds > 1 else ""
        figures = (f"{_fmt_figure(self.delta, True)}, {ci}, "
                   f"{self.prompts} prompt{'s' * (self.prompts != 1)}{nested}{p}")
        if self.verdict in (BETTER, WORSE):
            return f"{a} is {self.verdict} than {b} ({figures})"
        if self.prompts_needed and self.prompts_needed <= self.prompts:  # enough prompts for the size asked
            if self.ci95 and -self.detect < self.ci95[0] and self.ci95[1] < self.detect:
                need = f"the 95 % CI excludes a difference of {self.detect:.2g} either way"
            else:
                need = (f"{self.prompts} prompts should detect a difference of {self.detect:.2g} (about "
                        f"{self.prompts_needed} would), yet this one is short of p < {ALPHA:g}: more prompts "
                        "would settle it")
        else:
            need = (f"about {self.prompts_needed} prompts would detect {self.detect:+.2g}"
                    if self.prompts_needed else "more prompts are needed to tell")
        seen = prompts_to_detect(self.sd, abs(self.delta)) if self.sd is not None else None
        if seen and abs(self.delta) > self.detect and seen > self.prompts:
            need += f" (about {seen} would detect {self.delta:+.2f}, the size seen)"
        return f"{a} vs {b}: no detectable difference ({figures}): {need}"


def _fmt_figure(x: float, signed: bool) -> str:
    """Two decimals; a figure that is not 0 but rounds to it keeps two significant digits."""
    if x and round(x, 2) == 0:
        return f"{x:+.2g}" if signed else f"{x:.2g}"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def fmt_ci(ci: tuple[float, float] | None, signed: bool = False) -> str:
    """``"2.31..2.70"`` (``"+0.18..+0.66"`` when ``signed``), ``"–"`` for None. An end that is
    not 0 but rounds to it keeps two significant digits (``"+0.0031..+0.08"``), so an interval
    that excludes 0 never prints as touching it."""
    if ci is None:
        return "–"
    return _fmt_figure(ci[0], signed) + ".." + _fmt_figure(ci[1], signed)


def fmt_p(p: float | None) -> str:
    """``"= 0.031"``, ``"< 0.001"`` (the relation included), ``"–"`` for None."""
    if p is None:
        return "–"
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def paired(a: Sequence[float], b: Sequence[float], *, name: str = "pair",
           detect: float = DETECT, seed: int = SEED,
           permutations: int = PERMUTATIONS, alpha: float = ALPHA) -> Paired:
    """Compare per-prompt figures ``a`` and ``b`` (aligned: the same prompt at each index).

    The p-value and the interval come from one sign-flip test (the same sign patterns), the
    interval being the shifts it does not reject, so they cannot disagree: ``better`` /
    ``worse`` exactly when p < ``alpha`` (:data:`ALPHA`; a smaller one when the comparison is
    one of several: :func:`holm_levels`), and then the interval, at ``1 - alpha``, lies on
    that side of 0."""
    if len(a) != len(b):
        raise ValueError("paired figures need one value per prompt on both sides")
    both = [p for p in map(_finite, zip(a, b)) if len(p) == 2]  # a prompt with a NaN: out
    diffs = _finite(x - y for x, y in both)
    n = len(diffs)
    if n == 0:
        return Paired(0, None, None, None, NONE, detect, None)
    delta = fmean(diffs)
    p_of = _p_of_shift(diffs, delta, rng_for(name, "test", seed=seed), permutations)
    p = p_of(0.0)
    ci = _inverted_interval(p_of, diffs, delta, p, alpha, permutations)
    verdict = NONE
    if ci is not None and p < alpha:  # the interval then excludes 0 on the mean's side
        verdict = BETTER if delta > 0 else WORSE
    sd = stdev(diffs) if n >= 2 else None
    return Paired(n, delta, ci, p, verdict, detect,
                  prompts_to_detect(sd, detect) if sd is not None else None, sd)


def holm_adjusted(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values for a family of comparisons (None: not tested, not
    counted): sorted ascending, the i-th (from 1) of m is ``(m - i + 1) * p``, raised to the
    largest before it and capped at 1. A comparison is rejected at ``alpha`` exactly when its
    adjusted p is under ``alpha``; the family's chance of any false "better"/"worse" stays
    at most ``alpha`` (Holm, *Scand. J. Statist.* 6, 1979), and it rejects everything
    Bonferroni does, often more.

    >>> holm_adjusted([0.01, 0.04, 0.03, None])
    [0.03, 0.06, 0.06, None]
    """
    order = sorted((i for i, p in enumerate(p_values) if p is not None),
                   key=lambda i: p_values[i])
    m = len(order)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


def holm_levels(p_values: Sequence[float | None], alpha: float = ALPHA) -> list[float | None]:
    """The test level each comparison of a family is decided at under Holm's procedure: the
    i-th smallest p is tested at ``alpha / (m - i + 1)`` while every smaller one was rejected;
    from the first one that is not, every later one keeps that level (none of them is
    rejected). An interval inverting the test at a comparison's level (``paired(...,
    alpha=level)``) therefore excludes 0 exactly when Holm rejects it: the verdict and its
    interval never disagree. None where the p-value is None."""
    order = sorted((i for i, p in enumerate(p_values) if p is not None),
                   key=lambda i: p_values[i])
    m = len(order)
    out: list[float | None] = [None] * len(p_values)
    stopped: float | None = None
    for rank, i in enumerate(order):
        level = stopped if stopped is not None else alpha / (m - rank)
        if stopped is None and not p_values[i] < level:
            stopped = level
        out[i] = level
    return out


__all__ = ["holm_adjusted", "holm_levels", "LEVEL", "SEED", "BOOTSTRAP", "PERMUTATIONS", "DETECT", "TEST", "VERDICTS", "BETTER",
           "WORSE", "NONE", "Paired", "paired", "mean_ci", "pooled_ci", "sign_flip_p",
           "sign_flip_ci", "prompts_to_detect", "t_quantile", "t_cdf", "expanded_tail", "rng_for",
           "fmt_p", "fmt_ci"]
