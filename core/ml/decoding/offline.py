"""Offline tau from cached target features (docs/evaluation.md §4).

For every anchor a of a cached sequence (every response position), the drafter sees the
features of positions < a and the block ``[x_a, MASK...]``; its streak s(a) counts leading
draft tokens equal to the target's greedy tokens ``labels[a], labels[a+1], ...`` (labels[t] is
the target's argmax at position t, i.e. the greedy token for position t + 1).

Batched: the context K/V of the whole sequence are computed once per layer, then anchors go
through :func:`core.ml.models.drafter.multi_anchor_forward` (blockwise attention: each block scores
the shared context with the strict ``t < a`` mask plus its own B rows) ``max_rows // B`` at a
time, so a sequence of S response positions takes about ``S * B / max_rows`` forward passes
instead of S. :func:`draft_blocks_loop` is the one-anchor-per-forward reference
(the inference path); both must give identical streaks.

From the per-anchor streaks:

* trajectory: ``a_0 = P``, ``a_{i+1} = a_i + r_i`` with ``r_i`` what online commits
  (:func:`core.ml.measure.tau.trajectory`: ``s(a_i) + 1`` capped at the tokens left, no round once
  they are all committed), and, as online, a block that would reach past the end shrinks to
  what is left (those few anchors are drafted again with the shorter block, one forward each,
  since a non-causal drafter's drafts depend on the block's length). It equals online greedy
  tau round for round when the cached response is the target's own greedy output (which
  ends at its stop token, so a stop cuts the trajectory as it cuts online generation);
* all-anchor: ``1 + mean s(a)`` over anchors whose whole block has labels;
* DDTree-k offline: s(a) = depth of the deepest root path of the anchor's tree matching the
  labels (no extra target pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from core.ml.measure import tau as taulib
from core.ml.decoding.ddtree import build_tree, topk_per_depth
from core.ml.models.drafter import (
    DFlashDrafter,
    block_embeddings,
    block_token_ids,
    draft_logits,
    draft_path,
    multi_anchor_forward,
    refuse_tree,
)
from core.ml.formats.featstore import CachedSequence


@dataclass
class SequenceStreaks:
    """Per-anchor results for one cached sequence.

    Attributes:
        id: prompt id.
        prompt_len: P (first anchor).
        anchors: anchor positions P..S-1.
        streaks: chain streak s(a) per anchor.
        full: whether the anchor's whole block (B-1 labels) lies inside the sequence.
        tree_streaks: DDTree streak per anchor (when a budget was given).
        drafter_forwards: drafter passes that produced them (anchors batched ``max_rows // B`` a pass).
        block_size: B of the anchors' blocks.
        short: ``short(a, width) -> (chain streak, DDTree streak or None)`` of anchor ``a``
            drafted with a block of only ``width < B`` tokens (the trajectory's last blocks).
    """

    id: str
    prompt_len: int
    seq_len: int
    anchors: list[int]
    streaks: list[int]
    full: list[bool]
    tree_streaks: list[int] | None = None
    drafter_forwards: int = 0
    block_size: int = 0
    short: Callable[[int, int], tuple[int, int | None]] | None = field(default=None, repr=False, compare=False)

    def trajectory(self, max_new_tokens: int | None = None, tree: bool = False,
                   last_blocks: str = taulib.SHRINK) -> tuple[list[int], list[int]]:
        """``(anchors, rounds)`` of the greedy trajectory, rounds counted as online commits them.
        ``last_blocks`` :data:`~core.ml.measure.tau.FULL_BLOCK` (llama.cpp's end): every anchor keeps its
        full block's streak, capped at the tokens left as the draft cut is; the default shrinks
        the last blocks as the reference does."""
        streaks = dict(zip(self.anchors, self.tree_streaks if tree else self.streaks))
        end = self.seq_len if max_new_tokens is None else min(self.seq_len, self.prompt_len + max_new_tokens)
        shrink = last_blocks == taulib.SHRINK

        def streak_at(a: int) -> int:
            width = min(self.block_size, end - a)
            if shrink and self.short is not None and width < self.block_size:
                chain, tree_streak = self.short(a, width)
                return int(tree_streak if tree else chain)
            return streaks[a]

        return taulib.trajectory(streak_at, self.prompt_len, end)

    def all_anchor_rounds(self, tree: bool = False) -> list[int]:
        """``s(a) + 1`` for every anchor with a full block of labels."""
        streaks = self.tree_streaks if tree else self.streaks
        return [s + 1 for s, f in zip(streaks, self.full) if f]


@torch.no_grad()
def draft_blocks(
    drafter: DFlashDrafter,
    embed: nn.Module,
    head: nn.Module,
    seq: CachedSequence,
    anchors: Sequence[int],
    block_size: int,
    max_rows: int = 512,
    topk: int = 0,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Greedy draft tokens (:func:`core.ml.models.drafter.draft_path`) for many anchors, batched.

    Args:
        drafter / embed / head: the drafter and the target's embedding and LM head.
        seq: the cached sequence.
        anchors: anchor positions (sorted ascending is fastest).
        block_size: B.
        max_rows: block rows per forward pass (anchors per pass = max_rows // B).
        topk: also return per-slot top-k log-probs and ids (for DDTree), 0 = no.

    Returns:
        ``draft [A, B-1]`` (int64, CPU) and, with ``topk``, ``logp [A, B-1, k]`` and
        ``ids [A, B-1, k]``.
    """
    device = drafter.fc.weight.device
    S, B = seq.input_ids.shape[0], block_size
    ids = seq.input_ids.to(device)[None]  # [1, S]
    pos = torch.arange(S, device=device)[None]  # [1, S]
    ctx_kv = drafter.context_kv(drafter.project_context(seq.features.to(device)[None]), pos)
    per_pass = max(1, max_rows // B)
    drafts, vals, idxs = [], [], []
    for i in range(0, len(anchors), per_pass):
        chunk = list(anchors[i : i + per_pass])
        a = torch.tensor([chunk], device=device)  # [1, A]
        cmax = max(chunk)  # only context rows < max anchor are visible to this chunk
        kv = [(k[:, :, :cmax], v[:, :, :cmax]) for k, v in ctx_kv]
        blocks = block_token_ids(ids.to(embed.weight.device), a.to(embed.weight.device), B, drafter.mask_token_id)
        emb = block_embeddings(drafter.config, embed, blocks)
        h = multi_anchor_forward(drafter, None, emb.to(device), a, ctx_positions=pos[:, :cmax], ctx_kv=kv,
                                 anchor_positions=a, impl="blockwise", block_size=B)
        h = h.view(len(chunk), B, -1)[:, 1:]  # [A, B-1, H]; slot 0 (the anchor) is not a draft
        logits = draft_logits(drafter.config, head, h).float()  # [A, B-1, V]
        drafts.append(draft_path(drafter, h, logits, blocks[0, ::B].to(logits.device)).cpu())
        if topk:
            v, j = torch.topk(torch.log_softmax(logits, -1), min(topk, logits.shape[-1]), dim=-1)
            vals.append(v.cpu())
            idxs.append(j.cpu())
    if not drafts:
        empty = torch.empty(0, B - 1, dtype=torch.long)
        return empty, None, None
    return torch.cat(drafts), (torch.cat(vals) if topk else None), (torch.cat(idxs) if topk else None)


@torch.no_grad()
def draft_blocks_loop(drafter: DFlashDrafter, embed: nn.Module, head: nn.Module, seq: CachedSequence,
                      anchors: Sequence[int], block_size: int) -> Tensor:
    """Reference: one inference-path forward per anchor (context ``F[:a]``, no mask)."""
    out = [block_drafts(drafter, embed, head, seq, a, block_size)[1].cpu() for a in anchors]
    return torch.stack(out) if out else torch.empty(0, block_size - 1, dtype=torch.long)


@torch.no_grad()
def block_logits(drafter: DFlashDrafter, embed: nn.Module, head: nn.Module, seq: CachedSequence, a: int,
                 width: int) -> Tensor:
    """Draft logits ``[width-1, V]`` (float32) of one block of ``width`` tokens at anchor ``a``,
    through the inference path (context ``F[:a]``), as online drafts it."""
    return _block_forward(drafter, embed, head, seq, a, width)[1]


def _block_forward(drafter: DFlashDrafter, embed: nn.Module, head: nn.Module, seq: CachedSequence, a: int,
                   width: int) -> tuple[Tensor, Tensor]:
    """Draft hidden states ``[width-1, H]`` and float32 logits ``[width-1, V]`` of one block."""
    device = drafter.fc.weight.device
    block = torch.full((1, width), drafter.mask_token_id, dtype=torch.long, device=embed.weight.device)
    block[0, 0] = seq.input_ids[a]
    positions = torch.arange(a + width, device=device)[None]
    h = drafter(block_embeddings(drafter.config, embed, block).to(device), seq.features[:a].to(device)[None], positions)
    return h[0, 1:], draft_logits(drafter.config, head, h[0, 1:]).float()


def block_drafts(drafter: DFlashDrafter, embed: nn.Module, head: nn.Module, seq: CachedSequence, a: int,
                 width: int) -> tuple[Tensor, Tensor]:
    """Draft logits ``[width-1, V]`` and greedy draft tokens ``[width-1]`` of one block at anchor
    ``a`` (:func:`core.ml.models.drafter.draft_path`: a DFlash-2 drafter's are its selector's path)."""
    h, logits = _block_forward(drafter, embed, head, seq, a, width)
    anchor = seq.input_ids[a : a + 1].to(logits.device)
    return logits, draft_path(drafter, h[None], logits[None], anchor)[0]


def streaks_from_drafts(seq: CachedSequence, anchors: Sequence[int], drafts: Tensor) -> tuple[list[int], list[bool]]:
    """Streak per anchor against ``labels[a : a+B-1]`` (truncated at the sequence end)."""
    labels = seq.labels.tolist()
    S, width = len(labels), drafts.shape[1]
    streaks, full = [], []
    for a, d in zip(anchors, drafts.tolist()):
        streaks.append(taulib.streak(d, labels[a : a + width]))
        full.append(a + width <= S)
    return streaks, full


def sequence_streaks(
    drafter: DFlashDrafter,
    embed: nn.Module,
    head: nn.Module,
    seq: CachedSequence,
    block_size: int,
    tree_budget: int | None = None,
    max_rows: int = 512,
) -> SequenceStreaks:
    """All per-anchor streaks of one cached sequence (anchors = every response position).

    A DFlash-2 drafter's chain streaks are those of its selector's greedy path per anchor (what
    online drafts at that anchor); DDTree (``tree_budget``) is refused for it, as online.
    """
    if tree_budget is not None:
        refuse_tree(drafter)
    S = seq.input_ids.shape[0]
    anchors = list(range(seq.prompt_len, S))
    k = tree_budget if tree_budget else 0
    drafts, logp, ids = draft_blocks(drafter, embed, head, seq, anchors, block_size, max_rows, topk=k)
    streaks, full = streaks_from_drafts(seq, anchors, drafts)
    tree_streaks = None
    if tree_budget is not None:
        labels = seq.labels.tolist()
        tree_streaks = []
        for j, a in enumerate(anchors):
            if tree_budget > 0:
                topk = [list(zip(v, i)) for v, i in zip(logp[j].tolist(), ids[j].tolist())]
            else:
                topk = []
            tree = build_tree(int(seq.input_ids[a]), topk, tree_budget)
            tree_streaks.append(tree.deepest_match(labels[a : a + block_size - 1]))
    passes = -(-len(anchors) // max(1, max_rows // block_size))
    result = SequenceStreaks(seq.id, seq.prompt_len, S, anchors, streaks, full, tree_streaks, passes, block_size)
    labels_all = seq.labels.tolist()

    def short(a: int, width: int) -> tuple[int, int | None]:
        result.drafter_forwards += 1
        logits, drafts = block_drafts(drafter, embed, head, seq, a, width)
        labels = labels_all[a : a + width - 1]
        chain = taulib.streak(drafts.tolist(), labels)
        if tree_budget is None:
            return chain, None
        topk = topk_per_depth(logits, tree_budget) if tree_budget > 0 else []
        return chain, build_tree(int(seq.input_ids[a]), topk, tree_budget).deepest_match(labels)

    result.short = short
    return result
