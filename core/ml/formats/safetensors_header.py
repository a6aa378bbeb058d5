"""A safetensors file's header, read and checked against the file before a byte of a tensor is.

Pure Python (no torch): ``specdeck engines`` checks a drafter's weights with it on a laptop,
and every loader (:func:`core.ml.models.drafter.load_drafter`, :func:`core.ml.formats.weights.tensor_index`,
the feature cache) runs it before ``safetensors`` does, so a copy cut short, an empty file, a
header length that claims more bytes than the file holds, or a file that is not safetensors at
all is refused naming the file and what is wrong (:class:`core.errors.InvalidFile`: exit 2),
never met as an internal error from inside a load.

Format: 8-byte little-endian header length N, N bytes of a JSON object ``{name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}``, then the tensors' bytes, which the
offsets must cover exactly, with no gap, no overlap and nothing after (as ``safetensors``
requires).
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import InvalidFile
from core.text import too_deep

MAX_HEADER = 100 * 1024 * 1024
"""The largest header ``safetensors`` itself reads (its own limit)."""
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
              "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
"""Bytes per element of the dtypes whose tensor sizes are checked (others: offsets only)."""
HINT = "copy the file again from where it was made (a relay item re-sends it whole), or re-run what wrote it"


@dataclass(frozen=True)
class Header:
    """A checked safetensors header.

    Attributes:
        tensors: name -> ``{"dtype", "shape", "data_offsets"}`` as the file says (checked).
        metadata: the ``__metadata__`` strings.
        data_start: where the tensor bytes begin (8 + the header length).
        size: the file's size in bytes (``data_start`` + every tensor's bytes).
    """

    tensors: dict[str, dict[str, Any]]
    metadata: dict[str, str]
    data_start: int
    size: int


def read_header(path: str | os.PathLike[str]) -> Header:
    """The checked header of the safetensors file ``path``.

    Raises:
        InvalidFile: ``truncated (header says N bytes, file has M)``, ``empty``, ``not a
            safetensors file (...)``, or a tensor whose dtype, shape or offsets do not add up.
    """
    shown = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidFile(shown, "not a regular file: not a safetensors file", hint=HINT)
            size = st.st_size
            head = f.read(9)
            more = header_length(head, size)
            blob = f.read(more) if more else b""
    except OSError as e:
        raise InvalidFile(shown, f"cannot read it: {e.strerror or e}") from None
    return header_from(shown, size, head, blob)


def header_length(head: bytes, size: int) -> int | None:
    """How many header bytes to read after the first 9 (``head``: the file's first 9 bytes,
    ``size``: its size), or None when the header cannot be read (:func:`header_from` says why)."""
    if len(head) < 9:
        return None
    n = struct.unpack("<Q", head[:8])[0]
    return n - 1 if 8 + n <= size and 0 < n <= MAX_HEADER else None


def header_from(shown: str, size: int, head: bytes, rest: bytes) -> Header:
    """The checked header of a file of ``size`` bytes whose first 9 bytes are ``head`` and whose
    next :func:`header_length` bytes are ``rest`` (read here, or on a host).

    Raises:
        InvalidFile: as :func:`read_header`.
    """
    n = struct.unpack("<Q", head[:8])[0] if len(head) >= 8 else None
    first = head[8:9]
    if size == 0:
        raise InvalidFile(shown, "empty (0 bytes): not a safetensors file", hint=HINT)
    if n is None:
        raise InvalidFile(shown, f"not a safetensors file ({size} bytes, shorter than the 8-byte header length)",
                          hint=HINT)
    if first != b"{":
        raise InvalidFile(shown, "not a safetensors file (no JSON header after the 8-byte header length)", hint=HINT)
    if 8 + n > size:
        raise InvalidFile(shown, f"truncated (header says {8 + n} bytes, file has {size})", hint=HINT)
    if n > MAX_HEADER:
        raise InvalidFile(shown, f"not a safetensors file (a header of {n} bytes; safetensors reads at most "
                                 f"{MAX_HEADER})", hint=HINT)
    tensors, metadata = _parse(shown, first + rest)
    end = _covered(shown, tensors)
    if 8 + n + end != size:
        why = "truncated" if 8 + n + end > size else "longer than its header says"
        raise InvalidFile(shown, f"{why} (header says {8 + n + end} bytes, file has {size})", hint=HINT)
    return Header(tensors, metadata, 8 + n, size)


def _parse(shown: str, blob: bytes) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The header's tensors and metadata, each entry's form checked."""
    try:
        text = blob.decode("utf-8")
        if too_deep(text, 8):
            raise ValueError("nested too deeply")
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidFile(shown, f"not a safetensors file (its header is not JSON: {e})", hint=HINT) from None
    if not isinstance(raw, dict):
        raise InvalidFile(shown, "not a safetensors file (its header is not a JSON object)", hint=HINT)
    metadata = raw.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InvalidFile(shown, "not a safetensors file (__metadata__ is not an object of strings)", hint=HINT)
    for name, meta in raw.items():
        problem = _entry_problem(meta)
        if problem:
            raise InvalidFile(shown, f"not a safetensors file (tensor {name!r}: {problem})", hint=HINT)
    return raw, metadata


def _entry_problem(meta: Any) -> str | None:
    if not isinstance(meta, dict) or not isinstance(meta.get("dtype"), str):
        return "no dtype"
    shape, offsets = meta.get("shape"), meta.get("data_offsets")
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        return f"shape {shape!r} is not a list of sizes"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        return f"data_offsets {offsets!r} are not [begin, end]"
    item = ITEM_BYTES.get(meta["dtype"])
    numel = 1
    for d in shape:
        numel *= d
    if item is not None and numel * item != offsets[1] - offsets[0]:
        return f"{meta['dtype']} {shape} needs {numel * item} bytes, its offsets span {offsets[1] - offsets[0]}"
    return None


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62


def _covered(shown: str, tensors: dict[str, dict[str, Any]]) -> int:
    """The end of the tensor bytes, once the offsets are seen to tile them from 0 with no gap
    or overlap (as ``safetensors`` checks)."""
    end = 0
    for name, meta in sorted(tensors.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        begin, stop = meta["data_offsets"]
        if begin != end:
            raise InvalidFile(shown, f"not a safetensors file (tensor {name!r} starts at {begin}, the one before "
                                     f"it ends at {end})", hint=HINT)
        end = stop
    return end


def check_dir(path: str | os.PathLike[str], weights: str = "model.safetensors") -> list[Path]:
    """The safetensors files of a model directory (``weights``, or the shards its
    ``.index.json`` names), each header checked (:func:`read_header`); [] when it has none.

    Raises:
        InvalidFile: a file that is not whole, or an index naming a file outside the directory.
    """
    root = Path(path)
    files = shard_files(root, weights)
    for f in files:
        read_header(f)
    return files


def shard_files(root: Path, weights: str = "model.safetensors") -> list[Path]:
    """The files ``root/weights.index.json`` names (checked to be plain names inside ``root``),
    else ``root/weights`` when it is there, else []."""
    from core.text import read_json_file

    index = root / f"{weights}.index.json"
    if index.is_file():
        doc = read_json_file(index, "safetensors index")
        wmap = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
            raise InvalidFile(index, "no weight_map of tensor name -> file name", field="weight_map")
        names = sorted(set(wmap.values()))
        bad = [n for n in names if n != Path(n).name or n in ("", ".", "..")]
        if bad:
            raise InvalidFile(index, f"names {bad[:3]}, not files beside the index", field="weight_map")
        return [root / n for n in names]
    return [root / weights] if (root / weights).is_file() else []
