"""Artefacts built once per test run and shared read-only by every test and xdist worker.

A fitted tiny drafter, a feature cache or a converted model that several tests build the same
way is built by the first worker that asks for it, under an exclusive lock, into a folder
beside the workers' own temp roots (``tmp_path_factory``'s base: one per ``pytest`` run, so
nothing stale survives into the next run); every other worker waits on the lock and then reads
the finished folder. A test that changes such an artefact copies it first (:func:`copy_of`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable

COMPLETE = ".complete"


def shared_root(tmp_path_factory) -> Path:
    """The folder every worker of this run shares (the parent of a worker's temp base)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    root.mkdir(parents=True, exist_ok=True)
    return root


def build_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """The folder ``name``, built by ``build(folder)`` once per run whichever worker asks
    first; the others wait for it. A build that fails leaves nothing (the next asker builds
    again and fails the same way, by name)."""
    root = shared_root(tmp_path_factory)
    dest = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (dest / COMPLETE).exists():
            partial = root / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(dest, ignore_errors=True)
            partial.mkdir()
            build(partial)
            (partial / COMPLETE).touch()
            partial.rename(dest)
    return dest


def copy_of(src: Path, dst: Path) -> Path:
    """A private, writable copy of a shared artefact for a test that changes it."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(COMPLETE))
    return dst
