"""Run specdeck's drafter under an engine's rule: "tau as that engine serves it".

:func:`engine_rule_config` rewrites a :class:`~core.ml.formats.drafter_config.DFlashConfig` so that
its per-layer attention (docs/drafter.md §5) is the one an engine's table
(:mod:`core.ml.engines.rules`) says the engine will apply to the same ``config.json``: e.g. for
llama.cpp at 0c1e570 a drafter with sliding layers and no causal key runs every layer
non-causal, windowed where llama.cpp writes the window. Everything else (weights, taps, mask,
knobs) is kept, so an eval on the same prompts measures the rule's effect alone. A drafter
the engine already reads as specdeck does comes back unchanged.

The rule covers the engine's end of generation too (:func:`end_of_generation`): under
llama.cpp's, the rounds near ``max_new_tokens`` run as its server runs them (a full block, the
draft cut to the tokens left - 1, :data:`core.ml.measure.tau.FULL_BLOCK`), not as the reference does
(the last blocks shrunk), so specdeck and ``eval --engine llama.cpp`` agree to the last round.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from core.ml.engines.rules import FULL, SLIDING, engine
from core.ml.formats.drafter_config import DFlashConfig
from core.ml.measure.tau import FULL_BLOCK, SHRINK


def engine_rule_config(cfg: DFlashConfig, raw: dict[str, Any], name: str) -> DFlashConfig:
    """``cfg`` with the attention engine ``name`` applies to ``raw`` (the drafter's config.json).

    Raises:
        ValueError: an unknown engine, or an engine rule specdeck's config cannot state (a
            per-layer causality other than "all the same" or "causal exactly where sliding",
            or two windows); the message names the layers.
    """
    reading = engine(name).read(raw)
    layers = reading.layers
    if len(layers) != cfg.num_hidden_layers:
        raise ValueError(f"{reading.engine} reads {len(layers)} layers, the drafter has {cfg.num_hidden_layers}")
    windows = {r.window for r in layers if r.window}
    if len(windows) > 1:
        raise ValueError(f"{reading.engine} applies windows {sorted(windows)}; specdeck has one sliding_window")
    causal = [r.causal for r in layers]
    types = [SLIDING if r.window else FULL for r in layers]
    dflash = {k: v for k, v in cfg.dflash_extra.items() if k not in ("is_causal", "causal")}
    if len(set(causal)) == 1:
        top = causal[0]
    elif causal == [t == SLIDING for t in types]:
        top = None  # specdeck's own layer_types rule states it
    else:
        raise ValueError(f"{reading.engine} runs layers {[i for i, c in enumerate(causal) if c]} causal and the "
                         "others not, which neither a global causal flag nor layer_types can state")
    out = dataclasses.replace(cfg, layer_types=types, sliding_window=windows.pop() if windows else None,
                              is_causal=top, dflash_extra=dflash)
    got = [(r.causal, r.window) for r in out.attention_rules()]
    if got != [(r.causal, r.window) for r in layers]:  # pragma: no cover - the construction above guarantees it
        raise AssertionError(f"engine rule {reading.engine}: built {got}")
    return out


def end_of_generation(name: str) -> str:
    """How engine ``name`` runs the rounds near the token limit: its table's
    ``end_of_generation``, else the reference's (:data:`core.ml.measure.tau.SHRINK`: not read from that
    engine's source, so nothing is changed)."""
    return engine(name).end_of_generation or SHRINK


def same_rule(a: DFlashConfig, b: DFlashConfig) -> bool:
    """Whether two configs give every layer the same attention."""
    return a.attention_rules() == b.attention_rules()


def use_engine_rule(drafter: Any, path: str, name: str) -> dict[str, Any]:
    """Make a loaded drafter (:func:`core.ml.models.drafter.load_drafter`) run under engine ``name``'s
    rule for the config.json in ``path``: its config and every layer's attention rule are
    replaced (the masks are built from them on every call). Returns the record eval writes
    into result.json (``drafter.engine_rule``).

    Raises:
        UsageError: the rule cannot be stated for this drafter (see :func:`engine_rule_config`).
    """
    from core.ml.formats.drafter_config import read_config_file
    from core.ml.formats.runio import UsageError, say

    raw = read_config_file(path)  # every field an engine table reads, checked
    before = drafter.config
    try:
        after = engine_rule_config(before, raw, name)
    except ValueError as exc:
        raise UsageError(f"--engine-rule {name}: {exc}") from None
    reading = engine(name).read(raw)
    drafter.config = after
    for layer, rule in zip(drafter.layers, after.attention_rules()):
        layer.self_attn.rule = rule
    changed = not same_rule(before, after)
    end = end_of_generation(name)
    say(f"engine rule {reading.engine} ({reading.revision}): "
        + (f"the drafter runs {after.attention_text()}" if changed else "the same attention as specdeck's")
        + ("; the last rounds as its server runs them (a full block, the draft cut to the tokens left - 1)"
           if end == FULL_BLOCK else ""))
    return {"engine": reading.engine, "revision": reading.revision, "changed": changed,
            "specdeck_attention": before.attention_summary(), "attention": after.attention_summary(),
            "end_of_generation": end}
