"""The target model during speculative decoding: prefill, verify, and exact cache rollback.

Verification runs the target on tokens that may be rejected, so the cache must be rolled back
to the accepted prefix after each round. How depends on the cache layers
(transformers 5.24, see environment.md "Caches in transformers 5.24"):

* ``crop``: every layer is a plain attention ``DynamicLayer`` (Qwen3, Llama, ...): drop or
  index-select K/V rows. Cheap and exact.
* ``state``: attention layers plus gated delta-net linear-attention layers (hybrid ``qwen3_5``:
  conv and recurrent state, which cannot be cropped). Verification runs the linear layers
  tree-aware (:mod:`core.ml.models.hybrid`): every block position / tree node gets its own state in the
  one verify forward, the cache is left untouched, and after acceptance the accepted path's
  states are advanced from the recorded per-node inputs. One target forward per round, chain
  or tree, each node fed once.
* ``recompute``: any other cache layout: reset and re-run the whole committed sequence.

Draft trees (DDTree) are verified in one forward with a 4-D ancestor mask on the attention
layers (and tree-aware linear layers on hybrid targets).

Counts: every target forward and every token fed to it (prefill included, batch rows times
width for the recompute fallback) add to :attr:`TargetRunner.forwards` / :attr:`TargetRunner.tokens`,
reset by :meth:`TargetRunner.prefill`: the noise-free cost of a generation.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from core.ml.models.features import FeatureTap

try:  # transformers >= 5 layouts
    from transformers.cache_utils import DynamicCache, DynamicLayer
    from transformers.cache_utils import LinearAttentionLayer as _LinearLayer
except ImportError:  # pragma: no cover - older transformers
    from transformers import DynamicCache

    DynamicLayer = _LinearLayer = None  # type: ignore[assignment,misc]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``auto``/None -> cuda when available else cpu."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device,
                  stored: torch.dtype | None = None) -> torch.dtype:
    """``auto``/None -> the checkpoint's own dtype ``stored`` (never upcast: a bf16 27B target
    stays 54 GB, not 108), else bfloat16 on CUDA and float32 on CPU; or the named dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if stored is not None:
            return stored
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r} (float32, bfloat16, float16, auto)") from None


def half_matmul_note(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why a speed measured on this host says little, or None: a CPU without matrix
    instructions for ``dtype`` (bf16: AVX512-BF16 or AMX; fp16: AMX-FP16) computes a forward of
    B rows as about B one-row ones (:mod:`core.ml.models.cpu_rows` halves it), so a speculative round of
    B positions costs several decode steps here (bench/eval_speed.py measures it) while tau is
    unaffected."""
    from core.ml.models.cpu_rows import needed

    if not needed(dtype, device):  # a GPU, float32, native instructions, or this torch cannot tell
        return None
    name = str(dtype).removeprefix("torch.")
    return (f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no {name} matrix instructions: a forward "
            f"of B rows costs several one-row forwards (torch's own kernel: about B; --cpu-matmul auto's float32 "
            f"tiles: about half that), so a round of B positions costs several decode steps and the speedup "
            f"measured here is no guide to a GPU or AMX host (tau is unaffected); bench/eval_speed.py shows the bound")


def load_target(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> nn.Module:
    """Load a local causal LM directory with SDPA attention (never touches a hub).

    ``dtype`` None keeps the checkpoint's dtype; in that dtype transformers memory-maps the
    safetensors weights on CPU instead of copying them (a load costs about the weight bytes,
    touched pages only).
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from core.ml.formats.weights import checkpoint_dtype

    hf_logging.disable_progress_bar()  # stderr is for our messages; stdout stays JSON lines
    if dtype is None:
        dtype = checkpoint_dtype(path) or torch.float32
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=dtype, attn_implementation="sdpa", local_files_only=True
    )
    return model.to(device).eval()


#: Files that hold a tokenizer's vocabulary; a directory without any of them has no tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tekken.json")


def has_tokenizer(path: str | Path) -> bool:
    """Does ``path`` really hold a tokenizer (a vocabulary file, not only a config)?"""
    path = Path(path)
    return any((path / f).is_file() for f in TOKENIZER_FILES) or any(path.glob("*.tiktoken"))


def load_tokenizer(path: str | Path) -> Any | None:
    """The target directory's tokenizer, or None when the directory holds none.

    transformers 5 builds a default tokenizer (EOS id 0) for a directory without tokenizer
    files; its ids would stop generation at an ordinary token, so none is loaded then.
    """
    from transformers import AutoTokenizer

    if not has_tokenizer(path):
        return None
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, TypeError):
        return None


def stop_token_ids(model: nn.Module, tokenizer: Any | None = None) -> list[int]:
    """Stop ids as the reference benchmark takes them (z-lab ``dflash`` 0.1.0 ``stop_token_ids``):
    the model's ``generation_config.eos_token_id`` (an int or a list; transformers derives the
    generation config from config.json when the directory has no generation_config.json),
    else the tokenizer's EOS (from :func:`load_tokenizer`, so only one the target directory
    really holds). Not their union: a stop id the reference does not use would end specdeck's
    generations earlier than the reference's and change every round after it."""
    for src in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(src, "eos_token_id", None)
        if isinstance(eos, int):
            return [eos]
        if isinstance(eos, (list, tuple)) and eos:
            return [int(e) for e in eos]
    return []


def cache_kwarg(model: nn.Module) -> str:
    """Name of the cache argument of ``model.forward`` (``cache`` in 5.24, else ``past_key_values``)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model: nn.Module) -> Any:
    """A fresh ``DynamicCache`` laid out for ``model`` (hybrid-aware)."""
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # pragma: no cover - old signature
        return DynamicCache()


class TargetRunner:
    """Stateful target for one generation: committed ids, cache and feature taps.

    Args:
        model: a transformers causal LM (eval mode).
        layer_ids: tapped decoder layers for drafter features (None: no features).
    """

    def __init__(self, model: nn.Module, layer_ids: Sequence[int] | None = None) -> None:
        from core.ml.models.hybrid import linear_attention_modules

        self.model = model
        self.device = next(model.parameters()).device
        self.tap = FeatureTap(model, layer_ids) if layer_ids else None
        self._cache_kw = cache_kwarg(model)
        self._keep_kw = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._linear_modules = linear_attention_modules(model)
        self.forwards = self.tokens = 0
        self.reset()

    # ------------------------------------------------------------------ state

    def reset(self) -> None:
        """Drop the cache and the committed ids."""
        self.cache = new_cache(self.model)
        self.ids: list[int] = []  # tokens whose K/V (or state) are in the cache
        self._pending: dict[str, Any] | None = None
        self.strategy = self._strategy()

    def _strategy(self) -> str:
        layers = getattr(self.cache, "layers", None)
        if not layers or DynamicLayer is None:
            return "recompute" if layers is not None else "crop"
        kinds = {type(layer) for layer in layers}
        if kinds <= {DynamicLayer}:
            return "crop"
        if kinds <= {DynamicLayer, _LinearLayer} and self._linear_modules:
            return "state"
        return "recompute"

    @property
    def length(self) -> int:
        """Number of committed tokens in the cache."""
        return len(self.ids)

    def counts(self) -> dict[str, int]:
        """Target forwards and tokens fed since the last :meth:`prefill` (prefill included)."""
        return {"target_forwards": self.forwards, "target_tokens": self.tokens}

    def close(self) -> None:
        if self.tap is not None:
            self.tap.close()

    # ------------------------------------------------------------------ forward

    def _forward(self, ids: Tensor, positions: Tensor, mask: Any = None,
                 last_only: bool = False) -> tuple[Tensor, Tensor | None]:
        # ids/positions: [b, n] -> logits [b, n or 1, V] (float32), feats [b, n, K*H] | None
        kwargs: dict[str, Any] = {self._cache_kw: self.cache, "use_cache": True, "position_ids": positions}
        if mask is not None:
            kwargs["attention_mask"] = mask
        if last_only and self._keep_kw:
            kwargs["logits_to_keep"] = 1
        need_hs = self.tap is not None and self.tap.needs_hidden_states
        if need_hs:
            kwargs["output_hidden_states"] = True
        self.forwards += 1
        self.tokens += ids.numel()
        out = self.model(ids, **kwargs)
        feats = self.tap.pop_from(getattr(out, "hidden_states", None)) if self.tap is not None else None
        logits = out.logits[:, -1:] if last_only else out.logits
        return logits.float(), feats

    def _positions(self, n: int, batch: int = 1) -> Tensor:
        return torch.arange(self.length, self.length + n, device=self.device).expand(batch, n)

    @torch.no_grad()
    def prefill(self, input_ids: Sequence[int]) -> tuple[Tensor, Tensor | None]:
        """Run the prompt. Returns (logits of the last position [V], features [1, P, K*H])."""
        self.reset()
        self.forwards = self.tokens = 0
        ids = torch.tensor([list(input_ids)], device=self.device)
        logits, feats = self._forward(ids, self._positions(ids.shape[1]), last_only=True)
        self.ids = list(input_ids)
        return logits[0, -1], feats

    @torch.no_grad()
    def verify_chain(self, block: Sequence[int]) -> tuple[Tensor, Tensor | None]:
        """Feed ``block`` after the committed tokens; call :meth:`commit_chain` next.

        Returns:
            logits [n, V] (float32) and features [1, n, K*H] of the block positions.
        """
        n = len(block)
        if self.strategy == "state":
            logits, feats, states = self._verify_states(block, [-1, *range(n - 1)], list(range(n)), tree=False)
        else:
            states = None
            logits, feats = self._forward(torch.tensor([list(block)], device=self.device), self._positions(n))
            logits = logits[0]
        self._pending = {"kind": "chain", "tokens": list(block), "states": states}
        return logits, feats

    @torch.no_grad()
    def commit_chain(self, n_keep: int) -> None:
        """Keep the first ``n_keep`` tokens of the last :meth:`verify_chain` in the cache."""
        p, self._pending = self._pending, None
        assert p is not None and p["kind"] == "chain", "commit_chain without verify_chain"
        tokens = p["tokens"]
        if self.strategy == "recompute" and n_keep < len(tokens):
            self._recompute(self.ids + tokens[:n_keep])
            return
        if p["states"] is not None:
            p["states"].commit(self.cache, range(n_keep))
        self._crop_attention(len(tokens) - n_keep)
        self.ids += tokens[:n_keep]

    @torch.no_grad()
    def verify_tree(self, tokens: Sequence[int], parents: Sequence[int], depths: Sequence[int]) -> tuple[Tensor, Tensor | None]:
        """Verify a draft tree (node 0 = root = last committed-but-uncached token).

        Args:
            tokens: node tokens, ``tokens[0]`` the root.
            parents: parent index per node (``-1`` for the root; parent < child).
            depths: depth per node (root 0).

        Returns:
            logits [n, V] and features [1, n, K*H] per node; call :meth:`commit_tree` next.
        """
        states = None
        if self.strategy == "crop":
            ids = torch.tensor([list(tokens)], device=self.device)
            pos = torch.tensor([list(depths)], device=self.device) + self.length
            mask = tree_attention_mask(parents, self.length, self.model.dtype, self.device)
            logits, feats = self._forward(ids, pos, mask=mask)
            logits = logits[0]
        elif self.strategy == "state":
            logits, feats, states = self._verify_states(tokens, parents, depths, tree=True)
        else:
            logits, feats = self._verify_paths(tokens, parents)
        self._pending = {"kind": "tree", "tokens": list(tokens), "states": states}
        return logits, feats

    @torch.no_grad()
    def commit_tree(self, accepted: Sequence[int]) -> None:
        """Keep the root-to-node path ``accepted`` (node indices, starting with 0)."""
        p, self._pending = self._pending, None
        assert p is not None and p["kind"] == "tree", "commit_tree without verify_tree"
        keep_tokens = [p["tokens"][i] for i in accepted]
        if self.strategy == "recompute":
            self._rerun(keep_tokens)  # path verification left the cache at the committed prefix
            return
        if p["states"] is not None:
            p["states"].commit(self.cache, accepted)
        past, n = self.length, len(accepted)
        tail = torch.tensor([past + i for i in accepted], device=self.device)
        for layer in self._attention_layers():  # only the tree's rows move (not a copy of the whole cache)
            for name in ("keys", "values"):
                rows = getattr(layer, name)
                rows[..., past : past + n, :] = rows.index_select(-2, tail)
                setattr(layer, name, rows[..., : past + n, :])
        self.ids += keep_tokens

    # ------------------------------------------------------------------ helpers

    def _verify_states(self, tokens: Sequence[int], parents: Sequence[int], depths: Sequence[int],
                       tree: bool) -> tuple[Tensor, Tensor | None, Any]:
        """One forward over all nodes, linear layers tree-aware (hybrid targets)."""
        from core.ml.models.hybrid import TreeStates

        states = TreeStates(self._linear_modules, parents, depths)
        ids = torch.tensor([list(tokens)], device=self.device)
        if tree:
            pos = torch.tensor([list(depths)], device=self.device) + self.length
            mask: Any = {"full_attention": tree_attention_mask(parents, self.length, self.model.dtype, self.device),
                         "linear_attention": None}
        else:
            pos, mask = self._positions(len(tokens)), None
        states.install()
        try:
            logits, feats = self._forward(ids, pos, mask=mask)
        finally:
            states.remove()
        return logits[0], feats, states

    def _attention_layers(self) -> list[Any]:
        return [layer for layer in self.cache.layers
                if (DynamicLayer is None or isinstance(layer, DynamicLayer)) and getattr(layer, "keys", None) is not None]

    def _crop_attention(self, n: int) -> None:
        if n > 0:
            for layer in self._attention_layers():
                layer.keys = layer.keys[..., : layer.keys.shape[-2] - n, :]
                layer.values = layer.values[..., : layer.values.shape[-2] - n, :]

    def _rerun(self, tokens: Sequence[int]) -> None:
        if tokens:
            ids = torch.tensor([list(tokens)], device=self.device)
            self._forward(ids, self._positions(len(tokens)), last_only=True)
            self.ids += list(tokens)

    def _recompute(self, all_ids: list[int]) -> None:
        self.cache = new_cache(self.model)
        self.ids = []
        self._rerun(all_ids)

    def _verify_paths(self, tokens: Sequence[int], parents: Sequence[int]) -> tuple[Tensor, Tensor | None]:
        """Fallback for unknown cache layouts: each root-to-leaf path re-run with the committed
        ids on a scratch cache (the real cache is left at the committed prefix)."""
        n = len(tokens)
        has_child = [False] * n
        for i in range(1, n):
            has_child[parents[i]] = True
        paths = []
        for leaf in (i for i in range(n) if not has_child[i]):
            path, cur = [], leaf
            while cur != -1:
                path.append(cur)
                cur = parents[cur]
            paths.append(path[::-1])
        width = max(len(p) for p in paths)
        rows = torch.tensor([[tokens[i] for i in p] + [tokens[0]] * (width - len(p)) for p in paths], device=self.device)
        past = self.length
        saved, saved_ids = self.cache, list(self.ids)
        self.cache, self.ids = new_cache(self.model), []
        prefix = torch.tensor([saved_ids], device=self.device)
        full = torch.cat([prefix.expand(len(paths), -1), rows], dim=1)
        logits, feats = self._forward(full, torch.arange(past + width, device=self.device).expand(len(paths), -1))
        logits, feats = logits[:, past:], (feats[:, past:] if feats is not None else None)
        self.cache, self.ids = saved, saved_ids
        # node -> (row, col) of its first occurrence
        where: dict[int, tuple[int, int]] = {}
        for r, p in enumerate(paths):
            for c, node in enumerate(p):
                where.setdefault(node, (r, c))
        r_idx = torch.tensor([where[i][0] for i in range(n)], device=self.device)
        c_idx = torch.tensor([where[i][1] for i in range(n)], device=self.device)
        node_feats = feats[r_idx, c_idx][None] if feats is not None else None
        return logits[r_idx, c_idx], node_feats


def tree_attention_mask(parents: Sequence[int], past: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Additive 4-D mask [1, 1, n, past + n]: 0 for all past columns and for ancestors/self.

    Node i may see node j iff j is i or an ancestor of i (``vis[i] = vis[parent[i]] | {i}``).
    """
    from core.ml.models.hybrid import ancestor_matrix

    n = len(parents)
    vis = ancestor_matrix(parents)
    allowed = torch.cat([torch.ones(n, past, dtype=torch.bool), vis], dim=1)
    mask = torch.zeros(n, past + n, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)
