"""DFlash block-diffusion drafter (docs/drafter.md §1-§6).

The module tree and parameter names equal the published z-lab checkpoints (docs/drafter.md §1), so a
z-lab directory (``config.json`` + ``model.safetensors``) loads with strict keys::

    fc.weight [H, K*H]   hidden_norm.weight [H]   norm.weight [H]
    layers.{i}.input_layernorm.weight / post_attention_layernorm.weight [H]
    layers.{i}.self_attn.{q,k,v,o}_proj.weight   layers.{i}.self_attn.{q,k}_norm.weight [d]
    layers.{i}.mlp.{gate,up,down}_proj.weight

There is no embedding and no LM head: both are borrowed from the target at run time.

How a forward works (KV injection, docs/drafter.md §3). The target features of the committed
positions ``F[c, K*H]`` become context rows ``ctx = hidden_norm(fc(F))``. In every layer the
*same* ``k_proj``/``v_proj`` are applied to ``ctx`` and to the normalised block states, so the
keys are ``[ctx ; block]``; queries come from the block only. Context K/V of a position depend
only on that position's features, which is why (a) inference can cache them once per position
(:class:`DraftCache`) and (b) training can run many anchor blocks against one shared context
with a mask (:func:`multi_anchor_forward`).

Which keys a query sees is each layer's :class:`~core.ml.formats.drafter_config.AttentionRule`, the
serving engines' rule (docs/drafter.md §5): full-attention layers see the context before the anchor and
the whole block; sliding layers are causal with a window counted back from each query's own
position (context and block keys alike); top-level / ``dflash_config`` causality overrides
apply. Every path (inference, DDTree, offline, training) gets its masks from the same rules.

Two entry points share all code:

* inference: :meth:`DFlashDrafter.forward` (docs/drafter.md §3) with a
  :class:`DraftCache`; no mask for layers where nothing is hidden;
* training / batched offline eval: :func:`multi_anchor_forward`, with the dense boolean SDPA
  mask of :func:`anchor_block_mask` (``t < a_j``, strict).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.ml.formats.drafter_config import (  # noqa: F401 (re-export)
    FAMILY_DFLASH2,
    LAYER_SLIDING,
    AttentionRule,
    DFlashConfig,
    build_target_layer_ids,
    check_fields,
)
from core.ml.models.masks import (  # noqa: F401 (re-exported: the trainer imports them from here)
    NoiseFn,
    anchor_block_mask,
    block_mask,
    block_positions,
    block_token_ids,
    context_mask,
    uniform_feature_noise,
)
from core.ml.models.sampling import Sampling
from core.ml.models.sampling_torch import draw
from core.ml.models.sampling_torch import probs as sampling_probs

Masks = Tensor | Mapping[AttentionRule, Tensor | None] | None

# ----------------------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    """``w * x / sqrt(mean(x^2) + eps)``, computed in float32 and cast back (Qwen3 style)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(cfg: DFlashConfig) -> tuple[Tensor, float]:
    """Inverse frequencies ``[d/2]`` (float32) and the cos/sin scale for ``cfg``'s RoPE.

    Supports ``rope_scaling`` None/default, ``linear``, ``llama3`` and ``yarn`` (formulas as in
    the published implementations; yarn keeps ``truncate`` default True).
    """
    d, base = cfg.head_dim, cfg.rope_theta
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type") or rs.get("type") or "default"
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(rs["factor"]), 1.0
    if kind == "llama3":
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        out = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return torch.where(medium, smoothed, out), 1.0
    if kind == "yarn":
        orig = float(rs["original_max_position_embeddings"])
        factor = rs.get("factor") or cfg.max_position_embeddings / orig
        mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        att = rs.get("attention_factor")
        if att is None:
            att = get_mscale(factor, mscale) / get_mscale(factor, mscale_all) if mscale and mscale_all else get_mscale(factor)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def corr_dim(rot: float) -> float:
            return (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        extrap = 1 - ramp
        return (inv / factor) * (1 - extrap) + inv * extrap, float(att)
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3, yarn)")


class RotaryEmbedding(nn.Module):
    """cos/sin tables for absolute positions (rotate-half / NeoX form)."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        inv, scale = rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv, persistent=False)  # not in the checkpoint
        self.attention_scaling = scale

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        # positions: [b, n] -> cos, sin: [b, n, d] (float32)
        freqs = positions.float()[..., None] * self.inv_freq.float().to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [b, heads, n, d]; cos/sin: [b, n, d]
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return x * cos + rotate_half(x) * sin


class DraftMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftAttention(nn.Module):
    """GQA attention over ``[context K/V ; block K/V]`` (KV injection) under the layer's rule."""

    def __init__(self, cfg: DFlashConfig, layer_idx: int) -> None:
        super().__init__()
        H, d, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.nh, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(H, self.nh * d, bias=bias)
        self.k_proj = nn.Linear(H, self.nkv * d, bias=bias)
        self.v_proj = nn.Linear(H, self.nkv * d, bias=bias)
        self.o_proj = nn.Linear(self.nh * d, H, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.layer_type = cfg.layer_types[layer_idx]
        self.rule = cfg.attention_rules()[layer_idx]

    def project_kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """K/V for rows ``x`` [b, n, H] -> k, v [b, nkv, n, d] (k normed and rotated)."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.nkv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.nkv, self.d).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor | None) -> Tensor:
        # x: [b, q, H] (already input_layernorm-ed); ctx_k/ctx_v: [b, nkv, c, d]
        b, q, _ = x.shape
        qh = self.q_norm(self.q_proj(x).view(b, q, self.nh, self.d)).transpose(1, 2)  # [b, nh, q, d]
        qh = apply_rope(qh, cos, sin)
        k_blk, v_blk = self.project_kv(x, cos, sin)
        k = torch.cat([ctx_k.to(k_blk.dtype), k_blk], dim=2)  # [b, nkv, c+q, d]
        v = torch.cat([ctx_v.to(v_blk.dtype), v_blk], dim=2)
        rep = self.nh // self.nkv
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=self.d**-0.5)  # [b, nh, q, d]
        return self.o_proj(out.transpose(1, 2).reshape(b, q, self.nh * self.d))

    def forward_blocks(self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, ctx_bias: Tensor,
                       block_size: int) -> Tensor:
        """Many independent blocks against one shared context, without the block x block waste.

        Mathematically the dense path with :func:`anchor_block_mask`, but each query scores
        only the context columns and its own block's B columns: memory and time grow as
        ``A*B * (c + B)`` instead of ``A*B * (c + A*B)``.

        Args:
            x: [b, A*B, H] normalised block rows, block j = rows j*B .. j*B+B-1.
            cos, sin: [b, A*B, d] RoPE tables of the block rows.
            ctx_k, ctx_v: [b, nkv, c, d] shared context K/V.
            ctx_bias: [b, A*B, c] float32 additive mask: 0 where :func:`context_mask` (with this
                layer's window) is True, -inf elsewhere (every row still sees its own slot, so
                no row is empty).
            block_size: B (the in-block pattern is :func:`block_mask` of this layer's rule).
        """
        b, q, _ = x.shape
        B, A, rep, d = block_size, q // block_size, self.nh // self.nkv, self.d
        qh = apply_rope(self.q_norm(self.q_proj(x).view(b, q, self.nh, d)).transpose(1, 2), cos, sin)
        k_blk, v_blk = self.project_kv(x, cos, sin)  # [b, nkv, q, d]
        qg = qh.reshape(b, self.nkv, rep * q, d) * d**-0.5  # heads h = g*rep + r share kv group g (GQA)
        # context scores: one batched matmul over kv groups, strict t < a mask as an additive bias
        s_ctx = torch.matmul(qg, ctx_k.to(qg.dtype).transpose(-1, -2)).float()  # [b, g, r*q, c]
        s_ctx = s_ctx.view(b, self.nkv, rep, q, -1).add_(ctx_bias[:, None, None])
        # own-block scores: [b, g, r, A, B, B]
        qb = qg.view(b, self.nkv, rep, A, B, d)
        s_blk = torch.matmul(qb, k_blk.reshape(b, self.nkv, 1, A, B, d).transpose(-1, -2)).float()
        inner = block_mask(B, self.rule, x.device)
        if not bool(inner.all()):
            s_blk = s_blk.masked_fill(~inner, float("-inf"))
        s_blk = s_blk.view(b, self.nkv, rep, q, B)
        # softmax over [context ; own block] without concatenating the two score tensors
        m = torch.maximum(s_ctx.amax(-1, keepdim=True), s_blk.amax(-1, keepdim=True))
        e_ctx, e_blk = (s_ctx - m).exp_(), (s_blk - m).exp_()
        z = e_ctx.sum(-1, keepdim=True) + e_blk.sum(-1, keepdim=True)
        out = torch.matmul(e_ctx.to(qg.dtype).view(b, self.nkv, rep * q, -1), ctx_v.to(qg.dtype)).view(b, self.nkv, rep, q, d)
        e_blk = e_blk.to(qg.dtype).view(b, self.nkv, rep, A, B, B)
        out = out + torch.matmul(e_blk, v_blk.reshape(b, self.nkv, 1, A, B, d)).view(b, self.nkv, rep, q, d)
        out = (out / z.to(out.dtype)).reshape(b, self.nh, q, d)
        return self.o_proj(out.transpose(1, 2).reshape(b, q, self.nh * d))


class GroupedDynamicCausalConv(nn.Module):
    """DFlash-2's grouped dynamic causal convolution along the block (docs/drafter.md §7).

    Wraps one operation (a layer's attention or its MLP): :meth:`prepare` convolves its input,
    :meth:`finish` convolves its output, each with a kernel that is a learned base plus a
    per-position part predicted from the operation's *input* (both halves are predicted before
    the operation runs, so the output's kernel still depends on the input's content). Channels
    come in groups of ``g`` that share the dynamic part, so the projection stays small
    (``2 * K * H/g`` outputs). Output row ``t`` mixes rows ``t, t-1, ..., t-K+1`` of the *same
    block* only (rows before the block start count as zeros): context rows never enter, which is
    why the convolution needs no cache and why many blocks can run side by side.

    Parameters (published names): ``base_kernel [2, K, H]`` (``[0]`` before, ``[1]`` after the
    operation) and ``kernel_projection.weight [2*K*G, H]`` (G = H/g groups). The identity:
    ``base_kernel[:, 0] = 1``, the rest and ``kernel_projection`` zero.
    """

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int) -> None:
        super().__init__()
        self.kernel_size, self.group_size, self.groups = kernel_size, group_size, hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)

    def prepare(self, x: Tensor, block: int) -> tuple[Tensor, Tensor]:
        """Convolve the operation's input ``x [b, n, H]`` (rows in blocks of ``block``).

        Returns:
            the convolved input [b, n, H] and the output's dynamic kernel [b, n, K, G].
        """
        dyn = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, self.groups)
        return self._convolve(x, dyn[..., 0, :, :], 0, block), dyn[..., 1, :, :]

    def finish(self, y: Tensor, dyn: Tensor, block: int) -> Tensor:
        """Convolve the operation's output ``y [b, n, H]`` with the kernel :meth:`prepare` predicted."""
        return self._convolve(y, dyn, 1, block)

    def _convolve(self, x: Tensor, dyn: Tensor, half: int, block: int) -> Tensor:
        # x [b, n, H] -> [b, n/block, block, G, g]; dyn [b, n, K, G] -> [b, n/block, block, K, G, 1]
        b, n, H = x.shape
        xs = x.view(b, n // block, block, self.groups, self.group_size)
        dyn = dyn.reshape(b, n // block, block, self.kernel_size, self.groups, 1)
        base = self.base_kernel[half].to(x.dtype).view(self.kernel_size, self.groups, self.group_size)
        out = torch.zeros_like(xs)
        for lag in range(min(self.kernel_size, block)):
            past = xs if lag == 0 else F.pad(xs[:, :, :-lag], (0, 0, 0, 0, lag, 0))  # row t sees row t-lag
            out = out + base[lag] * past
            out = out + dyn[:, :, :, lag] * past
        return out.view(b, n, H)


class CandidateSelector(nn.Module):
    """DFlash-2's choice of the draft path among the top-k draft logits (docs/drafter.md §7).

    The drafter predicts all block slots at once, so slot j's argmax ignores which token slot
    j-1 drafted. The selector restores that dependency cheaply: for slot j it scores each of the
    k best tokens ``c`` as ``logit(c) + <pred[p] * proj(h_j), succ[c]>`` where ``p`` is the token
    chosen for slot j-1 (the anchor for slot 0), ``pred``/``succ`` are rank-r codebooks over the
    vocabulary and ``proj`` maps the slot's draft hidden state to rank r; greedy decoding takes
    the best score slot by slot. Zero codebooks leave the logits: the path is their argmax.

    Parameters (published names, the codebooks without ``.weight``):
    ``predecessor_codebook [V, r]``, ``successor_codebook [V, r]``, ``hidden_projection.weight [r, H]``.
    """

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.top_k = int(cfg.selector_top_k)
        self.predecessor_codebook = nn.Parameter(torch.empty(cfg.vocab_size, cfg.selector_rank))
        self.successor_codebook = nn.Parameter(torch.empty(cfg.vocab_size, cfg.selector_rank))
        self.hidden_projection = nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)

    def select(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor) -> Tensor:
        """The greedy path: hidden [b, n, H], logits [b, n, V], anchor_ids [b] -> tokens [b, n]."""
        return self._walk(hidden, logits, anchor_ids, lambda scores: torch.argmax(scores, dim=-1))[0]

    def sample(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor, temperature: float,
               generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """A sampled path, as the reference samples it: slot j's token is drawn from
        ``softmax(scores / temperature)`` over its k candidates (no top-p / top-k: the candidates
        are the filter). Returns the tokens [b, n] and that distribution over the vocabulary
        [b, n, V] (0 outside the candidates): the ``q`` of rejection sampling."""
        rows: list[Tensor] = []

        def pick(scores: Tensor) -> Tensor:
            q = torch.softmax(scores.float() / temperature, dim=-1)  # [b, k]
            rows.append(q)
            return torch.multinomial(q, 1, generator=generator)[:, 0]

        path, candidates = self._walk(hidden, logits, anchor_ids, pick, ranked=False)
        q = torch.zeros(*logits.shape, dtype=torch.float32, device=logits.device)
        return path, q.scatter_(-1, candidates, torch.stack(rows, dim=1))

    def _walk(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor, pick, ranked: bool = True
              ) -> tuple[Tensor, Tensor]:
        """Slot after slot from the anchor, ``pick`` one of the k candidates by their scores
        [b, k] -> index [b]. Returns the path [b, n] and the candidates [b, n, k], best first when
        ``ranked``, else in ``torch.topk``'s own order (the reference's when it samples, so one
        seed draws the same candidate in both)."""
        unary, candidates = torch.topk(logits, self.top_k, dim=-1, sorted=ranked)  # [b, n, k]
        proj = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype))  # [b, n, r]
        prev, path = anchor_ids.to(candidates.device), []
        for j in range(hidden.shape[1]):
            query = self.predecessor_codebook[prev] * proj[:, j]  # [b, r]
            pair = torch.einsum("br,bkr->bk", query, self.successor_codebook[candidates[:, j]])
            best = pick(unary[:, j] + pair.to(unary.dtype))  # [b]
            prev = candidates[:, j].gather(-1, best[:, None])[:, 0]
            path.append(prev)
        return torch.stack(path, dim=1), candidates


class DraftLayer(nn.Module):
    """Qwen3 pre-norm block; the context rows bypass ``input_layernorm``.

    In a DFlash-2 drafter the attention and the MLP are each wrapped by a
    :class:`GroupedDynamicCausalConv` (``attention_conv``, ``mlp_conv``) over the block rows,
    inside the residual branch; ``block`` is the length of the blocks the rows come in.
    """

    def __init__(self, cfg: DFlashConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)
        self.attention_conv = self.mlp_conv = None
        if cfg.family == FAMILY_DFLASH2:
            self.attention_conv = GroupedDynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
            self.mlp_conv = GroupedDynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    @staticmethod
    def _wrapped(conv: GroupedDynamicCausalConv | None, op, x: Tensor, block: int) -> Tensor:
        if conv is None:
            return op(x)
        x, dyn = conv.prepare(x, block)
        return conv.finish(op(x), dyn, block)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor | None,
                block: int | None = None) -> Tensor:
        block = block or h.shape[1]
        h = h + self._wrapped(self.attention_conv, lambda x: self.self_attn(x, cos, sin, ctx_k, ctx_v, mask),
                              self.input_layernorm(h), block)
        return h + self._wrapped(self.mlp_conv, self.mlp, self.post_attention_layernorm(h), block)

    def forward_blocks(self, h: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, ctx_bias: Tensor,
                       block_size: int) -> Tensor:
        h = h + self._wrapped(
            self.attention_conv,
            lambda x: self.self_attn.forward_blocks(x, cos, sin, ctx_k, ctx_v, ctx_bias, block_size),
            self.input_layernorm(h), block_size)
        return h + self._wrapped(self.mlp_conv, self.mlp, self.post_attention_layernorm(h), block_size)


# ----------------------------------------------------------------------------- forward knobs


def block_embeddings(config: DFlashConfig, embed: nn.Module, ids: Tensor) -> Tensor:
    """The target's embeddings of block tokens, times ``input_embedding_scale`` (docs/drafter.md §3).

    Every path that feeds a block to the drafter (online, DDTree, offline, training) embeds
    it here, so the knob cannot be honoured in one and forgotten in another.
    """
    emb = embed(ids)
    scale = float(config.input_embedding_scale)
    return emb * scale if scale != 1.0 else emb


def draft_logits(config: DFlashConfig, head: nn.Module, hidden: Tensor) -> Tensor:
    """Draft logits from draft hidden states through the target's LM head, in the head's dtype.

    ``output_multiplier`` scales them, then ``final_logit_softcapping`` (when set and > 0)
    soft-caps them to ``cap * tanh(logits / cap)``, in the reference's order.
    """
    logits = head(hidden.to(head.weight.dtype))
    mult, cap = float(config.output_multiplier), config.final_logit_softcapping
    if mult != 1.0:
        logits = logits * mult
    if cap is not None and float(cap) > 0:
        logits = torch.tanh(logits / float(cap)) * float(cap)
    return logits


def draft_path(drafter: DFlashDrafter, hidden: Tensor, logits: Tensor, anchor_ids: Tensor) -> Tensor:
    """The greedy draft tokens of block slots 1.. (docs/drafter.md §7): [b, n] int64.

    A DFlash drafter drafts each slot's argmax; a DFlash-2 drafter the path its
    :class:`CandidateSelector` picks among the top-k logits, slot after slot from the anchor.
    Every path that turns draft logits into draft tokens (online chain, offline) goes through
    here, so the two families cannot be told apart by one path and mixed up by another.

    Args:
        drafter: the drafter.
        hidden: [b, n, H] draft hidden states of the slots (the anchor's row excluded).
        logits: [b, n, V] their :func:`draft_logits`.
        anchor_ids: [b] the blocks' anchor tokens (slot 0).
    """
    if drafter.candidate_selector is None:
        return logits.argmax(-1)
    return drafter.candidate_selector.select(hidden, logits, anchor_ids)


def draft_sample(drafter: DFlashDrafter, hidden: Tensor, logits: Tensor, anchor_ids: Tensor, sampling: Sampling,
                 generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """The sampled draft tokens of block slots 1.. and the distribution each was drawn from
    (docs/evaluation.md §2, "Sampling"): ``([b, n], [b, n, V])``.

    A DFlash drafter draws each slot from its tempered, filtered logits
    (:func:`core.ml.models.sampling_torch.probs`); a DFlash-2 drafter walks its candidate selector, drawing
    each slot among the selector's candidates (:meth:`CandidateSelector.sample`), as the
    reference does. Either way the distribution returned is the one drawn from, which is what
    rejection sampling needs to stay lossless.
    """
    if drafter.candidate_selector is None:
        q = sampling_probs(logits, sampling)
        return draw(q, generator), q
    return drafter.candidate_selector.sample(hidden, logits, anchor_ids, sampling.temperature, generator)


def refuse_tree(drafter: DFlashDrafter | None) -> None:
    """Refuse DDTree on a DFlash-2 drafter, saying why (docs/evaluation.md §3)."""
    if drafter is not None and drafter.family == FAMILY_DFLASH2:
        raise ValueError("DDTree is not defined for a DFlash-2 drafter (DFlash2DraftModel): its draft is the "
                         "candidate selector's path, which the reference builds no tree from; evaluate it with "
                         "the chain (drop --tree-budget / tree_budget)")


# ----------------------------------------------------------------------------- inference cache


class DraftCache:
    """Per-layer context K/V of committed positions (block K/V are never stored).

    Equivalent to z-lab's "append, then ``crop(start)``": after each round only context rows
    remain, so the next block attends to ``[all cached context ; its own block]``.
    """

    def __init__(self) -> None:
        self.kv: list[tuple[Tensor, Tensor]] | None = None
        self.positions: Tensor | None = None  # [b, c]

    def __len__(self) -> int:
        return 0 if self.positions is None else int(self.positions.shape[1])

    def append(self, kv: list[tuple[Tensor, Tensor]], positions: Tensor) -> None:
        """Append new context rows: ``kv[i] = (k, v)`` each [b, nkv, n, d]; positions [b, n]."""
        if self.kv is None:
            self.kv, self.positions = list(kv), positions
            return
        self.kv = [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)) for (k0, v0), (k1, v1) in zip(self.kv, kv)]
        self.positions = torch.cat([self.positions, positions], 1)

    def crop(self, n: int) -> None:
        """Keep the first ``n`` context rows."""
        if self.kv is not None:
            self.kv = [(k[:, :, :n], v[:, :, :n]) for k, v in self.kv]
            self.positions = self.positions[:, :n]


# ----------------------------------------------------------------------------- the drafter


class DFlashDrafter(nn.Module):
    """The DFlash draft model (no embeddings, no LM head)."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        H = config.hidden_size
        self.fc = nn.Linear(config.feature_dim, H, bias=False)
        self.hidden_norm = RMSNorm(H, config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.candidate_selector = CandidateSelector(config) if config.family == FAMILY_DFLASH2 else None

    @property
    def family(self) -> str:
        """``dflash`` or ``dflash2`` (:attr:`DFlashConfig.family`)."""
        return self.config.family

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.config.target_layer_ids)

    def reset_rotary(self, device: torch.device | str | None = None) -> None:
        """Recompute the (non-persistent) RoPE buffer, e.g. after loading onto ``meta``."""
        inv, scale = rope_inv_freq(self.config)
        self.rotary_emb.inv_freq = inv.to(device or self.fc.weight.device)
        self.rotary_emb.attention_scaling = scale

    # -- pieces -----------------------------------------------------------------------------

    def project_context(self, ctx_feats: Tensor, noise_fn: NoiseFn | None = None) -> Tensor:
        """Context rows ``hidden_norm(fc(F))``: [b, c, K*H] -> [b, c, H].

        Args:
            ctx_feats: concatenated target features (``hidden_states[id+1]`` per tapped id).
            noise_fn: optional training-time hook applied to the fc input.
        """
        if noise_fn is not None:
            ctx_feats = noise_fn(ctx_feats)
        return self.hidden_norm(self.fc(ctx_feats.to(self.fc.weight.dtype)))

    def context_kv(self, ctx: Tensor, ctx_positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per-layer context K/V: ctx [b, c, H], positions [b, c] -> [(k, v) [b, nkv, c, d]]."""
        cos, sin = self.rotary_emb(ctx_positions)
        return [layer.self_attn.project_kv(ctx, cos, sin) for layer in self.layers]

    def forward_block(
        self, noise_emb: Tensor, block_positions: Tensor, ctx_kv: list[tuple[Tensor, Tensor]], masks: Masks = None,
        block: int | None = None,
    ) -> Tensor:
        """Run the draft stack on block rows against given context K/V.

        Args:
            noise_emb: [b, q, H] target embeddings of the block tokens ``[x_a, MASK, ...]``.
            block_positions: [b, q] absolute positions of the block rows.
            ctx_kv: per-layer context K/V from :meth:`context_kv` (or a :class:`DraftCache`).
            masks: None (attend everywhere), one bool mask [b, 1, q, c+q] for all layers, or a
                mapping ``AttentionRule -> mask`` (None: nothing hidden for that rule).
            block: length of the blocks the q rows come in (default q: one block); a DFlash-2
                drafter's convolutions run within each block.

        Returns:
            [b, q, H] = ``norm(h)``; logits = ``target_lm_head(...)``.
        """
        cos, sin = self.rotary_emb(block_positions)
        h = noise_emb.to(self.fc.weight.dtype)
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            mask = masks[layer.self_attn.rule] if isinstance(masks, Mapping) else masks
            h = layer(h, cos, sin, ck, cv, mask, block)
        return self.norm(h)

    def forward_blocks(self, noise_emb: Tensor, block_positions: Tensor, ctx_kv: list[tuple[Tensor, Tensor]],
                       anchors: Tensor, ctx_positions: Tensor, ctx_doc: Tensor | None = None,
                       anchor_doc: Tensor | None = None, block_size: int | None = None) -> Tensor:
        """Blockwise multi-anchor stack (see :meth:`DraftAttention.forward_blocks`): [b, A*B, H].

        ``block_size``: B of the blocks (default the drafter's own; eval may run another).
        """
        B = block_size or self.config.block_size
        ctx_bias: dict[int | None, Tensor] = {}  # additive float32 context mask per window, built once per pass
        for rule in self.config.attention_rules():
            if rule.window not in ctx_bias:
                keep = context_mask(anchors, ctx_positions, B, rule.window, ctx_doc, anchor_doc)
                ctx_bias[rule.window] = torch.zeros(keep.shape, device=keep.device).masked_fill_(~keep, float("-inf"))
        cos, sin = self.rotary_emb(block_positions)
        h = noise_emb.to(self.fc.weight.dtype)
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            h = layer.forward_blocks(h, cos, sin, ck, cv, ctx_bias[layer.self_attn.rule.window], B)
        return self.norm(h)

    # -- inference forward (docs/drafter.md §3) ------------------------------------------------------

    def forward(
        self,
        noise_emb: Tensor,
        ctx_feats: Tensor,
        positions: Tensor,
        cache: DraftCache | None = None,
        attn_mask: Masks = None,
    ) -> Tensor:
        """Draft one block per batch row.

        Args:
            noise_emb: [b, q, H] embeddings of ``[x_s, MASK * (q-1)]``.
            ctx_feats: [b, c, K*H] features of the *new* context rows (all context when no cache).
            positions: [b, c+q] positions of the new context rows then of the block.
            cache: context K/V of earlier rows; the new rows are appended to it.
            attn_mask: explicit mask(s); by default each layer's :class:`AttentionRule`
                (:meth:`inference_masks`): full layers see all cached context and the whole
                block, sliding layers are causal with the window counted from each query.

        Returns:
            [b, q, H] normalised draft hidden states.
        """
        c = ctx_feats.shape[1]
        new_kv = self.context_kv(self.project_context(ctx_feats), positions[:, :c])
        if cache is not None:
            cache.append(new_kv, positions[:, :c])
            kv, ctx_pos = cache.kv, cache.positions
        else:
            kv, ctx_pos = new_kv, positions[:, :c]
        block_pos = positions[:, c:]
        masks = attn_mask if attn_mask is not None else self.inference_masks(block_pos[:, :1], ctx_pos, block_pos.shape[1])
        return self.forward_block(noise_emb, block_pos, kv, masks)

    def inference_masks(self, anchors: Tensor, ctx_positions: Tensor, q: int) -> dict[AttentionRule, Tensor | None]:
        """Masks per rule for one block of ``q`` rows per batch row at ``anchors`` [b, 1].

        The context rows are all before the block. None where the rule hides nothing (full
        layers, or a window wider than everything), so SDPA runs unmasked there.
        """
        masks: dict[AttentionRule, Tensor | None] = {}
        for rule in set(self.config.attention_rules()):
            m = anchor_block_mask(anchors, ctx_positions, q, rule)
            masks[rule] = None if bool(m.all()) else m
        return masks

    def layer_masks(self, anchors: Tensor, ctx_positions: Tensor, ctx_doc: Tensor | None = None,
                    anchor_doc: Tensor | None = None, block_size: int | None = None) -> dict[AttentionRule, Tensor]:
        """Multi-anchor masks per rule (see :func:`anchor_block_mask`)."""
        B = block_size or self.config.block_size
        return {rule: anchor_block_mask(anchors, ctx_positions, B, rule, ctx_doc, anchor_doc)
                for rule in set(self.config.attention_rules())}


# ----------------------------------------------------------------------------- multi-anchor


def multi_anchor_forward(
    drafter: DFlashDrafter,
    ctx_feats: Tensor | None,
    block_emb: Tensor,
    anchors: Tensor,
    ctx_positions: Tensor | None = None,
    doc_ids: Tensor | None = None,
    noise_fn: NoiseFn | None = None,
    ctx_kv: list[tuple[Tensor, Tensor]] | None = None,
    anchor_positions: Tensor | None = None,
    impl: str = "dense",
    block_size: int | None = None,
) -> Tensor:
    """All anchor blocks of a sequence in one masked forward (training path, docs/drafter.md §5).

    Args:
        drafter: the drafter.
        ctx_feats: [b, S, K*H] target features of every position of the sequence (may be None
            when ``ctx_kv`` and ``ctx_positions`` are given).
        block_emb: [b, A*B, H] target embeddings of :func:`block_token_ids`.
        anchors: [b, A] anchor positions (need not be sorted; blocks are independent).
        ctx_positions: [b, S] positions (default ``0..S-1``; per-document for packed rows).
        doc_ids: [b, S] document ids for packed rows (context restricted to the same doc).
        noise_fn: training noise on the fc input (e.g. :func:`uniform_feature_noise`).
        ctx_kv: precomputed :meth:`DFlashDrafter.context_kv` to reuse across anchor chunks
            (it may hold only the first rows of the sequence, up to the largest anchor).
        anchor_positions: [b, A] positions of the anchors (default: looked up in
            ``ctx_positions``; give it when the context is cut at the anchors).
        impl: ``dense`` (one SDPA call per layer with the dense mask of
            :func:`anchor_block_mask`, docs/training.md §2) or ``blockwise``
            (:meth:`DraftAttention.forward_blocks`: same result, cost linear in the number of
            anchors; used by offline eval).
        block_size: B of the blocks in ``block_emb`` (default: the drafter's own).

    Returns:
        [b, A*B, H] normalised hidden states; block j's rows equal the inference path's output
        for context ``F[:a_j]`` and the same block (docs/training.md §2).
    """
    if ctx_positions is None:
        b, S, _ = ctx_feats.shape
        ctx_positions = torch.arange(S, device=ctx_feats.device).expand(b, S)
    if ctx_kv is None:
        ctx_kv = drafter.context_kv(drafter.project_context(ctx_feats, noise_fn), ctx_positions)
    anchor_doc = torch.gather(doc_ids, 1, anchors) if doc_ids is not None else None
    anchor_pos = anchor_positions if anchor_positions is not None else torch.gather(ctx_positions, 1, anchors)
    B = block_size or drafter.block_size
    bpos = block_positions(anchor_pos, B)
    if impl == "blockwise":
        return drafter.forward_blocks(block_emb, bpos, ctx_kv, anchor_pos, ctx_positions, doc_ids, anchor_doc, B)
    if impl != "dense":
        raise ValueError(f"impl must be 'dense' or 'blockwise', got {impl!r}")
    masks = drafter.layer_masks(anchor_pos, ctx_positions, doc_ids, anchor_doc, B)
    return drafter.forward_block(block_emb, bpos, ctx_kv, masks, B)


# ----------------------------------------------------------------------------- load / save

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


def expected_tensors(config: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names and shapes for ``config`` (docs/drafter.md §1)."""
    with torch.device("meta"):
        model = DFlashDrafter(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of the drafter directory ``path`` (``model.safetensors`` or the shards its
    index names), each file's header checked against the file first (:func:`load_checked`)."""
    from core.ml.formats.safetensors_header import shard_files
    from core.ml.formats.safetensors_stream import load_checked

    files = shard_files(path, WEIGHTS_NAME)
    if not files:
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {path}")
    state: dict[str, Tensor] = {}
    for file in files:
        state.update(load_checked(file))
    return state


_FOREIGN_PREFIXES = ("embed_tokens.", "lm_head.", "verifier_", "d2t", "t2d", "t2d.")
_CODEBOOK_ALIASES = {f"candidate_selector.{n}_codebook.weight": f"candidate_selector.{n}_codebook"
                     for n in ("predecessor", "successor")}
"""The codebooks as ``nn.Embedding`` would name them; the published files (and specdeck's) have no ``.weight``."""


def load_drafter(
    path: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    strict: bool = True,
) -> DFlashDrafter:
    """Load a drafter directory (``config.json`` + ``model.safetensors``), DFlash or DFlash-2.

    A DFlash-2 drafter's codebooks load with or without a ``.weight`` suffix. An optional ``model.`` prefix on every key is stripped. In speculators-format directories
    the tensors that are not part of the drafter body (``embed_tokens``, ``lm_head``,
    ``verifier_*``, ``d2t``/``t2d``) are ignored. Any other unexpected or missing key fails.

    Args:
        path: the directory.
        device: where to put the weights.
        dtype: cast to this dtype (default: keep the checkpoint's).
        strict: require an exact key match.

    Raises:
        FileNotFoundError: config or weights missing.
        ValueError: bad config, or keys/shapes do not match (lists them).
    """
    path = Path(path)
    if not (path / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {path}")
    config = DFlashConfig.from_file(path / CONFIG_NAME)
    state = _read_safetensors(path)
    if state and all(k.startswith("model.") for k in state):
        state = {k[len("model."):]: v for k, v in state.items()}
    if config.source_format == "speculators":
        state = {k: v for k, v in state.items() if not k.startswith(_FOREIGN_PREFIXES)}
    state = {_CODEBOOK_ALIASES.get(k, k): v for k, v in state.items()}
    want = expected_tensors(config)
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    bad_shape = [f"{k}: {tuple(state[k].shape)} != {want[k]}" for k in want if k in state and tuple(state[k].shape) != want[k]]
    if bad_shape or (strict and (missing or unexpected)):
        raise ValueError(f"{path}: checkpoint does not match config: missing={missing} unexpected={unexpected} shapes={bad_shape}")
    with torch.device("meta"):
        model = DFlashDrafter(config)
    model.load_state_dict(state, strict=strict, assign=True)
    model.rotary_emb.inv_freq = torch.empty(0)  # meta buffer: rebuilt below on the real device
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device=device)
    model.reset_rotary(device)
    return model.eval()


def save_drafter(model: DFlashDrafter, out_dir: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Save ``config.json`` + ``model.safetensors`` in the z-lab layout (atomic renames)."""
    from core.ml.formats.runio import atomic_target, atomic_write_json
    from core.ml.formats.safetensors_stream import save_streaming

    out = Path(out_dir)
    state = model.state_dict()
    cfg = model.config.to_dict()
    cfg["dtype"] = str(dtype or next(iter(state.values())).dtype).removeprefix("torch.")
    check_fields(cfg, str(out / CONFIG_NAME))  # every value in range and finite, before a byte is written
    out.mkdir(parents=True, exist_ok=True)
    with atomic_target(out / WEIGHTS_NAME) as tmp:
        save_streaming(state, tmp, metadata={"format": "pt"}, dtype=dtype)
    atomic_write_json(out / CONFIG_NAME, cfg, allow_nan=False)
    return out
