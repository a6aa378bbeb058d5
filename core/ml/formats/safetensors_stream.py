"""Write a safetensors file one tensor at a time (bounded memory); read one whose header was checked.

``safetensors.torch.save_file`` first turns every tensor into a ``bytes`` copy and holds them
all, so saving W bytes of weights costs about W extra bytes of memory; when the tensors are
memory-mapped from a checkpoint that doubles the peak. Here the header is computed from shapes
and dtypes alone, then each tensor's raw bytes are written straight from its storage (after an
optional per-tensor dtype cast), so the extra memory is at most one tensor. The output is a
standard safetensors file (``safetensors.torch.load_file`` reads it; tests check that).

Format: 8-byte little-endian header length, a JSON header ``{name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}}`` padded with spaces to a multiple of 8,
then the concatenated tensor bytes in header order.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

from core.ml.formats import strictjson

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


def save_streaming(
    tensors: Mapping[str, torch.Tensor],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
    dtype: torch.dtype | None = None,
) -> int:
    """Write ``tensors`` to ``path`` in safetensors format, one tensor in memory at a time.

    Args:
        tensors: name -> tensor (any device; CPU tensors may be mmap-backed).
        path: output file (written in place; wrap with an atomic rename if needed).
        metadata: string -> string ``__metadata__``.
        dtype: cast floating-point tensors to this dtype on the way out (None: keep).

    Returns:
        Bytes written.
    """
    names = sorted(tensors)
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    out_dtypes = {}
    for name in names:
        t = tensors[name]
        dt = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        if dt not in DTYPES:
            raise ValueError(f"{name}: dtype {dt} not supported by safetensors")
        nbytes = t.numel() * torch.empty((), dtype=dt).element_size()
        header[name] = {"dtype": DTYPES[dt], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        out_dtypes[name] = dt
        offset += nbytes
    blob = strictjson.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(Path(path), "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in names:
            t = tensors[name].detach()
            if t.dtype != out_dtypes[name]:
                t = t.to(out_dtypes[name])
            t = t.to("cpu").contiguous()
            if t.numel():
                f.write(memoryview(t.view(-1).view(torch.uint8).numpy()))
            del t
        f.flush()
        os.fsync(f.fileno())
    return 8 + len(blob) + offset


def load_checked(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file ``path`` (``safetensors.torch.load_file``), once its
    header is checked against the file (:func:`core.ml.formats.safetensors_header.read_header`): a copy
    cut short, an empty file or one that is not safetensors is an
    :class:`~core.errors.InvalidFile` naming it, and so is what ``safetensors`` still refuses."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from core.errors import InvalidFile
    from core.ml.formats.safetensors_header import read_header

    read_header(path)
    try:
        return load_file(os.fspath(path))
    except SafetensorError as exc:
        raise InvalidFile(path, f"not a readable safetensors file ({exc})") from None
