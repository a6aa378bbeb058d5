"""On-disk cache of target features written by ``core.ml.extract`` and read by offline eval.

Layout of a cache directory::

    manifest.json              format, target, layer ids, dtype, entries {id: {...}}, provenance
    provenance.json            the provenance of the (last) extract run
    seq/<name>.safetensors     one file per prompt:
        input_ids [S] int64    prompt + the target's greedy continuation
        features  [S, K*H]     hidden_states[id + 1] of each tapped layer, concatenated
        labels    [S] int64    labels[t] = argmax of the target at position t (the greedy
                               token for position t + 1), from one full forward
        metadata: id, prompt_len

Every file and the manifest are written through a temp file and ``os.replace``, so a crash
never leaves a half-written entry; the manifest lists only complete entries (resume = skip
the ids already listed).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from core.ml.formats.runio import UsageError, atomic_target, atomic_write_json, read_json

FORMAT = "specdeck-features-v1"
MANIFEST = "manifest.json"


@dataclass
class CachedSequence:
    """One cached prompt: ids, features and greedy labels (see module docstring)."""

    id: str
    input_ids: Tensor  # [S] int64
    features: Tensor  # [S, K*H]
    labels: Tensor  # [S] int64
    prompt_len: int

    @property
    def generated(self) -> list[int]:
        return self.input_ids[self.prompt_len:].tolist()


def entry_name(prompt_id: str) -> str:
    """Filesystem-safe, collision-free file name for a prompt id."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(prompt_id))[:60] or "prompt"
    digest = hashlib.sha256(str(prompt_id).encode()).hexdigest()[:10]
    return f"seq/{stem}-{digest}.safetensors"


def write_entry(root: Path, seq: CachedSequence) -> str:
    """Write one sequence file atomically; returns its path relative to ``root``."""
    from safetensors.torch import save_file

    rel = entry_name(seq.id)
    tensors = {
        "input_ids": seq.input_ids.detach().to("cpu", torch.int64).contiguous(),
        "features": seq.features.detach().cpu().contiguous(),
        "labels": seq.labels.detach().to("cpu", torch.int64).contiguous(),
    }
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    with atomic_target(root / rel) as tmp:
        save_file(tensors, str(tmp), metadata={"id": str(seq.id), "prompt_len": str(seq.prompt_len), "format": FORMAT})
    return rel


def read_entry(root: Path, prompt_id: str, entry: dict[str, Any]) -> CachedSequence:
    """Load one sequence listed in the manifest (its header checked: a cut copy is refused by name)."""
    from core.ml.formats.safetensors_stream import load_checked

    path = root / entry["file"]
    if not path.is_file():
        raise UsageError(f"feature cache {root}: {entry['file']} listed in the manifest is missing")
    t = load_checked(path)
    return CachedSequence(str(prompt_id), t["input_ids"], t["features"], t["labels"], int(entry["prompt_len"]))


def load_manifest(root: Path) -> dict[str, Any] | None:
    """The manifest of a cache directory, or None when there is none yet."""
    path = Path(root) / MANIFEST
    if not path.exists():
        return None
    manifest = read_json(path, what="feature cache manifest")
    if manifest.get("format") != FORMAT:
        raise UsageError(f"{path}: format {manifest.get('format')!r} is not {FORMAT}")
    return manifest


def save_manifest(root: Path, manifest: dict[str, Any]) -> None:
    atomic_write_json(Path(root) / MANIFEST, manifest)
