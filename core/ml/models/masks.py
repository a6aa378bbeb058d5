"""Anchor-block masks and inputs shared by training, offline eval and inference (docs/drafter.md §5, docs/training.md §2).

Block j of a sequence starts at anchor ``a_j`` and holds ``[x_{a_j}, MASK * (B-1)]`` at
positions ``a_j .. a_j+B-1``. It may see the context rows at positions ``< a_j`` (strict: the
anchor's own target features are *not* visible; ``<=`` is SpecForge PR #473's bug), only its
own document in packed rows, and its own block. Each layer's :class:`AttentionRule` (the serving
engines' rule) restricts that further for the query at position q: ``p <= q`` when causal, and
``p > q - W`` for a sliding layer's window W, context and block keys alike.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from core.ml.formats.drafter_config import AttentionRule

NoiseFn = Callable[[Tensor], Tensor]
FULL = AttentionRule(causal=False, window=None)


def context_mask(
    anchors: Tensor,
    ctx_positions: Tensor,
    block_size: int,
    window: int | None = None,
    ctx_doc: Tensor | None = None,
    anchor_doc: Tensor | None = None,
) -> Tensor:
    """Context part of :func:`anchor_block_mask`: [b, A*B, c] bool.

    ``pos_t < a_j`` (strict), and with a window ``pos_t > a_j + k - window`` for slot k (the
    window is measured from each query's own position, not from the block start).
    """
    a = anchors.repeat_interleave(block_size, dim=1)[:, :, None]  # [b, A*B, 1]
    t = ctx_positions[:, None, :]  # [b, 1, c]
    ctx = t < a
    if window is not None:
        slot = torch.arange(block_size, device=anchors.device).repeat(anchors.shape[1])[None, :, None]
        ctx = ctx & (t > a + slot - window)
    if ctx_doc is not None and anchor_doc is not None:
        ctx = ctx & (ctx_doc[:, None, :] == anchor_doc.repeat_interleave(block_size, dim=1)[:, :, None])
    return ctx


def block_mask(block_size: int, rule: AttentionRule, device: torch.device | str | None = None) -> Tensor:
    """Inside one block: [B, B] bool, row = query slot k, column = key slot k'.

    ``k' <= k`` when causal; ``k - k' < W`` with a window (positions a+k and a+k').
    """
    k = torch.arange(block_size, device=device)
    keep = torch.ones(block_size, block_size, dtype=torch.bool, device=device)
    if rule.causal:
        keep = keep & (k[None, :] <= k[:, None])
    if rule.window is not None:
        keep = keep & (k[:, None] - k[None, :] < rule.window)
    return keep


def anchor_block_mask(
    anchors: Tensor,
    ctx_positions: Tensor,
    block_size: int,
    rule: AttentionRule = FULL,
    ctx_doc: Tensor | None = None,
    anchor_doc: Tensor | None = None,
) -> Tensor:
    """Dense boolean SDPA mask (True = attend) for A blocks against one shared context.

    Query row ``(j, k)`` (block j, slot k, position ``q = a_j + k``) may attend to

    * context column t iff ``pos_t < a_j`` (**strict**: the anchor's own features are not
      visible), same document, and ``pos_t > q - W`` in a windowed layer;
    * block column ``(j', k')`` iff ``j' == j``, and ``k' <= k`` in a causal layer, and
      ``k - k' < W`` in a windowed layer.

    Args:
        anchors: [b, A] anchor positions (block j covers positions a_j .. a_j+B-1).
        ctx_positions: [b, c] positions of the context rows.
        block_size: B.
        rule: the layer's :class:`AttentionRule` (default: non-causal, no window).
        ctx_doc: [b, c] document id per context row (packed sequences), optional.
        anchor_doc: [b, A] document id of each anchor, optional (with ``ctx_doc``).

    Returns:
        [b, 1, A*B, c + A*B] bool. Every row sees at least its own slot, so none is empty.
    """
    b, A = anchors.shape
    ctx = context_mask(anchors, ctx_positions, block_size, rule.window, ctx_doc, anchor_doc)
    blk_id = torch.arange(A * block_size, device=anchors.device) // block_size
    inner = block_mask(block_size, rule, anchors.device).repeat(A, A)  # [A*B, A*B], slot pattern per block pair
    blk = (blk_id[:, None] == blk_id[None, :]) & inner
    blk = blk[None].expand(b, -1, -1)
    return torch.cat([ctx, blk], dim=2)[:, None]


def uniform_feature_noise(std: float) -> NoiseFn:
    """Training-only noise hook for the fc input: ``F + U(-std, std)`` (speculators' default 0.05)."""

    def add_noise(feats: Tensor) -> Tensor:
        return feats + (torch.rand_like(feats) * 2 - 1) * std

    return add_noise


def block_token_ids(input_ids: Tensor, anchors: Tensor, block_size: int, mask_token_id: int) -> Tensor:
    """Noise-block ids ``[x_{a_j}, MASK * (B-1)]`` per anchor: [b, S], [b, A] -> [b, A*B]."""
    b, A = anchors.shape
    out = torch.full((b, A, block_size), mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
    out[:, :, 0] = torch.gather(input_ids, 1, anchors)
    return out.view(b, A * block_size)


def block_positions(anchors: Tensor, block_size: int) -> Tensor:
    """Positions ``a_j + k``: [b, A] -> [b, A*B]."""
    k = torch.arange(block_size, device=anchors.device)
    return (anchors[:, :, None] + k).flatten(1)
