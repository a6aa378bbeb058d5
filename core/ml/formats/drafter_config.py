"""DFlash drafter configuration: reads both published config layouts (docs/drafter.md §6).

Pure Python (no torch), so a config can be inspected without loading weights.

Layouts accepted:

* **z-lab** (``architectures: ["DFlashDraftModel"]``, ``model_type: "qwen3"``): Qwen3Config
  fields at the top level plus ``dflash_config: {mask_token_id, target_layer_ids}``;
  ``block_size`` at the top level (Qwen3/LLaMA drafters) or inside ``dflash_config``
  (Qwen3.5+ drafters).
* **speculators** (``speculators_model_type: "dflash"``): the layer fields live in
  ``transformer_layer_config``; ``aux_hidden_state_layer_ids`` are HF ``hidden_states``
  indices, i.e. z-lab ids + 1 (we subtract 1); ``mask_token_id``/``block_size`` at the top.

We always save the z-lab layout (:meth:`DFlashConfig.to_dict`), keeping every field of the
source config we do not interpret (``max_window_layers``, ``use_sliding_window``, ``eos_token_id``,
``dflash_config.causal`` ...), so a drafter fine-tuned from a published one keeps its layout.

Attention rule per draft layer (the serving engines', docs/drafter.md §5): :meth:`DFlashConfig.attention_rules`.
A layer is *causal* when, in this precedence, the top-level ``is_causal``, else
``dflash_config.is_causal``, else ``dflash_config.causal`` says so (each overrides every layer),
else iff ``layer_types[i] == "sliding_attention"`` (vLLM ``qwen3_dflash._dflash_layer_causal``).
A ``sliding_attention`` layer has a window W measured from each query's own absolute position:
the query at position q sees key positions p with ``q - W < p``; a causal layer adds ``p <= q``.
Context keys and block keys alike; context keys are always strictly before the anchor.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InvalidFile, InvalidInput
from core.ml.formats import bounds
from core.text import json_value_problem, read_json_file, show_value

ZLAB_ARCH = "DFlashDraftModel"
DFLASH2_ARCH = "DFlash2DraftModel"
LAYER_FULL = "full_attention"
LAYER_SLIDING = "sliding_attention"

KNOBS = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None}
"""Forward knobs of the reference drafter (z-lab ``dflash`` 0.1.0), read from ``dflash_config``
first, then the top level, as the reference's ``_draft_value`` reads them: the block's token
embeddings are multiplied by ``input_embedding_scale``; the draft logits by
``output_multiplier``, then soft-capped ``cap * tanh(logits / cap)`` when
``final_logit_softcapping`` is set and > 0."""

INERT_KEYS = frozenset({
    # PretrainedConfig's own bookkeeping
    "_name_or_path", "name_or_path", "architectures", "auto_map", "chunk_size_feed_forward", "dtype", "torch_dtype",
    "id2label", "label2id", "is_encoder_decoder", "model_type", "output_attentions", "output_hidden_states",
    "problem_type", "return_dict", "transformers_version", "use_cache", "tie_word_embeddings",
    # token ids and init: the drafter borrows embeddings and head, and is loaded, not initialised
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
    # training-only (no dropout at eval; specdeck's trainer applies none)
    "attention_dropout",
    # read to derive layer_types / RoPE (implemented through them)
    "max_window_layers", "use_sliding_window", "rope_parameters",
    # speculators layout bookkeeping (its layer fields live in transformer_layer_config)
    "speculators_model_type", "speculators_version", "speculators_config", "transformer_layer_config",
    "aux_hidden_state_layer_ids", "draft_vocab_size", "sliding_window_non_causal", "has_no_defaults_at_init",
})
"""Config keys that do not change a DFlash drafter's forward (besides the ones specdeck reads).
Any other key is refused at load by name: silently dropping a key that changes the forward
would measure a different drafter than the one served."""

INERT_DFLASH_KEYS = frozenset({"block_size", "is_causal", "causal"})
"""``dflash_config`` keys read elsewhere (block size, causality) besides mask/taps/knobs."""

DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
"""The sizes of a DFlash-2 drafter (z-lab ``DFlash2DraftModel``), read from ``dflash_config`` first,
then the top level, as the reference reads them: the kernel length and channel group of the
grouped dynamic causal convolutions around each layer's attention and MLP, the rank of the
candidate selector's codebooks and how many top draft logits it chooses among (docs/drafter.md §7).
A config with all four (or that names ``DFlash2DraftModel``) is a DFlash-2 drafter; some but not
all of them is refused."""
FAMILY_DFLASH, FAMILY_DFLASH2 = "dflash", "dflash2"

MAX_LAYERS = 4096
"""More layers (draft or target) than any config means: a bound, so that a hostile count is
refused, not looped over layer by layer."""
MAX_VOCAB = 1 << 24
"""Largest vocabulary (and token id + 1) taken: published targets have up to 262k tokens."""
MAX_POSITIONS = 1 << 30
"""Largest context length or window taken (ten-million-token models exist)."""


@dataclass(frozen=True)
class FieldRule:
    """What one config key may hold (JSON null always: the key is then absent).

    Attributes:
        kind: ``int``, ``number`` (finite; an integer too), ``bool``, ``str``, ``object``,
            ``ints`` or ``strs`` (a list of those).
        lo / hi: the closed range of an ``int`` or ``number`` (each element of ``ints``).
        positive: a ``number`` that must be > 0.
        noun: what the value is, for the message (``a layer count``).
    """

    kind: str
    lo: float | None = None
    hi: float | None = None
    positive: bool = False
    noun: str | None = None

    def problem(self, value: Any) -> tuple[str, str] | None:
        """``(key suffix, problem)`` when ``value`` breaks the rule (suffix ``[i]`` for a
        list element), else None."""
        if value is None:
            return None
        if self.kind in ("ints", "strs"):
            if not isinstance(value, list):
                return "", f"{show_value(value)} is not a list of {'integers' if self.kind == 'ints' else 'strings'}"
            if len(value) > MAX_LAYERS:
                return "", f"has {len(value)} entries, more than any config has ({MAX_LAYERS})"
            one = dataclasses.replace(self, kind=self.kind[:-1])
            for i, x in enumerate(value):
                got = one.problem(x) if x is not None else ("", "null is not allowed in this list")
                if got:
                    return f"[{i}]", got[1]
            return None
        why = self._scalar(value)
        return ("", why) if why else None

    def _scalar(self, v: Any) -> str | None:
        shown = show_value(v)
        span = f" ({_bound(self.lo)}..{_bound(self.hi)})" if self.lo is not None and self.hi is not None else ""
        if self.kind in ("int", "number"):
            whole = self.kind == "int"
            if isinstance(v, bool) or not isinstance(v, int if whole else (int, float)):
                return f"{shown} is not {self.noun or ('an integer' if whole else 'a number')}{span}"
            if isinstance(v, float) and not math.isfinite(v):
                return f"{shown} is not a finite number"
            if self.positive and v <= 0:
                return f"{shown} must be > 0"
            if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
                return f"{shown} is out of range{span}"
            return None
        want, noun = _PLAIN[self.kind]
        return None if isinstance(v, want) else f"{shown} is not {self.noun or noun}"


_PLAIN = {"bool": (bool, "true or false"), "str": (str, "a string"), "object": (dict, "an object")}


def _bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _int(lo: int, hi: int, noun: str | None = None) -> FieldRule:
    return FieldRule("int", lo, hi, noun=noun)


_POSITIVE = FieldRule("number", positive=True)
FIELDS: dict[str, FieldRule] = {
    "hidden_size": _int(1, 1 << 16), "intermediate_size": _int(1, 1 << 20),
    "num_hidden_layers": _int(1, MAX_LAYERS, "a layer count"),
    "num_attention_heads": _int(1, 1 << 12), "num_key_value_heads": _int(1, 1 << 12), "head_dim": _int(1, 1 << 12),
    "vocab_size": _int(1, MAX_VOCAB), "block_size": _int(2, 4096), "mask_token_id": _int(0, MAX_VOCAB - 1),
    "target_layer_ids": FieldRule("ints", 0, MAX_LAYERS - 1, noun="a layer id"),
    "aux_hidden_state_layer_ids": FieldRule("ints", 1, MAX_LAYERS, noun="a hidden_states index"),
    "num_target_layers": _int(1, MAX_LAYERS), "max_window_layers": _int(0, MAX_LAYERS),
    "max_position_embeddings": _int(1, MAX_POSITIONS), "sliding_window": _int(1, MAX_POSITIONS),
    "swa_window_size": _int(1, MAX_POSITIONS),
    "rms_norm_eps": FieldRule("number", 0, 1, positive=True), "rope_theta": _POSITIVE,
    "rope_scaling": FieldRule("object"), "rope_parameters": FieldRule("object"),
    "layer_types": FieldRule("strs"), "architectures": FieldRule("strs"),
    "hidden_act": FieldRule("str"), "speculators_model_type": FieldRule("str"), "mask_token": FieldRule("str"),
    **{k: FieldRule("bool") for k in ("is_causal", "causal", "attention_bias", "use_sliding_window", "use_swa",
                                      "sliding_window_non_causal")},
    "dflash_config": FieldRule("object"), "transformer_layer_config": FieldRule("object"),
    "input_embedding_scale": FieldRule("number"), "output_multiplier": FieldRule("number"),
    "final_logit_softcapping": FieldRule("number"),
    "conv_kernel_size": _int(1, 4096), "conv_group_size": _int(1, 1 << 16), "selector_rank": _int(1, 1 << 16),
    "selector_top_k": _int(1, MAX_VOCAB),
}
"""Every key specdeck or an engine table (:mod:`core.ml.engines.rules`) reads, with what it may hold.
Checked at the top level, in ``dflash_config`` and in ``transformer_layer_config`` (speculators)
by :func:`check_fields`, before anything converts a value: a list where a size goes, a NaN, a
block size of 1e30 is refused by name, never met by ``int()`` or a tensor shape."""
ROPE_FIELDS: dict[str, FieldRule] = {
    "factor": _POSITIVE, "low_freq_factor": _POSITIVE, "high_freq_factor": _POSITIVE,
    "original_max_position_embeddings": _int(1, MAX_POSITIONS), "rope_theta": _POSITIVE,
    **{k: FieldRule("number") for k in ("mscale", "mscale_all_dim", "attention_factor", "beta_fast", "beta_slow",
                                        "partial_rotary_factor")},
    "rope_type": FieldRule("str"), "type": FieldRule("str"), "truncate": FieldRule("bool"),
    "mrope_section": FieldRule("ints", 0, 1 << 12),
}
"""What ``rope_scaling`` / ``rope_parameters`` may hold (the keys :func:`core.ml.models.drafter.rope_inv_freq` reads)."""
TARGET_FIELDS: dict[str, FieldRule] = {
    **{k: FIELDS[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads",
                              "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta",
                              "rope_scaling", "rope_parameters", "architectures")},
    "model_type": FieldRule("str"), "text_config": FieldRule("object"),
}
"""The target config.json keys specdeck reads itself (layers to tap, hidden size, vocabulary,
the rotary sizes llama.cpp's conversion needs), top level and ``text_config``."""
NESTED = ("dflash_config", "transformer_layer_config")
CONFIG_HINT = ("fix that field of the config (docs/drafter.md §6 lists them), or point at the drafter "
               "directory it came from")
TARGET_HINT = "point at the target's own directory, or copy its config.json again from where it came from"


def check_fields(cfg: Any, source: str = "config", rules: dict[str, FieldRule] = FIELDS,
                 nested: tuple[str, ...] = NESTED, hint: str = CONFIG_HINT) -> None:
    """Refuse, by file and key path, a config value no reader may take.

    Each key of ``rules`` at the top level and in the ``nested`` objects is checked against
    its rule (rope objects against :data:`ROPE_FIELDS`); then every value anywhere: no
    non-finite number, no integer beyond 64 bits, no nesting deeper than 32 levels (what
    ``export`` would write back, and no engine reads).

    Raises:
        InvalidFile: ``source: dflash_config.block_size: 1e+30 is out of range (2..4096)``.
    """
    if not isinstance(cfg, dict):
        raise InvalidFile(source, f"a config is a JSON object, this is {show_value(cfg)}", hint=hint)
    levels = [("", cfg)] + [(f"{k}.", cfg[k]) for k in nested if isinstance(cfg.get(k), dict)]
    for prefix, level in levels:
        got = _first_problem(level, rules)
        if got:
            raise InvalidFile(source, got[1], field=prefix + got[0], hint=hint)
    bad = json_value_problem(cfg)
    if bad:
        raise InvalidFile(source, bad[1], field=bad[0] or None, hint=hint)


def _first_problem(level: dict[str, Any], rules: dict[str, FieldRule]) -> tuple[str, str] | None:
    """``(key path, problem)`` of the first key of ``level`` that breaks its rule."""
    for key, rule in rules.items():
        value = level.get(key)
        got = rule.problem(value)
        if got is None and key in ("rope_scaling", "rope_parameters") and isinstance(value, dict):
            inner = _first_problem(value, ROPE_FIELDS)
            got = (f".{inner[0]}", inner[1]) if inner else None
        if got:
            return key + got[0], got[1]
    return None


def read_config_file(path: str | Path, what: str = "drafter config") -> dict[str, Any]:
    """A drafter's ``config.json`` (``path``: the file or a directory holding it), read as
    untrusted (:func:`core.text.read_json_file`) and every field checked (:func:`check_fields`).

    Raises:
        InvalidFile: naming the file and the key path.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    raw = read_json_file(path, what, hint=CONFIG_HINT)
    check_fields(raw, str(path))
    return raw


def check_drafter_dir(drafter: str | Path, target: str | Path | None = None) -> DFlashConfig:
    """A drafter directory's files, and the drafter against its target, before anything is
    loaded or written: its config.json field by field (:meth:`DFlashConfig.from_file`), every
    safetensors header of the drafter (and of ``target``) against its file (a copy cut short,
    empty, not safetensors), the target's config.json (:func:`read_target_config`), and whether
    the drafter fits that target (:meth:`DFlashConfig.target_problems`). Returns the config.

    Raises:
        InvalidFile: a file, named with the key path where it is one value.
        InvalidInput: no weights there, or a drafter that does not fit the target.
    """
    from core.ml.formats.safetensors_header import check_dir

    cfg = DFlashConfig.from_file(drafter)
    if not check_dir(drafter):
        raise InvalidInput(f"{drafter}: no model.safetensors there",
                           hint="a drafter directory holds config.json + model.safetensors")
    if target is None:
        return cfg
    problems = cfg.target_problems(read_target_config(target))
    check_dir(target)
    if problems:
        raise InvalidInput(f"the drafter {drafter} does not fit the target {target}: "
                           + "; ".join(f"{name}: {why}" for name, why in problems),
                           hint="give the target this drafter was trained for")
    return cfg


def read_target_config(path: str | Path, *, text: bool = True) -> dict[str, Any]:
    """A target's text config (``text_config`` merged over the top level of a composite one;
    ``text=False``: the document as written), from its directory or its ``config.json``, the
    keys specdeck reads checked (:data:`TARGET_FIELDS`) at the top level and in ``text_config``.

    Raises:
        InvalidFile: naming the file and the key path.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    raw = read_json_file(path, "target config", hint=TARGET_HINT)
    check_fields(raw, str(path), TARGET_FIELDS, ("text_config",), hint=TARGET_HINT)
    inner = raw.get("text_config")
    return {**raw, **inner} if text and isinstance(inner, dict) else raw


@dataclass(frozen=True)
class AttentionRule:
    """Which keys one draft layer's queries see (docs/drafter.md §5; vLLM/SGLang/SpecForge rule).

    The query at absolute position q of a block anchored at a sees context key positions
    ``p < a`` and block key positions ``a..a+B-1``, restricted to ``p <= q`` when ``causal`` and
    to ``p > q - window`` when ``window`` is set (sliding layers).

    Attributes:
        causal: keys after the query's own position are hidden.
        window: W of a sliding layer (None: no window).
    """

    causal: bool
    window: int | None = None

    def describe(self) -> str:
        """E.g. ``causal, window 2048 from each query`` or ``non-causal, full``."""
        kind = "causal" if self.causal else "non-causal"
        return f"{kind}, window {self.window} from each query" if self.window else f"{kind}, full"


def resolve_causality(layer_types: list[str], top_is_causal: Any = None,
                      dflash: dict[str, Any] | None = None) -> tuple[list[bool], str]:
    """Per-layer causality and the key that decided it (vLLM ``_dflash_layer_causal`` precedence).

    Top-level ``is_causal``, then ``dflash_config.is_causal``, then ``dflash_config.causal``
    (each sets every layer); else a layer is causal iff it is ``sliding_attention``.
    """
    dflash = dflash or {}
    for key, value in (("is_causal", top_is_causal), ("dflash_config.is_causal", dflash.get("is_causal")),
                       ("dflash_config.causal", dflash.get("causal"))):
        if value is not None:
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false, got {value!r}")
            return [value] * len(layer_types), key
    return [t == LAYER_SLIDING for t in layer_types], "layer_types"


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Default tapped target layers when a config has none (z-lab ``build_target_layer_ids``).

    One draft layer: ``[N // 2]``; otherwise ``round(1 + i * (N - 4) / (L - 1))`` for
    ``i = 0..L-1`` (evenly spaced from 1 to N-3). Qwen3-8B (N=36, L=5): ``[1, 9, 17, 25, 33]``.
    Note: Python's ``round`` (banker's rounding), as in z-lab.
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass
class DFlashConfig:
    """Everything the drafter needs; names follow Qwen3Config where they exist.

    Attributes:
        hidden_size: H, must equal the target's hidden size.
        num_hidden_layers: L, number of draft layers.
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (GQA).
        head_dim: per-head size (default H / heads).
        intermediate_size: MLP width.
        vocab_size: the target's vocabulary size (embeddings/LM head come from the target).
        block_size: B, tokens per draft block (B-1 draft tokens per round).
        mask_token_id: id filling the B-1 masked block slots.
        target_layer_ids: 0-based target decoder layers tapped; feature = hidden_states[id+1].
        num_target_layers: N, used only for the default ``target_layer_ids``.
        rms_norm_eps: RMSNorm epsilon.
        max_position_embeddings: kept for the record and RoPE scaling.
        rope_theta: RoPE base.
        rope_scaling: None/default, or a dict with ``rope_type`` in linear, yarn, llama3.
        layer_types: per draft layer, ``full_attention`` or ``sliding_attention``.
        sliding_window: W of sliding layers, measured from each query's absolute position.
        is_causal: top-level causality override (every layer), None when absent.
        dflash_extra: keys of ``dflash_config`` besides mask_token_id / target_layer_ids
            (``is_causal``, ``causal``, ``block_size`` ...), written back unchanged.
        attention_bias: bias on q/k/v/o projections (False in every published drafter).
        hidden_act: must be ``silu``.
        source_format: ``zlab`` or ``speculators``: the layout the config was read from.
        extra: other top-level keys of a z-lab config, written back unchanged on save.
        input_embedding_scale / output_multiplier / final_logit_softcapping: the forward
            knobs of :data:`KNOBS` (defaults: no effect).
        conv_kernel_size / conv_group_size / selector_rank / selector_top_k: the DFlash-2 sizes
            of :data:`DFLASH2_KEYS` (None in a DFlash-1 drafter).
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    head_dim: int | None = None
    num_target_layers: int | None = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, Any] | None = None
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    is_causal: bool | None = None
    dflash_extra: dict[str, Any] = field(default_factory=dict)
    attention_bias: bool = False
    hidden_act: str = "silu"
    source_format: str = "zlab"
    extra: dict[str, Any] = field(default_factory=dict)
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.layer_types is None:
            self.layer_types = [LAYER_FULL] * self.num_hidden_layers
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        self.validate()

    # ------------------------------------------------------------------ derived

    @property
    def num_taps(self) -> int:
        """K: number of tapped target layers (fc input is K * H)."""
        return len(self.target_layer_ids)

    @property
    def feature_dim(self) -> int:
        """Width of the concatenated target features (K * H)."""
        return self.num_taps * self.hidden_size

    @property
    def family(self) -> str:
        """``dflash2`` for a DFlash-2 drafter (convolutions and candidate selector), else ``dflash``."""
        return FAMILY_DFLASH2 if self.conv_kernel_size is not None else FAMILY_DFLASH

    def causality(self) -> tuple[list[bool], str]:
        """Per-layer causality and the config key that decided it (see :func:`resolve_causality`)."""
        return resolve_causality(list(self.layer_types), self.is_causal, self.dflash_extra)

    def attention_rules(self) -> list[AttentionRule]:
        """The resolved :class:`AttentionRule` of every draft layer."""
        causal, _ = self.causality()
        return [AttentionRule(c, self.sliding_window if t == LAYER_SLIDING else None)
                for c, t in zip(causal, self.layer_types)]

    def attention_summary(self) -> dict[str, Any]:
        """The resolved per-layer rule, for provenance and logs."""
        causal, source = self.causality()
        rules = self.attention_rules()
        return {"source": source, "sliding_window": self.sliding_window,
                "layers": [{"layer": i, "type": t, "causal": r.causal, "window": r.window}
                           for i, (t, r) in enumerate(zip(self.layer_types, rules))]}

    def attention_text(self) -> str:
        """One line: ``layers 0-3 sliding_attention: causal, window 2048 from each query; ...``."""
        rules, parts, i = self.attention_rules(), [], 0
        n = len(rules)
        while i < n:
            j = i
            while j + 1 < n and rules[j + 1] == rules[i] and self.layer_types[j + 1] == self.layer_types[i]:
                j += 1
            span = f"layer {i}" if i == j else f"layers {i}-{j}"
            parts.append(f"{span} {self.layer_types[i]}: {rules[i].describe()}")
            i = j + 1
        return "; ".join(parts) + f" (causality from {self.causality()[1]})"

    def validate(self) -> None:
        """Check invariants; raises ValueError naming the field."""
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (one anchor and at least one draft slot), got {self.block_size}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        bad = set(self.layer_types) - {LAYER_FULL, LAYER_SLIDING}
        if bad:
            raise ValueError(f"unsupported layer_types {sorted(bad)}")
        if LAYER_SLIDING in self.layer_types and not self.sliding_window:
            raise ValueError("sliding_attention layers need a sliding_window")
        if self.sliding_window is not None and LAYER_SLIDING in self.layer_types and int(self.sliding_window) < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")
        self.causality()  # a non-boolean override fails here, naming the key
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} unsupported (DFlash drafters use silu)")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids is empty")
        for name in KNOBS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if value is not None and bounds.float32(value):  # the forward multiplies float32 logits by it
                raise ValueError(f"{name} {bounds.float32(value)}")
        self._validate_dflash2()
        if self.num_target_layers is not None and max(self.target_layer_ids) >= self.num_target_layers:
            raise ValueError(f"target_layer_ids {self.target_layer_ids} exceed num_target_layers {self.num_target_layers}")
        check_fields(self.to_dict(), "drafter config")  # what a save writes: every value in range

    def target_problems(self, target: dict[str, Any]) -> list[tuple[str, str]]:
        """``(field, why)`` for every way this drafter cannot run on the target whose (text)
        config is ``target`` (:func:`read_target_config`): another hidden size, taps past its
        last layer, a mask token outside its vocabulary. Empty when it fits."""
        out = []
        n, h, vocab = target.get("num_hidden_layers"), target.get("hidden_size"), target.get("vocab_size")
        if h is not None and h != self.hidden_size:
            out.append(("hidden_size", f"the drafter's hidden_size {self.hidden_size} is not the target's {h}: "
                                       "wrong target"))
        if n is not None and max(self.target_layer_ids) >= n:
            out.append(("target_layer_ids", f"taps {self.target_layer_ids} but the target has {n} layers "
                                            f"(0..{n - 1})"))
        if vocab is not None and self.mask_token_id >= vocab:
            out.append(("mask_token_id", f"mask token {self.mask_token_id} is outside the target's vocabulary "
                                         f"of {vocab}"))
        return out

    def _validate_dflash2(self) -> None:
        given = [k for k in DFLASH2_KEYS if getattr(self, k) is not None]
        arch = self.extra.get("architectures") or []
        if not given and DFLASH2_ARCH not in arch:
            return
        if len(given) < len(DFLASH2_KEYS):
            missing = [k for k in DFLASH2_KEYS if k not in given]
            raise ValueError(f"a DFlash-2 drafter ({DFLASH2_ARCH}) needs all of {list(DFLASH2_KEYS)} in "
                             f"dflash_config; missing {missing}")
        for name in DFLASH2_KEYS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.hidden_size % self.conv_group_size:
            raise ValueError(f"conv_group_size {self.conv_group_size} must divide hidden_size {self.hidden_size}")
        if self.selector_top_k > self.vocab_size:
            raise ValueError(f"selector_top_k {self.selector_top_k} exceeds vocab_size {self.vocab_size}")

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], source: str | None = None) -> DFlashConfig:
        """Parse a z-lab or speculators ``config.json`` dict, every field checked first
        (:func:`check_fields`).

        Args:
            cfg: the parsed config.
            source: where it came from (a file), named in every error; None: errors name
                no file (a config built in code).

        Raises:
            InvalidFile: a value of the wrong type, out of range or not finite (names the
                key path); with ``source``, any refusal below.
            ValueError: a required field is missing or inconsistent (message names it).
        """
        check_fields(cfg, source or "config")
        try:
            if cfg.get("speculators_model_type") is not None:
                return cls._from_speculators(cfg)
            return cls._from_zlab(cfg)
        except InvalidFile:
            raise
        except ValueError as exc:
            if source is None:
                raise
            raise InvalidFile(source, str(exc), hint=CONFIG_HINT) from None

    @classmethod
    def from_file(cls, path: str | Path) -> DFlashConfig:
        """Read ``path`` (a ``config.json`` or a directory containing one) as untrusted input
        (:func:`read_config_file`).

        Raises:
            InvalidFile: naming the file and, for a bad value, its key path.
        """
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_dict(read_config_file(path), source=str(path))

    @classmethod
    def _from_zlab(cls, cfg: dict[str, Any]) -> DFlashConfig:
        dflash = cfg.get("dflash_config") or {}
        block_size = cfg.get("block_size") or dflash.get("block_size")
        if block_size is None:
            raise ValueError("config has no block_size (checked top level and dflash_config)")
        mask = dflash.get("mask_token_id", cfg.get("mask_token_id"))
        if mask is None:
            raise ValueError("config has no dflash_config.mask_token_id")
        n_layers = _req(cfg, "num_hidden_layers")
        ids = dflash.get("target_layer_ids")
        if ids is None:
            if cfg.get("num_target_layers") is None:
                raise ValueError("config has neither dflash_config.target_layer_ids nor num_target_layers")
            ids = build_target_layer_ids(int(cfg["num_target_layers"]), int(n_layers))
        _refuse_unknown(cfg, dflash)
        known = ({f.name for f in dataclasses.fields(cls)} - {"extra", "dflash_extra", *KNOBS, *DFLASH2_KEYS}) | {"dflash_config"}
        extra = {k: v for k, v in cfg.items() if k not in known}
        dflash_extra = {k: v for k, v in dflash.items() if k not in ("mask_token_id", "target_layer_ids")}
        knobs = {k: next((v for v in (dflash.get(k), cfg.get(k)) if v is not None), default)
                 for k, default in KNOBS.items()}
        sizes = {k: dflash.get(k, cfg.get(k)) for k in DFLASH2_KEYS}
        return cls(
            **knobs,
            **sizes,
            **_layer_fields(cfg),
            block_size=int(block_size),
            mask_token_id=int(mask),
            target_layer_ids=list(ids),
            num_target_layers=cfg.get("num_target_layers"),
            is_causal=cfg.get("is_causal"),
            dflash_extra=dflash_extra,
            source_format="zlab",
            extra=extra,
        )

    @classmethod
    def _from_speculators(cls, cfg: dict[str, Any]) -> DFlashConfig:
        kind = cfg.get("speculators_model_type")
        if kind != "dflash":
            raise ValueError(f"speculators_model_type is {kind!r}, expected 'dflash'")
        layer_cfg = cfg.get("transformer_layer_config")
        if not isinstance(layer_cfg, dict):
            raise ValueError("speculators config has no transformer_layer_config")
        aux = cfg.get("aux_hidden_state_layer_ids")
        if not aux:
            raise ValueError("speculators config has no aux_hidden_state_layer_ids")
        if cfg.get("mask_token_id") is None:
            raise ValueError("speculators config has no mask_token_id")
        fields = _layer_fields(layer_cfg)
        return cls(
            **fields,
            block_size=int(cfg.get("block_size") or 8),
            mask_token_id=int(cfg["mask_token_id"]),
            target_layer_ids=[int(i) - 1 for i in aux],  # HF hidden_states index -> decoder layer id
            num_target_layers=None,
            # speculators' sliding_window_non_causal makes its sliding layers non-causal; its full
            # layers are non-causal anyway, so it is the engines' global override is_causal: false
            is_causal=False if cfg.get("sliding_window_non_causal") else cfg.get("is_causal"),
            source_format="speculators",
        )

    # ------------------------------------------------------------------ writing

    def to_dict(self) -> dict[str, Any]:
        """The z-lab ``config.json`` layout (docs/drafter.md §6)."""
        out: dict[str, Any] = dict(self.extra)
        dflash = {**self.dflash_extra, "mask_token_id": self.mask_token_id,
                  "target_layer_ids": list(self.target_layer_ids)}
        for name, default in KNOBS.items():  # where the source had it; else in dflash_config
            value = getattr(self, name)
            if name in self.extra:
                out[name] = value
            elif value != default or name in dflash:
                dflash[name] = value
        for name in DFLASH2_KEYS:
            value = getattr(self, name)
            if value is not None:
                (out if name in self.extra else dflash)[name] = value
        arch = DFLASH2_ARCH if self.family == FAMILY_DFLASH2 else ZLAB_ARCH
        out.update(
            {
                "architectures": list(self.extra.get("architectures") or [arch]),
                "model_type": "qwen3",
                "block_size": self.block_size,
                "dflash_config": dflash,
                "num_target_layers": self.num_target_layers,
                "hidden_size": self.hidden_size,
                "num_hidden_layers": self.num_hidden_layers,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim,
                "intermediate_size": self.intermediate_size,
                "vocab_size": self.vocab_size,
                "rms_norm_eps": self.rms_norm_eps,
                "max_position_embeddings": self.max_position_embeddings,
                "rope_theta": self.rope_theta,
                "rope_scaling": self.rope_scaling,
                "layer_types": list(self.layer_types),
                "sliding_window": self.sliding_window,
                "attention_bias": self.attention_bias,
                "hidden_act": self.hidden_act,
            }
        )
        if self.is_causal is not None:
            out["is_causal"] = self.is_causal
        if "use_sliding_window" not in self.extra:
            out["use_sliding_window"] = LAYER_SLIDING in self.layer_types
        out.setdefault("tie_word_embeddings", False)
        if out.get("num_target_layers") is None:
            out.pop("num_target_layers")
        return out

    def fingerprint(self) -> str:
        """Short sha256 of the canonical z-lab dict (identifies the architecture)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _refuse_unknown(cfg: dict[str, Any], dflash: dict[str, Any]) -> None:
    """Refuse, by name, config keys that would change the forward and that specdeck does not
    implement (any key it does not know to be inert)."""
    fields = {f.name for f in dataclasses.fields(DFlashConfig)} | {"dflash_config", "rope_scaling", "rope_theta"}
    top = sorted(k for k in cfg if k not in fields and k not in INERT_KEYS)
    inner = sorted(k for k in dflash if k not in ("mask_token_id", "target_layer_ids", *KNOBS, *DFLASH2_KEYS,
                                                   *INERT_DFLASH_KEYS))
    if top or inner:
        names = top + [f"dflash_config.{k}" for k in inner]
        raise ValueError(f"config keys {names} are not known to specdeck: they may change the drafter's forward, "
                         "and specdeck would measure another drafter than the one served. If a key is inert, add it "
                         "to INERT_KEYS in core/ml/formats/drafter_config.py; otherwise this drafter needs support first")


def _req(cfg: dict[str, Any], key: str) -> Any:
    if cfg.get(key) is None:
        raise ValueError(f"config has no {key}")
    return cfg[key]


def _layer_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen3Config-style fields shared by both layouts."""
    rope_params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rope_params.get("rope_theta"))
    scaling = cfg.get("rope_scaling")
    if scaling is None and rope_params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
    n_layers = int(_req(cfg, "num_hidden_layers"))
    layer_types = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if layer_types is None:
        if cfg.get("use_sliding_window") and window:
            max_window = cfg.get("max_window_layers")
            max_window = n_layers if max_window is None else max_window
            layer_types = [LAYER_SLIDING if i >= max_window else LAYER_FULL for i in range(n_layers)]
        else:
            layer_types = [LAYER_FULL] * n_layers
    return {
        "hidden_size": int(_req(cfg, "hidden_size")),
        "num_hidden_layers": n_layers,
        "num_attention_heads": int(_req(cfg, "num_attention_heads")),
        "num_key_value_heads": int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
        "head_dim": cfg.get("head_dim"),
        "intermediate_size": int(_req(cfg, "intermediate_size")),
        "vocab_size": int(_req(cfg, "vocab_size")),
        "rms_norm_eps": float(cfg.get("rms_norm_eps") or 1e-6),
        "max_position_embeddings": int(cfg.get("max_position_embeddings") or 40960),
        "rope_theta": float(theta if theta is not None else 1_000_000.0),
        "rope_scaling": scaling,
        "layer_types": list(layer_types),
        "sliding_window": int(window) if window and LAYER_SLIDING in layer_types else window,
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "hidden_act": cfg.get("hidden_act") or "silu",
    }
