"""Run-time plumbing of the reference trainer: seeds, lr schedule, signals, DDP, checkpoints.

Kept apart from :mod:`core.ml.train` (the loop) so each piece can be read and tested alone:

* :func:`step_seed`: data order, anchors and noise are pure functions of (seed, step, rank),
  which is what makes a resumed run repeat the uninterrupted loss curve without saving RNG state.
* :func:`lr_factor`: linear warmup, then cosine decay to ``min_lr_ratio`` (paper App. A.1).
* :class:`StopFlag`: SIGTERM/SIGINT only set a flag; the loop finishes the step, checkpoints
  and exits (``stop`` in specdeck loses at most the current step).
* :class:`Dist`: world size/rank from torchrun's environment, gloo on CPU, nccl on CUDA.
* :func:`save_checkpoint` / :func:`resolve_resume`: ``step_{N}.pt`` written through a temp
  file and ``os.replace``, then ``latest`` (the file name of the newest checkpoint).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import signal
import sys
from pathlib import Path
from collections.abc import Iterable
from typing import Any

from core.ml.formats import strictjson
from core.ml.formats.runio import UsageError, atomic_write_text, say

LATEST = "latest"
CKPT_RE = re.compile(r"^step_(\d+)\.pt$")



def step_seed(seed: int, *parts: Any) -> int:
    """A 63-bit seed from (seed, parts...): data order, anchors and noise per (step, rank)."""
    blob = ":".join(str(p) for p in (seed, *parts)).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") & ((1 << 63) - 1)


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at 0-based ``step``: linear warmup, then cosine to ``min_ratio``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def print_line(obj: dict[str, Any]) -> None:
    """One JSON line on stdout (metrics have no "event" key; everything else has one)."""
    sys.stdout.write(strictjson.dumps(obj) + "\n")
    sys.stdout.flush()


class StopFlag:
    """Set by SIGTERM/SIGINT; the loop stops after the current step (a second SIGINT aborts)."""

    def __init__(self) -> None:
        self.set = False
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.set and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.set = True
        say(f"{signal.Signals(signum).name}: stopping after the current step (a checkpoint will be written)")


class Dist:
    """World size, rank and collectives (no-ops in a single process)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.active = False

    def init(self, device_type: str) -> None:
        if self.world > 1 and not self.dist.is_initialized():
            self.dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
            self.active = True

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, t: Any) -> Any:
        if self.active:
            self.dist.all_reduce(t)
        return t

    def close(self) -> None:
        if self.active and self.dist.is_initialized():
            self.dist.destroy_process_group()
            self.active = False


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_files(out: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of the ``step_N.pt`` files in ``out``, ascending."""
    found = [(int(m.group(1)), p) for p in out.glob("step_*.pt") if (m := CKPT_RE.match(p.name))]
    return sorted(found)


def resolve_resume(arg: str | None, out: Path) -> Path | None:
    """The checkpoint to resume from, or None for a fresh start.

    Raises:
        UsageError: a named checkpoint is missing, or a fresh start into a directory that
            already has checkpoints.
    """
    latest = out / LATEST
    if arg is None:
        if latest.is_file() or checkpoint_files(out):
            raise UsageError(f"--out {out} already holds checkpoints; pass --resume auto to continue, or "
                             "choose another output directory")
        return None
    if arg == "auto":
        if latest.is_file():
            path = out / latest.read_text(encoding="utf-8").strip()
            if path.is_file():
                return path
        files = checkpoint_files(out)
        return files[-1][1] if files else None
    path = Path(arg)
    if not path.is_file():
        raise UsageError(f"--resume {arg}: checkpoint not found")
    return path


def save_checkpoint(out: Path, step: int, drafter: Any, opt: Any, sched: Any, cfg_dict: dict[str, Any],
                    drafter_cfg: dict[str, Any], run: dict[str, Any], keep: int | None,
                    pins: Iterable[int] = ()) -> Path:
    """Write ``step_{step}.pt`` atomically, then ``latest``; when ``keep`` is set, delete all
    but the newest ``keep`` and the ``pins`` (core.ml.formats.retention: tau plays no part
    here, a detached watcher's retention is the one that knows it)."""
    import torch

    from core.ml.formats.runio import atomic_target

    path = out / f"step_{step}.pt"
    state = {"model": {k: v.detach().cpu() for k, v in drafter.state_dict().items()},
             "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": int(step),
             "config": cfg_dict, "drafter_config": drafter_cfg, "run": run}
    with atomic_target(path) as tmp:
        torch.save(state, tmp)
    atomic_write_text(out / LATEST, path.name + "\n")
    if keep is not None:
        from core.ml.formats import retention

        files = dict(checkpoint_files(out))
        decision = retention.decide(files, {}, files,
                                    retention.Policy(keep, best=0, pins=frozenset(pins)))
        for s in decision.delete:
            if files[s] != path:
                files[s].unlink(missing_ok=True)
    return path
