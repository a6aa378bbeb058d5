"""Loss and training metrics of the reference DFlash trainer (docs/training.md §3 and §6).

Notation: A anchor blocks of size B; draft slot k = 1..B-1 of block j predicts position
``a_j + k``; slot 0 (the anchor token itself) is never supervised. ``m[j, k-1]`` is 1 when the
label exists (same sequence, inside it) and lies in the loss mask (response tokens).

v5 (default): hard cross-entropy with position decay::

    w_k = exp(-(k-1) / gamma)        (w_1 = 1; gamma 7 for B 16, 5 for B 10, 4 for B 8)
    L   = sum_jk m w CE(logits_jk, y_jk) / sum_jk m w          (normalize: weights, SF/paper)
                                     ... / sum_jk m            (normalize: mask, SP)

v4 legacy options (off by default), each a separate knob:

* ``soft_kl_weight`` a and ``temperature`` T: ``L = (1-a) * L_CE + a * L_KL`` where ``L_KL``
  uses the same weights on ``T^2 * KL(softmax(t/T) || softmax(s/T))`` per slot, t = the target's
  logits at ``a_j + k - 1`` (the teacher), s = the draft logits (Hinton's T^2 keeps gradient
  scale comparable across T). v4 used a = 0.7, T = 2.
* ``streak_weighting``: slot k's weight is also multiplied by ``prod_{i<k} q_i``, the
  (detached) drafter probability of the right token at every earlier valid slot, i.e. the
  chance the streak reaches slot k. The normalisation then uses these full weights too.
* gamma set by hand (v4: 10) instead of by block size.

Metrics are returned as *counts* (summable over steps and ranks, divided at the end):
per-position correct/total, loss numerator/denominator, exact streak sum over blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def decay_weights(block_size: int, gamma: float, device: torch.device | str | None = None) -> Tensor:
    """Position weights ``w_k = exp(-(k-1)/gamma)`` for slots k = 1..B-1: -> [B-1] float32."""
    k = torch.arange(1, block_size, dtype=torch.float32, device=device)
    return torch.exp(-(k - 1) / gamma)


def streak_weights(ce: Tensor, mask: Tensor) -> Tensor:
    """v4 streak weighting: ``s_k = prod_{i<k} q_i`` with ``q_i = exp(-CE_i)`` detached.

    Invalid (masked) slots count as ``q = 1`` (they neither break nor extend the streak).

    Args:
        ce: [A, B-1] per-slot cross-entropy.
        mask: [A, B-1] float validity.

    Returns:
        [A, B-1] weights, 1 at slot 1.
    """
    q = torch.where(mask > 0, torch.exp(-ce.detach()), torch.ones_like(ce))
    s = torch.cumprod(q, dim=1)
    return torch.cat([torch.ones_like(s[:, :1]), s[:, :-1]], dim=1)


def soft_kl(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """Per-slot ``T^2 * KL(softmax(teacher/T) || softmax(student/T))``: [..., V] -> [...] float32."""
    T = float(temperature)
    log_p_t = F.log_softmax(teacher.float() / T, dim=-1)
    log_p_s = F.log_softmax(student.float() / T, dim=-1)
    return (T * T) * (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)


@dataclass
class LossOutput:
    """One batch's loss and metric counts.

    Attributes:
        loss: scalar to backpropagate.
        num / den: the weighted sum and its normaliser (``loss = num / den``), detached.
        correct: [B-1] correct argmax drafts per position over valid slots.
        total: [B-1] valid slots per position.
        streak_sum: sum over blocks with a valid slot 1 of the exact teacher-forced streak.
        blocks: number of such blocks.
    """

    loss: Tensor
    num: float
    den: float
    correct: Tensor
    total: Tensor
    streak_sum: float
    blocks: int


def dflash_loss(
    logits: Tensor,
    labels: Tensor,
    mask: Tensor,
    gamma: float,
    normalize: str = "weights",
    teacher_logits: Tensor | None = None,
    soft_kl_weight: float = 0.0,
    temperature: float = 1.0,
    streak_weighting: bool = False,
) -> LossOutput:
    """Weighted DFlash loss over the draft slots of A blocks.

    Args:
        logits: [A, B-1, V] draft logits of slots 1..B-1.
        labels: [A, B-1] int64 label of each slot (any value where ``mask`` is 0).
        mask: [A, B-1] bool/float: 1 where the slot is supervised.
        gamma: decay constant of ``w_k = exp(-(k-1)/gamma)``.
        normalize: ``weights`` (divide by sum of the weights) or ``mask`` (by the slot count).
        teacher_logits: [A, B-1, V] target logits for the soft term (needed when
            ``soft_kl_weight > 0``).
        soft_kl_weight: v4 mix weight a of the soft KL term.
        temperature: v4 temperature of the soft KL term.
        streak_weighting: v4 streak weighting.

    Returns:
        :class:`LossOutput`. With no supervised slot the loss is ``0 * logits.sum()`` (keeps
        the graph, e.g. for DDP) and ``den`` is 0.
    """
    A, n, V = logits.shape
    m = mask.to(torch.float32)
    safe = torch.where(m > 0, labels, torch.zeros_like(labels))
    ce = F.cross_entropy(logits.float().reshape(-1, V), safe.reshape(-1), reduction="none").view(A, n)
    w = decay_weights(n + 1, gamma, logits.device)[None] * m  # [A, B-1]
    if streak_weighting:
        w = w * streak_weights(ce, m)
    den = (w.sum() if normalize == "weights" else m.sum()).detach()
    per_slot = ce
    if soft_kl_weight > 0:
        if teacher_logits is None:
            raise ValueError("soft_kl_weight > 0 needs teacher_logits")
        kl = soft_kl(logits, teacher_logits, temperature)
        per_slot = (1 - soft_kl_weight) * ce + soft_kl_weight * kl
    num = (w * per_slot).sum()
    loss = num / den if den > 0 else logits.sum() * 0.0
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels) & (m > 0)
        correct, total = hit.sum(0).float(), m.sum(0)
        run = torch.cumprod(hit.float(), dim=1).sum(1)  # exact streak from slot 1 (docs/training.md §6, SF)
        has = m[:, 0] > 0
    return LossOutput(loss, float(num.detach()), float(den), correct.cpu(), total.cpu(),
                      float(run[has].sum()), int(has.sum()))


def per_position_accuracy(correct: Tensor, total: Tensor) -> list[float]:
    """``acc_k = correct_k / total_k`` (0.0 where no slot k was supervised)."""
    return [float(c / t) if t > 0 else 0.0 for c, t in zip(correct.tolist(), total.tolist())]


def expected_acceptance_length(acc: list[float]) -> float:
    """EAL: expected accepted *draft* tokens per block from teacher-forced accuracies.

    ``eal = sum_{k=1}^{B-1} prod_{i=1}^{k} acc_i`` (docs/training.md §6, speculators ``metrics.py``):
    the expected streak if each slot were right independently with probability ``acc_i``. It
    has no +1 bonus token, so ``1 + eal`` is the matching estimate of tau (acceptance length
    per verification round). Teacher-forced: slot k sees the true context, not earlier drafts.

    Example: ``acc = [0.5, 0.5]`` -> ``0.5 + 0.25 = 0.75``.
    """
    total, prod = 0.0, 1.0
    for a in acc:
        prod *= a
        total += prod
    return total if math.isfinite(total) else 0.0


# ----------------------------------------------------------------------------- one training forward


class TrainForward(torch.nn.Module):
    """The multi-anchor training forward of a drafter as one module (what DDP wraps).

    DDP synchronises gradients only for computations that go through the wrapped module's
    ``forward``, so the whole drafter part of a step (context projection, all anchor blocks
    with the block mask) is this module's forward; the frozen target embedding and LM head
    stay outside.

    Args:
        drafter: the :class:`~core.ml.models.drafter.DFlashDrafter` being trained.
        attention: ``dense`` (one SDPA per layer with the docs/training.md §2 block mask) or
            ``blockwise`` (the same attention computed block by block).
    """

    def __init__(self, drafter: torch.nn.Module, attention: str = "dense") -> None:
        super().__init__()
        self.drafter = drafter
        self.attention = attention

    def forward(self, fc_in: Tensor, block_emb: Tensor, anchors: Tensor, positions: Tensor,
                doc: Tensor | None) -> Tensor:
        """fc_in [1, S, F], block_emb [1, A*B, H], anchors [1, A], positions/doc [1, S] -> [1, A*B, H]."""
        from core.ml.models.drafter import multi_anchor_forward

        return multi_anchor_forward(self.drafter, fc_in, block_emb, anchors, ctx_positions=positions, doc_ids=doc,
                                    anchor_positions=torch.gather(positions, 1, anchors), impl=self.attention)


def batch_loss(forward: torch.nn.Module, embed: torch.nn.Module, head: torch.nn.Module, batch: Any, cfg: Any,
               gen: torch.Generator | None, drafter_config: Any) -> LossOutput:
    """Loss of one packed batch: noise/split, one multi-anchor forward, labels, weighted loss.

    Args:
        forward: :class:`TrainForward` (possibly DDP-wrapped).
        embed / head: the target's frozen input embedding and LM head.
        batch: a :class:`~core.ml.train.data.Batch` on the training device.
        cfg: the resolved :class:`~core.ml.train.config.TrainConfig`.
        gen: the step's noise generator; None for validation (no noise).
        drafter_config: the drafter's :class:`~core.ml.formats.drafter_config.DFlashConfig`: its forward
            knobs (embedding scale, logit multiplier and soft-cap) apply in training as in eval.

    Returns:
        :class:`LossOutput` (labels: ``loss.labels``; teacher = the target logits at
        ``a + k - 1`` computed from the final layer returned by
        :func:`~core.ml.train.data.model_inputs`).
    """
    from core.ml.models.drafter import block_embeddings, block_token_ids, draft_logits
    from core.ml.train.data import model_inputs

    B, lc = cfg.drafter.block_size, cfg.loss
    fc_in, final = model_inputs(batch.taps, batch.final, cfg.fc_layers, cfg.noise.std, cfg.noise.target, gen)
    ids, anchors, S = batch.input_ids, batch.anchors, batch.num_tokens
    empty = anchors.numel() == 0  # no anchor candidate (e.g. a 1-token response): one masked dummy block,
    if empty:                     # so the forward (and DDP's gradient all-reduce) still runs
        anchors = torch.zeros(1, dtype=torch.long, device=ids.device)
    A = int(anchors.shape[0])
    with torch.no_grad():
        block_emb = block_embeddings(drafter_config, embed, block_token_ids(ids[None], anchors[None], B,
                                                                         cfg.drafter.mask_token_id))  # [1, A*B, H]
    doc = batch.doc[None] if batch.num_sequences > 1 else None
    h = forward(fc_in[None], block_emb, anchors[None], batch.positions[None], doc)  # [1, A*B, H]
    h = h.view(A, B, -1)[:, 1:]  # slot 0 is the anchor token itself: never supervised
    logits = draft_logits(drafter_config, head, h)  # [A, B-1, V], the drafter's knobs applied
    k = torch.arange(1, B, device=ids.device)
    p = anchors[:, None] + k  # [A, B-1] position of slot k's label
    pc = p.clamp(max=S - 1)
    mask = (p < S) & (batch.doc[pc] == batch.doc[anchors][:, None]) & batch.loss_mask[pc] & (not empty)
    teacher = None
    if final is not None and (lc.labels == "target" or lc.soft_kl_weight > 0):
        with torch.no_grad():
            teacher = head(final[pc - 1].to(head.weight.dtype)).float()  # target logits at a+k-1: [A, B-1, V]
    if lc.labels == "data":
        labels = ids[pc]
    elif teacher is not None:
        labels = teacher.argmax(-1)
    elif batch.labels is not None:
        labels = batch.labels[pc - 1]  # cached greedy labels: argmax of the same final layer
    else:
        raise ValueError("loss.labels 'target' needs the final layer or cached labels")
    return dflash_loss(logits, labels, mask, lc.gamma, lc.normalize, teacher if lc.soft_kl_weight > 0 else None,
                       lc.soft_kl_weight, lc.temperature, lc.streak_weighting)
