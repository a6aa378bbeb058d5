"""A campaign's arms compared: every arm against the reference and against each other.

An ablation asks several questions of the same prompts at once (3 arms: 3 against the
reference, 3 between arms), and at 5 % each, six questions give a false "better" far more
often than one in twenty. So the family is decided together with Holm's step-down procedure
(:func:`core.tau.stats.holm_levels`): each comparison is the usual paired sign-flip test over
the prompts both drafters share, decided at its Holm level, and its interval inverts the test
at that same level, so a verdict and its interval never disagree (the interval is wider
than a lone comparison's 95 %: that is the price of asking six questions).

The figures per prompt are the tau table's (:func:`core.tau.table.build_comparison`: a
prompt's tau, its samples averaged), so ``compare --arms`` and ``compare`` agree on every tau.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Iterable, Sequence

from core.tau import stats


@dataclass(frozen=True)
class ArmPair:
    """One comparison of the family: ``a`` against ``b`` (``a - b`` per prompt)."""

    a: str
    b: str
    prompts: int
    tau_a: float | None
    tau_b: float | None
    delta: float | None
    ci: tuple[float, float] | None
    """The interval of ``delta`` at ``1 - level`` (None under a few prompts)."""
    level: float | None
    """The test level Holm decides it at (0.05 / family size for the smallest p)."""
    p_value: float | None
    """The comparison's own p-value (sign-flip, paired)."""
    p_holm: float | None
    """Holm-adjusted p: the verdict is better/worse exactly when it is under 0.05."""
    verdict: str
    knob_a: tuple[str, ...] = ()
    """What arm ``a`` changes (:attr:`core.plans.arms.Arm.knob`); () for the reference."""
    knob_b: tuple[str, ...] = ()

    def text(self) -> str:
        """``taps is better than v4 (+0.28, Holm 98.3 % CI +0.10..+0.45, 8 prompts, p = 0.008,
        Holm p = 0.047)``."""
        if self.delta is None:
            return f"{self.a} vs {self.b}: no shared prompts to compare"
        ci = (f"Holm {100 * (1 - self.level):.1f} % CI {stats.fmt_ci(self.ci, signed=True)}"
              if self.ci and self.level else "no interval")
        figures = (f"{self.delta:+.2f}, {ci}, {self.prompts} prompts, p {stats.fmt_p(self.p_value)}, "
                   f"Holm p {stats.fmt_p(self.p_holm)}")
        if self.verdict in (stats.BETTER, stats.WORSE):
            return f"{self.a} is {self.verdict} than {self.b} ({figures})"
        return f"{self.a} vs {self.b}: no detectable difference ({figures})"


@dataclass(frozen=True)
class ArmsComparison:
    against: str
    pairs: tuple[ArmPair, ...]
    """Each arm against ``against`` (in the arms' order), then each pair of arms."""
    missing: tuple[str, ...] = ()
    """Arms (or the reference) with no eval result yet: left out of the family."""

    @property
    def family(self) -> int:
        return sum(p.p_value is not None for p in self.pairs)


def per_prompt(comp) -> dict[str, dict[str, float]]:
    """``{drafter label: {prompt: tau}}`` from a :class:`core.tau.table.Comparison`."""
    out: dict[str, dict[str, float]] = {}
    for c in comp.cells:
        if c.tau is not None:
            out.setdefault(c.drafter, {})[c.prompt_id] = c.tau
    return out


def compare_arms(taus: dict[str, dict[str, float]], arms: Sequence[tuple[str, str, tuple]],
                 against: str, *, seed: int = stats.SEED) -> ArmsComparison:
    """Every arm against ``against`` and every two arms against each other, Holm-corrected.

    Args:
        taus: per drafter label, its tau per prompt (:func:`per_prompt`).
        arms: ``(arm name, its drafter label, its knob)`` in the plan's order
            (:func:`core.plans.arms.arm_labels`).
        against: the reference drafter's label.
        seed: the permutation test's seed.
    """
    have = [(name, label, knob) for name, label, knob in arms if label in taus]
    missing = [name for name, label, _ in arms if label not in taus]
    if against not in taus:
        missing.append(against)
    todo: list[tuple[str, str, tuple, tuple]] = []
    if against in taus:
        todo += [(label, against, knob, ()) for _, label, knob in have]
    todo += [(la, lb, ka, kb) for (_, la, ka), (_, lb, kb) in combinations(have, 2)]

    def aligned(a: str, b: str) -> tuple[list[float], list[float]]:
        shared = [p for p in taus[a] if p in taus[b]]
        return [taus[a][p] for p in shared], [taus[b][p] for p in shared]

    first = [stats.paired(*aligned(a, b), name=f"{a} vs {b}", seed=seed) for a, b, _, _ in todo]
    ps = [r.p_value for r in first]
    adjusted, levels = stats.holm_adjusted(ps), stats.holm_levels(ps)
    pairs = []
    for (a, b, ka, kb), r, padj, level in zip(todo, first, adjusted, levels):
        if level is not None:
            r = stats.paired(*aligned(a, b), name=f"{a} vs {b}", seed=seed, alpha=level)
        xa, xb = aligned(a, b)
        pairs.append(ArmPair(a, b, r.prompts, _mean(xa), _mean(xb), r.delta, r.ci95, level,
                             r.p_value, padj, r.verdict, tuple(ka), tuple(kb)))
    return ArmsComparison(against, tuple(pairs), tuple(missing))


def _mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def to_markdown(c: ArmsComparison) -> str:
    """The family as Markdown: one row per arm against the reference (its knob beside it),
    then one per two arms, then the verdicts in words."""
    head = (f"Arms against {c.against} and each other: {c.family} comparisons, verdicts "
            "Holm-corrected (family-wise 5 %), each interval at its Holm level")
    cols = "| tau | Δ | Holm CI | p | Holm p | verdict |"
    rule = "|---:|---:|---|---:|---:|---|"
    out = [head, "", f"| arm | knob | {c.against} " + cols, "|---|---|---:" + rule]
    out += [_row(p, [p.a, "; ".join(p.knob_a) or "–", _num(p.tau_b)]) for p in c.pairs
            if p.b == c.against]
    between = [p for p in c.pairs if p.b != c.against]
    if between:
        out += ["", "| arm | against arm | tau (against) " + cols, "|---|---|---:" + rule]
        out += [_row(p, [p.a, p.b, _num(p.tau_b)]) for p in between]
    out += ["", *(f"- {p.text()}" for p in c.pairs)]
    if c.missing:
        out += ["", f"not evaluated yet (left out of the family): {', '.join(c.missing)}"]
    return "\n".join(out) + "\n"


def _row(p: ArmPair, first: list[str]) -> str:
    return "| " + " | ".join(first + [
        _num(p.tau_a), f"{p.delta:+.3f}" if p.delta is not None else "–",
        stats.fmt_ci(p.ci, signed=True), stats.fmt_p(p.p_value).removeprefix("= "),
        stats.fmt_p(p.p_holm).removeprefix("= "), p.verdict.replace("_", " ")]) + " |"


def to_dict(c: ArmsComparison) -> dict:
    return {"against": c.against, "family": c.family, "correction": "holm",
            "missing": list(c.missing),
            "pairs": [{**p.__dict__, "knob_a": list(p.knob_a), "knob_b": list(p.knob_b),
                       "ci": list(p.ci) if p.ci else None, "text": p.text()} for p in c.pairs]}


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


__all__ = ["ArmPair", "ArmsComparison", "compare_arms", "per_prompt", "to_markdown", "to_dict"]
