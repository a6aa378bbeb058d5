"""The tensor side of sampled speculative decoding (:mod:`core.ml.models.sampling` says what is computed
and why): tempered, filtered distributions, draws from a seeded generator, and the acceptance of
a block of drafts with its correction or bonus token."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from core.ml.models.sampling import Sampling


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


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded ``seed``."""
    return torch.Generator(device=device).manual_seed(int(seed))
