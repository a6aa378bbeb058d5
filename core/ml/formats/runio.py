"""Run I/O shared by every ``python -m core.ml.<task>`` entry point.

Pure Python (no torch import at module load), so the laptop-side code can reuse it.

Conventions (the console parses these, keep them stable):

* stdout carries machine-readable lines only: ONE JSON object per line, each with an
  ``"event"`` key (``progress``, ``info``, ``metric``, ``result``). See :func:`emit`.
* Human-oriented messages go to stderr (:func:`say`).
* Expected errors raise :class:`UsageError` (bad input: exit 2) or :class:`TaskError`
  (other failure: exit 1); :func:`run_main` turns them into a one-line stderr message, never
  a bare traceback. Set ``SPECDECK_DEBUG=1`` to see tracebacks.
* Results are written through a temp file in the same directory plus ``os.replace``
  (:func:`atomic_write_json`, :func:`atomic_target`), with provenance (:func:`provenance`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from core.ml.formats import bounds, strictjson

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

_PACKAGES = ("torch", "transformers", "safetensors", "tokenizers", "numpy")


class UsageError(Exception):
    """Bad input (missing file, bad argument, refused pickle): exit status 2."""


class TaskError(Exception):
    """Any other expected failure: exit status 1."""


# ----------------------------------------------------------------------------- output


def emit(event: str, **fields: Any) -> dict[str, Any]:
    """Print one machine-readable JSON line to stdout and flush.

    Args:
        event: the event kind, e.g. ``"progress"`` or ``"result"``.
        **fields: JSON-serialisable fields, e.g. ``task="extract", done=3, total=12``.

    Returns:
        The dict that was printed.
    """
    obj = {"event": event, **fields}
    sys.stdout.write(strictjson.dumps(obj, default=_json_default) + "\n")
    sys.stdout.flush()
    return obj


def say(message: str) -> None:
    """Print a human-oriented message to stderr."""
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.stderr.flush()


class Progress:
    """Emits ``{"event": "progress", ...}`` lines with throughput and ETA.

    Example line: ``{"event": "progress", "task": "extract", "done": 3, "total": 12,
    "unit": "prompts", "tokens_per_s": 812.5, "eta_s": 40}``. With ``label`` each line also
    says which drafter it measures (``"label": "v5"``; core.capsules.progress says ``eval v5: 3/12 ...``).
    """

    def __init__(self, task: str, total: int, unit: str = "prompts", label: str | None = None) -> None:
        self.task, self.total, self.unit = task, total, unit
        self.named = {"label": label} if label else {}
        self.done = 0
        self.tokens = 0
        self.t0 = time.perf_counter()

    def step(self, n: int = 1, tokens: int = 0, **extra: Any) -> dict[str, Any]:
        """Advance by ``n`` units (and ``tokens`` processed tokens) and emit a line."""
        self.done += n
        self.tokens += tokens
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else None
        return emit(
            "progress",
            task=self.task,
            done=self.done,
            total=self.total,
            unit=self.unit,
            tokens_per_s=round(self.tokens / elapsed, 2),
            eta_s=None if eta is None else round(eta, 1),
            **self.named,
            **extra,
        )


# ----------------------------------------------------------------------------- atomic files


@contextlib.contextmanager
def atomic_target(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success rename it over ``path`` atomically.

    The temp file lives in the same directory (same filesystem), so ``os.replace`` is atomic.
    On an exception the temp file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file and ``os.replace``."""
    with atomic_target(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, allow_nan: bool = True) -> Path:
    """Write ``obj`` as indented strict JSON to ``path`` atomically (a non-finite number as
    null, named under ``non_finite``: :mod:`core.ml.formats.strictjson`).

    ``allow_nan=False`` for a file an engine reads (a drafter's config.json): a NaN or an
    infinity is then a ValueError before anything is written, never a null where a number
    belongs."""
    if not allow_nan:
        text = json.dumps(obj, indent=2, default=_json_default, allow_nan=False) + "\n"
    else:
        text = strictjson.dumps(obj, indent=2, default=_json_default) + "\n"
    return atomic_write_text(path, text)


def read_json(path: str | os.PathLike[str], what: str = "file") -> Any:
    """Read a JSON file, raising :class:`UsageError` naming the file on any problem."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise UsageError(f"{what} {path} is not valid JSON: {exc}") from None


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# ----------------------------------------------------------------------------- provenance


def git_sha(repo_dir: str | os.PathLike[str] | None = None) -> str | None:
    """Return the git SHA of the specdeck checkout (or ``SPECDECK_GIT_SHA``), else None."""
    env = os.environ.get("SPECDECK_GIT_SHA")
    if env:
        return env
    repo_dir = Path(repo_dir) if repo_dir else Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(repo_dir), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) >= 7 else None


def package_versions(names: Sequence[str] = _PACKAGES) -> dict[str, str | None]:
    """Installed versions of ``names`` (None when absent), without importing them."""
    import importlib.metadata  # here: the plan checks that import this module need none of it

    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cuda_info() -> dict[str, Any]:
    """CUDA availability and device name; only consults torch if it is already imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"available": None, "note": "torch not imported"}
    info: dict[str, Any] = {"available": bool(torch.cuda.is_available()), "version": torch.version.cuda}
    if info["available"]:
        info["device_count"] = torch.cuda.device_count()
        info["device_name"] = torch.cuda.get_device_name(0)
    return info


def provenance(
    argv: Sequence[str] | None = None,
    seed: int | None = None,
    task: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Provenance record written inside every result and as ``provenance.json`` beside it.

    Args:
        argv: the command line (defaults to ``sys.argv``).
        seed: the random seed used, if any.
        task: the entry point name, e.g. ``"eval"``.
        extra: more fields to merge in (e.g. input file hashes).

    Returns:
        A JSON-serialisable dict: argv, cwd, task, seed, time_utc, host, python, platform,
        package versions, CUDA info and the specdeck git SHA (None when unknown).
    """
    import platform

    record: dict[str, Any] = {
        "task": task,
        "argv": list(sys.argv if argv is None else argv),
        "cwd": os.getcwd(),
        "seed": seed,
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "cuda": cuda_info(),
        "git_sha": git_sha(),
    }
    if extra:
        record.update(extra)
    return record


def write_result(path: str | os.PathLike[str], result: dict[str, Any], prov: dict[str, Any]) -> Path:
    """Write ``result`` (with ``provenance`` inside) and ``provenance.json`` beside it, atomically."""
    path = Path(path)
    result = {**result, "provenance": prov}
    atomic_write_json(path.parent / "provenance.json", prov)
    atomic_write_json(path, result)
    return path


# ----------------------------------------------------------------------------- main wrapper


def run_main(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Run an entry point, mapping expected errors to exit codes and one-line messages.

    Args:
        main: the task's ``main(argv)``; returns an exit code or None (= 0).
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        The process exit status: 0 ok, 2 bad input (:class:`UsageError`, or
        :class:`core.errors.InvalidInput`: a config.json or safetensors file refused by name), 1
        other failure, 130 on Ctrl-C.
    """
    from core.errors import InvalidInput

    try:
        code = main(argv)
        return EXIT_OK if code is None else int(code)
    except (UsageError, InvalidInput) as exc:  # InvalidFile: a config or weights file refused by name
        say(f"error: {exc}")
        return EXIT_USAGE
    except TaskError as exc:
        say(f"error: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - last-resort: one line, traceback on demand
        if os.environ.get("SPECDECK_DEBUG"):
            traceback.print_exc()
        say(f"error: unexpected {type(exc).__name__}: {exc} (set SPECDECK_DEBUG=1 for a traceback)")
        return EXIT_FAILURE


_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
          "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4}


def add_generation_args(p, *, needs: str, example: str) -> None:
    """The arguments of every task that loads a target and generates from prompts (eval,
    extract), so both read ``--dtype`` and ``--max-memory`` alike: ``needs`` names what the
    memory check sizes ("the target", "the mode"), ``example`` a cap to show."""
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto (default): the target checkpoint's own dtype, never "
                   "upcast; or float32, bfloat16, float16")
    p.add_argument("--max-memory", help=f"refuse before loading when {needs} needs more than this "
                   f"(e.g. {example}); default: the memory this host has available")
    p.add_argument("--limit", type=int, help="only the first N prompts")
    p.add_argument("--cpu-matmul", choices=["auto", "torch"], default="auto",
                   help="auto (default): on a CPU without bf16/fp16 matrix instructions, compute linears of 8+ rows "
                   "(verify, prefill) in float32 tiles (core.ml.models.cpu_rows; about 1 output in 5000 differs by one "
                   "bf16 ulp); torch: torch's own kernels throughout")


def check_flags(args: Any, **checks: Callable[[Any], str | None]) -> None:
    """Refuse the first flag whose value a :mod:`core.ml.formats.bounds` validator refuses: ``checks``
    maps each argument's dest to its validator; an unset (None) argument passes.

    Raises:
        UsageError: ``--flag VALUE: what is wrong`` (exit 2, before anything is loaded).
    """
    for dest, check in checks.items():
        value = getattr(args, dest, None)
        why = None if value is None else check(value)
        if why:
            raise UsageError(f"--{dest.replace('_', '-')} {why}")


def check_generation_args(args: Any) -> None:
    """The numbers of :func:`add_generation_args`, bounded as the plan's params are (a token
    count of 10**20 would generate until the memory is gone).

    Raises:
        UsageError: naming the flag.
    """
    check_flags(args, max_new_tokens=bounds.count, limit=bounds.count)


def parse_bytes(text: str) -> int:
    """``"40G"``, ``"512MB"``, ``"1.5GiB"``, ``"1000000"`` -> bytes (decimal units, *iB binary)."""
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"{text!r} is not a size (examples: 40G, 512MB, 1.5GiB)") from None
    if unit not in _UNITS or not 0 <= value < float("inf"):
        raise ValueError(f"{text!r} is not a size (examples: 40G, 512MB, 1.5GiB)")
    return int(value * _UNITS[unit])


def fixed_mmap_threshold(nbytes: int = 128 * 1024) -> bool:
    """Make glibc serve every allocation of ``nbytes`` or more with its own mmap (returned to
    the system on free), instead of its dynamic threshold that moves tensor-sized blocks onto
    the heap after the first free. A training loop frees and re-allocates its gradients every
    step; on the heap that fragments and the RSS creeps up step after step (about 20 MB a step
    for a 235 MB drafter on CPU, measured by bench/memory.py). Returns False where there is no
    glibc ``mallopt``."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, int(nbytes)))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False
