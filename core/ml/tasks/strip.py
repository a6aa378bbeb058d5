"""``python -m core.ml.strip``: training checkpoint -> drafter ``model.safetensors`` + ``config.json``.

    python -m core.ml.strip CHECKPOINT OUT_DIR [--key model] [--prefix P] [--trust-pickle]
                            [--config CONFIG] [--dtype keep|float32|bfloat16|float16]

A training checkpoint is a ``torch.save`` dict such as ``{"model": state_dict, "optimizer":
..., "scheduler": ..., "step": ..., "config": {...}}`` (core.ml.train's) or SpecForge's
``training_state.pt`` (``{"draft_state_dict": ..., "global_step": ...}``, read without ``--key``). It is opened with
``torch.load(mmap=True, weights_only=True)``: tensors stay in the memory-mapped file and only
the drafter weights are ever read (the optimizer state, typically 2x the weights, is never
paged in), and they are written one tensor at a time (:mod:`core.ml.formats.safetensors_stream`), so
peak memory is about the weights, not the checkpoint. A checkpoint that needs
arbitrary unpickling (dataclasses, Paths, numpy scalars...) is refused unless
``--trust-pickle`` is given (that runs code from the file: only for checkpoints you made).

The drafter config comes from ``--config`` (a config.json or a drafter directory), else the
checkpoint's ``config`` entry, else a ``config.json`` beside the checkpoint. Keys are matched
strictly against the drafter's tensor names (docs/drafter.md §1) after removing ``--prefix`` (and an
automatic ``module.`` / ``_orig_mod.`` / ``model.`` prefix); target embeddings/LM head are dropped.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.ml.formats.runio import UsageError, atomic_write_json, emit, provenance, run_main, say

STATE_KEYS = ("draft_state_dict", "model", "state_dict", "model_state_dict", "module", "draft_model")
"""Where trainers keep the drafter's weights: SpecForge's ``training_state.pt`` under
``draft_state_dict`` (keys ``draft_model.*`` beside the frozen target's embedding and head),
core.ml.train's under ``model``."""
AUTO_PREFIXES = ("module.", "_orig_mod.", "model.", "draft_model.")
DROP_PREFIXES = ("embed_tokens.", "lm_head.", "verifier_", "target_")


def load_checkpoint(path: Path, trust_pickle: bool) -> Any:
    """``torch.load`` with mmap; weights-only unless ``trust_pickle``.

    Raises:
        UsageError: the file needs arbitrary unpickling (names ``--trust-pickle``), or is not a
            torch checkpoint.
    """
    import torch

    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=not trust_pickle)
    except pickle.UnpicklingError as exc:
        if trust_pickle:
            raise UsageError(f"{path}: cannot unpickle ({exc})") from exc
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
        detail = next((ln.strip() for ln in text.splitlines() if "Unsupported global" in ln), "")
        raise UsageError(
            f"{path} needs arbitrary unpickling (it pickles objects other than tensors and plain "
            f"containers{': ' + detail if detail else ''}). Re-run with --trust-pickle if you trust this file."
        ) from exc
    except RuntimeError as exc:
        if "mmap" in str(exc) or "zip" in str(exc).lower():
            raise UsageError(f"{path}: {_not_a_checkpoint(path, exc)}") from None
        raise


def _not_a_checkpoint(path: Path, exc: Exception) -> str:
    """What a file torch cannot open as a zip checkpoint is: empty, a zip cut short, drafter
    weights already (safetensors), or something else (torch's own words then)."""
    from core.ml.formats.safetensors_header import read_header

    with open(path, "rb") as f:
        size, magic = os.fstat(f.fileno()).st_size, f.read(4)
    if size == 0:
        return "empty (0 bytes): not a torch checkpoint; copy it again from where it was saved"
    if magic == b"PK\x03\x04":
        return (f"truncated or damaged: a zip-format torch checkpoint of {size} bytes whose end (the zip's "
                "central directory) is missing or wrong; copy it again from where it was saved")
    try:
        read_header(path)
    except ValueError:
        return f"not a zip-format torch checkpoint (torch.save's format), cannot mmap it ({exc})"
    return ("a safetensors file, not a training checkpoint: these are drafter weights already; put them in a "
            "drafter directory beside their config.json instead of stripping them")


def pick_state(ckpt: Any, key: str | None) -> dict[str, Any]:
    """The drafter state dict inside a checkpoint (``--key`` or the first of STATE_KEYS)."""
    import torch

    if not isinstance(ckpt, dict):
        raise UsageError(f"checkpoint is a {type(ckpt).__name__}, expected a dict")
    if key is not None:
        if key not in ckpt:
            raise UsageError(f"--key {key!r} not in checkpoint (keys: {sorted(map(str, ckpt))[:20]})")
        state = ckpt[key]
    elif all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        state = ckpt  # a bare state dict
    else:
        found = [k for k in STATE_KEYS if isinstance(ckpt.get(k), dict)]
        if not found:
            raise UsageError(f"no state dict found (tried {STATE_KEYS}); pass --key (keys: {sorted(map(str, ckpt))[:20]})")
        state = ckpt[found[0]]
    if not isinstance(state, dict):
        raise UsageError(f"checkpoint entry is a {type(state).__name__}, not a state dict")
    return state


def find_config(args: argparse.Namespace, ckpt: Any) -> Any:
    """The drafter config (``--config``, the checkpoint's entry, or a config.json beside it),
    every field checked (:meth:`DFlashConfig.from_dict`): a bad value is refused by file (or
    entry) and key."""
    from core.errors import InvalidInput
    from core.ml.formats.drafter_config import DFlashConfig

    try:
        if args.config:
            return DFlashConfig.from_file(args.config)
        if isinstance(ckpt, dict):
            # core.ml.train stores the drafter's config.json under drafter_config and its own
            # (trainer) config under config; other trainers store the drafter's under config.
            for key in ("drafter_config", "config"):
                cfg = ckpt.get(key)
                if isinstance(cfg, dict) and ("block_size" in cfg or "dflash_config" in cfg):
                    return DFlashConfig.from_dict(cfg, source=f"{args.checkpoint} (its {key!r} entry)")
        beside = Path(args.checkpoint).parent / "config.json"
        if beside.is_file():
            return DFlashConfig.from_file(beside)
    except InvalidInput:  # InvalidFile: names the file (or the checkpoint's entry) and the key
        raise
    except (OSError, ValueError) as exc:
        raise UsageError(f"drafter config unreadable: {exc}") from exc
    raise UsageError("no drafter config: pass --config CONFIG.json (or a drafter dir), or store 'config' in the "
                     "checkpoint (a SpecForge checkpoint carries none: give its model.draft_model_config)")


def clean_keys(state: dict[str, Any], prefix: str | None, want: set[str]) -> tuple[dict[str, Any], list[str]]:
    """Strip prefixes and drop target-owned tensors; returns (state, dropped keys)."""
    dropped = []
    if prefix:
        dropped += [k for k in state if not k.startswith(prefix)]
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    changed = True
    while changed and not (set(state) & want):
        changed = False
        for p in AUTO_PREFIXES:
            if state and all(k.startswith(p) for k in state):
                state = {k[len(p):]: v for k, v in state.items()}
                changed = True
    keep = {}
    for k, v in state.items():
        if k not in want and k.startswith(DROP_PREFIXES):
            dropped.append(k)
        else:
            keep[k] = v
    return keep, dropped


def _step_of(ckpt: Any) -> int | None:
    """The step a checkpoint says it was saved at (SpecForge: ``global_step``)."""
    if not isinstance(ckpt, dict):
        return None
    step = ckpt.get("step", ckpt.get("global_step"))
    return step if isinstance(step, int) else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.strip", description="strip a training checkpoint to drafter weights")
    p.add_argument("checkpoint", help="torch.save checkpoint (dict with model, optimizer, ...)")
    p.add_argument("out_dir", help="output drafter directory")
    p.add_argument("--key", help="checkpoint entry holding the drafter state dict (default: auto)")
    p.add_argument("--prefix", help="key prefix to strip (keys without it are dropped)")
    p.add_argument("--trust-pickle", action="store_true", help="allow arbitrary unpickling (runs code from the file)")
    p.add_argument("--config", help="drafter config.json or directory (default: from the checkpoint)")
    p.add_argument("--dtype", default="keep", choices=["keep", "float32", "bfloat16", "float16"])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ckpt_path = Path(args.checkpoint)
    if not ckpt_path.is_file():
        raise UsageError(f"checkpoint not found: {ckpt_path}")
    import torch

    from core.ml.models.drafter import CONFIG_NAME, WEIGHTS_NAME, check_fields, expected_tensors
    from core.ml.formats.runio import atomic_target
    from core.ml.formats.safetensors_stream import save_streaming

    size_in = ckpt_path.stat().st_size
    ckpt = load_checkpoint(ckpt_path, args.trust_pickle)
    config = find_config(args, ckpt)
    want = expected_tensors(config)
    state, dropped = clean_keys(pick_state(ckpt, args.key), args.prefix, set(want))
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    shapes = [f"{k}: {tuple(state[k].shape)} != {want[k]}" for k in want if k in state and tuple(state[k].shape) != want[k]]
    if missing or unexpected or shapes:
        raise UsageError(f"state dict does not match the drafter config: missing={missing[:8]} "
                         f"unexpected={unexpected[:8]} shapes={shapes[:8]} (check --key/--prefix/--config)")
    if dropped:
        say(f"dropped {len(dropped)} non-drafter tensors, e.g. {dropped[:3]}")
    dtype = None if args.dtype == "keep" else getattr(torch, args.dtype)
    out = Path(args.out_dir)
    tensors = {k: state[k] for k in want}  # still mmap-backed: pages are read while writing
    cfg = config.to_dict()
    cfg["dtype"] = str(dtype or next(iter(tensors.values())).dtype).removeprefix("torch.")
    check_fields(cfg, str(out / CONFIG_NAME))  # every value finite and in range, before a byte is written
    out.mkdir(parents=True, exist_ok=True)
    weights_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    with atomic_target(out / WEIGHTS_NAME) as tmp:
        save_streaming(tensors, tmp, metadata={"format": "pt"}, dtype=dtype)
    atomic_write_json(out / CONFIG_NAME, cfg, allow_nan=False)
    prov = provenance(task="strip", extra={"checkpoint": str(ckpt_path.resolve()),
                                           "step": _step_of(ckpt)})
    atomic_write_json(out / "provenance.json", prov)
    size_out = (out / WEIGHTS_NAME).stat().st_size
    emit("info", task="strip", checkpoint_bytes=size_in, weights_bytes=weights_bytes, out_bytes=size_out,
         tensors=len(tensors), dropped=len(dropped))
    say(f"checkpoint {size_in / 2**20:.1f} MiB -> {WEIGHTS_NAME} {size_out / 2**20:.1f} MiB ({len(tensors)} tensors)")
    emit("result", task="strip", path=str(out.resolve()))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
