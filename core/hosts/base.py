"""The host interface shared by the local and SSH implementations.

Every operation is a coroutine. Paths are strings in the host's own filesystem; a relative
path is taken relative to the host's ``workdir`` (see :meth:`Host.path`). Commands given as a
list are quoted word by word (``shlex.join``); a string is handed to the host's shell as
written, so callers that splice values into a string must quote them with ``shlex.quote``.

A host reports its connection state through :attr:`Host.status` and the callbacks registered
with :meth:`Host.on_status`, so that the console can show connected / reconnecting /
unreachable without knowing about SSH.
"""

from __future__ import annotations

import enum
import posixpath
import shlex
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Mapping, Sequence

from core.errors import RemoteCommandFailed
from core.hosts import bulk
from core.hosts.bulk import BulkStream


@dataclass(frozen=True)
class CommandResult:
    """What a finished command left behind (cf. asyncssh's SSHCompletedProcess)."""

    host: str
    command: str
    exit_status: int | None
    """The exit status; None when the command was killed by a signal."""
    stdout: str
    stderr: str
    signal: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def check(self) -> "CommandResult":
        """Raise :class:`RemoteCommandFailed` unless the command exited 0."""
        if not self.ok:
            raise RemoteCommandFailed(self.host, self.command, self.exit_status, self.stderr,
                                      signal=self.signal)
        return self


@dataclass(frozen=True)
class FileStat:
    path: str
    size: int
    mtime: float
    is_dir: bool
    is_link: bool = False
    """Only from :meth:`Host.lstat` (``stat`` follows links)."""


class HostState(str, enum.Enum):
    UNKNOWN = "unknown"
    """Not connected yet."""
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class HostStatus:
    state: HostState
    reason: str = ""
    since: float = field(default_factory=time.time)


class AsyncWriter(ABC):
    """A byte sink on a host (a file opened for writing or appending)."""

    @abstractmethod
    async def write(self, data: bytes) -> None: ...

    @abstractmethod
    async def close(self) -> None:
        """Flush and close; raises if the data did not all land."""


def to_command(command: str | Sequence[str]) -> str:
    """A shell command string: a list is quoted word by word, a string is kept as written."""
    if isinstance(command, str):
        return command
    return shlex.join(str(c) for c in command)


class Host(ABC):
    """A machine specdeck runs work on.

    Args:
        name: The host's name in the plan.
        workdir: Its working directory (may start with ``~``); relative paths resolve here.
        python: The Python interpreter to use for ``python -m core.ml.*`` (default: the venv's).
        env: Extra environment variables for every command (never secrets: those belong
            in the host's own environment or ssh-agent).
    """

    def __init__(self, name: str, *, workdir: str, python: str | None = None,
                 env: Mapping[str, str] | None = None):
        self.name = name
        self.workdir = workdir
        self.python = python
        self.env = dict(env or {})
        self._status = HostStatus(HostState.UNKNOWN)
        self._listeners: list[Callable[[str, HostStatus], None]] = []
        self._home: str | None = None

    # -- state ---------------------------------------------------------------------------
    @property
    def status(self) -> HostStatus:
        return self._status

    def on_status(self, callback: Callable[[str, HostStatus], None]) -> None:
        """Call ``callback(host_name, status)`` on every state change."""
        self._listeners.append(callback)

    def _set_status(self, state: HostState, reason: str = "") -> None:
        if state == self._status.state and reason == self._status.reason:
            return
        self._status = HostStatus(state, reason)
        for cb in list(self._listeners):
            cb(self.name, self._status)

    # -- paths ---------------------------------------------------------------------------
    @property
    def home(self) -> str:
        assert self._home is not None, "connect() first"
        return self._home

    def path(self, p: str) -> str:
        """An absolute path on the host: ``~`` expanded, relative paths under ``workdir``."""
        wd = self.workdir
        if wd == "~" or wd.startswith("~/"):
            wd = self.home + wd[1:]
        if p == "~" or p.startswith("~/"):
            return posixpath.normpath(self.home + p[1:])
        return posixpath.normpath(posixpath.join(wd, p))

    # -- lifecycle -----------------------------------------------------------------------
    @abstractmethod
    async def connect(self) -> None:
        """Open (or verify) the connection; raises HostUnreachable / HostKeyRejected."""

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> "Host":
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- commands ------------------------------------------------------------------------
    @abstractmethod
    async def run(self, command: str | Sequence[str], *, check: bool = False,
                  timeout: float | None = None, input: bytes | None = None,
                  cwd: str | None = None, env: Mapping[str, str] | None = None) -> CommandResult:
        """Run a command in the host's shell and wait for it.

        Args:
            command: A list (each element one literal word) or a shell string.
            check: Raise :class:`RemoteCommandFailed` on a non-zero exit.
            timeout: Seconds before the command is abandoned (raises TimeoutError).
            input: Bytes for its standard input (default: none, stdin is empty).
            cwd: Working directory (default: the host's workdir, created if missing).
            env: Extra environment variables on top of the host's ``env``.

        Raises:
            HostUnreachable: the transport failed (not the command).
        """

    # -- files ---------------------------------------------------------------------------
    @abstractmethod
    async def read_file(self, path: str) -> bytes: ...

    @abstractmethod
    async def write_file(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        """Write atomically (temp file + rename), creating parent directories."""

    @abstractmethod
    async def stat(self, path: str) -> FileStat | None:
        """Size and mtime, or None when the path does not exist."""

    async def lstat(self, path: str) -> FileStat | None:
        """Like :meth:`stat`, but a symbolic link is reported as one (``is_link``)."""
        return await self.stat(path)

    async def identity(self, path: str) -> str | None:
        """``size inode device mtime`` of the file ``path`` resolves to (links followed), in
        one token; None when it is missing. Any rewrite changes it, so a hash recorded with
        it stays valid while it is the same (the relay's cheap "unchanged" test)."""
        q = shlex.quote(self.path(path))
        res = await self.run(f"find -L {q} -maxdepth 0 -printf '%s %i %D %T@\\n' 2>/dev/null")
        out = res.stdout.strip()
        return out if res.ok and out else None

    @abstractmethod
    async def listdir(self, path: str) -> list[str]: ...

    @abstractmethod
    async def remove(self, path: str, *, recursive: bool = False) -> None: ...

    @abstractmethod
    async def makedirs(self, path: str) -> None: ...

    @abstractmethod
    async def rename(self, src: str, dst: str) -> None:
        """Atomic rename within the host's filesystem."""

    @abstractmethod
    async def read_from(self, path: str, offset: int, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` from ``offset`` (b'' at end of file or when it is missing)."""

    @abstractmethod
    def open_reader(self, path: str, offset: int = 0, *, chunk_size: int = 1 << 20,
                    length: int | None = None) -> AsyncIterator[bytes]:
        """Stream a file's bytes from ``offset`` to its end (or ``length`` of them), in
        chunks (for relays)."""

    @abstractmethod
    async def open_writer(self, path: str, *, append: bool, offset: int | None = None
                          ) -> AsyncWriter:
        """A sink writing to ``path`` (appending when ``append``, else at ``offset`` without
        truncating when given), parent dirs created; never through a symbolic link."""

    @property
    def address(self) -> str:
        """How other machines reach this host (a torchrun rendezvous on it)."""
        return "127.0.0.1"

    async def bulk_ready(self) -> str | None:
        """None when :meth:`open_bulk` gives descriptors here, else why not (for the log)."""
        return "this host offers asyncio streams only"

    async def open_bulk(self, path: str, *, offset: int = 0, write: bool = False,
                        length: int | None = None) -> "BulkStream | None":
        """A file descriptor end for the relay's fast path (see :mod:`core.hosts.bulk`):
        ``path`` read from ``offset`` (``length`` bytes, or to its end), or appended to
        when ``write``. None: this host only offers the asyncio streams above (the relay
        then uses those)."""
        return None

    def _bulk_process(self, script: str, *, write: bool, path: str) -> BulkStream:
        """A descriptor end running the shell ``script`` on the host (``bulk_ready``)."""
        raise NotImplementedError

    async def open_bulk_range(self, path: str, journal: str, start: int, end: int,
                              chunk: int) -> "BulkStream | None":
        """A sink writing ``[start, end)`` of ``path`` in place, journaling each whole
        ``chunk`` in ``journal`` (:func:`core.hosts.bulk.range_writer`); None when this
        host has no descriptor path."""
        if await self.bulk_ready() is not None:
            return None
        script = bulk.range_writer(self.path(path), self.path(journal), start, end, chunk)
        return self._bulk_process(script, write=True, path=self.path(path))

    @abstractmethod
    async def disk_free(self, path: str) -> int:
        """Free bytes available to the user on the filesystem holding ``path``
        (its nearest existing ancestor when it does not exist yet)."""

    async def sha256(self, path: str) -> str:
        """The file's sha256, computed on the host.

        ``openssl dgst`` (or Python's hashlib, both using the CPU's SHA extensions) is about
        5x faster than coreutils' ``sha256sum``, which is the last resort.
        """
        q = shlex.quote(self.path(path))
        script = (f"f={q}; if command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r \"$f\"; "
                  "elif command -v python3 >/dev/null 2>&1; then python3 -c "
                  "'import hashlib,sys;h=hashlib.sha256();f=open(sys.argv[1],\"rb\");"
                  "[h.update(b) for b in iter(lambda:f.read(1<<20),b\"\")];print(h.hexdigest())'"
                  " \"$f\"; else sha256sum \"$f\"; fi")
        res = await self.run(script, check=True)
        return res.stdout.split()[0].lstrip("\\").lower()
