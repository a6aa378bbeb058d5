"""Bulk byte streams for the relay's fast path: plain file descriptors moved by a thread.

A relay of a multi-GB checkpoint spends its time moving bytes, and on the console machine
the cheapest way to move them is a thread doing blocking ``read``/``write`` on file
descriptors (the GIL is released for both, and for ``hashlib`` on large buffers), with the
SSH cipher work left to OpenSSH's own ``ssh`` client processes, in C, one per endpoint.
The asyncio path (asyncssh channels) stays as the fallback: it needs no ``ssh`` binary and
reuses the open connection, so small files and hosts the OpenSSH client cannot reach with
the same settings use it.

A :class:`BulkStream` is one end: a descriptor, :meth:`~BulkStream.finish` (flush, wait,
raise if the data did not all land) and :meth:`~BulkStream.abort` (unblock and stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import subprocess
import tempfile
import threading
from abc import ABC, abstractmethod
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

background_nice = 0
"""Niceness for the bulk work this process starts on this machine (the pump thread, the
``ssh`` clients, a local file's hash). 0 in the CLI, where the copy should take the CPU it
can get; the console raises it (:func:`set_background_nice`) so that a relay at full speed
on a busy laptop never starves the UI thread: CFS gives a nice-10 task about a tenth of the
share of a nice-0 one when both want the CPU, and the whole CPU when the UI is idle."""


def set_background_nice(n: int) -> None:
    """Run this process's later bulk work at niceness ``n`` (the console calls this)."""
    global background_nice
    background_nice = max(0, min(19, int(n)))


def niced(argv: Sequence[str]) -> list[str]:
    """``argv`` under ``nice`` when a background niceness is set."""
    return ["nice", "-n", str(background_nice), *argv] if background_nice else list(argv)


def in_background_thread(fn: Callable[[], T]) -> "asyncio.Future[T]":
    """Run ``fn`` in a thread of its own at the background niceness; a future for its result.

    Not the loop's executor: a pool thread is reused by other work, and an unprivileged
    process cannot lower a thread's niceness back once raised.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value) -> None:
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)

    def main() -> None:
        if background_nice:
            with contextlib.suppress(OSError, AttributeError):
                # Linux: a thread has its own nice value, addressed by its native id.
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), background_nice)
        try:
            outcome = (True, fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=main, name="specdeck-bulk", daemon=True).start()
    return fut


_F_SETPIPE_SZ = 1031
"""fcntl command to resize a pipe (Linux): 1 MiB pipes halve the wakeups of 64 KiB ones."""


class BulkStream(ABC):
    """One end of a bulk transfer: ``fd`` is read (a source) or written (a sink)."""

    fd: int
    describe: str
    """How the bytes travel, for progress lines (e.g. ``openssh aes128-gcm``)."""

    @abstractmethod
    async def finish(self) -> None:
        """Close our end, wait for the other side; raise if the data did not all land."""

    @abstractmethod
    def abort(self) -> None:
        """Stop now (a blocked read or write in the pump thread returns); never raises."""

    async def close_quietly(self) -> None:
        """:meth:`abort` and release everything, ignoring errors (the error path)."""
        self.abort()
        with contextlib.suppress(Exception):
            await self.finish()


class FileBulk(BulkStream):
    """A local file: read from ``offset``, or appended to and fsync'ed on finish."""

    def __init__(self, path: str, *, offset: int = 0, write: bool = False):
        self.path = path
        self.describe = "local file"
        if write:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        else:
            self.fd = os.open(path, os.O_RDONLY)
            os.lseek(self.fd, offset, os.SEEK_SET)
        self._write = write
        self._closed = False

    async def finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        fd = self.fd
        if self._write:
            await asyncio.to_thread(os.fsync, fd)  # hundreds of ms for GBs: off the loop
        os.close(fd)

    def abort(self) -> None:
        pass  # a regular file never blocks for long; the pump sees the stop flag


class ProcessBulk(BulkStream):
    """A local process (an ``ssh`` client running ``dd`` on the host) whose stdout is the
    source, or whose stdin is the sink.

    ``on_exit(returncode, stderr)`` turns a non-zero exit into the exception to raise (or
    None when the status is fine); it is how an SSH host maps 255 to "unreachable".
    """

    def __init__(self, argv: Sequence[str], *, write: bool, describe: str,
                 on_exit: Callable[[int, bytes], Exception | None],
                 env: dict[str, str] | None = None):
        self.describe = describe
        self._write = write
        self._on_exit = on_exit
        self._err = tempfile.TemporaryFile()  # a file, so a chatty stderr never blocks
        self._proc = subprocess.Popen(
            niced(argv), stdin=subprocess.PIPE if write else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if write else subprocess.PIPE, stderr=self._err,
            env=env, start_new_session=True)
        pipe = self._proc.stdin if write else self._proc.stdout
        assert pipe is not None
        self._pipe = pipe
        self.fd = pipe.fileno()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.fd, _F_SETPIPE_SZ, 1 << 20)
        self._finished = False

    async def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._write:
            with contextlib.suppress(OSError):
                self._pipe.close()  # EOF: the remote dd flushes, fsyncs and exits
        code = await asyncio.to_thread(self._proc.wait)
        with contextlib.suppress(OSError):
            self._pipe.close()
        self._err.seek(0)
        stderr = self._err.read()[-8192:]
        self._err.close()
        exc = self._on_exit(code, stderr)
        if exc is not None:
            raise exc

    def abort(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, 9)


def pump(src: BulkStream, dst: BulkStream, *, chunk: int, update: Callable[[bytes], None],
         sent: list[int], stop: Callable[[], bool], pace: Callable[[int], None]) -> None:
    """Copy ``src.fd`` to ``dst.fd`` until EOF (in :func:`in_background_thread`).

    ``update`` sees every chunk (the stream hash), ``sent[0]`` counts bytes written (read
    by the event loop for progress), ``pace(total)`` sleeps for a bandwidth cap, ``stop()``
    ends early. A killed peer shows up as EOF or ``BrokenPipeError``; the callers' finish()
    says which side failed and why.
    """
    rfd, wfd = src.fd, dst.fd
    while not stop():
        data = os.read(rfd, chunk)
        if not data:
            return
        update(data)
        view = memoryview(data)
        while view:
            n = os.write(wfd, view)
            view = view[n:]
        sent[0] += len(data)
        pace(sent[0])
