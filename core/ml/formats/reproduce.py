"""The record that reproduces a run (issue 47 §2), made on the host where the run's code lives.

Every train and eval writes it inside its ``provenance.json`` (``"reproduce"``); the console
stores it with the run (``run.result["record"]``) and ``specdeck diff`` names every difference
between two runs' records, not only their configs. It holds:

* ``specdeck``: the installed version and the code hash a host's venv wheel carries
  (``0.1.0+code.<hash>``, core.selfwheel); an editable or source install carries none, and its
  git checkout says what ran instead;
* ``git``: the commit of the checkout the code came from and whether its tree was dirty; a
  dirty tree's ``git diff HEAD`` is kept beside the run (``git.diff``, at most
  :data:`DIFF_CAP` bytes) and only its sha256 and size go in the record, never the diff into
  the database. "Not a git checkout" (a wheel in site-packages) is said, never an error;
* ``versions``: Python, torch, transformers and CUDA;
* ``target``: path, the sha256 of its config.json, its revision when it has one (a Hugging
  Face snapshot directory, or the config's ``_commit_hash``), its checkpoint dtype and
  quantisation, and the dtype it ran at;
* ``data``: what it measured or trained on, by digest;
* ``config``: the resolved settings.

Pure Python, no torch import (:func:`versions` reads torch only if the task imported it), so
it runs on a laptop too. Git runs as an argument list (no shell), each value an argument.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from core.ml.formats.runio import atomic_write_text, package_versions

DIFF_NAME = "git.diff"
"""The file a dirty tree's diff is kept in, beside the run's provenance.json."""
DIFF_CAP = 1 << 20
"""At most this many bytes of the diff are kept (the record says when it was cut)."""
SOURCE_ENV = "SPECDECK_SOURCE_DIR"
"""A checkout to read the commit of instead of specdeck's own (a trainer whose code lives
elsewhere); unset: the directory specdeck's ``core`` package was imported from."""
_GIT_TIMEOUT_S = 10


def _git(where: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True,
                              timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None


def source_dir() -> tuple[Path, bool]:
    """The directory whose checkout ran (``$SPECDECK_SOURCE_DIR``, else specdeck's own root)
    and whether it was given (then any checkout counts; specdeck's own root counts only when
    that checkout tracks specdeck's code, not a venv inside some other repository)."""
    given = os.environ.get(SOURCE_ENV)
    if given:
        return Path(given).expanduser().resolve(), True
    return Path(__file__).resolve().parents[3], False


def git_state(out_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The commit and dirtiness of the code's checkout; a dirty tree's diff is written to
    ``out_dir/git.diff`` (when ``out_dir`` is given), capped at :data:`DIFF_CAP` bytes."""
    where, given = source_dir()
    head = _git(where, "rev-parse", "HEAD")
    if head is None or head.returncode != 0:
        return {"dir": str(where), "commit": None, "note": "not a git checkout"}
    if not given:
        tracked = _git(where, "ls-files", "--", "core/__init__.py")
        if tracked is None or not tracked.stdout.strip():
            return {"dir": str(where), "commit": None,
                    "note": "not a git checkout (an installed package)"}
    out: dict[str, Any] = {"dir": str(where), "commit": head.stdout.decode().strip()}
    status = _git(where, "status", "--porcelain", "--untracked-files=no")
    if status is None or status.returncode != 0:
        out["dirty"] = None
        return out
    out["dirty"] = bool(status.stdout.strip())
    if out["dirty"]:
        diff = _git(where, "diff", "HEAD", "--no-color", "--no-ext-diff")
        data = diff.stdout if diff is not None and diff.returncode == 0 else b""
        out.update({"diff_sha256": hashlib.sha256(data).hexdigest(), "diff_bytes": len(data),
                    "diff_truncated": len(data) > DIFF_CAP})
        if out_dir is not None:
            path = Path(out_dir) / DIFF_NAME
            atomic_write_text(path, data[:DIFF_CAP].decode("utf-8", errors="replace"))
            out["diff"] = str(path.resolve())
    return out


def specdeck_version() -> dict[str, Any]:
    """The installed specdeck's version and the code hash it carries (None without one)."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("specdeck")
    except importlib.metadata.PackageNotFoundError:
        return {"version": None, "code": None}
    local = version.partition("+")[2]
    code = local.split(".", 1)[1] if local.startswith("code.") else None
    return {"version": version, "code": code}


def versions() -> dict[str, Any]:
    """Python, torch, transformers and CUDA (torch's build and the device, read from torch
    only when the task imported it)."""
    import platform

    pk = package_versions(("torch", "transformers"))
    torch = sys.modules.get("torch")
    cuda = None
    if torch is not None and torch.cuda.is_available():
        cuda = {"version": torch.version.cuda, "device": torch.cuda.get_device_name(0)}
    elif torch is not None:
        cuda = {"version": torch.version.cuda, "device": None}
    return {"python": platform.python_version(), "torch": pk["torch"],
            "transformers": pk["transformers"], "cuda": cuda}


def _revision(path: Path, config: dict) -> str | None:
    """A Hugging Face snapshot directory's name (``.../snapshots/<commit>``), else the
    config's ``_commit_hash``; None when neither says."""
    if path.parent.name == "snapshots" and path.name:
        return path.name
    rev = config.get("_commit_hash")
    return rev if isinstance(rev, str) and rev else None


def _quantization(config: dict) -> str | None:
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = q.get("quant_method") or "quantized"
    bits = q.get("bits") or (4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None)
    return f"{method}" + (f" {bits}-bit" if bits else "")


def target_identity(path: str | os.PathLike[str], ran_dtype: str | None = None) -> dict[str, Any]:
    """A target directory's identity: path, config digest, revision, dtype, quantisation.

    ``dtype`` is the checkpoint's own (its config's ``dtype`` or ``torch_dtype``);
    ``ran_dtype`` the one the run computed in (a float32 target run in bfloat16 differs)."""
    p = Path(path).resolve()
    raw = b""
    try:
        raw = (p / "config.json").read_bytes()
        config = json.loads(raw)
    except (OSError, ValueError):
        config = {}
    config = config if isinstance(config, dict) else {}
    text = config.get("text_config")  # a composite target (qwen3_5): its sizes and dtype in there
    config = {**text, **config} if isinstance(text, dict) else config
    dtype = config.get("dtype") or config.get("torch_dtype")
    return {"path": str(p), "config_sha256": hashlib.sha256(raw).hexdigest() if raw else None,
            "revision": _revision(p, config), "dtype": dtype if isinstance(dtype, str) else None,
            "quantization": _quantization(config), "ran_dtype": ran_dtype}


def reproduction(out_dir: str | os.PathLike[str] | None, *, config: dict[str, Any],
                 target: dict[str, Any] | None, data: dict[str, Any] | None) -> dict[str, Any]:
    """The whole record (module docstring); ``out_dir`` is where the run writes (git.diff)."""
    return {"specdeck": specdeck_version(), "git": git_state(out_dir), "versions": versions(),
            "target": target, "data": data, "config": config}


def file_digest(path: Path) -> dict[str, Any]:
    """``{"path", "sha256"}`` of a data file, read in blocks; an unreadable one is said."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        return {"path": str(path), "sha256": None, "note": f"unreadable: {exc.strerror or exc}"}
    return {"path": str(Path(path).resolve()), "sha256": h.hexdigest()}


def args_config(args: Any, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A task's parsed arguments as JSON values (paths as strings), ``drop`` left out."""
    out = {}
    for k, v in sorted(vars(args).items()):
        if k in drop:
            continue
        out[k] = v if v is None or isinstance(v, (bool, int, float, str)) else str(v)
    return out
