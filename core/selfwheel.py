"""Build a wheel of the running specdeck, so a host's venv runs the same ``core.ml`` code.

A wheel is a zip with a ``.dist-info``; building it from the imported packages' own files
(rather than from a source checkout) works the same from an editable install, a plain
install, or a laptop without build tools. The version carries a hash of the code, named as
one (``0.1.0+code.3f9a2c1b7e``: the sha256 of the packages' files, not a git commit), so a
host's venv is known to be current or stale by its version. Versions made before it was
named said ``0.1.0+g3f9a2c1b7e`` (which read as ``git describe``'s commit): :func:`code_of`
reads both, as hosts' venvs and stored runs still hold them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import core

PACKAGES = ("core", "console")
HOST_REQUIRES = ("pyyaml>=6", "transformers>=5.0", "safetensors>=0.4", "tokenizers>=0.20",
                 "apprise>=2.2")
"""What ``python -m core.ml.*`` needs on a host besides torch (installed by the venv action);
apprise: a run capsule and the detached watcher notify from the host (core.ml.notify)."""


def _files() -> list[tuple[str, Path]]:
    """Each package's files in the order of their paths' parts (as sorted ``Path``s order
    them: the hash depends on it), walked with ``os.walk`` pruning ``__pycache__``
    (``specdeck --version`` computes this at every call)."""
    root = Path(core.__file__).resolve().parent.parent
    out = []
    for pkg in PACKAGES:
        rels = []
        for d, dirs, files in os.walk(root / pkg):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            at = Path(d).relative_to(root).as_posix()
            rels += [f"{at}/{f}" for f in files if not f.endswith(".pyc")
                     and os.path.isfile(os.path.join(d, f))]
        out += [(rel, root / rel) for rel in sorted(rels, key=lambda r: r.split("/"))]
    return out


def code_hash() -> str:
    h = hashlib.sha256()
    for rel, p in _files():
        h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:10]


CODE = "code"
"""The local version label's first part: what the hash after it is a hash of."""
_OLD_CODE = "g"
"""How versions said it before (``+g<hash>``: read, never written)."""


def version() -> str:
    """``0.1.0+code.3f9a2c1b7e``: the release, then the hash of this code (:func:`code_hash`)."""
    return f"{core.__version__}+{CODE}.{code_hash()}"


def code_of(version: str) -> str | None:
    """The code hash a specdeck version carries (``0.1.0+code.3f9a2c1b7e`` and the older
    ``0.1.0+g3f9a2c1b7e`` alike: ``3f9a2c1b7e``); None when it carries none."""
    local = version.partition("+")[2]
    if local.startswith(f"{CODE}."):
        return local[len(CODE) + 1:] or None
    if local.startswith(_OLD_CODE) and len(local) > 1 and all(
            c in "0123456789abcdef" for c in local[1:]):
        return local[1:]
    return None


def wheel_name() -> str:
    """The file name :func:`build_wheel` writes (the version carries the code hash)."""
    return f"specdeck-{version()}-py3-none-any.whl"


def _record_hash(data: bytes) -> str:
    import base64

    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(out_dir: str | os.PathLike) -> Path:
    """Write ``specdeck-<version>-py3-none-any.whl`` into ``out_dir`` and return its path
    (zipfile loads here: ``--version`` hashes the same files and needs none of it)."""
    import io
    import zipfile

    ver = version()
    dist = f"specdeck-{ver}.dist-info"
    meta = "\n".join(["Metadata-Version: 2.1", "Name: specdeck", f"Version: {ver}",
                      "Summary: specdeck core for drafter hosts",
                      *(f"Requires-Dist: {r}" for r in HOST_REQUIRES), ""])
    wheel = "Wheel-Version: 1.0\nGenerator: specdeck\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entry = "[console_scripts]\nspecdeck = console.cli:main\n"
    records = []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        def add(name: str, data: bytes) -> None:
            zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            records.append(f"{name},{_record_hash(data)},{len(data)}")

        for rel, p in _files():
            add(rel, p.read_bytes())
        add(f"{dist}/METADATA", meta.encode())
        add(f"{dist}/WHEEL", wheel.encode())
        add(f"{dist}/entry_points.txt", entry.encode())
        records.append(f"{dist}/RECORD,,")
        zi = zipfile.ZipInfo(f"{dist}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        z.writestr(zi, "\n".join(records) + "\n")
    path = Path(out_dir) / wheel_name()
    path.write_bytes(buf.getvalue())
    return path
