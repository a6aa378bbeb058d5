"""A target checkpoint's weights without loading them: dtype, bytes per tensor, partial loads.

Everything here reads only ``config.json``, ``model.safetensors.index.json`` and the
safetensors headers (8-byte length + JSON), so it costs kilobytes whatever the model's size:

* :func:`checkpoint_dtype`: the dtype the checkpoint is stored in (bf16 for the campaign's
  target), so a load keeps it instead of upcasting to float32 (2x the memory);
* :func:`weight_bytes`: bytes of all tensors or of a named subset, at a given dtype, for the
  memory preflight (:func:`preflight`), which refuses before loading instead of an OOM kill;
* :func:`load_embed_head`: exactly the input embedding and LM head, by name, memory-mapped
  from the safetensors files (what the trainer from cached features and offline eval need; a
  27B target's embedding + head are about 2.5 GB of its 54).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.ml.formats.runio import UsageError, parse_bytes  # noqa: F401  (parse_bytes: re-exported)
from core.ml.formats.safetensors_header import read_header, shard_files
from core.ml.formats.safetensors_stream import DTYPES
from core.text import read_json_file

ST_DTYPES = {v: k for k, v in DTYPES.items()}
NAMED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EMBED_SUFFIX, HEAD_SUFFIX, NORM_SUFFIX = "embed_tokens.weight", "lm_head.weight", "norm.weight"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: file, dtype, shape, absolute byte offsets in the file."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def weight_files(model_dir: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files of the checkpoint in ``model_dir``: the shards its
    ``model.safetensors.index.json`` names (sorted, each once), else ``model.safetensors``.

    Raises:
        FileNotFoundError: neither file is there.
        InvalidFile: an index that names no files, or names files outside ``model_dir``.
    """
    root = Path(model_dir)
    files = shard_files(root)
    if not files:
        raise FileNotFoundError(f"{root}: no model.safetensors or model.safetensors.index.json")
    return files


def tensor_index(model_dir: str | os.PathLike[str]) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint in ``model_dir`` (sharded or single-file safetensors),
    each file's header checked against the file (:func:`core.ml.formats.safetensors_header.read_header`).

    Raises:
        FileNotFoundError: no safetensors there.
        InvalidFile: a file cut short, empty or not safetensors; an index that names no files.
    """
    out: dict[str, TensorInfo] = {}
    for path in weight_files(model_dir):
        header = read_header(path)
        start = header.data_start
        for key, meta in header.tensors.items():
            b, e = meta["data_offsets"]
            out[key] = TensorInfo(path, ST_DTYPES.get(meta["dtype"], torch.uint8), tuple(meta["shape"]), start + b, start + e)
    return out


def _config(model_dir: Path) -> dict[str, Any]:
    try:
        cfg = read_json_file(Path(model_dir) / "config.json", "target config")
    except ValueError:  # InvalidFile: a config that does not say its dtype says no dtype here
        return {}
    return cfg if isinstance(cfg, dict) else {}


def checkpoint_dtype(model_dir: str | os.PathLike[str]) -> torch.dtype | None:
    """The floating dtype the checkpoint is stored in: the one holding most bytes in the
    safetensors headers, else ``dtype``/``torch_dtype`` of config.json; None if unknown."""
    try:
        index = tensor_index(model_dir)
    except (OSError, ValueError):
        index = {}
    by: dict[torch.dtype, int] = {}
    for info in index.values():
        if info.dtype.is_floating_point:
            by[info.dtype] = by.get(info.dtype, 0) + info.end - info.begin
    if by:
        return max(by, key=by.__getitem__)
    cfg = _config(Path(model_dir))
    for c in (cfg, cfg.get("text_config")):
        name = (c.get("dtype") or c.get("torch_dtype")) if isinstance(c, dict) else None
        if isinstance(name, str) and name in NAMED_DTYPES:
            return NAMED_DTYPES[name]
    return None


def weight_bytes(model_dir: str | os.PathLike[str], names: Iterable[str] | None = None,
                 dtype: torch.dtype | None = None) -> int:
    """Bytes the named tensors (default: all) take once loaded in ``dtype`` (None: as stored)."""
    index = tensor_index(model_dir)
    total = 0
    for key in (index if names is None else names):
        info = index[key]
        dt = dtype if (dtype is not None and info.dtype.is_floating_point) else info.dtype
        total += info.numel * torch.empty((), dtype=dt).element_size()
    return total


def embed_head_names(model_dir: str | os.PathLike[str], norm: bool = False) -> dict[str, str]:
    """``{"embed": name, "head": name[, "norm": name]}`` in the checkpoint (tied head: the embedding).

    Raises:
        ValueError: no (or several) embedding / final norm tensors.
    """
    index = tensor_index(model_dir)
    keys = [k for k in index if "visual" not in k and "mtp" not in k.split(".")[0]]

    def one(suffix: str, exclude: str = "") -> str | None:
        hits = [k for k in keys if k.endswith(suffix) and (not exclude or exclude not in k)]
        # the text model's own tensor: the shortest name (model.norm.weight, not layers.N.x.norm.weight)
        hits = [k for k in hits if k.count(".") == min(h.count(".") for h in hits)] if hits else []
        if len(hits) > 1:
            raise ValueError(f"{model_dir}: several tensors end in {suffix}: {hits[:4]}")
        return hits[0] if hits else None

    embed = one(EMBED_SUFFIX)
    if embed is None:
        raise ValueError(f"{model_dir}: no tensor named *{EMBED_SUFFIX} in the checkpoint")
    out = {"embed": embed, "head": one(HEAD_SUFFIX) or embed}
    if norm:
        name = one("." + NORM_SUFFIX, "layers.")
        if name is None:
            raise ValueError(f"{model_dir}: no final norm (*.{NORM_SUFFIX}) in the checkpoint")
        out["norm"] = name
    return out


def load_mmap(model_dir: str | os.PathLike[str], names: Iterable[str]) -> dict[str, torch.Tensor]:
    """The named tensors, memory-mapped (copy-on-write) from their safetensors files.

    Pages are read when touched and stay reclaimable file pages; nothing else of the file is
    read. A tensor whose offset is not aligned to its element size is copied instead.
    """
    index = tensor_index(model_dir)
    maps: dict[Path, mmap.mmap] = {}
    out = {}
    for key in names:
        info = index[key]
        if info.file not in maps:
            with open(info.file, "rb") as f:
                maps[info.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        nbytes = info.end - info.begin
        raw = torch.frombuffer(maps[info.file], dtype=torch.uint8, count=nbytes, offset=info.begin) if nbytes else \
            torch.empty(0, dtype=torch.uint8)
        if info.begin % torch.empty((), dtype=info.dtype).element_size():
            raw = raw.clone()
        out[key] = raw.view(info.dtype).reshape(info.shape)
    return out


class EmbedHead(nn.Module):
    """A target reduced to its input embedding and LM head (and final norm when loaded).

    Offers what the offline eval and the trainer from cached features use of a target:
    ``get_input_embeddings()``, ``get_output_embeddings()``, ``config``, ``dtype``.
    """

    def __init__(self, config: Any, embed: torch.Tensor, head: torch.Tensor, norm: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(embed.shape[0], embed.shape[1], _weight=embed, _freeze=True)
        self.lm_head = nn.Linear(head.shape[1], head.shape[0], bias=False, device="meta")
        tied = head.data_ptr() == embed.data_ptr() and head.shape == embed.shape
        self.lm_head.weight = self.embed_tokens.weight if tied else nn.Parameter(head, requires_grad=False)
        self.norm_weight = nn.Parameter(norm, requires_grad=False) if norm is not None else None

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype


def load_embed_head(model_dir: str | os.PathLike[str], device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None, norm: bool = False) -> EmbedHead:
    """Only the embedding and LM head of the target in ``model_dir`` (memory-mapped on CPU in
    the stored dtype; moved/cast only when ``device``/``dtype`` ask for it)."""
    from transformers import AutoConfig

    names = embed_head_names(model_dir, norm)
    tensors = load_mmap(model_dir, set(names.values()))
    dev = torch.device(device)

    def put(t: torch.Tensor) -> torch.Tensor:
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        return t.to(dev) if dev.type != "cpu" else t

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    ready = {name: put(t) for name, t in tensors.items()}  # a tied head is cast once, shared
    return EmbedHead(config, ready[names["embed"]], ready[names["head"]],
                     ready[names["norm"]] if norm else None).eval()


# ----------------------------------------------------------------------------- memory preflight

def available_memory() -> int | None:
    """Bytes this process may still use: MemAvailable, capped by a cgroup v2 limit."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            room = int(limit) - used
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def gb(n: float) -> str:
    """Bytes as GB with two decimals (MB below 10 MB, where GB would read 0.00)."""
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n / 1e6:.2f} MB"


def preflight(needed: int, what: str, max_memory: str | None = None, hint: str = "",
              device: torch.device | None = None) -> dict[str, Any]:
    """Refuse (UsageError, exit 2) when ``needed`` bytes exceed ``--max-memory`` or what the host
    (or the CUDA device) has available; returns the figures otherwise."""
    if max_memory is not None:
        try:
            avail, source = parse_bytes(max_memory), "--max-memory"
        except ValueError as exc:
            raise UsageError(f"--max-memory {exc}") from None
    elif device is not None and device.type == "cuda":
        avail, source = torch.cuda.mem_get_info(device)[0], f"free on {device}"
    else:
        avail, source = available_memory(), "available on this host"
    if avail is not None and needed > avail:
        raise UsageError(f"{what} needs {gb(needed)} of memory, {gb(avail)} {source}: refused before loading. "
                         f"{hint}".rstrip())
    return {"needed_bytes": needed, "available_bytes": avail, "source": source}
