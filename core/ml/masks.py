"""Anchor-block masks and inputs shared by training, offline eval and inference (spec §4.3, §8.7).

Block j of a sequence starts at anchor ``a_j`` and holds ``[x_{a_j}, MASK * (B-1)]`` at
positions ``a_j .. a_j+B-1``. It may see the context rows at positions ``< a_j`` (strict: the
anchor's own target features are *not* visible; ``<=`` is SpecForge PR #473's bug), only the
last ``window`` of them in sliding-window layers, only its own document in packed rows, and
its own block (bidirectional, or causal for sliding layers when configured).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

NoiseFn = Callable[[Tensor], Tensor]


def context_mask(
    anchors: Tensor,
    ctx_positions: Tensor,
    block_size: int,
    window: int | None = None,
    ctx_doc: Tensor | None = None,
    anchor_doc: Tensor | None = None,
) -> Tensor:
    """Context part of :func:`anchor_block_mask`: [b, A*B, c] bool, ``pos_t < a_j`` (strict)."""
    a = anchors.repeat_interleave(block_size, dim=1)[:, :, None]  # [b, A*B, 1]
    t = ctx_positions[:, None, :]  # [b, 1, c]
    ctx = t < a
    if window is not None:
        ctx = ctx & (t >= a - window)
    if ctx_doc is not None and anchor_doc is not None:
        ctx = ctx & (ctx_doc[:, None, :] == anchor_doc.repeat_interleave(block_size, dim=1)[:, :, None])
    return ctx


def anchor_block_mask(
    anchors: Tensor,
    ctx_positions: Tensor,
    block_size: int,
    window: int | None = None,
    causal_block: bool = False,
    ctx_doc: Tensor | None = None,
    anchor_doc: Tensor | None = None,
) -> Tensor:
    """Dense boolean SDPA mask (True = attend) for A blocks against one shared context.

    Query row ``(j, k)`` (block j, slot k) may attend to

    * context column t iff ``pos_t < a_j`` (**strict**: the anchor's own features are not
      visible), and ``pos_t >= a_j - window`` for sliding layers, and same document;
    * block column ``(j', k')`` iff ``j' == j`` (and ``k' <= k`` when ``causal_block``).

    Args:
        anchors: [b, A] anchor positions (block j covers positions a_j .. a_j+B-1).
        ctx_positions: [b, c] positions of the context rows.
        block_size: B.
        window: sliding window W, or None for full attention.
        causal_block: causal attention inside a block (sliding layers, speculators style).
        ctx_doc: [b, c] document id per context row (packed sequences), optional.
        anchor_doc: [b, A] document id of each anchor, optional (with ``ctx_doc``).

    Returns:
        [b, 1, A*B, c + A*B] bool.
    """
    b, A = anchors.shape
    ctx = context_mask(anchors, ctx_positions, block_size, window, ctx_doc, anchor_doc)
    blk_id = torch.arange(A * block_size, device=anchors.device) // block_size
    blk = blk_id[:, None] == blk_id[None, :]  # [A*B, A*B]
    if causal_block:
        slot = torch.arange(A * block_size, device=anchors.device)
        blk = blk & (slot[None, :] <= slot[:, None])
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
