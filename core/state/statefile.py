"""Checking a state database before specdeck writes a byte to it.

The state file is named by the user (``--state``, ``$SPECDECK_STATE``) or derived from the
plan: it may be a directory, ``/dev/null``, a garbage or truncated file, read-only, on a full
disk, locked by another program, or written by a newer specdeck. :func:`preflight` inspects it
read-only and raises :class:`StateFileError` (exit status 2) naming the path and what to do;
nothing is created, converted to WAL or migrated unless it passes. A database holding a
migration this specdeck does not know is never opened for writing.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from core.errors import InvalidInput, StateDiskFull

SQLITE_MAGIC = b"SQLite format 3\x00"
MIGRATIONS_TABLE = "_sqlite_migrations"
SQLITE_IOERR, SQLITE_FULL = 10, 13
"""SQLite's primary result codes for a write the disk refused (an extended code's low byte)."""
SQLITE_IOERR_NOMEM = SQLITE_IOERR | (12 << 8)
"""An I/O error that is memory, not the disk: never a full state disk."""


class StateFileError(InvalidInput):
    default_title = "State database unusable"

    def __init__(self, path: str, problem: str, hint: str | None = None):
        self.path = path
        super().__init__(f"state database {path}: {problem}",
                         hint=hint or "pass another file with --state (or $SPECDECK_STATE)")


def preflight(path: str, known_migrations: list[str], migration_set: str,
              timeout: float = 10.0) -> None:
    """Raise :class:`StateFileError` unless ``path`` can be a specdeck state database."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        _check_new(p)
        return
    except OSError as e:
        raise StateFileError(path, f"cannot be read ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise StateFileError(path, "is a directory, not a database file")
    if not stat.S_ISREG(st.st_mode):
        raise StateFileError(path, "is not a regular file (a device, pipe or socket)")
    root = os.geteuid() == 0  # root passes os.access: the owner's mode bits still count
    if not os.access(p, os.R_OK) or (root and not st.st_mode & stat.S_IRUSR):
        raise StateFileError(path, "cannot be read (permission denied)",
                             hint="fix its permissions (chmod u+rw) or pass another --state")
    try:
        dmode = os.stat(p.parent).st_mode
    except OSError:
        dmode = 0
    if (not os.access(p, os.W_OK) or not os.access(p.parent, os.W_OK | os.X_OK)
            or (root and (not st.st_mode & stat.S_IWUSR or not dmode & stat.S_IWUSR))):
        raise StateFileError(path, "is read-only (the file or its directory): specdeck records "
                             "every status change and log line there",
                             hint="make it writable (chmod u+w), or pass another --state")
    if st.st_size == 0:
        return  # an empty file is a new database
    try:
        with open(p, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise StateFileError(path, f"cannot be read ({e.strerror})") from None
    if head != SQLITE_MAGIC:
        raise StateFileError(path, "is not an SQLite database (garbage or another kind of file)",
                             hint="move it aside, or pass another --state; specdeck never "
                                  "overwrites it")
    _check_schema(path, known_migrations, migration_set, timeout)


def _check_new(p: Path) -> None:
    parent = p.parent
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise StateFileError(str(p), f"{parent} is not a directory")
    root_ro = os.geteuid() == 0 and not os.stat(parent).st_mode & stat.S_IWUSR
    if not os.access(parent, os.W_OK | os.X_OK) or root_ro:
        raise StateFileError(str(p), f"cannot be created: {parent} is not writable",
                             hint="pass a writable path with --state (or $SPECDECK_STATE)")


def _check_schema(path: str, known: list[str], migration_set: str, timeout: float) -> None:
    # Without a -wal file beside it (nobody has it open) read it as immutable: a read-only
    # WAL reader would otherwise create -wal and -shm files next to a file we may refuse.
    wal = os.path.exists(path + "-wal")
    uri = "file:" + _uri_path(path) + ("?mode=ro" if wal else "?mode=ro&immutable=1")
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=timeout)
    except sqlite3.Error as e:
        raise StateFileError(path, f"cannot be opened ({e})") from None
    try:
        tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if MIGRATIONS_TABLE not in tables:
            if tables:
                raise StateFileError(path, "is an SQLite database of another program (no "
                                     "specdeck schema)", hint="pass another --state")
            return
        applied = [r[0] for r in conn.execute(
            f"SELECT name FROM {MIGRATIONS_TABLE} WHERE migration_set = ?", [migration_set])]
        unknown = [n for n in applied if n not in known]
        if unknown:
            raise StateFileError(
                path, f"was written by a newer specdeck (schema changes {', '.join(unknown)} "
                "are unknown here); it was not opened for writing",
                hint="upgrade specdeck (pip install -U specdeck), or pass another --state")
    except sqlite3.DatabaseError as e:
        raise StateFileError(path, _sqlite_problem(e)) from None
    finally:
        conn.close()


def _uri_path(path: str) -> str:
    from urllib.parse import quote

    return quote(os.path.abspath(path))


def _sqlite_problem(e: BaseException) -> str:
    msg = str(e)
    low = msg.lower()
    if "locked" in low or "busy" in low:
        return "is locked by another program (it held the lock too long); close it and retry"
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return f"is damaged or not a database ({msg})"
    if "full" in low or "disk i/o" in low:
        return (f"cannot be written ({msg}: a full disk, a file size limit or a failing "
                "device); free space and retry")
    if "readonly" in low or "read-only" in low:
        return "is read-only; make it writable or pass another --state"
    if "unable to open" in low:
        return "cannot be opened (missing directory or permission denied)"
    return msg


def open_problem(path: str, e: BaseException) -> StateFileError:
    """The error for a failure while opening (after :func:`preflight` passed)."""
    return StateFileError(path, _sqlite_problem(e) if isinstance(e, sqlite3.Error)
                          else f"{getattr(e, 'strerror', None) or e}")


def disk_full(path: str, exc: BaseException) -> StateDiskFull | None:
    """The :class:`StateDiskFull` for ``exc`` when it is SQLite saying that the state
    database's disk took no more writes (``SQLITE_FULL``, or an I/O error on a write: a file
    size limit, a failing device), naming the file and its filesystem; None for any other
    error (a lock, a constraint, a bug), which keeps its own handling."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int) or code == SQLITE_IOERR_NOMEM:
        return None
    if code & 0xFF not in (SQLITE_FULL, SQLITE_IOERR):
        return None
    full = code & 0xFF == SQLITE_FULL
    why = None
    if not full:  # SQLite does not say which: a limit of this process is worth naming
        import resource

        why = "a full disk or a failing device"
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            why = f"a file size limit of {limit} bytes for this process (`ulimit -f`), {why}"
    mount = _mount_point(os.path.dirname(os.path.abspath(path)))
    return StateDiskFull(path, filesystem_of(path), str(exc), full=full, why=why, mount=mount)


def filesystem_of(path: str) -> str:
    """Where a file lives, for a message: ``the tmpfs filesystem mounted at /mnt/state (0 B
    free of 262.1 KB)``; what cannot be found out is left out."""
    from core.text import human

    d = os.path.dirname(os.path.abspath(path))
    mount = _mount_point(d)
    kind = _fs_type(mount)
    where = f"the {kind} filesystem mounted at {mount}" if kind else f"the filesystem at {mount}"
    try:
        st = os.statvfs(d)
    except OSError:
        return where
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return f"{where} ({human(free)} free of {human(size)})"


def _mount_point(d: str) -> str:
    """The mount point of the filesystem holding directory ``d`` (``d`` itself if unknown)."""
    try:
        dev = os.stat(d).st_dev
    except OSError:
        return d
    while d != os.path.dirname(d):
        up = os.path.dirname(d)
        try:
            if os.stat(up).st_dev != dev:
                break
        except OSError:
            break
        d = up
    return d


def _fs_type(mount: str) -> str | None:
    """The filesystem type mounted at ``mount`` (Linux's /proc/self/mounts; None elsewhere)."""
    kind = None
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and _unescape(fields[1]) == mount:
                    kind = fields[2]  # the last one mounted there is what is seen
    except OSError:
        return None
    return kind


def _unescape(field: str) -> str:
    """A /proc/self/mounts field: spaces, tabs, newlines and backslashes are octal escapes."""
    import re

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
