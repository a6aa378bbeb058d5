"""Which checkpoints of a train run to keep, knowing tau; and deleting the others, counted.

``keep_checkpoints: N`` used to mean "the newest N", which deletes the step whose tau was the
best so far: the one the operator would ship. :func:`decide` keeps

* the newest ``newest`` steps (the newest one always: it is what a resume starts from);
* the best ``best`` steps by tau among those evaluated (ties: the earlier step);
* every pinned step: one another item names (``item:<train>@step:N``), the step a trainer's
  best pointer names (``@best``), any the operator listed;

and deletes a step only once it was evaluated (a result, done or failed, is recorded for it):
one the watcher has not read yet may still be the best. :func:`apply` deletes what
:func:`decide` let go, in any trainer's layout (:mod:`core.ml.formats.layouts`: a
``step_N.pt`` file, a SpecForge ``{run}-stepN`` dir, a speculators epoch dir), a link never
followed, and says how many bytes each freed. Pure but for :func:`apply`; the watcher
(:mod:`core.ml.tasks.watcher`) runs both on the host after each eval.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

NEWEST = "newest"
BEST = "best"
PINNED = "pinned"
UNEVALUATED = "not evaluated yet"


@dataclass(frozen=True)
class Policy:
    """How many to keep (``core.ml.watcher --keep-newest/--keep-best/--pin``)."""

    newest: int
    """Keep the newest N steps (>= 1: the newest is the resume point)."""
    best: int = 1
    """Keep the best K steps by tau (0: tau plays no part)."""
    pins: frozenset[int] = frozenset()
    """Steps never deleted (named by another item, the operator, or a best pointer)."""

    def __post_init__(self):
        if self.newest < 1:
            raise ValueError(f"keep newest must be >= 1, got {self.newest}")
        if self.best < 0:
            raise ValueError(f"keep best must be >= 0, got {self.best}")


@dataclass(frozen=True)
class Decision:
    keep: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """step -> why it is kept (:data:`NEWEST`, :data:`BEST`, :data:`PINNED`,
    :data:`UNEVALUATED`)."""
    delete: tuple[int, ...] = ()
    """Steps to delete, oldest first."""


def best_steps(taus: Mapping[int, float | None], k: int) -> list[int]:
    """The ``k`` steps with the highest tau (a step with no tau is never among them; on a tie
    the earlier step wins: it was there first)."""
    scored = [(t, s) for s, t in taus.items() if isinstance(t, (int, float)) and t == t]
    scored.sort(key=lambda ts: (-ts[0], ts[1]))
    return [s for _, s in scored[:k]]


def decide(steps: Iterable[int], taus: Mapping[int, float | None], evaluated: Iterable[int],
           policy: Policy) -> Decision:
    """Which of ``steps`` (the checkpoints there now) to keep and which to delete.

    Args:
        steps: the steps whose checkpoints exist.
        taus: step -> tau of the evaluated ones (None or absent: failed or not evaluated).
        evaluated: the steps a result is recorded for (done or failed).
        policy: how many newest and best to keep, and the pinned steps.

    Returns:
        A :class:`Decision`: every step is either kept (with its reasons) or deleted.
    """
    steps = sorted(set(steps))
    done = set(evaluated)
    why: dict[int, list[str]] = {s: [] for s in steps}
    for s in steps[-policy.newest:]:
        why[s].append(NEWEST)
    for s in best_steps({s: taus.get(s) for s in steps if s in done}, policy.best):
        why[s].append(BEST)
    for s in steps:
        if s in policy.pins:
            why[s].append(PINNED)
        if not why[s] and s not in done:
            why[s].append(UNEVALUATED)
    return Decision({s: tuple(w) for s, w in why.items() if w},
                    tuple(s for s in steps if not why[s]))


@dataclass(frozen=True)
class Deleted:
    step: int
    path: str
    bytes: int


def tree_bytes(path: str) -> int:
    """Bytes of the regular files at ``path`` (a file, or a dir walked without following
    links); a link counts as its own size."""
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path):
        return st.st_size
    total = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def remove(path: str) -> int:
    """Delete a checkpoint entry (a file, a link, or a dir and what is in it; a link is
    removed, never followed); its bytes."""
    size = tree_bytes(path)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return size


def apply(out_dir: str, names: Mapping[int, str], decision: Decision) -> list[Deleted]:
    """Delete ``decision.delete``'s entries of ``out_dir`` (``names``: step -> the entry's
    name there); what each freed. An entry already gone frees nothing and is not listed."""
    gone = []
    for step in decision.delete:
        path = os.path.join(out_dir, names[step])
        try:
            gone.append(Deleted(step, path, remove(path)))
        except FileNotFoundError:
            continue
    return gone
