"""Acceptance-length (tau) metrics: pure Python, no torch, count-returning.

Definitions (docs/evaluation.md §1; the same convention as z-lab/dflash and DDTree):

* A *round* is one target verification step. Its **acceptance length** is
  ``tau_round = accepted draft tokens + 1`` (the +1 is the target's bonus/correction token),
  so it lies in ``1..B`` for block size ``B`` (B-1 draft tokens per round).
* The **streak** of a round is ``s = tau_round - 1``: the number of consecutive draft tokens
  accepted from slot 1 onward.
* **Macro tau** (what z-lab and DDTree report): mean over prompts of (mean over that prompt's
  rounds of tau_round).
* **Pooled tau** (vLLM's ``1 + accepted / drafts``): total committed tokens over all rounds of
  all prompts divided by the total number of rounds.
* **Per-position acceptance** ``p_k = #{rounds with s >= k} / #rounds`` for ``k = 1..B-1``
  (unconditional, pooled over rounds); identity ``tau_pooled = 1 + sum_k p_k``.
* **Histogram**: number of rounds with ``tau_round == t`` for ``t = 1..B``.

Functions that count return ints (summable across prompts and hosts); ratios are computed only
at the end (:func:`summarize`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

DEFINITION = (
    "tau (acceptance length) per verification round = accepted draft tokens + 1 (the target's "
    "bonus/correction token), in 1..block_size. 'tau' is the macro average: mean over prompts of "
    "the mean over that prompt's rounds. 'tau_pooled' = total committed tokens / total rounds "
    "over all prompts. 'per_position_acceptance'[k-1] = fraction of rounds whose streak "
    "(tau-1) is >= k, k = 1..block_size-1 (so tau_pooled = 1 + sum). 'histogram'[t] = number of "
    "rounds with tau == t. Greedy (temperature 0) drafts and verification."
)

OFFLINE_DEFINITION = (
    "Offline tau from cached target features and greedy labels y (y[t+1] = argmax of the "
    "target at position t). For an anchor a the drafter sees the features of positions < a and "
    "the block [x_a, MASK...]; its streak s(a) = number of leading draft tokens equal to "
    "y[a+1], y[a+2], ... . 'trajectory': a_0 = prompt length, a_(i+1) = a_i + s(a_i) + 1, "
    "rounds tau = s + 1 (equals online greedy tau when the cached response is the target's own "
    "greedy output). 'all_anchor': tau = 1 + mean s(a) over every response anchor whose whole "
    "block has labels."
)


def streak(draft: Sequence[int], labels: Sequence[int]) -> int:
    """Number of leading positions where ``draft[i] == labels[i]``.

    Compares up to ``min(len(draft), len(labels))`` positions, so a label sequence cut short by
    the end of the data truncates the streak.

    Args:
        draft: drafted tokens for slots 1..n.
        labels: the target's tokens for the same positions.

    Returns:
        The streak ``s`` (count of accepted draft tokens, no bonus).
    """
    s = 0
    for d, y in zip(draft, labels):
        if d != y:
            break
        s += 1
    return s


def committed_tokens(rounds: Iterable[int]) -> int:
    """Total tokens committed over ``rounds`` (the sum of per-round acceptance lengths)."""
    return sum(int(r) for r in rounds)


def position_counts(rounds: Iterable[int], block_size: int) -> list[int]:
    """Count rounds whose streak reaches each draft position.

    Args:
        rounds: per-round acceptance lengths (tau_round in 1..block_size).
        block_size: B; positions are k = 1..B-1.

    Returns:
        ``counts`` with ``counts[k-1] = #{rounds with tau_round - 1 >= k}``.

    Raises:
        ValueError: if a round lies outside 1..block_size.
    """
    counts = [0] * max(block_size - 1, 0)
    for r in rounds:
        _check_round(r, block_size)
        for k in range(1, int(r)):
            counts[k - 1] += 1
    return counts


def histogram(rounds: Iterable[int], block_size: int) -> list[int]:
    """Count rounds per acceptance length.

    Returns:
        ``counts`` of length ``block_size`` with ``counts[t-1] = #{rounds with tau_round == t}``.
    """
    counts = [0] * block_size
    for r in rounds:
        _check_round(r, block_size)
        counts[int(r) - 1] += 1
    return counts


def mean_tau(rounds: Sequence[int]) -> float | None:
    """Mean acceptance length of one prompt's rounds (None when there are no rounds)."""
    return committed_tokens(rounds) / len(rounds) if rounds else None


def macro_tau(per_prompt_rounds: Iterable[Sequence[int]]) -> float | None:
    """Mean over prompts (with at least one round) of each prompt's mean tau."""
    taus = [t for t in (mean_tau(r) for r in per_prompt_rounds) if t is not None]
    return sum(taus) / len(taus) if taus else None


def pooled_tau(per_prompt_rounds: Iterable[Sequence[int]]) -> float | None:
    """Total committed tokens divided by total rounds, over all prompts."""
    total, n = 0, 0
    for rounds in per_prompt_rounds:
        total += committed_tokens(rounds)
        n += len(rounds)
    return total / n if n else None


def trajectory(
    streak_at: Mapping[int, int] | Callable[[int], int], start: int, end: int
) -> tuple[list[int], list[int]]:
    """Walk the greedy trajectory over per-anchor streaks.

    ``a_0 = start``, ``a_{i+1} = a_i + s(a_i) + 1`` while ``a_i < end``.

    Args:
        streak_at: streak s(a) per anchor position (mapping or function).
        start: first anchor (the prompt length: the block whose slot 0 is the first generated
            token).
        end: stop once an anchor reaches this position (prompt length + max new tokens).

    Returns:
        ``(anchors, rounds)`` with ``rounds[i] = s(anchors[i]) + 1``.
    """
    get = streak_at.__getitem__ if isinstance(streak_at, Mapping) else streak_at
    anchors, rounds = [], []
    a = start
    while a < end:
        s = int(get(a))
        anchors.append(a)
        rounds.append(s + 1)
        a += s + 1
    return anchors, rounds


def summarize(per_prompt_rounds: Sequence[Sequence[int]], block_size: int) -> dict[str, Any]:
    """All tau figures for a set of prompts, in the result.json layout.

    Args:
        per_prompt_rounds: for each prompt, its per-round acceptance lengths.
        block_size: B.

    Returns:
        dict with ``tau`` (macro), ``tau_pooled``, ``per_position_acceptance`` (list of p_k,
        k = 1..B-1), ``per_position_counts`` (the counts behind it), ``histogram`` (dict
        ``"t" -> rounds``), ``num_rounds``, ``num_prompts`` and ``committed_tokens``.
    """
    all_rounds = [r for rounds in per_prompt_rounds for r in rounds]
    n = len(all_rounds)
    counts = position_counts(all_rounds, block_size)
    hist = histogram(all_rounds, block_size)
    return {
        "tau": macro_tau(per_prompt_rounds),
        "tau_pooled": pooled_tau(per_prompt_rounds),
        "per_position_acceptance": [c / n for c in counts] if n else [0.0] * len(counts),
        "per_position_counts": counts,
        "histogram": {str(t): hist[t - 1] for t in range(1, block_size + 1)},
        "num_rounds": n,
        "num_prompts": len(per_prompt_rounds),
        "committed_tokens": committed_tokens(all_rounds),
    }


def _check_round(r: int, block_size: int) -> None:
    if not 1 <= int(r) <= block_size:
        raise ValueError(f"acceptance length {r} outside 1..{block_size}")
