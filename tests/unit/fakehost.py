"""A :class:`core.hosts.base.Host` in memory, for the runner's and jobs' unit tests.

Files live in a dict. A run capsule's command "runs" when its wrapper is started: the
command (the last line of ``cmd.sh``) is looked up in ``programs`` for the log it writes
and its exit status, and the capsule gets the ``pid``, ``log`` and ``exit`` files the real
wrapper writes; a command in ``held`` keeps running until :meth:`FakeHost.end`. The capsule
scripts of :mod:`core.capsules.jobs` are answered from those files (inspect), or do nothing (the
process-tree scripts: nothing but capsules runs here). Real hosts are the integration tests'.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from typing import AsyncIterator, Mapping, Sequence

from core.errors import HostUnreachable
from core.hosts.base import AsyncWriter, CommandResult, FileStat, Host, HostState, to_command

PID = 4242
"""The pid every fake command runs as."""


class FakeHost(Host):
    def __init__(self, name: str = "gpu", *, workdir: str = "/w",
                 programs: Mapping[str, tuple[bytes, int]] | None = None):
        super().__init__(name, workdir=workdir)
        self._home = "/home/op"
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {"/"}
        self.programs = dict(programs or {})
        """command -> (what it writes to its log, its exit status); default ``(b"", 0)``."""
        self.held: set[str] = set()
        """Commands that keep running until :meth:`end`."""
        self.reachable = True
        self.commands: list[str] = []
        self.connects = 0

    # -- the process model ---------------------------------------------------------------
    def end(self, capsule: str, status: int = 0, log: bytes = b"") -> None:
        """The command running in ``capsule`` writes ``log`` and exits with ``status``."""
        self._append(f"{capsule}/log", log)
        self.files[f"{capsule}/exit"] = f"exit {status}\n".encode()

    def _start(self, capsule: str) -> None:
        command = self.files[f"{capsule}/cmd.sh"].decode().rstrip("\n").rsplit("\n", 1)[-1]
        self.files[f"{capsule}/pid"] = f"{PID} 100 boot {PID + 1} 101\n".encode()
        if command in self.held:
            return
        log, status = self.programs.get(command, (b"", 0))
        self.end(capsule, status, log)

    def _inspect(self, capsule: str) -> str:
        if f"{capsule}/exit" in self.files:
            return "ended " + self.files[f"{capsule}/exit"].decode()
        if f"{capsule}/pid" in self.files:
            return f"running {PID}"
        return "nopid" if capsule in self.dirs else "missing"

    # -- lifecycle -----------------------------------------------------------------------
    def _check_reachable(self) -> None:
        if not self.reachable:
            self._set_status(HostState.UNREACHABLE, "connection refused")
            raise HostUnreachable(self.name, "connection refused")

    async def connect(self) -> None:
        self.connects += 1
        self._check_reachable()
        self._set_status(HostState.CONNECTED)

    async def close(self) -> None:
        pass

    async def run(self, command: str | Sequence[str], *, check: bool = False,
                  timeout: float | None = None, input: bytes | None = None,
                  cwd: str | None = None, env: Mapping[str, str] | None = None
                  ) -> CommandResult:
        self._check_reachable()
        cmd = to_command(command)
        self.commands.append(cmd)
        out = ""
        if cmd.startswith("touch ") and "wrapper.sh" in cmd:  # core.capsules.jobs.start
            self._start(posixpath.dirname(shlex.split(cmd)[1]))
        elif cmd.startswith("D=") and "ended $(cat" in cmd:  # core.capsules.jobs.inspect
            out = self._inspect(shlex.split(cmd.split("\n", 1)[0][2:])[0])
        res = CommandResult(self.name, cmd, 0, out, "")
        return res.check() if check else res

    # -- files ---------------------------------------------------------------------------
    def _append(self, path: str, data: bytes) -> None:
        self.files[path] = self.files.get(path, b"") + data

    async def read_file(self, path: str) -> bytes:
        self._check_reachable()
        return self.files[self.path(path)]

    async def write_file(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        self._check_reachable()
        path = self.path(path)
        await self.makedirs(posixpath.dirname(path))
        self.files[path] = bytes(data)

    async def stat(self, path: str) -> FileStat | None:
        self._check_reachable()
        path = self.path(path)
        if path in self.files:
            return FileStat(path, len(self.files[path]), time.time(), False)
        return FileStat(path, 0, time.time(), True) if path in self.dirs else None

    async def listdir(self, path: str) -> list[str]:
        path = self.path(path)
        names = {p[len(path) + 1:].split("/", 1)[0] for p in [*self.files, *self.dirs]
                 if p.startswith(path + "/")}
        return sorted(names)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        path = self.path(path)
        self.files.pop(path, None)
        if recursive:
            for p in [p for p in self.files if p.startswith(path + "/")]:
                del self.files[p]
            self.dirs = {d for d in self.dirs if d != path and not d.startswith(path + "/")}

    async def makedirs(self, path: str) -> None:
        path = self.path(path)
        while path not in self.dirs:
            self.dirs.add(path)
            path = posixpath.dirname(path)

    async def rename(self, src: str, dst: str) -> None:
        self.files[self.path(dst)] = self.files.pop(self.path(src))

    async def read_from(self, path: str, offset: int, max_bytes: int) -> bytes:
        self._check_reachable()
        return self.files.get(self.path(path), b"")[offset:offset + max_bytes]

    async def open_reader(self, path: str, offset: int = 0, *, chunk_size: int = 1 << 20,
                          length: int | None = None) -> AsyncIterator[bytes]:
        data = self.files.get(self.path(path), b"")[offset:]
        yield data if length is None else data[:length]

    async def open_writer(self, path: str, *, append: bool, offset: int | None = None
                          ) -> AsyncWriter:
        raise NotImplementedError("relays are tested on real hosts")

    async def disk_free(self, path: str) -> int:
        return 1 << 40
