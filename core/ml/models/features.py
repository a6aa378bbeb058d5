"""Target context features for DFlash (docs/drafter.md §2).

The feature of tapped layer id ``l`` (0-based decoder layer) is the output of decoder layer
``l``, which is ``hidden_states[l + 1]`` in transformers' ``output_hidden_states`` indexing
(index 0 is the embedding output). Features of several ids are concatenated on the last dim,
in the order of ``target_layer_ids``.

Two equivalent ways to get them, both here:

* :func:`context_features` picks ``hidden_states[id + 1]`` from an ``output_hidden_states``
  run (keeps every layer's states alive: simple, more memory);
* :class:`FeatureTap` registers forward hooks on the tapped decoder layers only (what the
  hosts use: memory is K layers, not N + 1). In transformers 5 the last entry of
  ``hidden_states`` is taken *after* the final norm, so a tap of the last layer hooks the final
  norm to stay equal to ``hidden_states[N]``.

Tests prove tap == ``hidden_states[id + 1]`` for every id, for Qwen3 and hybrid Qwen3.5.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn


def context_features(hidden_states: Sequence[Tensor], layer_ids: Sequence[int]) -> Tensor:
    """Concatenate ``hidden_states[id + 1]`` for each id: -> [b, n, K*H].

    Args:
        hidden_states: transformers' ``output.hidden_states`` (num_layers + 1 tensors [b, n, H]).
        layer_ids: 0-based decoder layer ids (z-lab ``target_layer_ids``).
    """
    n_layers = len(hidden_states) - 1
    for i in layer_ids:
        if not 0 <= i < n_layers:
            raise ValueError(f"layer id {i} outside 0..{n_layers - 1}")
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def decoder_parts(model: nn.Module) -> tuple[nn.ModuleList, nn.Module | None] | None:
    """Find the decoder layer list and the final norm of a transformers causal LM.

    Returns:
        ``(layers, final_norm)`` or None when the layout is not recognised.
    """
    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if n is None and hasattr(model, "config") and hasattr(model.config, "get_text_config"):
        n = getattr(model.config.get_text_config(), "num_hidden_layers", None)
    base = model.get_decoder() if hasattr(model, "get_decoder") else None
    for root in (base, getattr(model, "model", None), model):
        if root is None:
            continue
        layers = getattr(root, "layers", None)
        if isinstance(layers, nn.ModuleList) and (n is None or len(layers) == n):
            return layers, getattr(root, "norm", None)
    return None


class FeatureTap:
    """Forward hooks capturing ``hidden_states[id + 1]`` of the tapped layers.

    Use as a context manager around target forwards; :meth:`pop` returns the features of the
    most recent forward and clears them::

        with FeatureTap(model, [1, 9, 17]) as tap:
            out = model(input_ids)
            feats = tap.pop()          # [b, n, 3*H]

    If the decoder layout is not recognised, :attr:`needs_hidden_states` is True and the caller
    must pass ``output_hidden_states=True`` and call :meth:`pop_from` instead.
    """

    def __init__(self, model: nn.Module, layer_ids: Sequence[int]) -> None:
        self.model = model
        self.layer_ids = [int(i) for i in layer_ids]
        self._out: dict[int, Tensor] = {}
        self._handles: list[Any] = []
        parts = decoder_parts(model)
        self.needs_hidden_states = parts is None
        if parts is not None:
            layers, norm = parts
            n = len(layers)
            for i in self.layer_ids:
                if not 0 <= i < n:
                    raise ValueError(f"layer id {i} outside 0..{n - 1}")
                # transformers 5: hidden_states[n] is the final-norm output, not layer n-1's.
                module = norm if (i == n - 1 and norm is not None) else layers[i]
                self._handles.append(module.register_forward_hook(self._hook(i)))

    def _hook(self, i: int):
        def fn(_mod: nn.Module, _inp: Any, out: Any) -> None:
            self._out[i] = out[0] if isinstance(out, (tuple, list)) else out

        return fn

    def pop(self) -> Tensor:
        """Features of the last forward: [b, n, K*H]."""
        if self.needs_hidden_states:
            raise RuntimeError("FeatureTap could not hook this model; use pop_from(hidden_states)")
        missing = [i for i in self.layer_ids if i not in self._out]
        if missing:
            raise RuntimeError(f"no captured output for layers {missing}; did a forward run?")
        feats = torch.cat([self._out[i] for i in self.layer_ids], dim=-1)
        self._out.clear()
        return feats

    def pop_from(self, hidden_states: Sequence[Tensor] | None) -> Tensor:
        """Hook features when available, else ``hidden_states[id + 1]`` of the output."""
        if not self.needs_hidden_states:
            return self.pop()
        if hidden_states is None:
            raise RuntimeError("model output has no hidden_states; pass output_hidden_states=True")
        return context_features(hidden_states, self.layer_ids)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._out.clear()

    def __enter__(self) -> FeatureTap:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@torch.no_grad()
def target_features(model: nn.Module, input_ids: Tensor, layer_ids: Sequence[int], **kwargs: Any) -> tuple[Any, Tensor]:
    """One target forward returning ``(output, features [b, n, K*H])``.

    Args:
        model: any transformers causal LM.
        input_ids: [b, n].
        layer_ids: 0-based tapped decoder layers.
        **kwargs: passed to the model (e.g. ``logits_to_keep``).
    """
    with FeatureTap(model, layer_ids) as tap:
        if tap.needs_hidden_states:
            kwargs["output_hidden_states"] = True
        out = model(input_ids, **kwargs)
        return out, tap.pop_from(getattr(out, "hidden_states", None))
