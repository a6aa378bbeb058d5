"""Verification of token trees on hybrid targets (gated delta-net + attention), one forward each.

A hybrid ``qwen3_5`` target mixes full-attention layers (a K/V cache: rows can be dropped or
index-selected) with gated delta-net linear-attention layers, whose cache is a causal-conv
window (the last ``K`` pre-conv inputs) and a recurrent state ``S`` per head ``[dk, dv]``.
``S`` cannot be cropped. Instead of snapshotting it and re-running the accepted tokens
(two target forwards per round, and a batch of root-to-leaf paths for a tree), the verify
forward here runs each linear layer *tree-aware*, without touching its cache:

* conv: node i's window is its own input and those of its ``K-1`` nearest ancestors, reaching
  into the cached window past the root;
* delta rule, all nodes at once: node i's state is ``S_i = f(S_parent(i), k_i, v_i, g_i, beta_i)``
  with the recurrence

      S <- exp(g) * S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q

  (q, k l2-normalised, q scaled by dk^-1/2, all in float32, as the decode path computes it).
  Unrolled along a node's root path it is the chunked (WY) form of the delta rule with the
  causal mask replaced by the ancestor mask (:func:`tree_delta_rule`): one triangular solve
  and a few batched matmuls per layer, whatever the tree's depth;
* attention layers see the tree through an ancestor mask (a chain: the plain causal mask).

Every node is computed once, so a chain of B tokens costs one forward of B tokens and a tree of
n nodes one forward of n tokens. The per-node inputs ``x`` and ``k``, the pseudo-values ``u``
and the path decays are kept; after acceptance :meth:`TreeStates.commit` sets the cached state
to the accepted path's last node's, in closed form (one small matmul per layer, no weight
matmul), and rebuilds the conv window from the path's inputs. Memory: the per-node inputs (tens
of KB per node and layer), never a state per node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_PARTS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "A_log", "dt_bias", "norm", "out_proj")


def linear_attention_modules(model: nn.Module) -> list[nn.Module] | None:
    """The gated delta-net modules of ``model`` in layer order, or None when one has another layout.

    Only the ``qwen3_5`` layout (separate qkv / z / b / a projections) is handled; any other
    linear-attention module makes the caller fall back to recomputation.
    """
    found = []
    for mod in model.modules():
        name = type(mod).__name__
        if name.endswith("GatedDeltaNet") or (hasattr(mod, "conv1d") and hasattr(mod, "A_log")):
            if not all(hasattr(mod, p) for p in _PARTS) or not hasattr(mod, "layer_idx"):
                return None
            found.append(mod)
    return sorted(found, key=lambda m: m.layer_idx)


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def ancestor_matrix(parents: Sequence[int]) -> Tensor:
    """[n, n] bool: ``[i, j]`` iff node j is node i or one of its ancestors (``parent < child``)."""
    n = len(parents)
    vis = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            vis[i] = vis[p]
        vis[i, i] = True
    return vis


def tree_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                    anc: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gated delta rule of every tree node from the root state, without a loop over depths.

    Along node t's root path (the nodes j with ``anc[t, j]``), with ``G_t`` the sum of ``g``
    over the path, the recurrence unrolls to ``S_t = e^{G_t} S + sum_j e^{G_t - G_j} k_j u_j^T``
    where the pseudo-values ``u`` solve the unit lower-triangular system

        u_t + beta_t sum_{j strict ancestor of t} e^{G_t - G_j} (k_t . k_j) u_j = beta_t (v_t - e^{G_t} S^T k_t)

    (the chunked / WY form of the delta rule, its causal mask replaced by the ancestor mask:
    a node's ``u`` depends on its ancestors' only, so every path shares its prefix's), and
    ``o_t = S_t^T q_t = e^{G_t} S^T q_t + sum_j e^{G_t - G_j} (q_t . k_j) u_j``.

    Args:
        q, k: [n, H, dk] (k l2-normalised, q also scaled); v: [n, H, dv]; g, beta: [n, H]
            (``g <= 0``), all float32, nodes in ``parent < child`` order.
        state: the root's incoming state [H, dk, dv] (float32).
        anc: :func:`ancestor_matrix` of the tree, on the tensors' device.

    Returns:
        ``(out [n, H, dv], u [H, n, dv], decay [H, n, n], G [H, n])``, ``decay[h, t, j] =
        e^{G_t - G_j}`` where j is t or an ancestor of t, else 0: with the root state they give
        any node's state (:func:`path_state`).
    """
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, n, d]
    cum = (anc.to(g.dtype) @ g).T  # [H, n]: G_t, the log decay from the root state to node t
    diff = cum[:, :, None] - cum[:, None, :]
    decay = diff.masked_fill(~anc, float("-inf")).exp()  # [H, n, n], 0 off the ancestor paths
    strict = decay.masked_fill(torch.eye(len(anc), dtype=torch.bool, device=anc.device), 0.0)
    bh = beta.T[..., None]  # [H, n, 1]
    lower = (kh @ kh.transpose(-1, -2)) * strict * bh
    grow = cum.exp()[..., None]  # [H, n, 1]
    rhs = bh * (vh - grow * (kh @ state))
    u = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    out = grow * (qh @ state) + ((qh @ kh.transpose(-1, -2)) * decay) @ u
    return out.transpose(0, 1), u, decay, cum


def path_state(state: Tensor, k: Tensor, u: Tensor, decay: Tensor, cum: Tensor, node: int) -> Tensor:
    """Node ``node``'s state [H, dk, dv] from :func:`tree_delta_rule`'s outputs and the root state."""
    w = decay[:, node, :, None] * u  # [H, n, dv], 0 off the node's path
    return cum[:, node, None, None].exp() * state + k.transpose(0, 1).transpose(-1, -2) @ w


class TreeStates:
    """One verify forward's tree and the per-node linear-layer inputs it recorded.

    Args:
        modules: the target's gated delta-net modules (:func:`linear_attention_modules`).
        parents: parent index per node (``-1`` for the root, ``parent < child``).
        depths: depth per node (root 0); the ancestor matrix implies them, kept for the callers.
    """

    def __init__(self, modules: Sequence[nn.Module], parents: Sequence[int], depths: Sequence[int]) -> None:
        self.modules = list(modules)
        self.parents = list(parents)
        self.n = len(parents)
        self._anc = ancestor_matrix(self.parents)
        self.records: dict[int, tuple[Tensor, ...]] = {}
        self._windows: dict[tuple[int, str], Tensor] = {}

    # ------------------------------------------------------------------ the verify forward

    def install(self) -> None:
        """Route every linear layer's forward through :meth:`_forward` (undo with :meth:`remove`)."""
        for mod in self.modules:
            mod.forward = self._bound(mod)

    def remove(self) -> None:
        for mod in self.modules:
            mod.__dict__.pop("forward", None)

    def _bound(self, mod: nn.Module) -> Any:
        def forward(hidden_states: Tensor, cache: Any = None, attention_mask: Any = None, **_: Any) -> Tensor:
            return self._forward(mod, hidden_states, cache)

        return forward

    def _window(self, kernel: int, device: torch.device) -> Tensor:
        """[n, K] column indices into ``cat(conv_state [C, K], inputs [C, n])``, oldest first."""
        key = (kernel, str(device))
        if key not in self._windows:
            rows = []
            for i in range(self.n):
                cur, back, row = i, 0, []
                for _ in range(kernel):
                    if cur >= 0:
                        row.append(kernel + cur)
                        cur = self.parents[cur]
                    else:
                        row.append(kernel - 1 - back)
                        back += 1
                rows.append(row[::-1])
            self._windows[key] = torch.tensor(rows, device=device)
        return self._windows[key]

    def _forward(self, mod: nn.Module, hidden: Tensor, cache: Any) -> Tensor:
        from transformers.activations import ACT2FN

        layer = cache.layers[mod.layer_idx]
        conv_state, state0 = layer.conv_states[0], layer.recurrent_states[0]
        if conv_state is None or state0 is None:
            raise RuntimeError("tree verification needs a prefilled cache (linear-attention state missing)")
        if hidden.shape[0] != 1 or hidden.shape[1] != self.n:
            raise ValueError(f"tree verification expects [1, {self.n}, H] hidden states, got {list(hidden.shape)}")
        n, dt = self.n, hidden.dtype
        x = mod.in_proj_qkv(hidden)[0]  # [n, C] pre-conv inputs
        z = mod.in_proj_z(hidden).reshape(n, -1, mod.head_v_dim)
        beta = mod.in_proj_b(hidden)[0].sigmoid().float()  # [n, Hv]
        g = -mod.A_log.float().exp() * F.softplus(mod.in_proj_a(hidden)[0].float() + mod.dt_bias)  # [n, Hv]

        weight = mod.conv1d.weight[:, 0, :]  # [C, K]
        kernel = weight.shape[-1]
        ext = torch.cat([conv_state[0][:, -kernel:], x.T.to(conv_state.dtype)], dim=-1).to(weight.dtype)
        conv = (ext[:, self._window(kernel, ext.device)] * weight[:, None, :]).sum(-1)  # [C, n]
        if mod.conv1d.bias is not None:
            conv = conv + mod.conv1d.bias[:, None]
        conv = ACT2FN[mod.activation](conv).to(dt).T  # [n, C]
        q, k, v = torch.split(conv, [mod.key_dim, mod.key_dim, mod.value_dim], dim=-1)
        q = q.reshape(n, -1, mod.head_k_dim).float()
        k = k.reshape(n, -1, mod.head_k_dim).float()
        v = v.reshape(n, -1, mod.head_v_dim).float()
        rep = v.shape[1] // k.shape[1]
        if rep > 1:  # each q/k head serves `rep` consecutive value heads
            q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
        q = _l2norm(q) / math.sqrt(q.shape[-1])
        k = _l2norm(k)

        if self._anc.device != k.device:
            self._anc = self._anc.to(k.device)
        out, u, decay, cum = tree_delta_rule(q, k, v, g, beta, state0[0].float(), self._anc)
        self.records[mod.layer_idx] = (x, k, u, decay, cum)
        core = mod.norm(out.to(dt).reshape(-1, mod.head_v_dim), z.reshape(-1, mod.head_v_dim))
        return mod.out_proj(core.reshape(1, n, -1))

    # ------------------------------------------------------------------ after acceptance

    @torch.no_grad()
    def commit(self, cache: Any, path: Sequence[int]) -> None:
        """Advance every linear layer's cached conv window and recurrent state along ``path``.

        ``path``: accepted node indices from the root (``path[0] == 0``), each the previous
        one's child.
        """
        path = list(path)
        if path and path[0] != 0:
            raise ValueError(f"commit path {path} does not start at the root (node 0)")
        for a, b in zip(path, path[1:]):
            if self.parents[b] != a:
                raise ValueError(f"commit path {path} is not a root path: node {b}'s parent is {self.parents[b]}")
        if not path:
            self.records.clear()
            return
        idx = torch.tensor(path)
        for mod in self.modules:
            x, k, u, decay, cum = self.records[mod.layer_idx]
            layer = cache.layers[mod.layer_idx]
            conv_state, state = layer.conv_states[0], layer.recurrent_states[0]
            state.copy_(path_state(state[0].float(), k, u, decay, cum, path[-1])[None].to(state.dtype))
            kernel = conv_state.shape[-1]
            window = torch.cat([conv_state[0], x[idx.to(x.device)].T.to(conv_state.dtype)], dim=-1)[:, -kernel:]
            conv_state.copy_(window[None])
        self.records.clear()
