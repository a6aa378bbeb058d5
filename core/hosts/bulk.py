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
import errno
import fcntl
import os
import posixpath
import re
import shlex
import stat
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


READY = b"\x1fspecdeck-ready"
"""A stream script's first output, then one mode byte and ``\\036``: it proves the login
before any byte moves (what a login script printed before it is skipped), so no separate
probe login is needed. Mode ``h``: the source hashes what it sends (:func:`hashing_reader`)."""
READY_PRINTF = "printf '\\037specdeck-ready-\\036'\n"
_SENT = re.compile(rb"\x1fsha256=([0-9a-f]{64}) (\d+)\x1e")

_HASHING_READER = """import hashlib,os,sys
f=open(sys.argv[1],"rb",buffering=0);n=int(sys.argv[2]);h=hashlib.sha256()
b=bytearray(1<<17);m=memoryview(b);w=os.write;t=0
w(1,b"\\x1fspecdeck-readyh\\x1e")
while n<0 or t<n:
    k=f.readinto(m if n<0 else m[:min(len(b),n-t)])
    if not k:break
    h.update(m[:k]);v=m[:k]
    while v:v=v[w(1,v):]
    t+=k
sys.stderr.write("\\x1fsha256=%s %d\\x1e"%(h.hexdigest(),t))
"""


def hashing_reader(path: str, length: int | None = None) -> str:
    """Shell text sending ``path`` from its start (``length`` bytes, or to its end) to
    stdout and its sha256 on stderr at the end, computed from the bytes it sent (one read
    of the file, no copy more than ``dd``'s). Needs ``python3`` on the host; without it
    this is :func:`dd_reader` (mode ``-``: the receiver hashes)."""
    q = shlex.quote(path)
    n = -1 if length is None else int(length)
    return (f"[ -e {q} ] || exit {NO_FILE}\n"
            "if command -v python3 >/dev/null 2>&1; then "
            f"exec python3 -S -c {shlex.quote(_HASHING_READER)} {q} {n}; fi\n"
            + READY_PRINTF + dd_reader(path, 0, length).split("\n", 1)[1])


class NotReady(Exception):
    """A stream process never started its script (the ssh client did not log in)."""


class BulkStream(ABC):
    """One end of a bulk transfer: ``fd`` is read (a source) or written (a sink)."""

    fd: int
    describe: str
    """How the bytes travel, for progress lines (e.g. ``openssh aes128-gcm``)."""

    mode = "-"
    """``h`` when this source hashes the bytes it sends (:meth:`sent_sha256` after finish)."""

    async def ready(self) -> None:
        """Wait until the end is up (its script started); raise :class:`NotReady` if not."""

    def sent_sha256(self) -> tuple[str, int] | None:
        """(sha256, bytes) of what a hashing source sent, once finished; else None."""
        return None

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


BLOCK = 128 << 10
"""Bytes per read/write of the stream processes (``dd bs``, the pump's reads): a buffer that
stays in the CPU's L2 cache. 1 MiB buffers cost dd twice the system CPU (measured on this
project's 2-CPU box: 0.89 s against 0.36 s for 512 MiB through a pipe), as ``cat`` knows."""

NO_FILE = 66
"""Exit status of the stream scripts for "no such file" (EX_NOINPUT)."""
SYMLINK = 67
"""Exit status of the writer scripts for "a temporary name is a symbolic link": refused."""
SHORT = 65
"""Exit status of the range writer when its input ended before the range did (EX_DATAERR)."""


def dd_reader(path: str, offset: int, length: int | None = None) -> str:
    """Shell text streaming ``path`` from ``offset`` (``length`` bytes, or to its end) to
    stdout; exits NO_FILE when it is missing. GNU dd, 1 MiB blocks."""
    q = shlex.quote(path)
    flags = []
    if offset:
        flags.append("skip_bytes")
    if length is not None:
        flags.append("count_bytes")
    opts = (f" iflag={','.join(flags)}" if flags else "") + (f" skip={int(offset)}" if offset else "")
    opts += f" count={int(length)}" if length is not None else ""
    return f"[ -e {q} ] || exit {NO_FILE}\nexec dd if={q} bs=128K{opts} status=none"


def _refuse_links(*paths: str) -> str:
    """Shell text exiting SYMLINK when any of ``paths`` is a symbolic link."""
    qs = " ".join(shlex.quote(p) for p in paths)
    return (f"for p in {qs}; do if [ -L \"$p\" ]; then printf '%s is a symbolic link: refusing "
            f"to write through it\\n' \"$p\" >&2; exit {SYMLINK}; fi; done")


def _flusher(path: str) -> str:
    """Shell text starting a background loop that ``fdatasync``s ``path`` every second
    while this shell lives (``$fl``): the disk writes the file as it arrives, so the fsync
    at the end waits for the last second's bytes, not for the whole file's dirty pages."""
    return ("(while sleep 1 && kill -0 $$ 2>/dev/null; do dd if=/dev/null "
            f"of={shlex.quote(path)} oflag=append,nofollow conv=notrunc,fdatasync status=none; "
            "done) </dev/null >/dev/null 2>&1 &\nfl=$!")


def dd_writer(path: str, append: bool, offset: int | None = None) -> str:
    """Shell text writing stdin to ``path`` (appending when ``append``, else at ``offset``
    without truncating), fsync'ed at EOF. Never through a symbolic link (refused)."""
    q = shlex.quote(path)
    head = (f"mkdir -p -- {shlex.quote(posixpath.dirname(path))} || exit\n"
            f"{_refuse_links(path)}\n")
    if append:  # the relay's one-stream path: big files, so flush as they arrive
        return (head + _flusher(path) + "\n"
                f"dd of={q} bs=128K iflag=fullblock oflag=append,nofollow conv=notrunc,fsync "
                'status=none; rc=$?; kill "$fl" 2>/dev/null; exit $rc')
    if offset is not None:
        flags = f"oflag=seek_bytes,nofollow seek={int(offset)} conv=notrunc,fsync"
    else:
        flags = "oflag=nofollow conv=fsync"
    return head + f"exec dd of={q} bs=128K iflag=fullblock {flags} status=none"


def range_writer(path: str, journal: str, start: int, end: int, chunk: int) -> str:
    """Shell text writing stdin into ``path`` at ``[start, end)``, ``chunk`` bytes per
    ``dd``; after each whole chunk lands, its end offset is appended to ``journal`` (the
    range's resume point). A chunk cut short (the sender stopped) is not journaled, so a
    resume re-sends at most that one chunk. The file is fsync'ed once the range is whole.
    Exit SHORT when the input ended before ``end``; SYMLINK when a name is a link."""
    f, j = shlex.quote(path), shlex.quote(journal)
    return "\n".join([
        f"mkdir -p -- {shlex.quote(posixpath.dirname(path))} "
        f"{shlex.quote(posixpath.dirname(journal))} || exit",
        _refuse_links(path, journal),
        _flusher(path),
        f"off={int(start)}; end={int(end)}; c={int(chunk)}",
        'while [ "$off" -lt "$end" ]; do',
        '  n=$((end - off)); [ "$n" -gt "$c" ] && n=$c',
        f'  r=$(LC_ALL=C dd of={f} bs=128K iflag=fullblock,count_bytes count="$n" '
        'oflag=seek_bytes,nofollow seek="$off" conv=notrunc 2>&1) '
        "|| { printf '%s\\n' \"$r\" >&2; exit 1; }",
        '  case "$r" in *"',
        f'$n bytes"*) ;; *) exit {SHORT};; esac',
        '  off=$((off + n))',
        f"  printf '%s\\n' \"$off\" >> {j} || exit 1",
        "done",
        'kill "$fl" 2>/dev/null',
        f"exec dd if=/dev/null of={f} oflag=nofollow conv=notrunc,fsync status=none",
    ])


def script_error(code: int, stderr: bytes, host: str, what: str, path: str) -> OSError:
    """The OSError for a stream script (above) that exited ``code``: a missing file, a
    refused symbolic link, a full disk (ENOSPC, kept so callers can say what to do) or
    the last lines of its stderr."""
    text = stderr.decode("utf-8", "replace")
    tail = "; ".join(text.strip().splitlines()[-3:]) or f"exit status {code}"
    if code == NO_FILE:
        return FileNotFoundError(errno.ENOENT, f"no such file on {host}", path)
    if code == SYMLINK:
        return OSError(errno.ELOOP, f"{tail} (on {host})", path)
    if code == SHORT:
        return OSError(errno.EPIPE, f"{what} {path} on {host}: the stream ended before "
                       "its range did", path)
    if "No space left on device" in text:
        return OSError(errno.ENOSPC, f"{what} {path} on {host}: no space left on device",
                       path)
    return OSError(errno.EIO, f"{what} {path} failed on {host}: {tail}", path)


class FileBulk(BulkStream):
    """A local file: read from ``offset``, or appended to (never through a symbolic link)
    and fsync'ed on finish."""

    def __init__(self, path: str, *, offset: int = 0, write: bool = False):
        self.path = path
        self.describe = "local file"
        if write:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                              0o644)
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
                 env: dict[str, str] | None = None, ready_marker: bytes | None = None,
                 not_ready: Callable[[int, bytes], str] | None = None,
                 ready_timeout: float = 30.0):
        self.describe = describe
        self._write = write
        self._on_exit = on_exit
        self._marker, self._not_ready, self._ready_timeout = (ready_marker, not_ready,
                                                              ready_timeout)
        self._err = tempfile.TemporaryFile()  # a file, so a chatty stderr never blocks
        # A writer's stdout carries only the ready marker (its script writes nothing else).
        self._proc = subprocess.Popen(
            niced(argv), stdin=subprocess.PIPE if write else subprocess.DEVNULL,
            stdout=subprocess.PIPE if (ready_marker or not write) else subprocess.DEVNULL,
            stderr=self._err, env=env, start_new_session=True)
        pipe = self._proc.stdin if write else self._proc.stdout
        assert pipe is not None
        self._pipe = pipe
        self.fd = pipe.fileno()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.fd, _F_SETPIPE_SZ, 1 << 20)
        self._finished = False
        self._aborted = False
        self._sent: tuple[str, int] | None = None

    def sent_sha256(self) -> tuple[str, int] | None:
        return self._sent

    async def ready(self) -> None:
        """Read up to the ready marker on the process's stdout (anything a login script
        printed before it is dropped); on EOF first, :class:`NotReady` with the reason."""
        if self._marker is None:
            return
        out = self._proc.stdout
        assert out is not None
        fd, marker = out.fileno(), self._marker

        def wait_marker() -> bool:
            seen = b""
            while not seen.endswith(marker):
                b = os.read(fd, 1)
                if not b:
                    return False
                seen = (seen + b)[-len(marker):]
            tail = os.read(fd, 1) + os.read(fd, 1)  # the mode byte, then \036
            if len(tail) != 2:
                return False
            self.mode = chr(tail[0])
            return True

        try:
            ok = await asyncio.wait_for(asyncio.to_thread(wait_marker), self._ready_timeout)
        except asyncio.TimeoutError:
            self.abort()
            ok = False
        if ok:
            return
        code = await asyncio.to_thread(self._proc.wait)
        self._err.seek(0)
        err = self._err.read()[-8192:]
        self._finished = True
        self._close_pipes()
        self._err.close()
        raise NotReady(self._not_ready(code, err) if self._not_ready
                       else f"the stream process exited with status {code}")

    def _close_pipes(self) -> None:
        for p in (self._proc.stdin, self._proc.stdout):
            if p is not None:
                with contextlib.suppress(OSError):
                    p.close()

    async def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._write:
            with contextlib.suppress(OSError):
                self._pipe.close()  # EOF: the remote dd flushes, fsyncs and exits
        code = await asyncio.to_thread(self._proc.wait)
        self._close_pipes()
        if self._aborted and code == -9:
            self._err.close()
            return  # we stopped it (another end failed, or a cancel): not its failure
        self._err.seek(0)
        stderr = self._err.read()[-8192:]
        self._err.close()
        found = _SENT.search(stderr) if code == 0 else None
        self._sent = (found.group(1).decode(), int(found.group(2))) if found else None
        exc = self._on_exit(code, stderr)
        if exc is not None:
            raise exc

    def abort(self) -> None:
        self._aborted = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, 9)


class Pacer:
    """A bandwidth cap shared by every stream of a transfer (thread-safe): ``add(n)``
    counts ``n`` more bytes and sleeps while the total runs ahead of ``limit`` bytes/s."""

    def __init__(self, limit: float | None):
        self.limit = limit
        self.total = 0
        self._lock = threading.Lock()
        self._t0 = None

    def add(self, n: int) -> None:
        import time

        with self._lock:
            now = time.monotonic()
            if self._t0 is None:
                self._t0 = now
            self.total += n
            ahead = self.total / self.limit - (now - self._t0) if self.limit else 0.0
        if ahead > 0:
            time.sleep(ahead)


_SPLICE = 1 << 20
"""Bytes per splice (page references move, nothing is copied: no cache to fit)."""


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def pump(src: BulkStream, dst: BulkStream, *, chunk: int, update: Callable[[bytes], None] | None,
         sent: list[int], stop: Callable[[], bool], pace: Callable[[int], None],
         limit: int | None = None) -> None:
    """Copy ``src.fd`` to ``dst.fd`` until EOF, or ``limit`` bytes (in
    :func:`in_background_thread`).

    ``update`` sees every chunk (the stream hash; None: no hash, and between two pipes the
    kernel moves the bytes with ``splice``, no copy through Python), ``sent[0]`` counts bytes
    written (read by the event loop for progress), ``pace(n)`` is told of ``n`` more bytes
    and sleeps for a bandwidth cap, ``stop()`` ends early. A killed peer shows up as EOF or
    ``BrokenPipeError``; the callers' finish() says which side failed and why.
    """
    rfd, wfd = src.fd, dst.fd
    left = limit
    if update is None and hasattr(os, "splice") and _is_pipe(rfd) and _is_pipe(wfd):
        while not stop() and left != 0:
            try:
                n = os.splice(rfd, wfd, _SPLICE if left is None else min(_SPLICE, left))
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.ENOSYS) and sent[0] == 0:
                    break  # no splice here: the copying loop below
                raise
            if not n:
                return
            sent[0] += n
            left = None if left is None else left - n
            pace(n)
        else:
            return
    while not stop() and left != 0:
        data = os.read(rfd, chunk if left is None else min(chunk, left))
        if not data:
            return
        if update is not None:
            update(data)
        view = memoryview(data)
        while view:
            n = os.write(wfd, view)
            view = view[n:]
        sent[0] += len(data)
        left = None if left is None else left - len(data)
        pace(len(data))
