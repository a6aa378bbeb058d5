"""Putting an export in place: where it is staged, which modes it sets, and the swap
(issue 42 §1, docs/serving.md §1 "What an export writes and touches").

An export is written whole into a private staging folder (0700) on the destination's own
filesystem, then swapped in with renames, so the final step never crosses devices (EXDEV) and
the destination never pairs one export's ``config.json`` with another's weights. Two units:

* **the folder**, when ``--out`` does not exist yet or holds an earlier export and nothing else:
  the new export is staged in a sibling folder (same parent, same filesystem) and exchanged with
  the old one in one ``renameat2(RENAME_EXCHANGE)``, so at every moment the path is the old
  export or the new one. Where that call is missing (an old kernel, a filesystem without it)
  the old folder is renamed aside and the new one renamed in: for that instant the path is
  absent, never mixed. The new folder takes the old one's permission bits (0755 when new).
* **the export's own files**, when ``--out`` is a folder shared with other files (or an empty
  folder, or a mount point, or one whose parent cannot be written): the operator's folder and
  files are never renamed, moved or chmod-ed. The earlier export's files move into a hidden
  backup folder inside it, the loadable file first (``config.json``, or ``drafter.gguf``), then
  the new files move in, the loadable file last; a failure moves everything back. So the folder
  holds the old export, no loadable export (no ``config.json``) for the instant between the two
  steps, or the new export; never a mix.

Modes are set only on what the export creates (its files 0644, the folders it creates 0755),
through a descriptor opened with ``O_NOFOLLOW``: never by walking the destination, never
through a symbolic link.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from core.ml.formats.runio import TaskError, UsageError, say

FILE_MODE, DIR_MODE = 0o644, 0o755
EXPORT_NAMES = ("config.json", "model.safetensors", "drafter.gguf", "provenance.json")
"""Every file name an export writes: only these are ever replaced or removed in ``--out``."""
HEADS = ("config.json", "drafter.gguf")
"""The file an engine opens first: present only together with the rest of its export."""
RENAME_EXCHANGE = 2


@dataclass(frozen=True)
class Destination:
    """Where an export goes and what it replaces there."""

    given: Path
    """``--out`` as the operator wrote it (named in messages)."""
    real: Path
    """The folder the files land in: ``given`` with every symbolic link resolved."""
    unit: str
    """``folder`` (the whole folder is swapped) or ``files`` (only the export's own files)."""
    old: tuple[str, ...]
    """The earlier export's files in ``real``: the ones this export replaces or removes."""
    mode: int
    """Permission bits of the new folder (``folder`` unit): the old folder's, or 0755."""


def resolve(out: Path, names: tuple[str, ...]) -> Destination:
    """Decide where an export writing ``names`` (plus provenance.json) goes for ``--out out``.

    A symbolic link is followed on purpose, and said: the export lands in the link's target and
    the link stays. Refused (exit 2, nothing written): a link to nothing, and a directory where
    the export has to write one of its files."""
    real = Path(os.path.realpath(out))
    links = [part for part in (out, *out.parents) if part.is_symlink()]  # as typed: the cwd's own are not news
    for link in links:
        if not link.exists():
            raise UsageError(f"--out {out}: {link} is a symbolic link to {os.path.realpath(link)}, which does not "
                             "exist: create that folder, or remove the link to export into a new folder there")
    if links:
        say(f"--out {out} resolves to {real} (a symbolic link on the way): the export is written there; "
            "the link is left as it is")
    if not real.exists():
        return Destination(out, real, "folder", (), DIR_MODE)
    entries = set(os.listdir(real))
    recorded = _recorded_files(real)
    old = tuple(n for n in EXPORT_NAMES if n in entries and (n in names or n in recorded))
    for name in old:
        if stat.S_ISDIR(os.lstat(real / name).st_mode):
            raise UsageError(f"--out {out}: {name} there is a directory, not a file of an earlier export: "
                             "move it away, or export into another folder")
    st = os.stat(real)
    whole = bool(old) and entries == set(old) and all(stat.S_ISREG(os.lstat(real / n).st_mode) for n in old)
    same_device = st.st_dev == os.stat(real.parent).st_dev  # a mount point cannot be renamed
    unit = "folder" if whole and same_device else "files"
    return Destination(out, real, unit, old, stat.S_IMODE(st.st_mode))


def _recorded_files(folder: Path) -> tuple[str, ...]:
    """The files an earlier export's provenance.json lists (only export names: never a path)."""
    try:
        prov = json.loads((folder / "provenance.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    if not isinstance(prov, dict) or prov.get("task") != "export" or not isinstance(prov.get("files"), list):
        return ()
    return tuple(n for n in prov["files"] if n in EXPORT_NAMES)


def open_stage(dest: Destination) -> tuple[Destination, Path]:
    """Create the private staging folder on ``dest``'s filesystem (and any missing parent,
    0755). A parent that cannot be written turns a ``folder`` unit into ``files`` (staged inside
    the destination). Returns the destination as it will be committed, and the stage. A folder
    that cannot be written is refused (exit 2) before anything is written."""
    if dest.unit == "folder":
        where = dest.real.parent
        try:
            make_parents(where)
        except OSError as exc:
            raise _cannot_write(dest, Path(exc.filename or where), exc) from exc
        try:
            return dest, Path(tempfile.mkdtemp(prefix=f".{dest.real.name}.export.", dir=where))
        except OSError as exc:
            if not (isinstance(exc, PermissionError) and dest.real.is_dir()):
                raise _cannot_write(dest, where, exc) from exc
        dest = Destination(dest.given, dest.real, "files", dest.old, dest.mode)
    try:
        return dest, Path(tempfile.mkdtemp(prefix=".specdeck-export.", dir=dest.real))
    except OSError as exc:
        raise _cannot_write(dest, dest.real, exc) from exc


def _cannot_write(dest: Destination, where: Path, exc: OSError) -> UsageError:
    return UsageError(f"--out {dest.given}: cannot write in {where} ({exc.strerror}): export into a folder "
                      "you can write to")


def make_parents(folder: Path) -> None:
    """Create ``folder`` and its missing ancestors; each one created here is made 0755 (a
    server running as another user must reach the export), the existing ones are left alone."""
    missing = []
    while not folder.exists() and not folder.is_symlink():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue  # someone else's, made meanwhile: not ours to chmod
        set_own_mode(path, DIR_MODE)


def set_own_mode(path: Path, mode: int) -> None:
    """chmod a file or folder this export created, through a descriptor opened without
    following a link (a link there is refused, never followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        kind = os.fstat(fd).st_mode
        if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
            raise TaskError(f"{path}: not a file or folder this export wrote; left as it is")
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def commit(dest: Destination, stage: Path, names: tuple[str, ...]) -> None:
    """Put the staged export (``names`` in ``stage``, modes already set) in place of the earlier
    one. On failure: exit 1 (:class:`TaskError`) saying what ``dest`` holds and what to do."""
    if dest.unit == "folder" and _still_only(dest):
        _swap_folder(dest, stage)
        return
    _swap_files(dest, stage, names)
    _remove_folder(stage, "the emptied staging folder")


def _still_only(dest: Destination) -> bool:
    """Whether the destination still is absent or holds the earlier export alone (it may have
    been given other files since it was looked at; then only the export's files are swapped)."""
    return not dest.real.exists() if not dest.old else set(os.listdir(dest.real)) == set(dest.old)


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (``renameat2(RENAME_EXCHANGE)``); False where the kernel, the
    C library or the filesystem lacks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    func = getattr(libc, "renameat2", None)
    if func is None:
        return False
    at_fdcwd = -100
    if func(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _swap_folder(dest: Destination, stage: Path) -> None:
    set_own_mode(stage, dest.mode)
    real = dest.real
    if not dest.old:
        try:
            os.rename(stage, real)
        except OSError as exc:
            raise TaskError(_unchanged(dest, stage, f"could not put the export in place as {real} ({exc.strerror})")) \
                from exc
        return
    try:
        if exchange(stage, real):
            _remove_folder(stage, "the earlier export")  # the old one is at the stage's path now
            return
        aside = Path(tempfile.mkdtemp(prefix=f".{real.name}.old.", dir=real.parent))
        try:
            os.rename(real, aside)  # over the empty folder mkdtemp made: a name nobody else holds
        except OSError:
            os.rmdir(aside)
            raise
    except OSError as exc:
        raise TaskError(_unchanged(dest, stage, f"could not swap the new export into {dest.given} ({exc.strerror})")) \
            from exc
    try:
        os.rename(stage, real)
    except OSError as exc:
        cause = f"could not put the new export in place as {real} ({exc.strerror})"
        try:
            os.rename(aside, real)
        except OSError:
            raise TaskError(f"{cause}, nor the earlier one back: {real} is absent; the earlier export is whole "
                            f"in {aside}, the new one in {stage}: rename one of them to {real}") from exc
        raise TaskError(_unchanged(dest, stage, cause)) from exc
    _remove_folder(aside, "the earlier export")


def _unchanged(dest: Destination, stage: Path, cause: str) -> str:
    """Drop the staged export that could not go in; the message saying what ``dest`` holds."""
    _remove_folder(stage, "the unused new export")
    if not dest.old:
        return f"{cause}; nothing was written there: fix the cause and export again"
    return (f"{cause}; {dest.given} holds the earlier export, unchanged ({describe(dest.real, dest.old)}); "
            "the new one was not installed: fix the cause and export again")


def _ordered(names: tuple[str, ...], heads_first: bool) -> list[str]:
    """``names`` with the loadable file (config.json, drafter.gguf) first or last."""
    heads = [n for n in names if n in HEADS]
    rest = [n for n in names if n not in HEADS]
    return heads + rest if heads_first else rest + heads


def _move(names: list[str], src: Path, dst: Path, done: list[str]) -> None:
    """Rename each of ``names`` from ``src`` to ``dst`` in order, appending each to ``done``
    once moved (so a failure leaves ``done`` naming what to move back)."""
    for name in names:
        os.rename(src / name, dst / name)
        done.append(name)


def _swap_files(dest: Destination, stage: Path, names: tuple[str, ...]) -> None:
    real = dest.real
    backup = Path(tempfile.mkdtemp(prefix=".specdeck-old.", dir=real)) if dest.old else None
    moved_out: list[str] = []
    moved_in: list[str] = []
    step = "move the earlier export's files aside"
    try:
        if backup is not None:
            _move(_ordered(dest.old, heads_first=True), real, backup, moved_out)
        step = "move the new export's files in"
        _move(_ordered(names, heads_first=False), stage, real, moved_in)
    except OSError as exc:
        name = Path(exc.filename).name if exc.filename else "?"
        cause = f"could not {step} in {dest.given} ({name}: {exc.strerror})"
        raise TaskError(_roll_back(dest, stage, backup, moved_in, moved_out, cause)) from exc
    if backup is not None:
        _remove_folder(backup, "the earlier export")


def _roll_back(dest: Destination, stage: Path, backup: Path | None, moved_in: list[str],
               moved_out: list[str], cause: str) -> str:
    """Undo a half-done file swap; returns the message saying what ``dest`` holds now."""
    try:
        _move(list(reversed(moved_in)), dest.real, stage, [])
        if backup is not None:
            _move(_ordered(tuple(moved_out), heads_first=False), backup, dest.real, [])
    except OSError as exc:
        there = [n for n in EXPORT_NAMES if (dest.real / n).exists()]
        return (f"{cause}, and could not undo it ({exc.strerror}): {dest.given} holds no complete export "
                f"({describe(dest.real, there) or 'none of its files'}); the earlier export's files are in "
                f"{backup}, the new ones in {stage}: move one set back into {dest.real}")
    if backup is not None:
        _remove_folder(backup, "an empty backup folder")
    return _unchanged(dest, stage, cause)


def describe(folder: Path, names) -> str:
    """``config.json (float32), model.safetensors``: an export's files, with the dtype its
    config declares (what an engine would load the weights as)."""
    parts = []
    for name in names:
        if name == "config.json":
            try:
                dtype = json.loads((folder / name).read_text(encoding="utf-8")).get("dtype")
            except (OSError, ValueError, AttributeError):
                dtype = None
            name = f"{name} ({dtype})" if dtype else name
        parts.append(name)
    return ", ".join(parts)


def _remove_folder(folder: Path, what: str) -> None:
    """Remove ``folder``, a folder of this export's own holding export files only; anything
    else there is said and left, never forced (the outcome is decided by then)."""
    try:
        for entry in os.listdir(folder):
            if entry not in EXPORT_NAMES:
                raise OSError(errno.ENOTEMPTY, f"{entry} is not an export's file", str(folder))
            path = folder / entry
            if stat.S_ISDIR(os.lstat(path).st_mode):
                raise OSError(errno.EISDIR, f"{entry} is a folder", str(folder))
            path.unlink()
        os.rmdir(folder)
    except OSError as exc:
        say(f"warning: {what} was left in {folder} ({exc.strerror}): remove it yourself once you no longer need it")
