"""A paired verdict as soon as it is settled: an anytime-valid confidence sequence for the mean
per-prompt difference of tau between two drafters (docs/evaluation.md §7). Pure Python, host-side:
an eval that pairs two drafters prompt by prompt asks :meth:`Sequential.add` after each prompt
and stops when :attr:`Sequential.verdict` is no longer ``None``; ``core.tau`` reuses it.

The method is the two-sided normal-mixture (Robbins) confidence sequence with a plug-in variance,
the asymptotic confidence sequence of Waudby-Smith, Arnold, Wu, Wang and Ramdas, "Time-uniform
central limit theory and asymptotic confidence sequences" (Annals of Statistics 52, 2024; arXiv
2103.06476), Theorem 2.2: after t prompts with differences of mean ``m`` and standard deviation
``s``, the set

    m ± s * sqrt( 2 (t rho^2 + 1) / (t^2 rho^2) * log( sqrt(t rho^2 + 1) / alpha ) )

holds the true mean difference at every t at once with probability about 1 - alpha (Robbins'
normal mixture, "Statistical methods related to the law of the iterated logarithm", 1970: Ville's
inequality on the mixture martingale), so looking after every prompt and stopping whenever it is
settled keeps the error rate: it is not a fixed-n test repeated. ``rho`` sets the prompt count at
which it is tightest (:func:`rho_for`, their eq. for t*). specdeck intersects the sets over time
(still valid) and gives no verdict before :data:`MIN_PROMPTS` prompts, where a plug-in variance
of a handful of prompts is not to be trusted.

The verdict, with ``delta`` the smallest difference the operator cares about (> 0):

* ``better``: the whole set is above 0; ``worse``: below 0;
* ``no_difference``: the whole set lies within (-delta, +delta): no difference as large as delta;
* ``None`` (unsettled) otherwise; at the cap the eval stops anyway and says so.

Each of the three is wrong only when the set misses the true difference, so each errs with
probability at most alpha (tests/unit/test_sequential.py simulates it over 400 seeds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

METHOD = ("normal-mixture confidence sequence (Robbins 1970; asymptotic CS, Waudby-Smith, Arnold, Wu, "
          "Wang & Ramdas, Ann. Statist. 2024, Thm 2.2), running intersection")
"""What a result's ``sequential.method`` names."""

MIN_PROMPTS = 10
"""No verdict before this many paired prompts (the plug-in variance needs a few)."""

ALPHA = 0.05
BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no_difference"
UNSETTLED = "unsettled"
"""What a run stopped at its cap without a verdict reports."""


def rho_for(t_star: int, alpha: float = ALPHA) -> float:
    """The mixture's rho that makes the set narrowest at ``t_star`` prompts (Waudby-Smith et al.)."""
    a = -2 * math.log(alpha)
    return math.sqrt((a + math.log(a + 1)) / t_star)


def radius(t: int, sd: float, rho: float, alpha: float = ALPHA) -> float:
    """Half-width of the set after ``t`` differences of standard deviation ``sd``."""
    r2 = rho * rho
    return sd * math.sqrt(2 * (t * r2 + 1) / (t * t * r2) * math.log(math.sqrt(t * r2 + 1) / alpha))


@dataclass
class Sequential:
    """The running confidence sequence of one pair (``a - b`` per prompt).

    Args:
        delta: the smallest tau difference the operator cares about (> 0).
        cap: the most prompts the eval runs (the fixed-size eval it replaces).
        alpha: the error rate (each verdict is wrong with probability at most ``alpha``).
        min_prompts: no verdict before this many prompts.
    """

    delta: float
    cap: int
    alpha: float = ALPHA
    min_prompts: int = MIN_PROMPTS
    n: int = 0
    lo: float = -math.inf
    hi: float = math.inf
    verdict: str | None = None
    _sum: float = 0.0
    _sq: float = 0.0
    _rho: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if not (self.delta > 0 and math.isfinite(self.delta)):
            raise ValueError(f"min_difference must be a number > 0, not {self.delta!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be between 0 and 1, not {self.alpha!r}")
        if self.cap < 1:
            raise ValueError(f"the cap on prompts must be >= 1, not {self.cap!r}")
        self._rho = rho_for(max(self.min_prompts, self.cap // 4), self.alpha)

    @property
    def mean(self) -> float | None:
        return self._sum / self.n if self.n else None

    @property
    def settled(self) -> bool:
        return self.verdict is not None

    def add(self, a: float, b: float) -> str | None:
        """One more paired prompt (tau of ``a`` and of ``b``); returns the verdict once settled
        (and keeps it: later prompts change nothing)."""
        if self.settled:
            return self.verdict
        d = float(a) - float(b)
        self.n += 1
        self._sum += d
        self._sq += d * d
        if self.n < max(2, self.min_prompts):
            return None
        m = self._sum / self.n
        var = max(0.0, (self._sq - self.n * m * m) / (self.n - 1))
        r = radius(self.n, math.sqrt(var), self._rho, self.alpha)
        self.lo, self.hi = max(self.lo, m - r), min(self.hi, m + r)
        if self.lo > 0:
            self.verdict = BETTER
        elif self.hi < 0:
            self.verdict = WORSE
        elif -self.delta < self.lo and self.hi < self.delta:
            self.verdict = NO_DIFFERENCE
        return self.verdict

    def at_cap(self) -> bool:
        return self.n >= self.cap

    def report(self, a: str = "a", b: str = "b") -> dict:
        """result.json's ``sequential`` block: the verdict, the prompts it took, what the fixed-size
        eval would have run, the set and the method."""
        ci = None if not math.isfinite(self.lo) else [self.lo, self.hi]
        verdict = self.verdict or UNSETTLED
        return {"stop": "settled", "verdict": verdict, "a": a, "b": b, "prompts": self.n,
                "fixed_prompts": self.cap, "prompts_saved": self.cap - self.n, "mean_difference": self.mean,
                "confidence_sequence": ci, "alpha": self.alpha, "min_difference": self.delta,
                "min_prompts": self.min_prompts, "method": METHOD, "text": self.text(a, b)}

    def text(self, a: str = "a", b: str = "b") -> str:
        """The verdict in words, with the prompts it took against the fixed-size eval."""
        took = f"after {self.n} of {self.cap} prompts"
        cs = ("" if not math.isfinite(self.lo) else
              f" (mean {self.mean:+.2f}, {100 * (1 - self.alpha):g} % confidence sequence "
              f"{self.lo:+.2f}..{self.hi:+.2f})")
        if self.verdict == BETTER:
            return f"{a} is better than {b}: settled {took}{cs}"
        if self.verdict == WORSE:
            return f"{a} is worse than {b}: settled {took}{cs}"
        if self.verdict == NO_DIFFERENCE:
            return f"{a} vs {b}: no difference as large as {self.delta:g}: settled {took}{cs}"
        return f"{a} vs {b}: not settled {took}{cs}"


def run(pairs, *, delta: float, cap: int, alpha: float = ALPHA, min_prompts: int = MIN_PROMPTS) -> Sequential:
    """The confidence sequence over ``pairs`` of (tau a, tau b), stopped when settled or at ``cap``."""
    seq = Sequential(delta, cap, alpha, min_prompts)
    for a, b in pairs:
        if seq.add(a, b) is not None or seq.at_cap():
            break
    return seq


__all__ = ["Sequential", "run", "radius", "rho_for", "METHOD", "MIN_PROMPTS", "ALPHA", "BETTER", "WORSE",
           "NO_DIFFERENCE", "UNSETTLED"]
