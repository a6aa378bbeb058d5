"""The trainers' checkpoint layouts: which entries of an output dir are checkpoints.

Each is a :class:`Layout` in :data:`LAYOUTS` (the three below built in; a trainer object of
:mod:`core.actions.trainers` names its layout, and registers it here when it brings its own).

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

When a checkpoint is whole, so that it may be read (:func:`entries`, :class:`Steady`):

* its trainer says so: specdeck's ``step_N.pt`` once ``latest`` names it or a later step
  (``core.ml.train`` renames the file whole, then writes ``latest``); SpecForge 0.2.0's once
  ``training_state.pt`` is there (``CheckpointManager.save`` writes it last, through a temp
  file and a rename); speculators 0.9.0's once a pointer names the epoch dir (its trainer's
  ``epoch{N}_step{S}`` / ``epoch{N}_end`` after the save, ``checkpoint_best`` after the
  validation);
* or nothing about it (the set of its files, their sizes and mtimes) has changed for a settle
  time (:data:`SETTLE_S`, long enough for a slow disk to pause inside one save): speculators
  writes ``config.json``, ``model.safetensors`` (or its shards and then
  ``model.safetensors.index.json``) with ``save_pretrained`` and marks nothing when it saves
  the best only, and a user's own command writing ``step_N.pt`` may write it in place.

An entry named as a checkpoint but shaped otherwise (a FIFO or a dir for ``step_N.pt``, a
link loop for ``model.safetensors``, a safetensors header claiming more bytes than the file
has: :func:`content_problem`) has a ``problem`` that names the file: readers name it and go
on with the others. speculators' descriptive symlinks (``epoch0_step16626``) and its
``interrupted`` dir are not checkpoints, nor is any symlink (a pointer).
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

TRAINERS = ("specdeck", "specforge", "speculators")
"""The built-in layouts (what ``core.ml.watcher --trainer`` takes); :data:`LAYOUTS` may hold
more."""
SPECDECK = re.compile(r"^step_(?P<step>\d{1,18})\.pt$")
SPECFORGE = re.compile(r"^(.+)-step(?P<step>\d{1,18})$")
SPECULATORS = re.compile(r"^(?P<step>\d{1,18})$")
SPECFORGE_STATE = "training_state.pt"
SPECULATORS_WEIGHTS = "model.safetensors"
SPECULATORS_INDEX = "model.safetensors.index.json"
SPECULATORS_CONFIG = "config.json"
SPECULATORS_BEST = "checkpoint_best"
SPECULATORS_SAVED = re.compile(r"^epoch(\d{1,18})_(?:step\d{1,18}|end)$")
"""The pointer speculators' trainer makes to an epoch dir once its save is done."""
SPECDECK_LATEST = "latest"


@dataclass(frozen=True)
class Layout:
    """Which top-level entries of an output dir are one trainer's checkpoints (module doc)."""

    name: str
    pattern: re.Pattern
    """A top-level entry's name that is a checkpoint; its group ``step`` is the step."""
    marker: str | None = None
    """The file inside the entry's dir that is there once the checkpoint is whole (None: the
    entry is a file, the checkpoint itself)."""
    glob: str | None = None
    """``find -name`` glob of the entry dirs (:func:`find_command` descends into them)."""
    best: re.Pattern | None = None
    """The name of its best pointer (a symlink to a checkpoint entry), if it has one."""
    drafter_dir: bool = False
    """The entry dir is a drafter dir eval loads as it is (no strip); else the marker file is
    the torch checkpoint strip reads."""


LAYOUTS: dict[str, Layout] = {}
"""The layouts by name, in the order an entry's name is tried against them."""


def register_layout(layout: Layout) -> Layout:
    """Add ``layout`` to :data:`LAYOUTS` (a trainer's own, named by its trainer object)."""
    LAYOUTS[layout.name] = layout
    return layout


register_layout(Layout("specdeck", SPECDECK))
register_layout(Layout("specforge", SPECFORGE, SPECFORGE_STATE, "*-step[0-9]*",
                       re.compile(r"^.+-best$")))
register_layout(Layout("speculators", SPECULATORS, SPECULATORS_WEIGHTS, "[0-9]*",
                       re.compile(rf"^{SPECULATORS_BEST}$"), drafter_dir=True))
SETTLE_S = 30.0
"""Default seconds a checkpoint its trainer marks nowhere as complete must stay unchanged (its
files, their sizes and mtimes) before it is read: longer than a slow or network disk pauses
inside one save (``watch_eval.settle_s``, ``core.ml.watcher --settle``)."""
KINDS = {"f": "a regular file", "d": "a directory", "l": "a symbolic link", "p": "a FIFO",
         "s": "a socket", "c": "a device", "b": "a device", "?": "unreadable"}
"""``find -printf %y``'s letters, in words."""


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
        lay = LAYOUTS.get(self.layout)
        return lay is None or not lay.drafter_dir


def out_dir_of(path: str, layout: str = "specdeck") -> str:
    """The output dir a checkpoint's ``path`` (as :class:`Checkpoint` has it) lies in."""
    path = path.rstrip("/")
    lay = LAYOUTS.get(layout)
    inner = lay is not None and lay.marker is not None and not lay.drafter_dir
    return posixpath.dirname(posixpath.dirname(path) if inner else path)


def parse_entry(name: str, trainer: str | None = None) -> tuple[str, int, str] | None:
    """``(layout, step, marker)`` for a top-level entry of an output dir, or None when it
    names no checkpoint. ``marker`` is the entry's file that is there once the checkpoint is
    whole (relative to the output dir). ``trainer`` limits it to that trainer's layout."""
    for lay in LAYOUTS.values():
        m = lay.pattern.match(name) if trainer in (None, lay.name) else None
        if m:
            marker = posixpath.join(name, lay.marker) if lay.marker else name
            return lay.name, int(m.group("step")), marker
    return None


def checkpoint_of(out_dir: str, name: str, trainer: str | None = None) -> Checkpoint | None:
    """The checkpoint entry ``name`` of ``out_dir`` is (None: it is none): the path strip and
    eval take (a speculators epoch dir, else the marker file)."""
    got = parse_entry(name, trainer)
    if got is None:
        return None
    layout, step, marker = got
    path = posixpath.join(out_dir, name if LAYOUTS[layout].drafter_dir else marker)
    return Checkpoint(step, path, layout)


def best_pointers(trainer: str | None = None) -> tuple[re.Pattern, ...]:
    """Entry names that point at a run's best checkpoint (symlinks to a step entry)."""
    return tuple(lay.best for lay in LAYOUTS.values()
                 if lay.best is not None and trainer in (None, lay.name))


def is_best_pointer(name: str, trainer: str | None = None) -> bool:
    return any(p.match(name) for p in best_pointers(trainer))


def pointed_step(link_target: str, trainer: str | None = None) -> int | None:
    """The step a pointer's symlink target names (``run-step40``, ``3``), or None."""
    got = parse_entry(posixpath.basename(link_target.rstrip("/")), trainer)
    return got[1] if got else None


@dataclass(frozen=True)
class Row:
    """One file or dir of an output dir as ``lstat`` sees it (a link is never followed): the
    top-level entries, and the files of those named as checkpoints."""

    path: str
    """Relative to the output dir, ``/``-separated: ``NAME`` or ``NAME/FILE``."""
    kind: str
    """``find -printf %y``'s letter (:data:`KINDS`): ``f`` a regular file, ``d``, ``l``..."""
    size: int
    mtime: float
    target: str = ""
    """A link's target (``readlink``), else empty."""


@dataclass(frozen=True)
class Entry:
    """A top-level entry of an output dir named as a checkpoint, as its rows show it now."""

    checkpoint: Checkpoint
    state: tuple[Row, ...]
    """The entry and its files: any change in it (a file more or less, a size, an mtime) is
    a change of the checkpoint (:class:`Steady`)."""
    complete: bool
    """Its trainer marked it complete (module doc)."""
    problem: str | None
    """Why it cannot be read as a checkpoint as it is now, naming the file; None: no problem
    its rows show (:func:`content_problem` reads the files too)."""

    @property
    def name(self) -> str:
        return self.state[0].path


def _kind(mode: int) -> str:
    for test, letter in ((stat.S_ISREG, "f"), (stat.S_ISDIR, "d"), (stat.S_ISLNK, "l"),
                         (stat.S_ISFIFO, "p"), (stat.S_ISSOCK, "s"), (stat.S_ISCHR, "c"),
                         (stat.S_ISBLK, "b")):
        if test(mode):
            return letter
    return "?"


def _descend(name: str, kind: str) -> bool:
    """Whether a top-level entry's files are listed too: a dir named as a SpecForge or
    speculators checkpoint (:func:`find_command` descends into the same, and a few more)."""
    got = parse_entry(name)
    return kind == "d" and got is not None and LAYOUTS[got[0]].marker is not None


def list_local(out_dir: str) -> list[Row]:
    """The :class:`Row` s of a local output dir (what :func:`find_command` lists on a host);
    [] when it is not a readable dir. An entry that cannot be read is listed as ``?``."""
    def rows_of(path: str, prefix: str) -> list[Row]:
        out = []
        try:
            with os.scandir(path) as it:
                names = [e.name for e in it]
        except OSError:
            return out
        for name in sorted(names):
            rel = prefix + name
            full = os.path.join(path, name)
            try:
                st = os.lstat(full)
            except OSError:
                out.append(Row(rel, "?", 0, 0.0))
                continue
            kind = _kind(st.st_mode)
            target = ""
            if kind == "l":
                try:
                    target = os.readlink(full)
                except OSError:
                    pass
            out.append(Row(rel, kind, st.st_size, st.st_mtime, target))
            if not prefix and _descend(name, kind):
                out.extend(rows_of(full, rel + "/"))
        return out

    return rows_of(out_dir, "") if os.path.isdir(out_dir) else []


_FORMAT = "'%y %s %T@ %P\\0%l\\0'"


def find_command(out_dir: str) -> str:
    """The shell command that prints a host's output dir as :func:`parse_find` reads it (GNU
    find; links never followed; only the dirs named as checkpoints are descended into)."""
    globs = " ".join(f"! -name {shlex.quote(lay.glob)}" for lay in LAYOUTS.values() if lay.glob)
    return (f"cd -- {shlex.quote(out_dir)} && find . -mindepth 1 -maxdepth 2 -printf {_FORMAT} "
            f"\\( ! -path './*/*' -type d {globs} -prune \\) 2>/dev/null")


def parse_find(text: str) -> list[Row]:
    """:func:`find_command`'s output as :class:`Row` s (a line it cannot read is left out)."""
    fields = text.split("\0")
    out = []
    for head, target in zip(fields[0::2], fields[1::2]):
        w = head.split(" ", 3)
        if len(w) != 4 or not w[1].isascii() or not w[1].isdigit():
            continue
        try:
            mtime = float(w[2])
        except ValueError:
            continue
        path = w[3].removeprefix("./")
        if path and ".." not in path.split("/"):
            out.append(Row(path, w[0] if w[0] in KINDS else "?", int(w[1]), mtime, target))
    return out


def _latest_step(text: str | None) -> int | None:
    m = SPECDECK.match((text or "").strip())
    return int(m.group(1)) if m else None


def entries(out_dir: str, rows: Iterable[Row], trainer: str | None = None, *,
            after: int | None = None, latest: str | None = None) -> list[Entry]:
    """The checkpoints an output dir's ``rows`` show, oldest step first, with what each one's
    rows say (:class:`Entry`): an entry whose marker file is not there yet is no checkpoint
    (a save not begun, or cut short), nor is a link (a pointer). ``latest``: the text of
    specdeck's ``latest`` file, when there is one; steps up to ``after`` are left out."""
    rows = list(rows)
    by_top: dict[str, list[Row]] = {}
    for r in rows:
        by_top.setdefault(r.path.split("/", 1)[0], []).append(r)
    saved = {posixpath.basename(r.target.rstrip("/")) for r in rows
             if r.kind == "l" and "/" not in r.path
             and (SPECULATORS_SAVED.match(r.path) or r.path == SPECULATORS_BEST)}
    newest = _latest_step(latest)
    out = []
    for name, group in by_top.items():
        top = next((r for r in group if r.path == name), None)
        got = parse_entry(name, trainer)
        if top is None or got is None or top.kind == "l" or (after is not None and got[1] <= after):
            continue
        layout, step, marker = got
        files = {r.path: r for r in group}
        if layout == "speculators" and marker not in files:
            marker = posixpath.join(name, SPECULATORS_INDEX)  # a sharded save's index
        if marker not in files:
            continue  # not whole yet, or a save cut short
        problem = None
        if layout == "specdeck":
            complete = newest is not None and newest >= step
        elif layout == "speculators":
            complete = name in saved
            config = files.get(posixpath.join(name, SPECULATORS_CONFIG))
            if config is None:
                problem = f"{posixpath.join(out_dir, name)}: no {SPECULATORS_CONFIG} beside its weights"
            elif config.kind != "f":
                problem = _not_a_file(out_dir, config)
        else:  # specforge's, and any layout whose marker file is written last
            complete = files[marker].kind == "f"
        if LAYOUTS[layout].marker is not None and top.kind != "d":
            problem = f"{posixpath.join(out_dir, name)}: is {KINDS[top.kind]}, not a checkpoint dir"
        elif files[marker].kind != "f":
            problem = _not_a_file(out_dir, files[marker])
        state = (top, *sorted((r for r in group if r is not top), key=lambda r: r.path))
        out.append(Entry(checkpoint_of(out_dir, name, trainer), state, complete, problem))
    return sorted(out, key=lambda e: (e.checkpoint.step, e.checkpoint.path))


def _not_a_file(out_dir: str, row: Row) -> str:
    return f"{posixpath.join(out_dir, row.path)}: is {KINDS[row.kind]}, not a regular file"


def local_entries(out_dir: str, trainer: str | None = None, *, after: int | None = None
                  ) -> list[Entry]:
    """:func:`entries` of a local output dir (its ``latest`` read when it is a small file)."""
    from core.errors import InvalidInput
    from core.text import read_bounded

    latest = None
    if trainer in (None, "specdeck"):
        try:
            latest = read_bounded(os.path.join(out_dir, SPECDECK_LATEST), 4096,
                                  "latest file").decode("utf-8", "replace")
        except (OSError, InvalidInput):  # none, or not a small file: the settle time decides
            latest = None
    return entries(out_dir, list_local(out_dir), trainer, after=after, latest=latest)


def content_problem(entry: Entry) -> str | None:
    """Why a local checkpoint cannot be read, from its files' bytes (the rows' ``problem``
    first): a speculators epoch dir's ``config.json`` that is not a JSON object, or a weights
    file whose safetensors header does not match the file (cut short, or lying about its
    size); None when nothing is wrong that can be seen before a load."""
    if entry.problem or entry.checkpoint.layout != "speculators":
        return entry.problem
    from core.errors import InvalidInput
    from core.ml.formats.safetensors_header import check_dir
    from core.text import read_json_file

    path = entry.checkpoint.path
    config = os.path.join(path, SPECULATORS_CONFIG)
    try:
        if not isinstance(read_json_file(config, "drafter config"), dict):
            return f"{config}: not a JSON object"
        if not check_dir(path, SPECULATORS_WEIGHTS):
            return f"{path}: no {SPECULATORS_WEIGHTS} (nor its index)"
    except InvalidInput as exc:  # InvalidFile: the file and what is wrong
        return exc.message
    return None


class Steady:
    """Which checkpoints have stayed unchanged for ``settle`` seconds, as this process has
    looked at them (its own monotonic clock: no host or file server clock is trusted)."""

    def __init__(self, settle: float, clock: Callable[[], float] = time.monotonic):
        self.settle, self.clock = settle, clock
        self.seen: dict[str, tuple[tuple[Row, ...], float]] = {}

    def steady(self, key: str, state: tuple[Row, ...]) -> bool:
        """``state`` is what ``key`` looks like now: True once it has looked so for ``settle``
        seconds (at once when ``settle`` is 0)."""
        now = self.clock()
        prev = self.seen.get(key)
        if prev is None or prev[0] != state:
            self.seen[key] = (state, now)
            return self.settle <= 0
        return now - prev[1] >= self.settle

    def forget(self, key: str) -> None:
        """Look at ``key`` afresh: it must stay unchanged for ``settle`` seconds again."""
        self.seen.pop(key, None)


def scan_dir(out_dir: str, trainer: str | None = None, *, settle: float = 0.0,
             after: int | None = None) -> list[Checkpoint]:
    """The whole checkpoints in a local ``out_dir``, oldest step first: no problem its rows
    show, and none of its files touched for ``settle`` seconds (by this host's clock); steps
    up to ``after`` are left out."""
    now = time.time()
    return [e.checkpoint for e in local_entries(out_dir, trainer, after=after)
            if e.problem is None and now - max(r.mtime for r in e.state) >= settle]


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


__all__ = ["TRAINERS", "LAYOUTS", "Layout", "register_layout", "SETTLE_S", "KINDS",
           "Checkpoint", "Row", "Entry", "Steady",
           "parse_entry", "checkpoint_of", "is_best_pointer", "pointed_step", "list_local",
           "find_command", "parse_find", "entries", "local_entries", "content_problem",
           "scan_dir", "out_dir_of", "best_step", "SPECFORGE_STATE", "SPECULATORS_WEIGHTS",
           "SPECULATORS_INDEX", "SPECULATORS_CONFIG", "SPECDECK_LATEST"]
