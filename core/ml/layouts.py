"""The three trainers' checkpoint layouts: which entries of an output dir are checkpoints.

Pure Python (no torch): the watcher on a host (:mod:`core.ml.watcher`) and specdeck's train,
eval and extract_weights actions read an output dir with the same rules, so ``@latest``,
``@best`` and ``@step:N`` name the same files everywhere.

==============  =====================================  ======================================
trainer         a checkpoint (its step)                pointers
==============  =====================================  ======================================
specdeck        ``step_N.pt`` (a file, renamed whole)  ``latest`` (a file naming the newest)
SpecForge       ``{run_id}-step{N}/training_state.pt``  ``{run_id}-latest``, ``{run_id}-best``
                (the dir is whole once the file is)    (relative symlinks to a step dir)
speculators     ``{epoch}/`` with ``model.safetensors``  ``checkpoint_best`` (symlink to an
                and ``config.json``: an HF drafter dir   epoch dir); N is the epoch
==============  =====================================  ======================================

SpecForge 0.2.0 writes ``training_state.pt`` last (``CheckpointManager.save``: temp file and
rename) and speculators 0.9.0 writes ``config.json`` and ``model.safetensors`` with
``save_pretrained``, so a checkpoint is whole once its marker file is there and has not changed
for a moment (:func:`scan_dir`'s ``settle``). speculators' descriptive symlinks
(``epoch0_step16626``) and its ``interrupted`` dir are not checkpoints.
"""

from __future__ import annotations

import os
import posixpath
import re
import time
from dataclasses import dataclass

TRAINERS = ("specdeck", "specforge", "speculators")
SPECDECK = re.compile(r"^step_(\d{1,18})\.pt$")
SPECFORGE = re.compile(r"^(.+)-step(\d{1,18})$")
SPECULATORS = re.compile(r"^(\d{1,18})$")
SPECFORGE_STATE = "training_state.pt"
SPECULATORS_WEIGHTS = "model.safetensors"
SPECULATORS_BEST = "checkpoint_best"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a run: its step and the path strip / eval take."""

    step: int
    """The training step (speculators: the epoch, the only number its layout has)."""
    path: str
    """A torch checkpoint file (specdeck, SpecForge) or a drafter dir (speculators)."""
    layout: str
    """One of TRAINERS."""

    @property
    def needs_strip(self) -> bool:
        """A torch checkpoint: strip it to a drafter dir first (speculators' is one already)."""
        return self.layout != "speculators"


def out_dir_of(path: str, layout: str = "specdeck") -> str:
    """The output dir a checkpoint's ``path`` (as :class:`Checkpoint` has it) lies in."""
    path = path.rstrip("/")
    return posixpath.dirname(posixpath.dirname(path) if layout == "specforge" else path)


def parse_entry(name: str, trainer: str | None = None) -> tuple[str, int, str] | None:
    """``(layout, step, marker)`` for a top-level entry of an output dir, or None when it
    names no checkpoint. ``marker`` is the entry's file that is there once the checkpoint is
    whole (relative to the output dir). ``trainer`` limits it to that trainer's layout."""
    m = SPECDECK.match(name)
    if m and trainer in (None, "specdeck"):
        return "specdeck", int(m.group(1)), name
    m = SPECFORGE.match(name)
    if m and trainer in (None, "specforge"):
        return "specforge", int(m.group(2)), posixpath.join(name, SPECFORGE_STATE)
    m = SPECULATORS.match(name)
    if m and trainer in (None, "speculators"):
        return "speculators", int(m.group(1)), posixpath.join(name, SPECULATORS_WEIGHTS)
    return None


def checkpoint_of(out_dir: str, name: str, trainer: str | None = None) -> Checkpoint | None:
    """The checkpoint entry ``name`` of ``out_dir`` is (None: it is none): the path strip and
    eval take (a speculators epoch dir, else the marker file)."""
    got = parse_entry(name, trainer)
    if got is None:
        return None
    layout, step, marker = got
    path = posixpath.join(out_dir, name if layout == "speculators" else marker)
    return Checkpoint(step, path, layout)


def best_pointers(trainer: str | None = None) -> tuple[re.Pattern, ...]:
    """Entry names that point at a run's best checkpoint (symlinks to a step entry)."""
    out = []
    if trainer in (None, "specforge"):
        out.append(re.compile(r"^.+-best$"))
    if trainer in (None, "speculators"):
        out.append(re.compile(rf"^{SPECULATORS_BEST}$"))
    return tuple(out)


def is_best_pointer(name: str, trainer: str | None = None) -> bool:
    return any(p.match(name) for p in best_pointers(trainer))


def pointed_step(link_target: str, trainer: str | None = None) -> int | None:
    """The step a pointer's symlink target names (``run-step40``, ``3``), or None."""
    got = parse_entry(posixpath.basename(link_target.rstrip("/")), trainer)
    return got[1] if got else None


def scan_dir(out_dir: str, trainer: str | None = None, *, settle: float = 0.0,
             after: int | None = None) -> list[Checkpoint]:
    """The whole checkpoints in a local ``out_dir``, oldest step first: the marker file is
    there and untouched for ``settle`` seconds; steps up to ``after`` are left out."""
    if not os.path.isdir(out_dir):
        return []
    now, out = time.time(), []
    for e in os.scandir(out_dir):
        if e.is_symlink():
            continue  # a pointer (latest, best, speculators' epoch0_step16626), not a checkpoint
        ck = checkpoint_of(out_dir, e.name, trainer)
        if ck is None or (after is not None and ck.step <= after):
            continue
        got = parse_entry(e.name, trainer)
        try:
            if now - os.stat(os.path.join(out_dir, got[2])).st_mtime < settle:
                continue
        except (FileNotFoundError, NotADirectoryError):  # not whole yet, or pruned meanwhile
            continue
        out.append(ck)
    return sorted(out, key=lambda c: (c.step, c.path))


def best_step(out_dir: str, trainer: str | None = None) -> int | None:
    """The step the run's best pointer in a local ``out_dir`` names (None: no pointer)."""
    try:
        names = os.listdir(out_dir)
    except OSError:
        return None
    for name in sorted(names):
        if is_best_pointer(name, trainer):
            try:
                return pointed_step(os.readlink(os.path.join(out_dir, name)), trainer)
            except OSError:
                continue
    return None


__all__ = ["TRAINERS", "Checkpoint", "parse_entry", "checkpoint_of", "is_best_pointer",
           "pointed_step", "scan_dir", "out_dir_of", "best_step", "SPECFORGE_STATE", "SPECULATORS_WEIGHTS"]
