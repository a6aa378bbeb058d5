"""Acceptance-length (tau) metrics: pure Python, no torch, count-returning.

Definitions (docs/evaluation.md §1; the same convention as z-lab/dflash and DDTree):

* A *round* is one target verification step. Its **acceptance length** is the number of
  tokens it commits: ``accepted draft tokens + 1`` (the +1 is the target's bonus/correction
  token), capped at the tokens left before ``max_new_tokens`` and cut after the first stop
  token (:func:`committed`, the reference's accounting), so it lies in ``1..B`` for block
  size ``B`` (B-1 draft tokens per round).
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

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

ACCOUNTING = "dflash-0.1.0"
LEGACY = "legacy"
"""How rounds are counted (result.json ``accounting``): as z-lab's reference ``dflash_generate``
in ``dflash`` 0.1.0 counts them (:func:`committed`). Results without the key were counted the
legacy way (``accepted + 1`` uncapped); :func:`recount` converts them."""

DEFINITION = (
    "tau (acceptance length) per verification round = the tokens the round commits: its "
    "accepted draft tokens + 1 (the target's bonus/correction token), capped at the tokens left "
    "before max_new_tokens and cut after the first stop token; in 1..block_size. No round runs "
    "once max_new_tokens tokens are committed, the prefill's token belongs to no round, and the "
    "last blocks shrink to the tokens left (accounting 'dflash-0.1.0': z-lab's dflash_generate "
    "in dflash 0.1.0, round for round). 'tau' is the macro average: mean over prompts of "
    "the mean over that prompt's rounds. 'tau_pooled' = total committed tokens / total rounds "
    "over all prompts. 'per_position_acceptance'[k-1] = fraction of rounds whose streak "
    "(tau-1) is >= k, k = 1..block_size-1 (so tau_pooled = 1 + sum). 'histogram'[t] = number of "
    "rounds with tau == t. Greedy (temperature 0) drafts and verification."
)

GREEDY = "Greedy (temperature 0) drafts and verification."
SAMPLED_DEFINITION = DEFINITION.removesuffix(GREEDY) + (
    "Sampled (temperature > 0; top_p, top_k as recorded): drafts drawn from the drafter's tempered, "
    "filtered distribution q (a DFlash-2 drafter's: along its candidate selector), each accepted with "
    "probability min(1, p/q) for the target's p, the correction drawn from max(p - q, 0) renormalised, the "
    "bonus from p (lossless: the output is distributed as the target's own sampling). 'per_prompt' holds "
    "one row per prompt and sample ('sample', 'seed'); every prompt has 'samples' rows, so 'tau' is the "
    "mean over prompts of each prompt's mean over its samples."
)

OFFLINE_DEFINITION = (
    "Offline tau from cached target features and greedy labels y (y[t+1] = argmax of the "
    "target at position t). For an anchor a the drafter sees the features of positions < a and "
    "the block [x_a, MASK...]; its streak s(a) = number of leading draft tokens equal to "
    "y[a+1], y[a+2], ... . 'trajectory': a_0 = prompt length, a_(i+1) = a_i + s(a_i) + 1, "
    "rounds tau = s + 1 committed as online (capped, cut at a stop, the last blocks shrunk), so "
    "it equals online greedy tau when the cached response is the target's own greedy output. "
    "'all_anchor': tau = 1 + mean s(a) over every response anchor whose whole "
    "block has labels."
)


SHRINK = "shrink"
"""How the last blocks of a generation run (result.json ``end_of_generation``), z-lab's reference
(``dflash_generate`` in ``dflash`` 0.1.0): a round's block is ``min(B, tokens left + 1)`` tokens,
so its drafts are at most the tokens left and the drafter sees the shorter block."""
FULL_BLOCK = "full-block"
"""How llama.cpp's server runs them (0c1e570, ``eval --engine llama.cpp`` and ``--engine-rule
llama.cpp``): the drafter always decodes a full block of B tokens (``common/speculative.cpp``:
the DFlash draft reads ``params.n_max``, not the slot's cap), the draft is then cut to
``n_remaining - 1`` tokens (``tools/server/server-context.cpp`` ``get_n_draft_max``, applied in
``common_speculative_draft``), so a round never offers more than the tokens left; with one token
left nothing is drafted and the target decodes it alone (a round of 1 here)."""
END_RULES = (SHRINK, FULL_BLOCK)

_SHRINK_TEXT = ("the last blocks shrink to the tokens left (accounting 'dflash-0.1.0': z-lab's dflash_generate "
                "in dflash 0.1.0, round for round)")
_FULL_BLOCK_TEXT = ("every block is a full block_size tokens for the drafter, its draft cut to the tokens left - 1 "
                    "and the last token decoded alone, as llama.cpp's server runs the end of a generation "
                    "(end_of_generation 'full-block'; rounds counted as accounting 'dflash-0.1.0' counts them)")
_OFFLINE_SHRINK_TEXT = "the last blocks shrunk"
_OFFLINE_FULL_BLOCK_TEXT = "every block full, as llama.cpp's server drafts it"


def end_block(last_blocks: str, block_size: int, left: int) -> tuple[int, int]:
    """The block the drafter sees and how many of its drafts the target verifies, for a round
    with ``left`` tokens still to commit (>= 1) under the end rule ``last_blocks``.

    :data:`SHRINK`: ``(min(B, left + 1), min(B - 1, left))``; :data:`FULL_BLOCK`: ``(B,
    min(B - 1, left - 1))``. Either way a round commits at most ``left`` tokens, and with the
    same draft tokens the two commit the same count; they differ where a drafter whose slots see
    each other drafts otherwise in a shorter block. 0 drafts: the drafter does not run.

    Raises:
        ValueError: an end rule other than :data:`END_RULES`.
    """
    if last_blocks == SHRINK:
        width = min(block_size, left + 1)
        return width, width - 1
    if last_blocks == FULL_BLOCK:
        return block_size, max(0, min(block_size - 1, left - 1))
    raise ValueError(f"unknown end-of-generation rule {last_blocks!r}; one of {', '.join(END_RULES)}")


def definition(sampled: bool = False, offline: bool = False, last_blocks: str = SHRINK) -> str:
    """The tau definition result.json states: :data:`DEFINITION` (or :data:`SAMPLED_DEFINITION`),
    offline :data:`OFFLINE_DEFINITION` after it, each saying how the last blocks ran."""
    text = SAMPLED_DEFINITION if sampled else DEFINITION
    if offline:
        text += " " + OFFLINE_DEFINITION
    if last_blocks == FULL_BLOCK:
        text = text.replace(_SHRINK_TEXT, _FULL_BLOCK_TEXT).replace(_OFFLINE_SHRINK_TEXT, _OFFLINE_FULL_BLOCK_TEXT)
    elif last_blocks != SHRINK:
        raise ValueError(f"unknown end-of-generation rule {last_blocks!r}; one of {', '.join(END_RULES)}")
    return text


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


def committed(new_tokens: Sequence[int], remaining: int, stop_ids: Collection[int] = ()) -> tuple[int, bool]:
    """How many of a round's new tokens are committed, and whether a stop token ended generation.

    The reference's accounting (``dflash_generate`` in z-lab's ``dflash`` 0.1.0): a round
    offers ``accepted + 1`` tokens (its accepted drafts, then the target's bonus or
    correction token); it commits at most ``remaining`` of them (the tokens left before
    ``max_new_tokens``) and none after the first stop token, which is committed itself. The
    count committed is the round's acceptance length.

    Args:
        new_tokens: the round's accepted drafts followed by the target's token.
        remaining: tokens still allowed (``max_new_tokens`` minus those committed, >= 1).
        stop_ids: stop token ids.

    Returns:
        ``(produced, stopped)``.
    """
    produced = min(len(new_tokens), remaining)
    for i, t in enumerate(new_tokens[:produced]):
        if t in stop_ids:
            return i + 1, True
    return produced, False


def recount(rounds: Sequence[int], num_tokens: int) -> list[int]:
    """Rounds of a result counted the legacy way (``accepted + 1`` uncapped, drafts after a
    stop token counted, one extra round once ``max_new_tokens`` were committed), recounted
    as :func:`committed` counts them, from the output's length ``num_tokens`` (which was
    already cut at ``max_new_tokens`` and after the first stop token).

    The first output token comes from the prefill and belongs to no round. Exact for every
    round but a final one whose block the reference would have shortened (its drafts came
    from the full block).
    """
    out, done = [], 1
    for r in rounds:
        left = num_tokens - done
        if left <= 0:
            break
        produced = min(int(r), left)
        out.append(produced)
        done += produced
    return out


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
    """Walk the greedy trajectory over per-anchor streaks, committing as online does.

    ``a_0 = start``; while ``a_i + 1 < end`` (a token is still to be committed): the round
    commits ``r_i = min(s(a_i) + 1, end - a_i - 1)`` tokens (:func:`committed`'s cap) and
    ``a_{i+1} = a_i + r_i``. A cached greedy response ends at its stop token, so ``end`` at
    its length cuts at the stop as online generation does.

    Args:
        streak_at: streak s(a) per anchor position (mapping or function).
        start: first anchor (the prompt length: the block whose slot 0 is the first generated
            token).
        end: one past the last position that may be committed (prompt length + max new tokens,
            or the cached sequence's length when shorter).

    Returns:
        ``(anchors, rounds)``.
    """
    get = streak_at.__getitem__ if isinstance(streak_at, Mapping) else streak_at
    anchors, rounds = [], []
    a = start
    while a + 1 < end:
        produced = min(int(get(a)) + 1, end - a - 1)
        anchors.append(a)
        rounds.append(produced)
        a += produced
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
