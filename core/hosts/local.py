"""The console machine as a host: subprocesses and plain file I/O, no SSH."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import signal as _signal
from typing import AsyncIterator, Mapping, Sequence

from core.hosts import bulk
from core.hosts.bulk import BulkStream, FileBulk, ProcessBulk
from core.hosts.base import AsyncWriter, CommandResult, FileStat, Host, HostState, to_command


NOT_INHERITED = ("SPECDECK_NOTIFY",)
"""This specdeck's environment that its commands on the local host never get: the
notification URL is a secret (core.runs.notify), which a run's command could print to its log."""

class _LocalWriter(AsyncWriter):
    def __init__(self, f):
        self._f = f

    async def write(self, data: bytes) -> None:
        # Local disk writes are fast and bounded by the chunk size; a thread hop per chunk
        # costs more than it saves.
        self._f.write(data)

    async def close(self) -> None:
        # fsync of a freshly written multi-GB file takes hundreds of ms: off the event loop,
        # or the console freezes at the end of every local relay.
        await asyncio.to_thread(self._sync_close)

    def _sync_close(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


class LocalHost(Host):
    """Runs commands with ``bash -c`` on this machine."""

    async def connect(self) -> None:
        self._home = os.path.expanduser("~")
        os.makedirs(self.path("."), exist_ok=True)
        self._set_status(HostState.CONNECTED)

    async def close(self) -> None:
        return None

    async def run(self, command: str | Sequence[str], *, check: bool = False,
                  timeout: float | None = None, input: bytes | None = None,
                  cwd: str | None = None, env: Mapping[str, str] | None = None) -> CommandResult:
        cmd = to_command(command)
        wd = self.path(cwd or ".")
        os.makedirs(wd, exist_ok=True)
        full_env = {**{k: v for k, v in os.environ.items() if k not in NOT_INHERITED},
                    **self.env, **(env or {})}
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", cmd, cwd=wd, env=full_env,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        try:
            out, err = await asyncio.wait_for(proc.communicate(input), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            try:
                os.killpg(proc.pid, _signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
            raise
        rc = proc.returncode
        sig = None
        if rc is not None and rc < 0:
            sig = _signal.Signals(-rc).name.removeprefix("SIG")
            rc = None
        res = CommandResult(self.name, cmd, rc, out.decode("utf-8", "replace"),
                            err.decode("utf-8", "replace"), signal=sig)
        return res.check() if check else res

    async def read_file(self, path: str) -> bytes:
        with open(self.path(path), "rb") as f:
            return f.read()

    async def write_file(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        p = self.path(path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        tmp = f"{p}.tmp.{os.getpid()}"
        try:
            os.unlink(tmp)  # a stale one (or a planted link: removed, never followed)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, p)

    async def stat(self, path: str) -> FileStat | None:
        return self._stat(path, os.stat)

    async def lstat(self, path: str) -> FileStat | None:
        return self._stat(path, os.lstat)

    def _stat(self, path: str, how) -> FileStat | None:
        p = self.path(path)
        try:
            st = how(p)
        except FileNotFoundError:
            return None
        import stat as _st
        return FileStat(p, st.st_size, st.st_mtime, _st.S_ISDIR(st.st_mode),
                        is_link=_st.S_ISLNK(st.st_mode))

    async def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(self.path(path)))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        p = self.path(path)
        if recursive and os.path.isdir(p):
            shutil.rmtree(p)
        else:
            try:
                os.remove(p)
            except FileNotFoundError:
                pass

    async def makedirs(self, path: str) -> None:
        os.makedirs(self.path(path), exist_ok=True)

    async def rename(self, src: str, dst: str) -> None:
        os.replace(self.path(src), self.path(dst))

    async def read_from(self, path: str, offset: int, max_bytes: int) -> bytes:
        try:
            with open(self.path(path), "rb") as f:
                f.seek(offset)
                return f.read(max_bytes)
        except FileNotFoundError:
            return b""

    async def open_reader(self, path: str, offset: int = 0, *, chunk_size: int = 1 << 20,
                          length: int | None = None) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        left = length
        with open(self.path(path), "rb") as f:
            f.seek(offset)
            while left != 0:
                n = chunk_size if left is None else min(chunk_size, left)
                chunk = await loop.run_in_executor(None, f.read, n)
                if not chunk:
                    return
                left = None if left is None else left - len(chunk)
                yield chunk

    async def open_writer(self, path: str, *, append: bool, offset: int | None = None
                          ) -> AsyncWriter:
        p = self.path(path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW  # a link at the name: ELOOP
        if append:
            flags |= os.O_APPEND
        elif offset is None:
            flags |= os.O_TRUNC
        fd = os.open(p, flags, 0o644)
        if offset is not None and not append:
            os.lseek(fd, offset, os.SEEK_SET)
        return _LocalWriter(os.fdopen(fd, "wb"))

    async def bulk_ready(self) -> str | None:
        return None

    async def sha256(self, path: str) -> str:
        """Hashed in a worker thread (hashlib, SHA extensions), at the bulk work's niceness."""
        p = self.path(path)

        def digest() -> str:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            return h.hexdigest()

        return await bulk.in_background_thread(digest)

    async def open_bulk(self, path: str, *, offset: int = 0, write: bool = False,
                        length: int | None = None) -> BulkStream | None:
        return FileBulk(self.path(path), offset=offset, write=write)

    def _bulk_process(self, script: str, *, write: bool, path: str) -> BulkStream:
        what = "writing" if write else "reading"

        def on_exit(code: int, stderr: bytes) -> Exception | None:
            return None if code == 0 else bulk.script_error(code, stderr, self.name, what, path)

        return ProcessBulk(["bash", "-c", script], write=write, describe="local dd",
                           on_exit=on_exit)

    async def disk_free(self, path: str) -> int:
        p = self.path(path)
        while not os.path.exists(p):
            p = os.path.dirname(p)
        st = os.statvfs(p)
        return st.f_bavail * st.f_frsize
