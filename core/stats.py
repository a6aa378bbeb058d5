"""Uncertainty for acceptance length: bootstrap intervals, a paired test and a verdict.

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
  the per-prompt differences, its interval (the expanded percentile bootstrap over the
  differences) and a two-sided **sign-flip permutation test** of "no difference" (under the
  null each prompt's difference is as likely positive as negative): exact over all 2^n sign
  patterns up to :data:`EXACT_MAX` prompts, else :data:`PERMUTATIONS` seeded random ones.
* **Verdict**: ``better`` / ``worse`` when p < 0.05 *and* the interval excludes 0 on that
  side, else ``no_detectable_difference`` together with about how many prompts a paired test
  would need to detect a difference of ``detect`` (80 % power, from the differences' spread).

Everything is seeded (:data:`SEED` and a name per figure), so a table prints the same
intervals every time it is built from the same rows.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from statistics import NormalDist, fmean, stdev
from typing import Sequence

from core.points import figure_of

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
    on it (the comparison names such rows: :func:`core.points.eval_row_problem`)."""
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


def sign_flip_p(diffs: Sequence[float], *, rng: random.Random | None = None,
                permutations: int = PERMUTATIONS) -> float:
    """Two-sided p-value of "the mean difference is 0" by flipping the signs of the
    differences: exact up to :data:`EXACT_MAX` of them (meet in the middle: the sums of two
    halves, one sorted), else seeded random sign patterns."""
    d = _finite(diffs)
    n = len(d)
    observed = abs(sum(d)) * (1 - 1e-12)  # ties with the observed sum count as extreme
    if n == 0 or observed == 0:
        return 1.0
    if n <= EXACT_MAX:
        half = n // 2
        left, right = _signed_sums(d[:half]), sorted(_signed_sums(d[half:]))
        m = len(right)
        hits = 0
        for a in left:  # count a + b >= observed and a + b <= -observed
            hits += m - bisect_left(right, observed - a) + bisect_right(right, -observed - a)
        return hits / (1 << n)
    rng = rng or rng_for("signflip")
    chunks = [_signed_sums(d[i:i + 8]) for i in range(0, n, 8)]
    getbits = rng.getrandbits
    hits = 0
    for _ in range(permutations):
        bits = getbits(n)
        s = 0.0
        for table in chunks:
            s += table[bits & 255]
            bits >>= 8
        if abs(s) >= observed:
            hits += 1
    return (hits + 1) / (permutations + 1)


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
    p_value: float | None
    verdict: str
    detect: float
    """The difference the prompts estimate is for."""
    prompts_needed: int | None
    """About how many prompts would detect ``detect`` (None when unknown)."""
    sd: float | None = None
    """Standard deviation of the per-prompt differences (None under 2 prompts)."""
    test: str = TEST

    def text(self, a: str, b: str, seeds: int = 1) -> str:
        """The verdict in words, e.g. ``v5 is better than v4 (+0.42, 95 % CI +0.18..+0.66,
        16 prompts, p = 0.003)``; with ``seeds`` > 1 (sampled, seeds nested in prompts) the
        prompts say so: ``16 prompts x 20 seeds``."""
        if self.delta is None:
            return f"{a} vs {b}: no shared prompts to compare"
        ci = f"95 % CI {fmt_ci(self.ci95, signed=True)}" if self.ci95 else "no interval"
        p = f", p {fmt_p(self.p_value)}" if self.p_value is not None else ""
        nested = f" × {seeds} seeds" if seeds > 1 else ""
        figures = f"{self.delta:+.2f}, {ci}, {self.prompts} prompt{'s' * (self.prompts != 1)}{nested}{p}"
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


def fmt_ci(ci: tuple[float, float] | None, signed: bool = False) -> str:
    """``"2.31..2.70"`` (``"+0.18..+0.66"`` when ``signed``), ``"–"`` for None."""
    if ci is None:
        return "–"
    f = "{:+.2f}" if signed else "{:.2f}"
    return f.format(ci[0]) + ".." + f.format(ci[1])


def fmt_p(p: float | None) -> str:
    """``"= 0.031"``, ``"< 0.001"`` (the relation included), ``"–"`` for None."""
    if p is None:
        return "–"
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def paired(a: Sequence[float], b: Sequence[float], *, name: str = "pair",
           detect: float = DETECT, seed: int = SEED, bootstrap: int = BOOTSTRAP,
           permutations: int = PERMUTATIONS) -> Paired:
    """Compare per-prompt figures ``a`` and ``b`` (aligned: the same prompt at each index)."""
    if len(a) != len(b):
        raise ValueError("paired figures need one value per prompt on both sides")
    both = [p for p in map(_finite, zip(a, b)) if len(p) == 2]  # a prompt with a NaN: out
    diffs = _finite(x - y for x, y in both)
    n = len(diffs)
    if n == 0:
        return Paired(0, None, None, None, NONE, detect, None)
    delta = fmean(diffs)
    ci = mean_ci(diffs, rng=rng_for(name, "delta", seed=seed), b=bootstrap)
    p = sign_flip_p(diffs, rng=rng_for(name, "test", seed=seed), permutations=permutations)
    verdict = NONE
    if ci is not None and p < ALPHA:
        if ci[0] > 0:
            verdict = BETTER
        elif ci[1] < 0:
            verdict = WORSE
    sd = stdev(diffs) if n >= 2 else None
    return Paired(n, delta, ci, p, verdict, detect,
                  prompts_to_detect(sd, detect) if sd is not None else None, sd)


__all__ = ["LEVEL", "SEED", "BOOTSTRAP", "PERMUTATIONS", "DETECT", "TEST", "VERDICTS", "BETTER",
           "WORSE", "NONE", "Paired", "paired", "mean_ci", "pooled_ci", "sign_flip_p",
           "prompts_to_detect", "t_quantile", "t_cdf", "expanded_tail", "rng_for", "fmt_p", "fmt_ci"]
