"""Sampled speculative decoding: the tempered, filtered distributions and lossless acceptance
(docs/evaluation.md §2, "Sampling").

The semantics are those of z-lab's reference (``dflash_generate`` in ``dflash`` 0.1.0) and of
speculative sampling (Leviathan et al. 2023, Chen et al. 2023):

* a distribution is ``softmax(logits / T)`` restricted to the ``top_k`` largest logits (0: all)
  and then to the smallest set of most likely tokens whose mass reaches ``top_p`` (renormalised);
  the target's ``p`` and a DFlash drafter's ``q`` are both made so;
* each draft token ``x`` is drawn from ``q`` and accepted with probability ``min(1, p(x) / q(x))``,
  slot after slot until one is rejected;
* at the rejected slot the correction is drawn from the residual ``max(p - q, 0)`` renormalised;
  after a fully accepted block the bonus token is drawn from ``p`` at the slot after it.

Then every committed token is distributed exactly as the target's own sampling at that position,
whatever ``q`` is (lossless; tests/ml/test_sampling.py checks it as a distribution). A drafter
whose draft is not drawn from its tempered logits (a DFlash-2 drafter's candidate selector) passes
the ``q`` it actually drew from.

Everything draws from one seeded :class:`torch.Generator` per generation, so a seed gives the same
rounds (:func:`sample_seed` derives each (prompt, sample)'s seed from the run's ``--seed``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn: ``temperature`` 0 is greedy (argmax, no randomness)."""

    temperature: float = 0.0
    top_p: float = 1.0
    """Keep the most likely tokens whose mass reaches this (1: all)."""
    top_k: int = 0
    """Keep the ``top_k`` largest logits (0: all)."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def problem(self) -> str | None:
        """What is wrong with these settings, in words (None when they are usable)."""
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            return f"temperature {self.temperature}: must be a finite number >= 0 (0: greedy)"
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            return f"top_p {self.top_p}: must be in (0, 1] (1: no nucleus filter)"
        if self.top_k < 0:
            return f"top_k {self.top_k}: must be >= 0 (0: no top-k filter)"
        if self.greedy and (self.top_p != 1 or self.top_k != 0):
            return ("top_p / top_k filter the sampling distribution, and greedy decoding (temperature 0) "
                    "samples nothing: set a temperature > 0, or drop them")
        return None

    def to_json(self) -> dict:
        return {"temperature": float(self.temperature), "top_p": float(self.top_p), "top_k": int(self.top_k)}


def probs(logits: Tensor, sampling: Sampling) -> Tensor:
    """The tempered, filtered distribution of each row of ``logits`` [..., V] (float32, rows sum to 1)."""
    scores = logits.float() / sampling.temperature
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        keep = torch.zeros_like(scores, dtype=torch.bool)
        keep.scatter_(-1, scores.topk(sampling.top_k, dim=-1).indices, True)
        scores = scores.masked_fill(~keep, float("-inf"))
    out = torch.softmax(scores, dim=-1)
    if sampling.top_p < 1:
        ranked, order = out.sort(dim=-1, descending=True)
        mass_before = ranked.cumsum(dim=-1) - ranked  # the most likely token is always kept
        ranked = torch.where(mass_before < sampling.top_p, ranked, torch.zeros_like(ranked))
        out = torch.zeros_like(out).scatter(-1, order, ranked)
        out = out / out.sum(dim=-1, keepdim=True)
    return out


def draw(dist: Tensor, generator: torch.Generator) -> Tensor:
    """One token per row of ``dist`` [..., V] -> [...] int64."""
    flat = dist.reshape(-1, dist.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(dist.shape[:-1])


def accept(draft: Sequence[int], q: Tensor, p: Tensor, generator: torch.Generator) -> tuple[int, int]:
    """Speculative sampling of one block: how many drafts are accepted, and the token after them.

    Args:
        draft: the n draft tokens (slots 1..n), drawn from ``q``.
        q: [n, V] the distributions the drafts were drawn from.
        p: [n + 1, V] the target's tempered, filtered distributions after each block token.
        generator: the generation's generator.

    Returns:
        ``(n_acc, token)``: ``token`` is the correction drawn from ``max(p - q, 0)`` at the first
        rejected slot, or the bonus drawn from ``p[n]`` when all n are accepted.
    """
    n = len(draft)
    n_acc = 0
    if n:
        idx = torch.tensor(list(draft), device=p.device)[:, None]
        p_x, q_x = p[:n].gather(-1, idx)[:, 0], q.to(p.device)[:n].gather(-1, idx)[:, 0]
        u = torch.rand(n, generator=generator, device=p.device)
        n_acc = int((u * q_x < p_x).to(torch.int64).cumprod(0).sum())  # u < p/q, i.e. min(1, p/q)
    if n_acc == n:
        return n, int(draw(p[n], generator))
    return n_acc, int(draw(residual(p[n_acc], q.to(p.device)[n_acc]), generator))


def residual(p: Tensor, q: Tensor) -> Tensor:
    """``max(p - q, 0)`` renormalised: what a rejection leaves to the target (``p`` itself when
    nothing is left, which rounding alone can cause: a rejection has ``p(x) < q(x)`` somewhere)."""
    left = (p - q).clamp_min(0)
    total = left.sum()
    return left / total if float(total) > 0 else p


def acceptance_probability(p: Tensor, q: Tensor) -> float:
    """The closed form of one draft's acceptance: ``sum_x min(p(x), q(x))``."""
    return float(torch.minimum(p, q).sum())


def sample_seed(seed: int, prompt_id: str, sample: int) -> int:
    """The generator seed of one (prompt, sample) of a run seeded ``seed``: distinct per prompt and
    sample, the same on every host and run (recorded in result.json's per-prompt rows)."""
    digest = hashlib.sha256(f"{seed}:{prompt_id}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded ``seed``."""
    return torch.Generator(device=device).manual_seed(int(seed))
