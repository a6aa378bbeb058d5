"""One rule table per serving engine: what it reads from a drafter's ``config.json``.

Each table restates, in our words, what the engine's loader does at one revision (the
sources are named in :data:`ENGINES` and in docs/serving.md §2); it never imports the engine.
A reading (:class:`EngineReading`) says, for every draft layer, the causality and window the
engine will apply, which target layers it taps, the mask token, the block size, the keys it
ignores and the fields it needs that are missing. The tables read the raw dict, not
:class:`~core.ml.formats.drafter_config.DFlashConfig`: an engine sees keys specdeck refuses or resolves
otherwise, and that is the point. The raw dict they get has had every key they read checked
(:func:`core.ml.formats.drafter_config.check_fields`: types, ranges, finite numbers), so a table
converts a value without meeting a list where a size goes or a NaN.

Conventions: ``target_layer_ids`` are 0-based target decoder layers whose *output* is the
feature (``hidden_states[id + 1]``), specdeck's meaning (docs/drafter.md §2), whatever form
the engine stores them in (``taps`` says that form).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.ml.formats.drafter_config import MAX_LAYERS
from core.ml.measure.tau import FULL_BLOCK

SLIDING, FULL = "sliding_attention", "full_attention"
KNOB_DEFAULTS = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None}
MONOTONE_KNOBS = ("output_multiplier", "final_logit_softcapping")
"""Knobs that only rescale or soft-cap the draft logits: with a positive multiplier the argmax,
hence a greedy draft, is the same with or without them."""


@dataclass(frozen=True)
class LayerReading:
    """The attention one draft layer gets in an engine: ``causal`` hides later block keys;
    ``window`` W shows keys p with ``q - W < p`` (None: no window)."""

    layer: int
    type: str
    causal: bool
    window: int | None

    def describe(self) -> str:
        kind = "causal" if self.causal else "non-causal"
        return f"{kind}, window {self.window}" if self.window else f"{kind}, full"


@dataclass(frozen=True)
class Finding:
    """One thing an engine does with a field, and what it changes.

    ``kind``: ``differs`` (the engine runs something other than specdeck measures),
    ``ignored`` (a key it does not read), ``missing`` (a field it needs), ``refused`` (it
    cannot load the drafter as written), ``note`` (how to serve it right).
    """

    kind: str
    field: str
    message: str


@dataclass(frozen=True)
class EngineReading:
    """What one engine will make of a drafter config."""

    engine: str
    revision: str
    layers: tuple[LayerReading, ...]
    causality_from: str
    target_layer_ids: tuple[int, ...] | None
    taps: str
    mask_token_id: int | None
    mask_from: str
    block_size: int | None
    block_from: str
    findings: tuple[Finding, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "revision": self.revision,
                "layers": [{"layer": r.layer, "type": r.type, "causal": r.causal, "window": r.window}
                           for r in self.layers],
                "causality_from": self.causality_from,
                "target_layer_ids": list(self.target_layer_ids) if self.target_layer_ids is not None else None,
                "taps": self.taps, "mask_token_id": self.mask_token_id, "mask_from": self.mask_from,
                "block_size": self.block_size, "block_from": self.block_from,
                "findings": [{"kind": f.kind, "field": f.field, "message": f.message} for f in self.findings]}


@dataclass(frozen=True)
class Engine:
    """An engine's table: its name, the revision read, the files, and the reader.

    ``end_of_generation``: how the engine runs the rounds near the token limit, where its
    source was read for it (:data:`core.ml.measure.tau.FULL_BLOCK` for llama.cpp); None where it was
    not, and an eval under the engine's rule keeps the reference's (:data:`core.ml.measure.tau.SHRINK`).
    """

    name: str
    revision: str
    sources: tuple[str, ...]
    read: Callable[[dict[str, Any]], EngineReading] = field(repr=False)
    end_of_generation: str | None = None


# ----------------------------------------------------------------------------- helpers


def zlab_view(raw: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The config as a z-lab-layout dict and whether it came from the speculators layout.

    A speculators config is turned around the way vLLM's ``update_dflash`` does it: the layer
    fields of ``transformer_layer_config`` at the top, ``dflash_config`` holding only
    ``mask_token_id`` and ``target_layer_ids = aux_hidden_state_layer_ids - 1``.
    """
    if raw.get("speculators_model_type") is None:
        return raw, False
    out = dict(raw.get("transformer_layer_config") or {})
    aux = raw.get("aux_hidden_state_layer_ids") or []
    out["dflash_config"] = {"mask_token_id": raw.get("mask_token_id"), "target_layer_ids": [int(i) - 1 for i in aux]}
    out["eagle_aux_hidden_state_layer_ids"] = list(aux)
    out["block_size"] = raw.get("block_size")
    return out, True


def dflash_of(cfg: dict[str, Any]) -> dict[str, Any]:
    value = cfg.get("dflash_config")
    return value if isinstance(value, dict) else {}


def num_layers(cfg: dict[str, Any]) -> int:
    n = cfg.get("num_hidden_layers") or len(layer_types_of(cfg) or []) or 0
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_LAYERS:
        raise ValueError(f"num_hidden_layers: {n!r} is not a layer count (an integer 0..{MAX_LAYERS})")
    return n


def layer_types_of(cfg: dict[str, Any]) -> list[str] | None:
    value = cfg.get("layer_types")
    return list(value) if isinstance(value, list) else None


def present_knobs(cfg: dict[str, Any], dflash: dict[str, Any], top_level: bool = True) -> dict[str, tuple[str, Any]]:
    """Knobs the config sets, key -> (where, value): ``dflash_config`` first, then the top level."""
    out = {}
    for name in KNOB_DEFAULTS:
        if name in dflash:
            out[name] = (f"dflash_config.{name}", dflash[name])
        elif top_level and name in cfg:
            out[name] = (name, cfg[name])
    return out


def knob_effect(name: str, value: Any) -> str:
    """What ignoring knob ``name`` = ``value`` does to a greedy draft."""
    if value == KNOB_DEFAULTS[name] or (name == "final_logit_softcapping" and not value):
        return "no effect (it is at its default)"
    if name in MONOTONE_KNOBS and (name != "output_multiplier" or float(value) > 0):
        return "greedy drafts are the same (a positive scale or a soft cap keeps the argmax); sampled drafts differ"
    return "the drafts differ from specdeck's (the block's embeddings or logits are not transformed)"


def ignored_knobs(cfg: dict[str, Any], dflash: dict[str, Any], read: set[str], engine: str,
                  top_level_read: bool = True) -> list[Finding]:
    """A finding per knob the config sets and ``engine`` does not read (``read``: the knobs it
    reads; ``top_level_read``: whether it also looks for them at the top level)."""
    out = []
    for name, (where, value) in present_knobs(cfg, dflash).items():
        if name in read and (top_level_read or where.startswith("dflash_config.")):
            continue
        out.append(Finding("ignored", where, f"{engine} does not read {where} = {value!r}: {knob_effect(name, value)}"))
    return out


def ids_or_none(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and value:
        return tuple(int(i) for i in value)
    return None


def default_taps(n_target: int, n_draft: int) -> tuple[int, ...]:
    """z-lab's ``build_target_layer_ids`` (SGLang carries the same formula)."""
    if n_draft == 1:
        return (n_target // 2,)
    start, end = 1, n_target - 3
    return tuple(int(round(start + i * (end - start) / (n_draft - 1))) for i in range(n_draft))


def dflash2(cfg: dict[str, Any]) -> bool:
    return "DFlash2DraftModel" in (cfg.get("architectures") or []) or "conv_kernel_size" in dflash_of(cfg)


# ----------------------------------------------------------------------------- vLLM

VLLM_REV = "vllm-project/vllm@036a00d1f5d0"
VLLM_SOURCES = (
    "vllm/model_executor/models/qwen3_dflash.py@036a00d1f5d0 (_dflash_layer_causal, _resolve_layer_attention)",
    "vllm/v1/spec_decode/dflash.py@01046b9a3384 (DFlashProposer: 1 + num_speculative_tokens query slots)",
    "vllm/transformers_utils/configs/speculators/algos.py@cfb173ab8e1b (update_dflash)",
)


def read_vllm(raw: dict[str, Any]) -> EngineReading:
    cfg, from_speculators = zlab_view(raw)
    dflash, types, n = dflash_of(cfg), layer_types_of(cfg), num_layers(cfg)
    findings: list[Finding] = []
    use_swa = bool(dflash.get("use_swa", False))
    any_sliding = bool(types) and SLIDING in types
    window = dflash.get("swa_window_size", cfg.get("sliding_window"))
    if cfg.get("is_causal") is not None:
        causal_all, source = bool(cfg["is_causal"]), "is_causal"
    elif dflash.get("causal") is not None:
        causal_all, source = bool(dflash["causal"]), "dflash_config.causal"
    else:
        causal_all, source = None, "layer_types"
    layers, needs_window = [], False
    for i in range(n):
        t = types[i] if types and i < len(types) else FULL
        sliding = use_swa if (types is None or (use_swa and not any_sliding)) else t == SLIDING
        causal = causal_all if causal_all is not None else (bool(types) and t == SLIDING)
        layers.append(LayerReading(i, t, causal, int(window) if sliding and window else None))
        needs_window |= sliding
    if needs_window and not window:
        findings.append(Finding("missing", "sliding_window", "vLLM raises: a sliding layer needs "
                                "dflash_config.swa_window_size or sliding_window"))
    if dflash.get("is_causal") is not None:
        findings.append(Finding("ignored", "dflash_config.is_causal", "vLLM reads top-level is_causal and "
                                "dflash_config.causal only; dflash_config.is_causal does not change its mask"))
    if from_speculators and raw.get("sliding_window_non_causal"):
        findings.append(Finding("ignored", "sliding_window_non_causal", "vLLM's update_dflash keeps only "
                                "mask_token_id and the taps: its sliding layers stay causal"))
    aux = ids_or_none(cfg.get("eagle_aux_hidden_state_layer_ids"))
    ids = ids_or_none(dflash.get("target_layer_ids"))
    if aux is not None:
        taps_ids, taps = tuple(i - 1 for i in aux), f"eagle_aux_hidden_state_layer_ids {list(aux)} (hidden_states indices)"
    elif ids is not None:
        taps_ids, taps = ids, f"hidden_states {[i + 1 for i in ids]} from dflash_config.target_layer_ids + 1"
    else:
        taps_ids, taps = None, "none"
        findings.append(Finding("missing", "dflash_config.target_layer_ids", "vLLM takes the taps from "
                                "dflash_config.target_layer_ids (speculators: aux_hidden_state_layer_ids); it has no default"))
    mask = dflash.get("mask_token_id", cfg.get("mask_token_id"))
    if mask is None:
        findings.append(Finding("missing", "dflash_config.mask_token_id", "vLLM fills the block with "
                                "dflash_config.mask_token_id; the config has none"))
    block = cfg.get("block_size") or dflash.get("block_size")
    findings.append(Finding("note", "block_size", "vLLM drafts num_speculative_tokens tokens per round "
                            f"(--speculative-config), not the config's block_size: set it to "
                            f"{(int(block) - 1) if block else 'B-1'}"))
    findings += ignored_knobs(cfg, dflash, set(), "vLLM")
    if types and 0 < types.count(SLIDING) < len(types):
        findings.append(Finding("note", "layer_types", "mixed sliding/full layers need VLLM_USE_V2_MODEL_RUNNER=1 "
                                "(qwen3_dflash raises NotImplementedError otherwise)"))
    if any(not r.causal for r in layers):
        findings.append(Finding("note", "attention backend", "non-causal draft layers need a backend that "
                                "supports them (FLASH_ATTN), as DFlashProposer asserts"))
    if dflash2(cfg):
        findings.append(Finding("refused", "architectures", "qwen3_dflash at this revision builds a DFlash-1 "
                                "stack; a DFlash-2 drafter's convolutions and selector are not run"))
    return EngineReading("vllm", VLLM_REV, tuple(layers), source, taps_ids, taps,
                         None if mask is None else int(mask), "dflash_config.mask_token_id",
                         None, "num_speculative_tokens + 1 (--speculative-config)", tuple(findings))


# ----------------------------------------------------------------------------- SGLang

SGLANG_REV = "sgl-project/sglang@003b23d7388e"
SGLANG_SOURCES = (
    "python/sglang/srt/models/dflash.py@003b23d7388e (_get_dflash_layer_attention_params)",
    "python/sglang/srt/speculative/dflash_utils.py@00731f0bc9fa (parse_dflash_draft_config)",
)


def read_sglang(raw: dict[str, Any]) -> EngineReading:
    findings: list[Finding] = []
    if raw.get("speculators_model_type") is not None:
        findings.append(Finding("refused", "speculators_model_type", "SGLang's DFlash loader reads dflash_config "
                                "and the top-level Qwen3 fields, which a speculators-layout config does not have: "
                                "serve the z-lab layout (specdeck export --format zlab)"))
    cfg, _ = zlab_view(raw)
    dflash, types, n = dflash_of(cfg), layer_types_of(cfg), num_layers(cfg)
    window = cfg.get("sliding_window")
    layers = []
    for i in range(n):
        t = types[i] if types and i < len(types) else FULL
        sliding = types is not None and t == SLIDING
        layers.append(LayerReading(i, t, sliding, int(window) if sliding and window else None))
    if types is not None and SLIDING in types and not window:
        findings.append(Finding("missing", "sliding_window", "SGLang raises: sliding_attention layers need sliding_window"))
    for key, value in (("is_causal", cfg.get("is_causal")), ("dflash_config.is_causal", dflash.get("is_causal")),
                       ("dflash_config.causal", dflash.get("causal"))):
        if value is not None:
            findings.append(Finding("ignored", key, f"SGLang ignores {key} = {value!r}: layer_types alone decide "
                                    "(full: non-causal, sliding: causal)"))
    ids = ids_or_none(dflash.get("target_layer_ids", cfg.get("target_layer_ids")))
    if ids is not None:
        taps, taps_ids = "dflash_config.target_layer_ids (captured before layer id + 1)", ids
    else:
        n_target = dflash.get("num_target_layers", cfg.get("num_target_layers"))
        if n_target is None:
            findings.append(Finding("differs", "num_target_layers", "no taps and no num_target_layers: SGLang spreads "
                                    f"the default taps over the draft's own {n} layers, not the target's"))
        taps_ids = default_taps(int(n_target or n), n) if (n_target or n) >= 4 or n == 1 else None
        taps = f"default build_target_layer_ids over {n_target or n} layers"
    mask = dflash.get("mask_token_id", cfg.get("mask_token_id"))
    mask_from = "dflash_config.mask_token_id" if mask is not None else \
        f"the tokenizer's {dflash.get('mask_token', '<|MASK|>')!r} token"
    if dflash.get("block_size") is not None and cfg.get("block_size") is not None \
            and int(dflash["block_size"]) != int(cfg["block_size"]):
        findings.append(Finding("differs", "block_size", f"SGLang reads dflash_config.block_size "
                                f"{dflash['block_size']} before the top-level {cfg['block_size']}"))
    block = dflash.get("block_size", cfg.get("block_size"))
    findings += ignored_knobs(cfg, dflash, {"output_multiplier", "final_logit_softcapping"}, "SGLang",
                              top_level_read=False)
    return EngineReading("sglang", SGLANG_REV, tuple(layers), "layer_types", taps_ids, taps,
                         None if mask is None else int(mask), mask_from,
                         int(block) if block is not None else 16,
                         "dflash_config.block_size, else block_size, else 16", tuple(findings))


# ----------------------------------------------------------------------------- llama.cpp

LLAMA_CPP_REV = "ggml-org/llama.cpp@0c1e57098bba (vendored in llama-cpp-python 0.3.36)"
LLAMA_CPP_SOURCES = (
    "conversion/qwen.py@0c1e57098bba (class DFlashModel: what convert_hf_to_gguf.py writes)",
    "common/speculative.cpp@0c1e57098bba (common_speculative_impl_draft_dflash: dflash.attention.causal, default false)",
    "src/models/dflash.cpp@0c1e57098bba (the draft graph: one causal flag, per-layer SWA)",
    "tools/server/server-context.cpp@0c1e57098bba (get_n_draft_max: the draft capped at n_remaining - 1; "
    "none with one token left)",
    "common/speculative.cpp@0c1e57098bba (common_speculative_draft: the DFlash block decoded whole, "
    "its draft then truncated to that cap)",
)


def read_llama_cpp(raw: dict[str, Any]) -> EngineReading:
    findings: list[Finding] = []
    if raw.get("speculators_model_type") is not None:
        findings.append(Finding("refused", "speculators_model_type", "convert_hf_to_gguf.py's DFlashModel reads "
                                "the z-lab top-level fields: convert the z-lab layout (specdeck export --format zlab)"))
    cfg, _ = zlab_view(raw)
    dflash, types, n = dflash_of(cfg), layer_types_of(cfg), num_layers(cfg)
    if cfg.get("is_causal") is not None:
        causal, source = bool(cfg["is_causal"]), "is_causal"
    elif dflash.get("causal") is not None:
        causal, source = bool(dflash["causal"]), "dflash_config.causal"
    else:
        causal, source = False, "default (dflash.attention.causal absent: non-causal)"
    use_swa = bool(cfg.get("use_sliding_window", False) or dflash.get("use_swa", False))
    window = dflash.get("swa_window_size") or cfg.get("sliding_window")
    layers = []
    for i in range(n):
        t = types[i] if types and i < len(types) else FULL
        swa = use_swa and bool(window) and (bool(dflash.get("use_swa")) or t == SLIDING)
        layers.append(LayerReading(i, t, causal, int(window) if swa else None))
    if types and SLIDING in types and not use_swa:
        findings.append(Finding("differs", "use_sliding_window", "the converter writes the window only when "
                                "use_sliding_window (or dflash_config.use_swa) is set: the sliding layers run "
                                "with no window at all"))
    if dflash.get("is_causal") is not None:
        findings.append(Finding("ignored", "dflash_config.is_causal", "the converter reads top-level is_causal, "
                                "else dflash_config.causal; dflash_config.is_causal is not read"))
    if types and SLIDING in types:
        findings.append(Finding("note", "causality", "llama.cpp has one causal flag for the whole draft "
                                "(dflash.attention.causal: top-level is_causal, else dflash_config.causal; "
                                "dflash_config.is_causal is not read; absent: non-causal), and writes the window "
                                "only when use_sliding_window or dflash_config.use_swa is set. No key gives sliding "
                                "layers causal and full layers non-causal at once: measure tau under this rule "
                                "with python -m core.ml.eval --engine-rule llama.cpp"))
    ids = ids_or_none(dflash.get("target_layer_ids", cfg.get("target_layer_ids")))
    if ids is None:
        findings.append(Finding("missing", "dflash_config.target_layer_ids", "the converter writes no "
                                "dflash.target_layers and the model refuses to load (\"requires 'target_layers'\")"))
    mask = dflash.get("mask_token_id")
    if mask is None:
        findings.append(Finding("missing", "dflash_config.mask_token_id", "the converter writes "
                                "tokenizer.ggml.mask_token_id from dflash_config.mask_token_id only"))
    block = dflash.get("block_size", cfg.get("block_size", 16))
    findings.append(Finding("note", "block_size", f"run llama-server with --spec-draft-n-max {int(block) - 1} "
                            "(its default is 3; a larger value is clamped to block_size - 1)"))
    findings += ignored_knobs(cfg, dflash, {"input_embedding_scale", "output_multiplier", "final_logit_softcapping"},
                              "llama.cpp")
    if not dflash2(cfg):
        for name, (where, value) in present_knobs(cfg, dflash).items():
            if name in MONOTONE_KNOBS and value not in (None, KNOB_DEFAULTS[name]):
                findings.append(Finding("ignored", where, f"written to the GGUF but applied only in a DFlash-2 "
                                        f"graph: {knob_effect(name, value)}"))
    findings.append(Finding("note", "target", "conversion needs the target's directory (--target-model-dir): "
                            "the draft GGUF takes the target's tokenizer, embedding and LM head"))
    return EngineReading("llama.cpp", LLAMA_CPP_REV, tuple(layers), source,
                         ids, f"dflash.target_layers {[i + 1 for i in ids] if ids else []} (target_layer_ids + 1)",
                         None if mask is None else int(mask), "dflash_config.mask_token_id",
                         int(block), "dflash_config.block_size, else block_size, else 16", tuple(findings))


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("vllm", VLLM_REV, VLLM_SOURCES, read_vllm),
    Engine("sglang", SGLANG_REV, SGLANG_SOURCES, read_sglang),
    Engine("llama.cpp", LLAMA_CPP_REV, LLAMA_CPP_SOURCES, read_llama_cpp, end_of_generation=FULL_BLOCK),
)}
"""Every engine specdeck knows, by the name ``--engine-rule`` and ``engines`` take."""


def engine(name: str) -> Engine:
    """The table of ``name`` (case-insensitive; ``llamacpp`` and ``llama-cpp`` say llama.cpp).

    Raises:
        ValueError: an engine specdeck has no table for (names the known ones).
    """
    key = name.lower().replace("llamacpp", "llama.cpp").replace("llama-cpp", "llama.cpp")
    if key not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; specdeck knows {', '.join(ENGINES)}")
    return ENGINES[key]
