"""The draft length to serve (issue 45 §3): expected speedup at each draft length from measured rounds.

The model (docs/evaluation.md §7). A round that drafts ``k`` tokens commits ``1 + min(s, k)``
tokens, where ``s`` is the round's streak at the full block (its accepted drafts; a round's
acceptance length is ``s + 1``). So the tokens a round commits at draft length ``k`` are

    E[tokens per round | k] = 1 + sum_{j=1..k} p_j = mean over rounds of min(tau_round, k + 1)

with ``p_j`` the per-position acceptance (:mod:`core.ml.measure.tau`). A round costs
``cost(k) = base + per_token * k`` in units of one plain decoding step of the target (what
``eval --speedup`` times, or the figures an operator gives for a serving engine), and

    speedup(k) = E[tokens per round | k] / cost(k).

The assumption is that a round's streak does not depend on how many drafts follow it (a drafter
proposes a whole block in one forward; cutting the block cuts the streak at k). Intervals are a
percentile bootstrap over prompts (prompts are the independent units: rounds of one prompt are
not), seeded, so the same rounds give the same interval.

Pure Python, no torch: the eval host, the laptop and ``compare`` all use it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MODEL = ("speedup(k) = E[tokens per round | k] / cost(k); E[tokens per round | k] = mean over rounds of "
         "min(tau_round, k + 1) = 1 + sum_{j<=k} p_j; cost(k) = base + per_token * k, in plain target steps")


@dataclass(frozen=True)
class Cost:
    """A round's cost at draft length ``k``: ``base + per_token * k`` plain target steps."""

    base: float = 1.0
    per_token: float = 0.0

    def __post_init__(self) -> None:
        for name in ("base", "per_token"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"cost.{name} must be a finite number, got {v!r}")
        if self.base <= 0:
            raise ValueError(f"cost.base must be > 0 (a round costs at least its verify), got {self.base!r}")
        if self.per_token < 0:
            raise ValueError(f"cost.per_token must be >= 0, got {self.per_token!r}")

    def at(self, k: int) -> float:
        return self.base + self.per_token * k

    def as_dict(self) -> dict[str, float]:
        return {"base": float(self.base), "per_token": float(self.per_token)}


def parse_cost(text: str) -> Cost:
    """``BASE,PER_TOKEN`` (``1.0,0.02``) or ``base=1.0,per_token=0.02`` -> :class:`Cost`."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or len(parts) > 2:
        raise ValueError(f"a cost is BASE,PER_TOKEN (e.g. 1.0,0.02), got {text!r}")
    named: dict[str, float] = {}
    for i, p in enumerate(parts):
        key, _, val = p.rpartition("=")
        key = key.strip() or ("base", "per_token")[i]
        if key not in ("base", "per_token"):
            raise ValueError(f"a cost names base and per_token, got {key!r} in {text!r}")
        try:
            named[key] = float(val)
        except ValueError:
            raise ValueError(f"cost {key} is not a number: {val!r}") from None
    return Cost(**named)


def tokens_per_round(per_prompt_rounds: Sequence[Sequence[int]], k: int) -> float | None:
    """Pooled E[tokens per round | k]: committed tokens over rounds, each round cut at ``k`` drafts."""
    n = sum(len(r) for r in per_prompt_rounds)
    if not n:
        return None
    return sum(min(t, k + 1) for rounds in per_prompt_rounds for t in rounds) / n


def _prompt_sums(per_prompt_rounds: Sequence[Sequence[int]], kmax: int) -> list[tuple[int, list[int]]]:
    """Per prompt: its number of rounds and its committed tokens at each k = 1..kmax."""
    return [(len(r), [sum(min(t, k + 1) for t in r) for k in range(1, kmax + 1)]) for r in per_prompt_rounds]


def advise(per_prompt_rounds: Sequence[Sequence[int]], block_size: int, cost: Cost = Cost(), *,
           resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Expected tokens per round and speedup at each draft length 1..B-1, with intervals, and the best.

    ``best`` is the draft length of the highest point estimate; ``best.within`` lists the draft
    lengths whose speedup interval reaches the best's lower bound (indistinguishable on these
    rounds: serve the shortest of them if a shorter draft is cheaper in memory or latency).
    """
    kmax = block_size - 1
    if kmax < 1:
        raise ValueError(f"a block size of {block_size} drafts nothing: no draft length to advise")
    rounds = [list(r) for r in per_prompt_rounds if len(r)]
    for r in rounds:
        for t in r:
            if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= block_size:
                raise ValueError(f"a round's acceptance length must be an integer in 1..{block_size}, got {t!r}")
    out: dict[str, Any] = {"model": MODEL, "cost": cost.as_dict(), "block_size": block_size,
                           "prompts": len(rounds), "rounds": sum(len(r) for r in rounds), "level": level,
                           "interval": f"percentile bootstrap over prompts, {resamples} resamples, seed {seed}"}
    if not rounds:
        out.update(rows=[], best=None)
        return out
    sums = _prompt_sums(rounds, kmax)
    n_rounds = sum(n for n, _ in sums)
    point = [sum(s[k] for _, s in sums) / n_rounds for k in range(kmax)]
    rng = random.Random(seed)
    boots: list[list[float]] = [[] for _ in range(kmax)]
    for _ in range(resamples):
        pick = [sums[rng.randrange(len(sums))] for _ in sums]
        n = sum(p[0] for p in pick)
        for k in range(kmax):
            boots[k].append(sum(p[1][k] for p in pick) / n)
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2

    def q(values: list[float], p: float) -> float:
        v = sorted(values)
        return v[min(len(v) - 1, max(0, int(round(p * (len(v) - 1)))))]

    rows = []
    for k in range(1, kmax + 1):
        c = cost.at(k)
        tpr, b = point[k - 1], boots[k - 1]
        rows.append({"k": k, "tokens_per_round": tpr, "tokens_per_round_ci": [q(b, lo_q), q(b, hi_q)],
                     "cost": c, "speedup": tpr / c, "speedup_ci": [q(b, lo_q) / c, q(b, hi_q) / c]})
    best = max(rows, key=lambda r: (r["speedup"], -r["k"]))
    floor = best["speedup_ci"][0]
    out["rows"] = rows
    out["best"] = {"k": best["k"], "speedup": best["speedup"], "speedup_ci": best["speedup_ci"],
                   "within": [r["k"] for r in rows if r["speedup_ci"][1] >= floor]}
    return out


def engine_settings(k: int) -> dict[str, Any]:
    """What each engine is told to draft ``k`` tokens a round (docs/serving.md)."""
    return {"vllm": {"num_speculative_tokens": k},
            "sglang": {"--speculative-num-draft-tokens": k + 1},
            "llama.cpp": {"--spec-draft-n-max": k}}


def lines(advice: dict[str, Any], label: str = "") -> list[str]:
    """The advice as a person reads it: one line per draft length, then the best."""
    if not advice.get("rows"):
        return [f"{label}draft length: no rounds to advise from"]
    c = advice["cost"]
    head = (f"{label}draft length (cost = {c['base']:g} + {c['per_token']:g}*k plain steps; "
            f"{advice['prompts']} prompts, {advice['rounds']} rounds, {int(advice['level'] * 100)}% CI):")
    out = [head]
    for r in advice["rows"]:
        lo, hi = r["speedup_ci"]
        out.append(f"  k={r['k']:>2}  tokens/round {r['tokens_per_round']:.2f}  speedup {r['speedup']:.2f} "
                   f"[{lo:.2f}, {hi:.2f}]")
    b = advice["best"]
    within = ", ".join(str(k) for k in b["within"])
    out.append(f"  best k={b['k']} (speedup {b['speedup']:.2f} [{b['speedup_ci'][0]:.2f}, {b['speedup_ci'][1]:.2f}];"
               f" indistinguishable: k in {{{within}}}); vLLM num_speculative_tokens={b['k']}, "
               f"llama.cpp --spec-draft-n-max {b['k']}")
    return out
