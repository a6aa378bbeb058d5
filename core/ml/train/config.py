"""Configuration of the reference DFlash trainer (``python -m core.ml.train --config FILE.yaml``).

Pure Python (PyYAML, no torch), so the console can read, validate and diff trainer configs.

A config file is YAML with the sections below; every key is documented by its ``doc`` in the
dataclasses of this module (``python -m core.ml.train --describe`` prints them all). Unknown
keys are errors that name the file and suggest the closest known key
(``train.yaml: unknown key 'gama' in section 'loss' (did you mean 'gamma'?)``). Relative paths
are relative to the config file.

The defaults are the v5 trainer (docs/training.md). The v4 behaviours are explicit options, all off by
default; a v4-legacy config differs from a v5 one in exactly these knobs (:data:`V4_KNOBS`):

=========================  ====================  ==================================================
knob                       v5 (default)          v4 legacy
=========================  ====================  ==================================================
``loss.soft_kl_weight``    0.0 (hard CE only)    0.7: 70 % soft KL + 30 % hard CE
``loss.temperature``       1.0 (unused)          2.0: KL between softmax(logits / T), scaled T^2
``loss.streak_weighting``  false                 true: slot k also weighted by P(slots 1..k-1 right)
``loss.gamma``             auto: 7 (B 16), 5     10 (set by hand)
                           (B 10), 4 (B 8)
``noise.target``           ``fc_input``          ``all_features``: the noise also hits the final
                                                 layer, so the target logits (labels, KL teacher)
                                                 are corrupted
``fc_layers``              ``taps``: fc is K*H   ``taps_and_final``: fc is (K+1)*H and sees the
                           wide                  final layer that gives the labels (a shortcut)
=========================  ====================  ==================================================

After loading, :func:`resolve` fills every automatic value (gamma, drafter shape from the
target's config.json, mask token id, layer ids, number of steps) so that the *resolved* config,
saved as ``resolved_config.yaml`` and inside every checkpoint, states exactly what ran.
:func:`knob_diff` compares two resolved configs (ignoring :data:`RUN_KEYS`, which say where a
run writes, not how it trains).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.ml.formats import bounds, strictjson

FC_LAYERS = ("taps", "taps_and_final")
NOISE_TARGETS = ("fc_input", "all_features")
LABEL_SOURCES = ("target", "data")
NORMALIZE = ("weights", "mask")
ATTENTION = ("dense", "blockwise")
DTYPES = ("auto", "float32", "bfloat16")
LAYER_TYPES = ("full_attention", "sliding_attention")

#: Keys that say where a run writes, not how it trains (ignored by :func:`knob_diff`).
RUN_KEYS = ("out_dir",)
#: The knobs that turn a v5 (default) run into the v4 legacy trainer.
V4_KNOBS = ("loss.soft_kl_weight", "loss.temperature", "loss.streak_weighting", "loss.gamma", "noise.target",
            "fc_layers")
#: gamma of the position decay by block size (SF help text / paper); 7 for other sizes.
GAMMA_BY_BLOCK = {16: 7.0, 10: 5.0, 8: 4.0}


class ConfigError(ValueError):
    """A bad trainer config; the message names the file and the key (exit status 2)."""


def knob(default: Any, doc: str, choices: tuple[str, ...] | None = None, path: bool = False) -> Any:
    """A documented config field (``doc`` is what ``--describe`` prints)."""
    meta = {"doc": doc, "choices": choices, "path": path}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class DrafterSection:
    """The drafter to train (a new random one, or ``init`` to continue from a drafter directory)."""

    init: str | None = knob(None, "drafter directory (config.json + model.safetensors) to start from; its "
                                  "config is used and the shape keys below must be null or equal", path=True)
    block_size: int = knob(16, "B: tokens per block (B-1 drafted per round)")
    num_layers: int = knob(5, "draft transformer layers")
    target_layer_ids: list[int] | None = knob(None, "0-based target decoder layers tapped for fc (K of them); "
                                                    "null: z-lab default spacing 1..N-3. Must not contain the "
                                                    "final layer N-1, which is reserved for the target logits")
    mask_token_id: int | None = knob(None, "id of the mask token filling slots 1..B-1; null: the target "
                                           "tokenizer's <|MASK|> token")
    num_attention_heads: int | None = knob(None, "query heads (null: the target's)")
    num_key_value_heads: int | None = knob(None, "key/value heads (null: the target's)")
    head_dim: int | None = knob(None, "per-head size (null: the target's)")
    intermediate_size: int | None = knob(None, "MLP width (null: the target's)")
    rope_theta: float | None = knob(None, "RoPE base (null: the target's)")
    max_position_embeddings: int | None = knob(None, "recorded in config.json (null: the target's)")
    layer_types: list[str] | None = knob(None, "per draft layer: full_attention (sees the context before the "
                                               "anchor and the whole block) or sliding_attention (causal, window "
                                               "counted back from each query's position, as vLLM/SGLang serve it); "
                                               "null: all full_attention (or drafter.init's)")
    sliding_window: int | None = knob(None, "W of the sliding_attention layers (the published Qwen3.6-27B "
                                            "drafter: 2048); null: none (or drafter.init's)")
    hidden_size: int | None = knob(None, "H; must equal the target's (null: the target's). Stating it lets a "
                                         "wrong target or feature cache be refused before launch")
    vocab_size: int | None = knob(None, "vocabulary rows; must equal the target's (null: the target's)")
    num_target_layers: int | None = knob(None, "the target's decoder layer count N; must equal the target's "
                                               "(null: the target's)")
    init_std: float = knob(0.02, "std of the normal init of a new drafter's linear weights (norms start at 1)")


@dataclass
class DataSection:
    """Training data: an extract cache (features) or a JSONL file run through the target on the fly."""

    features: str | None = knob(None, "feature cache from `python -m core.ml.extract` (extract the drafter's "
                                      "target_layer_ids plus the final layer N-1; a cache of the taps only "
                                      "works for the default v5 loss, with its cached greedy labels)", path=True)
    file: str | None = knob(None, "JSONL, one row per sequence, target run on the fly: {prompt|input_ids} "
                                  "plus optional {response|response_ids}; without a response the target's "
                                  "greedy continuation (max_new_tokens) is generated and used", path=True)
    max_new_tokens: int = knob(256, "data.file rows without a response: length of the generated continuation")
    chat_template: bool = knob(True, "data.file text prompts go through the target's chat template")
    max_length: int = knob(3072, "sequences are cut to this many tokens")
    min_loss_tokens: int | None = knob(None, "skip sequences with fewer supervised tokens (null: 2*B)")
    val_count: int = knob(0, "sequences held out for validation (never noised, never trained on)")


@dataclass
class TrainSection:
    """Optimisation and bookkeeping."""

    max_steps: int | None = knob(None, "optimizer steps; null: epochs * steps per epoch")
    epochs: float = knob(6.0, "passes over the training sequences when max_steps is null")
    batch_size: int = knob(1, "sequences per step per rank (packed into one row, context kept per sequence)")
    anchors_per_sequence: int = knob(512, "random anchors (blocks) sampled per sequence each step")
    lr: float = knob(6e-4, "peak AdamW learning rate")
    min_lr_ratio: float = knob(0.0, "cosine decay ends at lr * min_lr_ratio")
    warmup_ratio: float = knob(0.04, "linear warmup over this fraction of the steps")
    warmup_steps: int | None = knob(None, "warmup steps (overrides warmup_ratio)")
    weight_decay: float = knob(0.0, "AdamW weight decay")
    betas: list[float] = knob([0.9, 0.999], "AdamW betas")
    grad_clip: float = knob(1.0, "clip the global grad norm (0: off)")
    attention: str = knob("dense", "multi-anchor attention: dense (one SDPA with the block mask, docs/training.md §2) or "
                                   "blockwise (same result, memory linear in anchors)", ATTENTION)
    log_every: int = knob(1, "print a metrics line every N steps")
    checkpoint_every: int = knob(500, "write step_N.pt every N steps (and always at the end)")
    keep_checkpoints: int | None = knob(None, "keep only the newest N step_*.pt and the keep_steps ones "
                                              "(null: keep all; a detached tau watcher keeps the best by "
                                              "tau too: specdeck hands it this)")
    keep_steps: list[int] = knob([], "with keep_checkpoints: steps never deleted (specdeck lists the ones "
                                     "other items name, item:<train>@step:N)")
    val_every: int = knob(0, "validation every N steps (0: only at the end; needs data.val_count)")


@dataclass
class LossSection:
    """Loss (docs/training.md §3). Defaults: hard CE with position decay; v4 options off."""

    labels: str = knob("target", "target: argmax of the target logits at a+k-1 (from the final layer); "
                                 "data: the data token x_(a+k) (identical on greedy regenerations)", LABEL_SOURCES)
    gamma: float | None = knob(None, "position decay w_k = exp(-(k-1)/gamma); null: 7 for B 16, 5 for B 10, "
                                     "4 for B 8 (else 7). v4 set 10 by hand")
    normalize: str = knob("weights", "divide by sum(w*m) (weights: SF/paper) or by sum(m) (mask: SP)", NORMALIZE)
    soft_kl_weight: float = knob(0.0, "v4: weight of the soft KL term; loss = (1-a)*CE + a*T^2*KL. v4 used 0.7")
    temperature: float = knob(1.0, "v4: temperature T of the soft KL term (v4 used 2)")
    streak_weighting: bool = knob(False, "v4: multiply slot k's weight by the (detached) drafter probability "
                                         "that slots 1..k-1 are all right")


@dataclass
class NoiseSection:
    """Feature noise U(-std, std) on the training split only (speculators' AddUniformNoise)."""

    std: float = knob(0.05, "half-width of the uniform noise (0: off); named std as in speculators")
    target: str = knob("fc_input", "fc_input: only fc's input (default); all_features (v4): the whole "
                                   "extracted tensor, final layer included, so the target logits change", NOISE_TARGETS)


@dataclass
class TrainConfig:
    """A whole trainer config (see the module docstring for the v4/v5 knobs)."""

    target: str | None = knob(None, "target model directory (embeddings, LM head; features for data.file)",
                              path=True)
    out_dir: str | None = knob(None, "where checkpoints, resolved_config.yaml and config.json go", path=True)
    seed: int = knob(0, "seed of the init, data order, anchors and noise (per step and rank)")
    device: str = knob("auto", "auto (cuda when available), cpu or cuda")
    dtype: str = knob("auto", "auto (bfloat16 autocast on CUDA, float32 on CPU), float32 or bfloat16", DTYPES)
    fc_layers: str = knob("taps", "taps: fc sees the target_layer_ids features (K*H wide, as published); "
                                  "taps_and_final (v4): fc also sees the final layer ((K+1)*H)", FC_LAYERS)
    drafter: DrafterSection = field(default_factory=DrafterSection, metadata={"doc": "the drafter"})
    data: DataSection = field(default_factory=DataSection, metadata={"doc": "training data"})
    train: TrainSection = field(default_factory=TrainSection, metadata={"doc": "optimisation"})
    loss: LossSection = field(default_factory=LossSection, metadata={"doc": "loss"})
    noise: NoiseSection = field(default_factory=NoiseSection, metadata={"doc": "feature noise"})

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (str/int/float/bool/list/None only: safe for ``weights_only`` loads)."""
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- parsing


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check_value(where: str, key: str, value: Any, tp: Any, meta: Any) -> Any:
    """Check ``value`` against the annotation ``tp``; returns the (coerced) value."""
    args = typing.get_args(tp)
    optional = (typing.get_origin(tp) in (typing.Union, types.UnionType)) and type(None) in args
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: '{key}' must not be null")
    base = next(a for a in args if a is not type(None)) if optional else tp
    origin = typing.get_origin(base)
    if origin is list:
        (item,) = typing.get_args(base)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: '{key}' must be a list of {item.__name__}, got {value!r}")
        return [_check_value(where, f"{key}[{i}]", v, item, None) for i, v in enumerate(value)]
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: '{key}' must be true or false, got {value!r}")
        return value
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: '{key}' must be an integer, got {value!r}")
        if bounds.int64(value):  # a run's ints reach torch and the store as int64
            raise ConfigError(f"{where}: '{key}' {bounds.int64(value)}")
        return value
    if base is float:
        if isinstance(value, str):  # PyYAML (YAML 1.1) reads 3e-3 as a string; accept it
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: '{key}' must be a number, got {value!r}")
        if bounds.finite(value):
            raise ConfigError(f"{where}: '{key}' must be finite, got {value!r}")
        if bounds.float32(value):  # the trainer computes in float32 (lr, gamma, noise, init_std...)
            raise ConfigError(f"{where}: '{key}' {bounds.float32(value)}")
        return float(value)
    if base is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: '{key}' must be a string, got {value!r}")
        choices = (meta or {}).get("choices")
        if choices and value not in choices:
            raise ConfigError(f"{where}: '{key}' must be one of {', '.join(choices)}; got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {tp!r}")  # pragma: no cover - schema bug


def _unknown(where: str, key: str, known: list[str], section: str | None) -> ConfigError:
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{near[0]}'?)" if near else f" (known: {', '.join(known)})"
    inside = f" in section '{section}'" if section else ""
    return ConfigError(f"{where}: unknown key '{key}'{inside}{hint}")


def _build(cls: type, raw: Any, where: str, section: str | None) -> Any:
    if not isinstance(raw, dict):
        name = f"section '{section}'" if section else "the config"
        raise ConfigError(f"{where}: {name} must be a mapping, got {type(raw).__name__}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise _unknown(where, str(key), list(fields), section)
        tp, name = hints[key], f"{section}.{key}" if section else key
        if _is_section(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, where, name)
        else:
            kwargs[key] = _check_value(where, name, value, tp, fields[key].metadata)
    return cls(**kwargs)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["loss.gamma=5", "noise.std=0"]`` -> nested dict (values parsed as YAML scalars).

    Raises:
        ConfigError: an item without ``=``.
    """
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. loss.gamma=5")
        key, value = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = yaml.safe_load(value) if value.strip() else None
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _strict_loader() -> Any:
    """A SafeLoader that refuses duplicate keys (plain YAML keeps the last one silently)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}' (line {line})",
                                                        key_node.start_mark)
            seen.add(key)
        return loader.construct_mapping(node)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Loader


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read and validate a trainer config file; relative paths become absolute.

    Args:
        path: the YAML file.
        overrides: nested values applied on top (CLI ``--set``, ``--out``, ``--max-steps``).

    Raises:
        ConfigError: missing/invalid YAML, unknown key, wrong type or choice (names the key).
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_strict_loader())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path.name}: not valid YAML ({exc})") from exc
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{path.name}: the config must be a mapping of sections")
    raw = _merge(raw, overrides or {})
    cfg = _build(TrainConfig, raw, path.name, None)
    _absolutize(cfg, path.resolve().parent)
    check(cfg, path.name)
    return cfg


def from_dict(raw: dict[str, Any], where: str = "config") -> TrainConfig:
    """Build a config from a nested dict (e.g. a checkpoint's ``config``); same checks."""
    cfg = _build(TrainConfig, raw, where, None)
    check(cfg, where)
    return cfg


def _absolutize(cfg: Any, root: Path) -> None:
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            _absolutize(value, root)
        elif f.metadata.get("path") and isinstance(value, str):
            setattr(cfg, f.name, str((root / Path(value).expanduser()).resolve()))


def check(cfg: TrainConfig, where: str) -> None:
    """Cross-field checks that need no files (each error names the key)."""
    d, t, lo, n = cfg.drafter, cfg.train, cfg.loss, cfg.noise

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: '{key}' {msg}")

    need(cfg.target is not None, "target", "is required (the target model directory)")
    need((cfg.data.features is None) != (cfg.data.file is None), "data.features",
         "and 'data.file': give exactly one of them")
    need(d.block_size >= 2, "drafter.block_size", "must be >= 2")
    need(d.num_layers >= 1, "drafter.num_layers", "must be >= 1")
    need(d.target_layer_ids is None or len(d.target_layer_ids) > 0, "drafter.target_layer_ids", "must not be empty")
    need(d.target_layer_ids is None or len(set(d.target_layer_ids)) == len(d.target_layer_ids),
         "drafter.target_layer_ids", "has duplicates")
    need(d.init_std > 0, "drafter.init_std", "must be > 0")
    if d.layer_types is not None:
        bad = sorted(set(d.layer_types) - set(LAYER_TYPES))
        need(not bad, "drafter.layer_types", f"has {bad}; each entry must be one of {', '.join(LAYER_TYPES)}")
        need(d.init is not None or len(d.layer_types) == d.num_layers, "drafter.layer_types",
             f"has {len(d.layer_types)} entries for drafter.num_layers {d.num_layers}")
        need(d.init is not None or "sliding_attention" not in d.layer_types or d.sliding_window is not None,
             "drafter.sliding_window", "is required by the sliding_attention layers in drafter.layer_types")
    need(d.sliding_window is None or d.sliding_window >= 1, "drafter.sliding_window", "must be >= 1")
    for key in ("hidden_size", "vocab_size", "num_target_layers"):
        need(getattr(d, key) is None or getattr(d, key) >= 1, f"drafter.{key}", "must be >= 1")
    need(cfg.data.max_new_tokens >= 1, "data.max_new_tokens", "must be >= 1")
    need(cfg.data.max_length >= 2, "data.max_length", "must be >= 2")
    need(cfg.data.val_count >= 0, "data.val_count", "must be >= 0")
    need(t.max_steps is None or t.max_steps >= 0, "train.max_steps", "must be >= 0")
    need(t.epochs > 0, "train.epochs", "must be > 0")
    need(t.batch_size >= 1, "train.batch_size", "must be >= 1")
    need(t.anchors_per_sequence >= 1, "train.anchors_per_sequence", "must be >= 1")
    need(t.lr > 0, "train.lr", "must be > 0")
    need(0 <= t.min_lr_ratio <= 1, "train.min_lr_ratio", "must be in [0, 1]")
    need(0 <= t.warmup_ratio < 1, "train.warmup_ratio", "must be in [0, 1)")
    need(t.warmup_steps is None or t.warmup_steps >= 0, "train.warmup_steps", "must be >= 0")
    need(t.weight_decay >= 0, "train.weight_decay", "must be >= 0")
    need(len(t.betas) == 2 and all(0 <= b < 1 for b in t.betas), "train.betas", "must be two numbers in [0, 1)")
    need(t.grad_clip >= 0, "train.grad_clip", "must be >= 0")
    need(t.log_every >= 1, "train.log_every", "must be >= 1")
    need(t.checkpoint_every >= 1, "train.checkpoint_every", "must be >= 1")
    need(t.keep_checkpoints is None or t.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1")
    need(all(type(s) is int and s >= 0 for s in t.keep_steps), "train.keep_steps",
         "must be a list of steps (whole numbers >= 0)")
    need(t.val_every >= 0, "train.val_every", "must be >= 0")
    need(lo.gamma is None or lo.gamma > 0, "loss.gamma", "must be > 0")
    need(0 <= lo.soft_kl_weight <= 1, "loss.soft_kl_weight", "must be in [0, 1]")
    need(lo.temperature > 0, "loss.temperature", "must be > 0")
    need(not bounds.temperature(lo.temperature, greedy=False), "loss.temperature",
         str(bounds.temperature(lo.temperature, greedy=False)))
    for key, low in (("data.max_new_tokens", 1), ("data.max_length", 2), ("train.batch_size", 1),
                     ("train.anchors_per_sequence", 1)):
        section, name = key.split(".")
        why = bounds.count(getattr(getattr(cfg, section), name), low)
        need(not why, key, str(why))
    need(n.std >= 0, "noise.std", "must be >= 0")


# ----------------------------------------------------------------------------- resolving


def default_gamma(block_size: int) -> float:
    """gamma by block size: 7 for 16, 5 for 10, 4 for 8, else 7 (docs/training.md §3)."""
    return GAMMA_BY_BLOCK.get(block_size, 7.0)


def read_target_config(target: str | Path) -> dict[str, Any]:
    """The text config of a transformers target directory (``text_config`` of composite configs).

    Raises:
        ConfigError: no readable config.json, or a value specdeck reads of the wrong type or out
            of range, NaN, deep nesting (:func:`core.ml.formats.drafter_config.read_target_config`
            names the file and the key).
    """
    from core.ml.formats.drafter_config import read_target_config as read_checked

    try:
        return read_checked(Path(target) / "config.json")
    except ValueError as exc:  # InvalidFile: names the file and, for one bad value, its key
        raise ConfigError(getattr(exc, "message", str(exc))) from None


TARGET_SIZES = {"num_target_layers": "num_hidden_layers", "hidden_size": "hidden_size", "vocab_size": "vocab_size"}
"""Drafter-section keys that must equal the target's config.json (key there)."""


def refuse_dflash2_init(where: str, init: str | None, init_config: dict[str, Any]) -> None:
    """A DFlash-2 ``drafter.init`` is refused: specdeck's trainer has no loss or path for its
    convolutions and candidate selector (it would drop them, or train them as nothing), so it
    would not continue that drafter (docs/drafter.md §7).

    Raises:
        ConfigError: naming the key, the directory and what to do instead.
    """
    from core.ml.formats.drafter_config import DFLASH2_ARCH, DFLASH2_KEYS

    inner = init_config.get("dflash_config") or {}
    if DFLASH2_ARCH in (init_config.get("architectures") or []) or \
            any(k in inner or k in init_config for k in DFLASH2_KEYS):
        raise ConfigError(f"{where}: 'drafter.init' {init} is a DFlash-2 drafter (DFlash2DraftModel: convolutions "
                          "and a candidate selector), which specdeck does not train; start from a DFlash "
                          "(DFlashDraftModel) drafter, or train it with z-lab's tools")


def resolve(cfg: TrainConfig, where: str, target_cfg: dict[str, Any] | None, mask_token_id: int | None = None,
            init_config: dict[str, Any] | None = None) -> TrainConfig:
    """Fill the automatic values; returns a new config (the resolved one).

    Args:
        cfg: a loaded config.
        where: file name for messages.
        target_cfg: the target's (text) config.json dict; None resolves only what the config
            file states (``--print-config`` where the target is not on this machine): keys that
            need the target stay null.
        mask_token_id: the tokenizer's ``<|MASK|>`` id, if any (used when the key is null).
        init_config: the ``drafter.init`` directory's config.json dict, if any.

    Raises:
        ConfigError: an inconsistency with the target or drafter.init (names both sides).
    """
    from core.ml.formats.drafter_config import DFlashConfig, build_target_layer_ids

    cfg = dataclasses.replace(cfg, drafter=dataclasses.replace(cfg.drafter), loss=dataclasses.replace(cfg.loss))
    d = cfg.drafter
    tc = target_cfg or {}
    if target_cfg is not None:
        for key in (*TARGET_SIZES.values(), "num_attention_heads", "intermediate_size"):  # read below
            why = bounds.count(target_cfg.get(key), 1, bounds.INT64_MAX)
            if why:
                raise ConfigError(f"{where}: the target {cfg.target} has {key} {why} in its config.json: point "
                                  "'target' at the transformers model dir this drafter is for")
        for key, theirs in TARGET_SIZES.items():
            value, mine = int(target_cfg[theirs]), getattr(d, key)
            if mine is not None and mine != value:
                raise ConfigError(f"{where}: 'drafter.{key}' is {mine} but the target {cfg.target} has {theirs} "
                                  f"{value} (its config.json): point 'target' at the model this drafter is for, "
                                  f"or set drafter.{key} to {value}")
            setattr(d, key, value)
    n_target = d.num_target_layers
    final = n_target - 1 if n_target is not None else None
    if init_config is not None:
        refuse_dflash2_init(where, d.init, init_config)
        init = DFlashConfig.from_dict(init_config)
        taps = list(init.target_layer_ids)
        if cfg.fc_layers == "taps_and_final" and final is not None:  # a v4 drafter taps the final layer itself
            if not taps or taps[-1] != final:
                raise ConfigError(f"{where}: 'fc_layers' taps_and_final but drafter.init taps {taps} "
                                  f"(expected the final layer {final} last)")
            taps = taps[:-1]
        given = {"block_size": init.block_size, "num_layers": init.num_hidden_layers, "target_layer_ids": taps,
                 "mask_token_id": init.mask_token_id, "num_attention_heads": init.num_attention_heads,
                 "num_key_value_heads": init.num_key_value_heads, "head_dim": init.head_dim,
                 "intermediate_size": init.intermediate_size, "rope_theta": init.rope_theta,
                 "max_position_embeddings": init.max_position_embeddings, "layer_types": list(init.layer_types),
                 "sliding_window": init.sliding_window, "hidden_size": init.hidden_size,
                 "vocab_size": init.vocab_size}
        for key, value in given.items():
            mine = getattr(d, key)
            if key in ("block_size", "num_layers"):
                default = getattr(DrafterSection(), key)
                if mine != default and mine != value:
                    raise ConfigError(f"{where}: 'drafter.{key}' is {mine} but drafter.init has {value}")
            elif mine is not None and mine != value:
                raise ConfigError(f"{where}: 'drafter.{key}' is {mine} but drafter.init {d.init} has {value}"
                                  + (" (the target's)" if key in TARGET_SIZES and target_cfg is not None else ""))
            setattr(d, key, value)
    rope = tc.get("rope_theta", (tc.get("rope_parameters") or {}).get("rope_theta"))
    if d.target_layer_ids is None and n_target is not None:
        d.target_layer_ids = build_target_layer_ids(n_target, d.num_layers)
    if n_target is not None:
        bad = [i for i in d.target_layer_ids if not 0 <= i < n_target]
        if bad:
            raise ConfigError(f"{where}: 'drafter.target_layer_ids' {bad} outside the target's layers "
                              f"0..{n_target - 1} ({n_target} decoder layers): tap layers of this target")
        if final in d.target_layer_ids:
            raise ConfigError(f"{where}: 'drafter.target_layer_ids' contains the final layer {final}, which is "
                              "reserved for the target logits (use fc_layers: taps_and_final for the v4 shortcut)")
    if d.mask_token_id is None and target_cfg is not None:
        if mask_token_id is None:
            raise ConfigError(f"{where}: 'drafter.mask_token_id' is null and the target tokenizer has no <|MASK|> token")
        d.mask_token_id = int(mask_token_id)
    if d.mask_token_id is not None and d.vocab_size is not None and not 0 <= d.mask_token_id < d.vocab_size:
        raise ConfigError(f"{where}: 'drafter.mask_token_id' {d.mask_token_id} outside the target vocabulary "
                          f"({d.vocab_size} rows)")
    if target_cfg is not None:
        H = d.hidden_size
        d.num_attention_heads = d.num_attention_heads or int(tc["num_attention_heads"])
        d.num_key_value_heads = d.num_key_value_heads or int(tc.get("num_key_value_heads") or tc["num_attention_heads"])
        d.head_dim = d.head_dim or int(tc.get("head_dim") or H // int(tc["num_attention_heads"]))
        d.intermediate_size = d.intermediate_size or int(tc["intermediate_size"])
        d.rope_theta = float(d.rope_theta if d.rope_theta is not None else (rope if rope is not None else 1e6))
        d.max_position_embeddings = d.max_position_embeddings or int(tc.get("max_position_embeddings") or 40960)
    if d.num_attention_heads and d.num_key_value_heads and d.num_attention_heads % d.num_key_value_heads:
        raise ConfigError(f"{where}: 'drafter.num_attention_heads' must be a multiple of 'drafter.num_key_value_heads'")
    if d.layer_types is None:
        d.layer_types = ["full_attention"] * d.num_layers
    if len(d.layer_types) != d.num_layers:
        raise ConfigError(f"{where}: 'drafter.layer_types' has {len(d.layer_types)} entries for "
                          f"{d.num_layers} draft layers")
    if "sliding_attention" in d.layer_types and d.sliding_window is None:
        raise ConfigError(f"{where}: 'drafter.sliding_window' is required by the sliding_attention layers")
    if cfg.loss.gamma is None:
        cfg.loss.gamma = default_gamma(d.block_size)
    if cfg.data.min_loss_tokens is None:
        cfg.data = dataclasses.replace(cfg.data, min_loss_tokens=2 * d.block_size)
    return cfg


def unresolved(cfg: TrainConfig) -> list[str]:
    """Drafter keys still null after :func:`resolve` without a target (``drafter.init`` aside)."""
    d = cfg.drafter
    return [f"drafter.{f.name}" for f in dataclasses.fields(d)
            if getattr(d, f.name) is None and f.name not in ("init", "sliding_window")]


def drafter_config_dict(cfg: TrainConfig, target_cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    """The z-lab config.json of the drafter a resolved config trains.

    From ``drafter.init``: that drafter's config.json with every field kept (``layer_types``,
    ``sliding_window``, ``use_sliding_window``, ``max_window_layers``, overrides ...). Otherwise
    a new one from the drafter section. With ``fc_layers: taps_and_final`` the drafter's
    ``target_layer_ids`` end with the final layer N-1, so fc is (K+1)*H wide and inference taps
    the final layer too.
    """
    from core.ml.formats.drafter_config import DFlashConfig

    d = cfg.drafter
    if d.init is not None:
        init = DFlashConfig.from_file(Path(d.init) / "config.json")
        if init.num_target_layers is None:
            init.num_target_layers = d.num_target_layers
        return init.to_dict()
    n_target = d.num_target_layers
    ids = list(d.target_layer_ids) + ([n_target - 1] if cfg.fc_layers == "taps_and_final" else [])
    return DFlashConfig(
        hidden_size=d.hidden_size, num_hidden_layers=d.num_layers,
        num_attention_heads=d.num_attention_heads, num_key_value_heads=d.num_key_value_heads,
        head_dim=d.head_dim, intermediate_size=d.intermediate_size, vocab_size=d.vocab_size,
        block_size=d.block_size, mask_token_id=d.mask_token_id, target_layer_ids=ids,
        num_target_layers=n_target, rms_norm_eps=float((target_cfg or {}).get("rms_norm_eps", 1e-6)),
        max_position_embeddings=d.max_position_embeddings, rope_theta=d.rope_theta,
        layer_types=list(d.layer_types), sliding_window=d.sliding_window,
    ).to_dict()


def cache_problems(cfg: TrainConfig, manifest: dict[str, Any], where: str = "data.features") -> list[str]:
    """Why an extract cache (its manifest.json) cannot feed this resolved config; [] when it can.

    Checks the hidden size, that every tap is in the cache, and that the target's final layer
    is there when a knob needs it (v4 ``fc_layers``/``noise.target``/``loss.soft_kl_weight``).
    Each message names both sides and the fix.
    """
    d = cfg.drafter
    out: list[str] = []
    layers = [int(i) for i in manifest.get("layer_ids") or []]
    H = manifest.get("hidden_size")
    if H is not None and d.hidden_size is not None and int(H) != d.hidden_size:
        out.append(f"{where} {cfg.data.features} holds hidden size {H} but the drafter/target has {d.hidden_size}: "
                   f"it was extracted from another model; extract it again from {cfg.target}")
    missing = [i for i in d.target_layer_ids or [] if i not in layers]
    final = d.num_target_layers - 1 if d.num_target_layers is not None else None
    want = [*(d.target_layer_ids or []), *([final] if final is not None else [])]
    if missing:
        out.append(f"{where} {cfg.data.features} holds layers {layers} but drafter.target_layer_ids "
                   f"{d.target_layer_ids} need {missing} too: extract --layers {','.join(map(str, want))}")
    needs = [k for k, bad in (("fc_layers", cfg.fc_layers == "taps_and_final"),
                              ("noise.target", cfg.noise.target == "all_features" and cfg.noise.std > 0),
                              ("loss.soft_kl_weight", cfg.loss.soft_kl_weight > 0)) if bad]
    if needs and final is not None and final not in layers:
        out.append(f"'{needs[0]}' needs the target's final layer {final} in {where} {cfg.data.features} (it holds "
                   f"layers {layers}): extract --layers {','.join(map(str, want))}")
    return out


# ----------------------------------------------------------------------------- output


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"loss": {"gamma": 4}}`` -> ``{"loss.gamma": 4}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def knob_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between two resolved configs (``RUN_KEYS`` ignored)."""
    fa, fb = flatten(a), flatten(b)
    keys = sorted(set(fa) | set(fb))
    return {k: (fa.get(k), fb.get(k)) for k in keys if k not in RUN_KEYS and fa.get(k) != fb.get(k)}


def to_yaml(cfg: TrainConfig, header: str | None = None) -> str:
    """The config as YAML (sections in schema order), with an optional comment header."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def flow_list(dumper: yaml.SafeDumper, data: list[Any]) -> Any:
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)

    Dumper.add_representer(list, flow_list)
    text = yaml.dump(cfg.to_dict(), Dumper=Dumper, sort_keys=False, default_flow_style=False)
    return (f"# {header}\n" if header else "") + text


def describe() -> str:
    """Every knob with its type, default and doc, one line each (``--describe``)."""
    lines: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if _is_section(tp):
                lines.append(f"\n[{f.name}]  {tp.__doc__.strip().splitlines()[0]}")
                walk(tp, f"{f.name}.")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            choices = f.metadata.get("choices")
            kind = " | ".join(choices) if choices else getattr(tp, "__name__", str(tp)).replace("typing.", "")
            lines.append(f"{prefix}{f.name} = {strictjson.dumps(default)}  ({kind})\n    {f.metadata['doc']}")

    walk(TrainConfig, "")
    return "\n".join(lines).strip() + "\n"
