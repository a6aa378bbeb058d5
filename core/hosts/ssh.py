"""A host reached over SSH (asyncssh), built to survive dropped networks and sleeping laptops.

This is the only module in specdeck that imports asyncssh.

Design:

* **One connection per host.** Every operation (commands, file reads and writes, streams)
  multiplexes its own channel on a single SSH connection. A connection costs a TCP and key
  exchange round trip plus an authentication (and a ProxyJump hop, and an sshd monitor
  process on the host); a console that polls a dozen runs would otherwise open dozens of
  them, trip ``MaxStartups`` and spam auth logs. Opening it is serialised by a lock, so
  concurrent first calls make one connection, not one each. OpenSSH caps the sessions
  on one connection (``MaxSessions``, 10 by default), so at most :attr:`SSHHost.max_channels`
  command channels are open at once, plus one SFTP session; further calls queue (and a
  burst that still finds sshd's session table full, as it frees slots lazily, retries).

* **Configuration is OpenSSH's.** ``target`` is an ``~/.ssh/config`` alias or
  ``[user@]host[:port]``; asyncssh resolves HostName, User, Port, IdentityFile, ProxyJump
  (``none`` included) and UserKnownHostsFile from the config, reads ssh-agent keys when
  ``SSH_AUTH_SOCK`` is set, and checks the host key against ``~/.ssh/known_hosts``. All
  ``~`` paths are expanded when a connection is opened, from ``$HOME`` at that moment.
  An unknown or changed host key is never accepted: it raises :class:`HostKeyRejected`
  with the offered fingerprint and the exact command to trust it, or the known_hosts line
  to remove when a change is expected.

* **Reconnect in the background, never retry an operation.** When an established
  connection drops (the keepalive notices a silent network within about
  ``3 * keepalive_interval``; a reset is seen at once), the host moves to RECONNECTING and
  a background task dials again with capped exponential backoff (0.5 s doubling to 10 s).
  After :attr:`SSHHost.unreachable_after` failed attempts the state becomes UNREACHABLE;
  the task keeps dialling, so a host that comes back is picked up without anyone asking,
  and CONNECTED fires again (the runner reconciles its runs on that event). Operations
  that were in flight when the connection dropped fail with :class:`HostUnreachable`:
  their effect on the host is unknown (a command may or may not have run), so only the
  caller can decide to repeat them, which is why remote jobs run detached and are read
  back from files. Operations issued while reconnecting wait for the connection, at most
  :attr:`SSHHost.reconnect_wait` seconds (or until an attempt fails while UNREACHABLE),
  then raise :class:`HostUnreachable`. The first connection is not retried in the
  background: if the host cannot be reached at all, :meth:`SSHHost.connect` says why.

* **Transport errors and command errors never mix.** Refused connections, failed auth,
  timeouts and connections lost mid-command raise :class:`HostUnreachable` (or
  :class:`HostKeyRejected`); a command that ran and exited non-zero is a
  :class:`CommandResult` (or :class:`RemoteCommandFailed` with ``check=True``). A channel
  that closes without an exit status is a transport failure. File operations raise the
  same ``OSError`` subclasses as :class:`~core.hosts.local.LocalHost`.

* **Commands go through the remote login shell** (which must be POSIX: bash, zsh, dash),
  as OpenSSH does: ``cd`` into the working directory (created first) and ``export`` the
  environment in front of the command (sshd ignores most client ``env`` requests). Every
  value spliced in is ``shlex.quote``-d. sshd makes each session's shell a process group
  leader, and the shell reports its PID first thing (on stderr, stripped from the output),
  so a timeout or cancellation kills the whole group with ``kill -KILL -- -PID`` over
  another channel. The SSH ``signal`` request alone would not do: OpenSSH ignores it for
  root logins, which skip privilege separation. The host's tools are GNU coreutils
  (``dd`` with ``iflag=skip_bytes``, ``df -B1``, ``sha256sum``), as on any Linux GPU box.

* **Files**: small metadata operations use SFTP (one client per connection, reopened after
  a reconnect); ``write_file`` writes a temporary file and renames it over the target
  (``posix-rename@openssh.com``), so readers never see half a file. Bulk streams use a
  remote ``dd`` process instead (reading its stdout or feeding its stdin): one channel with
  SSH flow control gives backpressure for free and runs near the cipher's speed, where
  SFTP pays a request round trip per block (and asyncssh's 256 KiB blocks break OpenSSH's
  sftp-server, so blocks stay at its default).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import posixpath
import re
import secrets
import shlex
import shutil
import socket
import stat as _stat
from pathlib import Path
from typing import AsyncIterator, Mapping, Sequence

import asyncssh

from core.errors import HostKeyRejected, HostUnreachable, InvalidInput
from core.hosts.base import AsyncWriter, CommandResult, FileStat, Host, HostState, to_command
from core.hosts import bulk
from core.hosts.bulk import BulkStream, ProcessBulk

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PID_START = b"\x1fspecdeck-pid="
_PID_END = b"\x1e"
_PID_PRINTF = "printf '\\037specdeck-pid=%s\\036' \"$$\" >&2\n"
"""First line of every command: report the shell's PID on stderr, between control bytes."""
_CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"
"""Put AES-GCM in front of asyncssh's default cipher list (OpenSSH ``^`` syntax)."""
_WINDOW = 8 << 20
_MAX_PKTSIZE = 128 << 10
"""Channel window and largest data packet we accept: 8 MiB / 128 KiB packets roughly
double a stream's throughput over asyncssh's 2 MiB / 32 KiB (fewer per-packet Python
costs), and stay under OpenSSH's 256 KiB limit for a whole packet."""
_SESSION_FULL_CODES = (1, 2)
"""Channel-open failure codes sshd answers a session with when its MaxSessions table is
full (OPEN_ADMINISTRATIVELY_PROHIBITED, or OPEN_CONNECT_FAILED "open failed")."""


def _tilde(path: str) -> str:
    """``path`` with the local home directory shown as ``~`` (shorter messages)."""
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if path.startswith(home + "/") else path


def ssh_command(target: str) -> str:
    """The ``ssh`` command line that reaches ``target`` (OpenSSH rejects ``host:port``)."""
    try:
        host, port, user = parse_target(target)
    except InvalidInput:
        return f"ssh {shlex.quote(target)}"
    dest = shlex.quote(f"{user}@{host}" if user else host)
    return f"ssh -p {port} {dest}" if port else f"ssh {dest}"


def parse_target(target: str) -> tuple[str, int | None, str | None]:
    """Split ``[user@]host[:port]`` (or an alias) into host, port and user.

    IPv6 literals take brackets when a port follows (``[::1]:2222``).

    Raises:
        InvalidInput: the port is not a number.
    """
    user, _, rest = target.rpartition("@")
    port: str | None = None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":"):
            port = tail[1:]
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    else:
        host = rest
    if not host:
        raise InvalidInput(f"ssh target {target!r} names no host")
    if port is not None and not port.isdigit():
        raise InvalidInput(f"ssh target {target!r}: port {port!r} is not a number")
    return host, int(port) if port else None, user or None


class _Client(asyncssh.SSHClient):
    """asyncssh callbacks for one connection: loss notification and the offered host key."""

    def __init__(self, host: "SSHHost"):
        self._host = host
        self.conn: asyncssh.SSHClientConnection | None = None
        self.offered: tuple[str, str, int, asyncssh.SSHKey] | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        self._host._connection_lost(self.conn, exc)

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        # Called only for a key known_hosts does not trust: remember it for the error message,
        # and refuse it.
        self.offered = (host, addr, port, key)
        return False


class _DDWriter(AsyncWriter):
    """Feeds a remote ``dd`` process's stdin; SSH flow control is the backpressure.

    Holds one of the host's channel slots until :meth:`close`.
    """

    def __init__(self, host: "SSHHost", proc: asyncssh.SSHClientProcess, path: str):
        self._host = host
        self._proc = proc
        self._path = path
        self._done = False

    async def write(self, data: bytes) -> None:
        if self._done:
            raise ValueError(f"writer for {self._path} on {self._host.name} is closed")
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (OSError, asyncssh.Error) as exc:
            # dd died (disk full, permissions) or the connection did: _finish tells which.
            raise await self._finish(exc) from None

    async def close(self) -> None:
        """Send EOF, wait for dd to flush and fsync; raise unless it exited 0."""
        if self._done:
            return
        try:
            self._proc.stdin.write_eof()
        except (OSError, asyncssh.Error) as exc:
            raise await self._finish(exc) from None
        err = await self._finish(None)
        if err is not None:
            raise err

    async def _finish(self, exc: BaseException | None) -> Exception | None:
        """Wait for dd to exit and free the channel slot; the error to raise, if any."""
        self._done = True
        host, proc = self._host, self._proc
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait_closed(), None if exc is None else 10.0)
            status, sig = proc.exit_status, proc.exit_signal
            if sig:
                return OSError(errno.EIO, f"writing {self._path} on {host.name} was killed "
                               f"by signal {sig[0]}", self._path)
            if status is None:
                proc.close()
                return HostUnreachable(host.name, f"connection to {host._where} lost while "
                                       f"writing {self._path}")
            if status != 0:
                err = b""
                with contextlib.suppress(Exception):
                    err = await asyncio.wait_for(proc.stderr.read(), 5.0)
                return host._stream_error(status, "writing", self._path, err)
            if exc is not None:
                return HostUnreachable(host.name, f"writing {self._path} failed: {exc}")
            return None
        finally:
            host._slots.release()


class SSHHost(Host):
    """A machine reached over SSH, with one shared, self-healing connection.

    Args:
        name: The host's name in the plan.
        target: An ``~/.ssh/config`` alias, or ``[user@]host[:port]``.
        workdir: Its working directory (may start with ``~``); relative paths resolve here.
        python: The Python interpreter to use for ``python -m core.ml.*``.
        env: Extra environment variables for every command (exported in the remote shell).
        connect_timeout: Seconds allowed for one connection attempt (TCP, key exchange,
            authentication), also the default bound for an operation waiting on a reconnect.
        keepalive_interval: Seconds between SSH keepalives; three unanswered ones drop the
            connection, which starts a reconnect.
    """

    max_channels = 6
    """Command channels open at once on the connection. OpenSSH's MaxSessions is 10 by
    default; the SFTP session takes one, a kill on timeout one, and sshd frees slots lazily."""
    backoff_initial = 0.5
    """Seconds before the second reconnect attempt; doubles after each failure."""
    backoff_max = 10.0
    """The cap on the delay between reconnect attempts."""
    unreachable_after = 3
    """Failed reconnect attempts after which the state turns from RECONNECTING to UNREACHABLE."""

    def __init__(self, name: str, *, target: str, workdir: str, python: str | None = None,
                 env: Mapping[str, str] | None = None, connect_timeout: float = 10.0,
                 keepalive_interval: float = 15.0):
        super().__init__(name, workdir=workdir, python=python, env=env)
        self.target = target
        self._t_host, self._t_port, self._t_user = parse_target(target)
        self.connect_timeout = connect_timeout
        self.keepalive_interval = keepalive_interval
        self.reconnect_wait = connect_timeout
        """Seconds an operation waits for a reconnect before raising HostUnreachable."""
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        self._sftp_conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        self._sftp_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(self.max_channels)
        self._closed = False
        self._reconnect_task: asyncio.Task | None = None
        self._attempt_done = asyncio.Event()
        self._attempts = 0
        self._last_error: HostUnreachable | None = None
        self._attempts_ok = 0
        self._background: set[asyncio.Task] = set()
        self._where = target
        """``target`` as resolved by the config (``user@host:port``), for messages."""
        self._opts: asyncssh.SSHClientConnectionOptions | None = None
        self._openssh: tuple[list[str], str] | None = None
        """(argv prefix, cipher) of the OpenSSH client that reaches this host like we do."""
        self._openssh_why: str | None = None
        """Why the OpenSSH client cannot be used (then bulk streams stay on asyncssh)."""

    # -- connection ----------------------------------------------------------------------
    @property
    def connection_count(self) -> int:
        """How many SSH connections this host has opened so far (tests and diagnostics)."""
        return self._attempts_ok

    async def connect(self) -> None:
        """Open the connection, or wait for the reconnect in progress.

        Raises:
            HostKeyRejected: the host's key is unknown or changed.
            HostUnreachable: the host cannot be reached or refuses us.
        """
        self._closed = False
        if self._conn is not None:
            return
        if self._reconnecting():
            await self._wait_reconnected()
            return
        seen = self._attempts
        async with self._lock:
            if self._conn is not None:
                return
            if self._attempts != seen and self._last_error is not None:
                # Another caller's attempt failed while we queued: share its verdict.
                err = self._last_error
                raise type(err)(err.host, err.reason, hint=err.hint)
            try:
                conn = await self._attempt()
            except HostUnreachable as exc:
                self._set_status(HostState.UNREACHABLE, exc.reason)
                raise
        if self._conn is conn:
            self._set_status(HostState.CONNECTED)

    async def close(self) -> None:
        """Stop reconnecting and close the connection (a later call reconnects)."""
        self._closed = True
        task, self._reconnect_task = self._reconnect_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        conn, self._conn = self._conn, None
        self._sftp = self._sftp_conn = None
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5.0)
        self._set_status(HostState.UNKNOWN, "closed")

    def _reconnecting(self) -> bool:
        return self._reconnect_task is not None and not self._reconnect_task.done()

    async def _attempt(self) -> asyncssh.SSHClientConnection:
        """Dial once (caller holds the lock); on success the connection becomes current."""
        self._attempts += 1
        client: _Client | None = None

        def factory() -> _Client:
            nonlocal client
            client = _Client(self)
            return client

        opts = None
        try:
            opts = await asyncssh.SSHClientConnectionOptions.construct(
                config=(), host=self._t_host, port=self._t_port or (),
                username=self._t_user or (),
                connect_timeout=self.connect_timeout,
                keepalive_interval=self.keepalive_interval, keepalive_count_max=3,
                window=_WINDOW, max_pktsize=_MAX_PKTSIZE, client_factory=factory)
            self._where = f"{opts.username}@{opts.host}:{opts.port}"
            # AES-GCM first unless the config names Ciphers: with AES instructions (any
            # x86 GPU host, any ARMv8 laptop) it streams 2-3x faster than chacha20 here.
            ciphers = {} if opts.config.get("Ciphers") else {"encryption_algs": _CIPHERS}
            conn = await asyncssh.connect(self._t_host, port=self._t_port or (), options=opts,
                                          **ciphers)
        except asyncssh.HostKeyNotVerifiable as exc:
            err: HostUnreachable = self._host_key_error(opts, client, exc)
            self._last_error = err
            raise err from None
        except (OSError, asyncssh.Error, asyncio.TimeoutError, ValueError) as exc:
            desc, hint = self._describe(exc), self._hint(exc)
            jump = getattr(opts, "tunnel", None)
            if isinstance(jump, str) and jump.strip() and jump.strip().lower() != "none":
                desc, hint = await self._jump_failure(jump.strip(), desc, hint)
            err = HostUnreachable(self.name, desc, hint=hint)
            self._last_error = err
            raise err from None
        try:
            # Between markers: login scripts may print to stdout before our command runs.
            res = await asyncio.wait_for(
                conn.run("printf '\\037%s\\036' \"${HOME:-$(pwd)}\"", stdin=asyncssh.DEVNULL),
                self.connect_timeout)
            found = re.search("\x1f(/[^\x1e]*)\x1e", res.stdout or "")
            if res.exit_status != 0 or not found:
                raise OSError(f"could not read $HOME on the host: {res.stderr!r}")
            self._home = found.group(1)
            await asyncio.wait_for(conn.run(f"mkdir -p -- {shlex.quote(self.path('.'))}",
                                            stdin=asyncssh.DEVNULL), self.connect_timeout)
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            conn.close()
            err = HostUnreachable(self.name, f"connected to {self._where} but the session "
                                  f"failed: {exc}")
            self._last_error = err
            raise err from None
        self._last_error = None
        self._attempts_ok += 1
        self._conn = conn
        self._opts = opts
        self._sftp = self._sftp_conn = None
        return conn

    def _connection_lost(self, conn: asyncssh.SSHClientConnection | None,
                         exc: Exception | None) -> None:
        """asyncssh callback: a connection closed. Start reconnecting if it was ours."""
        if conn is None or conn is not self._conn:
            return  # a failed attempt, or one we already replaced or closed
        self._conn = None
        self._sftp = self._sftp_conn = None
        if self._closed:
            return
        reason = self._describe(exc) if exc else "the host closed the connection"
        self._set_status(HostState.RECONNECTING, reason)
        if not self._reconnecting():
            self._reconnect_task = asyncio.get_running_loop().create_task(
                self._reconnect_loop(), name=f"ssh-reconnect-{self.name}")

    async def _reconnect_loop(self) -> None:
        """Dial until connected (or closed), with capped exponential backoff."""
        delay = self.backoff_initial
        failures = 0
        while not self._closed:
            try:
                async with self._lock:
                    conn = self._conn or await self._attempt()
            except HostUnreachable as exc:
                failures += 1
                if failures >= self.unreachable_after or isinstance(exc, HostKeyRejected):
                    self._set_status(HostState.UNREACHABLE, exc.reason)
            except Exception as exc:  # noqa: BLE001 - a bug must not end the retries
                failures += 1
                self._set_status(HostState.UNREACHABLE, f"reconnect failed: {exc!r}")
            else:
                if self._conn is conn:
                    self._set_status(HostState.CONNECTED)
                self._notify_attempt()
                return
            self._notify_attempt()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff_max)

    def _notify_attempt(self) -> None:
        done, self._attempt_done = self._attempt_done, asyncio.Event()
        done.set()

    async def _wait_reconnected(self) -> asyncssh.SSHClientConnection:
        """Wait for the background reconnect, up to :attr:`reconnect_wait` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reconnect_wait
        while True:
            if self._conn is not None:
                return self._conn
            if self._closed:
                raise HostUnreachable(self.name, "the connection was closed")
            if not self._reconnecting():
                await self.connect()
                assert self._conn is not None
                return self._conn
            remaining = deadline - loop.time()
            attempt = self._attempt_done
            try:
                if remaining <= 0:
                    raise asyncio.TimeoutError
                await asyncio.wait_for(attempt.wait(), remaining)
            except asyncio.TimeoutError:
                raise HostUnreachable(
                    self.name, f"{self._status.state.value}: {self._status.reason}",
                    hint=f"specdeck keeps reconnecting to {self._where} in the background"
                ) from None
            if self._conn is None and self._status.state is HostState.UNREACHABLE:
                raise HostUnreachable(
                    self.name, self._status.reason,
                    hint=f"specdeck keeps reconnecting to {self._where} in the background")

    async def _connection(self) -> asyncssh.SSHClientConnection:
        """The live connection: connect on first use, wait while reconnecting."""
        conn = self._conn
        if conn is not None:
            return conn
        if self._closed:
            raise HostUnreachable(self.name, "the connection was closed (close() was called)")
        if self._reconnecting():
            return await self._wait_reconnected()
        await self.connect()
        assert self._conn is not None
        return self._conn

    # -- error messages ------------------------------------------------------------------
    def _describe(self, exc: BaseException) -> str:
        """A one-line reason for a failed connection attempt or a dropped connection."""
        where = self._where
        if isinstance(exc, ConnectionRefusedError):
            return f"connection refused by {where}"
        if isinstance(exc, asyncio.TimeoutError):
            return f"no answer from {where} within {self.connect_timeout:g} s"
        if isinstance(exc, socket.gaierror):
            return f"cannot resolve the host name of {where}: {exc.strerror}"
        if isinstance(exc, asyncssh.PermissionDenied):
            return f"authentication failed for {where} (permission denied)"
        if isinstance(exc, asyncssh.ConnectionLost):
            return f"connection to {where} lost: {exc.reason}"
        if isinstance(exc, asyncssh.Error):
            return f"{where}: {exc.reason}"
        if isinstance(exc, OSError) and exc.strerror:
            return f"{where}: {exc.strerror}"
        return f"{where}: {exc}"

    async def _jump_failure(self, jump: str, desc: str, hint: str | None
                            ) -> tuple[str, str | None]:
        """Say which hop of a ProxyJump failed: dial the first jump host on its own."""
        first = jump.split(",")[0].strip()
        try:
            host, port, user = parse_target(first.removeprefix("ssh://"))
            conn = await asyncio.wait_for(
                asyncssh.connect(host, port=port or (), username=user or ()),
                self.connect_timeout)
        except (OSError, asyncssh.Error, asyncio.TimeoutError, ValueError, InvalidInput) as e:
            why = (e.reason if isinstance(e, asyncssh.Error) else
                   "no answer" if isinstance(e, asyncio.TimeoutError) else
                   getattr(e, "strerror", None) or str(e) or type(e).__name__)
            return (f"the jump host {first} (ProxyJump of {self.target}) failed: {why}",
                    f"is {first} up? try `{ssh_command(first)}`")
        conn.close()
        return (f"{desc} (through the jump host {first}, which answered: the hop from it "
                f"failed)", hint)

    def _hint(self, exc: BaseException) -> str | None:
        if isinstance(exc, asyncssh.PermissionDenied):
            return (f"check the key: IdentityFile in ~/.ssh/config, `ssh-add -l` for the "
                    f"agent, and authorized_keys on the host; `{ssh_command(self.target)}` should "
                    f"log in without a password")
        if isinstance(exc, (ConnectionRefusedError, asyncio.TimeoutError, socket.gaierror)):
            return f"is the host up and sshd running? try `{ssh_command(self.target)}`"
        return None

    def _known_hosts_files(self, opts) -> list[str]:
        configured = getattr(opts, "known_hosts", None) if opts is not None else None
        if isinstance(configured, (list, tuple)) and configured:
            return [str(p) for p in configured if isinstance(p, (str, os.PathLike))]
        return [str(Path("~", ".ssh", "known_hosts").expanduser())]

    def _host_key_error(self, opts, client: _Client | None,
                        exc: asyncssh.HostKeyNotVerifiable) -> HostKeyRejected:
        """Explain a rejected host key: unknown (how to trust it) or changed (refuse loudly)."""
        files = self._known_hosts_files(opts)
        if client is None or client.offered is None:
            return HostKeyRejected(self.name, f"host key for {self._where} not accepted: "
                                   f"{exc.reason}",
                                   hint=f"compare with known_hosts ({', '.join(files)})")
        host, addr, port, key = client.offered
        fp = key.get_fingerprint("sha256")
        alg = key.get_algorithm()
        match_port = port if port != 22 else None
        matches: list[tuple[str, int, asyncssh.SSHKey]] = []
        for path in files:
            try:
                lines = Path(path).expanduser().read_text().splitlines()
            except OSError:
                continue
            for lineno, line in enumerate(lines, 1):
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                try:
                    keys = asyncssh.import_known_hosts(line).match(host, addr, match_port)[0]
                except (ValueError, asyncssh.KeyImportError):
                    continue
                matches.extend((path, lineno, k) for k in keys)
        label = self.target if self.target == self._where else f"{self.target} ({self._where})"
        keytype = alg.removeprefix("ssh-").split("-")[0]
        known = _tilde(files[0])
        scan = "ssh-keyscan -t " + keytype + (f" -p {port}" if port != 22 else "")
        scan += f" {shlex.quote(host)} >> {known}"
        if matches:
            path, lineno, old = matches[0]
            entry = shlex.quote(host if port == 22 else f"[{host}]:{port}")
            return HostKeyRejected(
                self.name,
                f"host key for {label} CHANGED: the host offered {alg} {fp}, but "
                f"{_tilde(path)}:{lineno} holds {old.get_algorithm()} "
                f"{old.get_fingerprint('sha256')}. This is a possible man-in-the-middle "
                f"attack; specdeck refuses to connect",
                hint=f"if the change is expected (host reinstalled, new key), remove the old "
                     f"line from {_tilde(path)}:{lineno} (`ssh-keygen -R {entry} -f "
                     f"{_tilde(path)}`), check the new fingerprint {fp} with the host's "
                     f"admin, then run `{scan}`")
        return HostKeyRejected(
            self.name,
            f"host key for {label} is unknown: the host offered {alg} key {fp}, "
            f"which is not in {', '.join(_tilde(f) for f in files)}",
            hint=f"check that fingerprint with the host's admin (on the host: `ssh-keygen -lf "
                 f"/etc/ssh/ssh_host_{keytype}_key.pub`), then trust it with `{scan}`, or run "
                 f"`{ssh_command(self.target)}` once and answer yes")

    def _lost(self, what: str, exc: BaseException) -> HostUnreachable:
        """The error for an operation whose connection failed under it."""
        reason = exc.reason if isinstance(exc, asyncssh.Error) else str(exc) or repr(exc)
        return HostUnreachable(self.name, f"{what}: connection to {self._where} failed: "
                               f"{reason}")

    @contextlib.contextmanager
    def _translate(self, what: str, path: str | None = None):
        """Map asyncssh errors: file errors to OSError, transport ones to HostUnreachable."""
        try:
            yield
        except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPNoSuchPath) as exc:
            raise FileNotFoundError(errno.ENOENT, f"{exc.reason} (on {self.name})",
                                    path) from None
        except asyncssh.SFTPPermissionDenied as exc:
            raise PermissionError(errno.EACCES, f"{exc.reason} (on {self.name})",
                                  path) from None
        except (asyncssh.SFTPConnectionLost, asyncssh.SFTPNoConnection) as exc:
            raise self._lost(what, exc) from None
        except asyncssh.SFTPError as exc:
            raise OSError(errno.EIO, f"{what} failed on {self.name}: {exc.reason}",
                          path) from None
        except (asyncssh.Error, ConnectionError, EOFError) as exc:
            raise self._lost(what, exc) from None

    # -- commands ------------------------------------------------------------------------
    def _shell(self, command: str, cwd: str | None, env: Mapping[str, str] | None
               ) -> tuple[str, bytes]:
        """The remote shell text (cd into the created cwd, read env, run command) and the
        bytes to send first on its stdin.

        Environment values never appear in the command text: sshd passes that text to the
        login shell as ``-c`` argument, visible to every user of the host in ``ps``. The
        ``export`` lines travel on stdin instead; ``head -c`` reads exactly their length, so
        the command's own input (``input=``) follows untouched.
        """
        wd = shlex.quote(self.path(cwd or "."))
        lines = [f"mkdir -p -- {wd} && cd {wd} || exit"]
        exports = []
        for key, value in {**self.env, **(env or {})}.items():
            if not _ENV_NAME.match(key):
                raise InvalidInput(f"environment variable name {key!r} is not valid")
            exports.append(f"export {key}={shlex.quote(str(value))}\n")
        head = "".join(exports).encode()
        if head:
            lines.append(f"__specdeck_env=$(head -c {len(head)}) && eval \"$__specdeck_env\" "
                         "|| exit 125; unset __specdeck_env")
        lines.append(command)
        return "\n".join(lines), head

    async def run(self, command: str | Sequence[str], *, check: bool = False,
                  timeout: float | None = None, input: bytes | None = None,
                  cwd: str | None = None, env: Mapping[str, str] | None = None) -> CommandResult:
        """Run a command in the remote login shell and wait for it.

        The command runs in ``cwd`` (default: the workdir, created if missing) with ``env``
        exported on top of the host's; see :meth:`Host.run` for the arguments.

        Raises:
            RemoteCommandFailed: ``check`` is set and the command exited non-zero.
            TimeoutError: ``timeout`` passed; the command's process group was killed.
            HostUnreachable: the connection failed before the command finished.
        """
        cmd = to_command(command)
        await self._connection()  # the workdir may start with ~: home is known once connected
        full, head = self._shell(cmd, cwd, env)
        res = await self._exec(full, display=cmd, input=head + (input or b"") if head else input,
                               timeout=timeout)
        return res.check() if check else res

    async def _exec(self, full: str, *, display: str, input: bytes | None = None,
                    timeout: float | None = None) -> CommandResult:
        """Run ``full`` (already quoted shell text) on its own channel.

        The shell first reports its PID (see the module docstring) so that a timeout or a
        cancellation can kill the command's whole process group.
        """
        async with self._slots:
            conn = await self._connection()
            pgid: list[int] = []
            with self._translate(f"running `{display}`"):
                proc = await self._open_process(conn, _PID_PRINTF + full)
                try:
                    if input:
                        proc.stdin.write(input)
                    proc.stdin.write_eof()
                    out, err = await asyncio.wait_for(self._communicate(proc, pgid), timeout)
                except asyncio.TimeoutError:
                    await self._kill(conn, proc, pgid)
                    raise TimeoutError(f"host {self.name!r}: `{display}` timed out after "
                                       f"{timeout:g} s and was killed") from None
                except asyncio.CancelledError:
                    task = asyncio.get_running_loop().create_task(self._kill(conn, proc, pgid))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
                    raise
        return self._result(proc, display, out, err)

    @staticmethod
    async def _communicate(proc: asyncssh.SSHClientProcess, pgid: list[int]
                           ) -> tuple[bytes, bytes]:
        """Read the PID marker off stderr (into ``pgid``), then all output until exit."""
        try:
            head = await proc.stderr.readuntil(_PID_END)
        except asyncio.IncompleteReadError as exc:
            head = exc.partial
        start = head.rfind(_PID_START)
        if start >= 0 and head.endswith(_PID_END):
            pgid.append(int(head[start + len(_PID_START):-len(_PID_END)]))
            head = head[:start]  # whatever a login script printed before the marker
        out, err = await proc.communicate()
        return out, head + err

    async def _kill(self, conn: asyncssh.SSHClientConnection,
                    proc: asyncssh.SSHClientProcess, pgid: list[int]) -> None:
        """SIGKILL the command's process group, then close its channel."""
        with contextlib.suppress(OSError, asyncssh.Error):
            proc.send_signal("KILL")  # enough where sshd honours it (non-root logins)
        if pgid:
            # A channel of its own, outside max_channels: the caller may hold the last slot.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.run(f"kill -KILL -- -{pgid[0]}",
                                                stdin=asyncssh.DEVNULL), 5.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait_closed(), 2.0)
        proc.close()

    def _result(self, proc: asyncssh.SSHClientProcess, display: str, out: bytes,
                err: bytes) -> CommandResult:
        status, sig = proc.exit_status, proc.exit_signal
        if sig:
            status = None
        elif status is None:
            # The channel closed without an exit status: the connection went away.
            raise HostUnreachable(self.name, f"connection to {self._where} lost while "
                                  f"running `{display}`")
        return CommandResult(self.name, display, status, out.decode("utf-8", "replace"),
                             err.decode("utf-8", "replace"),
                             signal=sig[0] if sig else None)

    async def _open_process(self, conn: asyncssh.SSHClientConnection,
                            full: str) -> asyncssh.SSHClientProcess:
        """Open a channel running ``full``, retrying while sshd is at its MaxSessions.

        OpenSSH frees a session slot a little after the channel's close is exchanged (once
        it has reaped the child), so a burst of short commands can briefly find every slot
        taken ("open failed").
        """
        delay = 0.02
        for _ in range(12):  # about 5 s in all
            try:
                return await conn.create_process(full, encoding=None)
            except asyncssh.ChannelOpenError as exc:
                if exc.code not in _SESSION_FULL_CODES:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        raise HostUnreachable(self.name, f"{self._where} refuses new sessions on the "
                              f"connection", hint="is MaxSessions in the host's sshd_config "
                              f"below {self.max_channels + 2}?")

    # -- files ---------------------------------------------------------------------------
    async def _sftp_client(self) -> asyncssh.SFTPClient:
        conn = await self._connection()
        if self._sftp is not None and self._sftp_conn is conn:
            return self._sftp
        async with self._sftp_lock:
            if self._sftp is None or self._sftp_conn is not conn:
                with self._translate("opening SFTP"):
                    self._sftp = await conn.start_sftp_client()
                self._sftp_conn = conn
            return self._sftp

    async def read_file(self, path: str) -> bytes:
        sftp = await self._sftp_client()
        p = self.path(path)
        with self._translate(f"reading {p}", p):
            async with sftp.open(p, "rb") as f:
                return await f.read()

    async def write_file(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        """Write atomically: a temporary file beside ``path``, fsynced, renamed over it."""
        sftp = await self._sftp_client()
        p = self.path(path)
        tmp = f"{p}.tmp.{secrets.token_hex(4)}"
        with self._translate(f"writing {p}", p):
            try:
                f = await sftp.open(tmp, "wb")
            except asyncssh.SFTPNoSuchFile:
                await self.makedirs(posixpath.dirname(p))
                f = await sftp.open(tmp, "wb")
            try:
                try:
                    await f.write(data)
                    with contextlib.suppress(asyncssh.SFTPOpUnsupported):
                        await f.fsync()
                finally:
                    await f.close()
                if mode is not None:
                    await sftp.chmod(tmp, mode)
                await sftp.posix_rename(tmp, p)
            except BaseException:
                with contextlib.suppress(Exception):
                    await sftp.remove(tmp)
                raise

    async def stat(self, path: str) -> FileStat | None:
        """Size, mtime (whole seconds: SFTP v3) and kind, or None when missing."""
        return await self._stat(path, follow=True)

    async def lstat(self, path: str) -> FileStat | None:
        """Like :meth:`stat`, but a symbolic link is reported as one (never followed)."""
        return await self._stat(path, follow=False)

    async def _stat(self, path: str, *, follow: bool) -> FileStat | None:
        sftp = await self._sftp_client()
        p = self.path(path)
        with self._translate(f"stat {p}", p):
            try:
                attrs = await (sftp.stat if follow else sftp.lstat)(p)
            except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPNoSuchPath):
                return None
        mode = attrs.permissions or 0
        return FileStat(p, attrs.size or 0, float(attrs.mtime or 0), _stat.S_ISDIR(mode),
                        is_link=_stat.S_ISLNK(mode))

    async def listdir(self, path: str) -> list[str]:
        sftp = await self._sftp_client()
        p = self.path(path)
        with self._translate(f"listing {p}", p):
            names = await sftp.listdir(p)
        return sorted(n for n in names if n not in (".", ".."))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file (nothing if missing), or with ``recursive`` a whole tree."""
        await self._connection()
        p = self.path(path)
        if recursive:
            res = await self._exec(f"rm -rf -- {shlex.quote(p)}", display=f"rm -rf {p}")
            if not res.ok:
                raise OSError(errno.EIO, f"rm -rf failed on {self.name}: "
                              f"{res.stderr.strip()}", p)
            return
        sftp = await self._sftp_client()
        with self._translate(f"removing {p}", p):
            try:
                await sftp.remove(p)
            except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPNoSuchPath):
                pass

    async def makedirs(self, path: str) -> None:
        # One `mkdir -p` round trip; SFTP would stat and mkdir each component in turn.
        await self._connection()
        p = self.path(path)
        res = await self._exec(f"mkdir -p -- {shlex.quote(p)}", display=f"mkdir -p {p}")
        if not res.ok:
            raise OSError(errno.EIO, f"mkdir -p failed on {self.name}: "
                          f"{res.stderr.strip()}", p)

    async def rename(self, src: str, dst: str) -> None:
        """Atomic rename (``posix-rename@openssh.com``: replaces ``dst``)."""
        sftp = await self._sftp_client()
        s, d = self.path(src), self.path(dst)
        with self._translate(f"renaming {s}", s):
            await sftp.posix_rename(s, d)

    async def read_from(self, path: str, offset: int, max_bytes: int) -> bytes:
        if max_bytes <= 0:
            return b""
        sftp = await self._sftp_client()
        p = self.path(path)
        with self._translate(f"reading {p}", p):
            try:
                async with sftp.open(p, "rb") as f:
                    # asyncssh reads big spans as parallel block requests and pads a block
                    # that came back short with zeros when a later one has data: on a file
                    # that grows meanwhile (a live log) that stored NULs in place of output.
                    # Read only what existed when we looked; those bytes do not change.
                    size = (await f.stat()).size
                    if size is None or size <= offset:
                        return b""
                    return await f.read(min(max_bytes, size - offset), offset)
            except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPNoSuchPath):
                return b""

    def _stream_error(self, status: int, what: str, path: str, stderr: bytes) -> OSError:
        """The OSError for a stream command (dd) that exited with ``status``."""
        return bulk.script_error(status, stderr, self.name, what, path)

    async def open_reader(self, path: str, offset: int = 0, *, chunk_size: int = 1 << 20,
                          length: int | None = None) -> AsyncIterator[bytes]:
        """Stream ``path`` from ``offset`` to its current end (or ``length`` bytes),
        ``chunk_size`` bytes at a time.

        Reads the binary stdout of a remote ``dd`` (1 MiB blocks; ``tail -c +N`` is three
        times slower, with 8 KiB writes), so SSH flow control paces the host to the consumer.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            HostUnreachable: the connection dropped mid-stream (never a silent short read).
        """
        await self._connection()
        p = self.path(path)
        full = bulk.dd_reader(p, offset, length)
        async with self._slots:
            conn = await self._connection()
            with self._translate(f"reading {p}", p):
                proc = await self._open_process(conn, full)
            finished = False
            try:
                proc.stdin.write_eof()
                eof = False
                while not eof:
                    with self._translate(f"reading {p}", p):
                        try:
                            chunk = await proc.stdout.readexactly(chunk_size)
                        except asyncio.IncompleteReadError as exc:
                            chunk, eof = exc.partial, True
                    if chunk:
                        yield chunk
                with self._translate(f"reading {p}", p):
                    await proc.wait_closed()
                finished = True
                status, sig = proc.exit_status, proc.exit_signal
                if sig or status is None:
                    # EOF without an exit status: the connection dropped, the data is short.
                    raise HostUnreachable(self.name, f"connection to {self._where} lost "
                                          f"while reading {p}")
                if status != 0:
                    raise self._stream_error(status, "reading", p, proc.collect_output()[1])
            finally:
                if not finished:
                    proc.close()  # consumer stopped early: dd dies of SIGPIPE

    async def open_writer(self, path: str, *, append: bool, offset: int | None = None
                          ) -> AsyncWriter:
        """A sink that feeds a remote ``dd`` (``conv=fsync``) creating or appending to ``path``
        (or writing at ``offset``); a symbolic link at ``path`` is refused.

        ``write`` returns once the data fits in the SSH window (backpressure); ``close``
        waits for ``dd`` and raises ``OSError`` with its stderr unless it exited 0.
        """
        await self._connection()
        p = self.path(path)
        full = bulk.dd_writer(p, append, offset)
        await self._slots.acquire()
        try:
            conn = await self._connection()
            with self._translate(f"writing {p}", p):
                proc = await self._open_process(conn, full)
        except BaseException:
            self._slots.release()
            raise
        return _DDWriter(self, proc, p)

    # -- bulk streams through the OpenSSH client ----------------------------------------
    def _openssh_command(self) -> tuple[list[str], str] | str:
        """The ``ssh`` argv (up to the destination) that reaches this host with the settings
        our connection used, and the cipher it asks for; or why there is none.

        Same config file, same known_hosts files with ``StrictHostKeyChecking=yes`` (an
        unknown or changed key fails, it is never added), the same identity files plus the
        agent, ``BatchMode`` (never a prompt). OpenSSH expands ``~`` from the password
        database, not ``$HOME``, so every path is passed expanded.
        """
        ssh = shutil.which("ssh")
        if ssh is None:
            return "no OpenSSH client (ssh) on this machine"
        opts = self._opts
        if opts is None:
            return "not connected"
        config = Path("~", ".ssh", "config").expanduser()
        known = [os.path.expanduser(str(p)) for p in self._known_hosts_files(opts)]
        keys = [os.path.expanduser(str(k)) for k in (opts.config.get("IdentityFile") or ())]
        if not keys:
            keys = [str(Path("~", ".ssh", n).expanduser())
                    for n in ("id_ed25519", "id_ecdsa", "id_rsa")]
        keys = [k for k in keys if os.path.exists(k)]
        paths = [str(config), *known, *keys]
        if any(re.search(r"[\s\"'\\]", p) for p in paths):
            return "a config, key or known_hosts path holds a space or a quote"
        argv = [ssh, "-F", str(config) if config.exists() else os.devnull,
                "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", "UserKnownHostsFile=" + (" ".join(known) or os.devnull),
                "-o", f"ConnectTimeout={max(1, int(self.connect_timeout))}",
                "-o", f"ServerAliveInterval={max(1, int(self.keepalive_interval))}",
                "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR",
                "-o", "ControlMaster=no", "-o", "ControlPath=none",
                "-o", "ForwardAgent=no", "-o", "ClearAllForwardings=yes", "-T"]
        cipher = "config's"
        if not opts.config.get("Ciphers"):
            argv += ["-o", "Ciphers=^" + _CIPHERS.lstrip("^")]
            cipher = "aes128-gcm"
        for k in keys:
            argv += ["-i", k]
        if self._t_port:
            argv += ["-p", str(self._t_port)]
        if self._t_user:
            argv += ["-l", self._t_user]
        return [*argv, "--", self._t_host], cipher

    @property
    def address(self) -> str:
        """The HostName our ssh config resolves this host to (the target before connecting)."""
        host = getattr(self._opts, "host", None) if self._opts is not None else None
        return str(host or self._t_host)

    async def bulk_ready(self) -> str | None:
        """None when the OpenSSH client can carry bulk streams here (as far as is known: the
        first data process proves its login, see :meth:`_bulk_process`), else why not."""
        await self._connection()
        if self._openssh is None and self._openssh_why is None:
            built = self._openssh_command()
            if isinstance(built, str):
                self._openssh_why = built
            else:
                self._openssh = built
        return self._openssh_why

    async def open_bulk(self, path: str, *, offset: int = 0, write: bool = False,
                        length: int | None = None) -> BulkStream | None:
        """An ``ssh`` client process running ``dd`` on the host (see :mod:`core.hosts.bulk`),
        or None when :meth:`bulk_ready` says the OpenSSH client cannot be used. A whole
        file read from its start is hashed on the host as it is sent (the console's CPU
        then only runs the ciphers, and its pump splices)."""
        if await self.bulk_ready() is not None:
            return None
        p = self.path(path)
        if write:
            script = bulk.READY_PRINTF + bulk.dd_writer(p, append=True)
        elif offset == 0:
            script = bulk.hashing_reader(p, length)
        else:
            script = bulk.READY_PRINTF + bulk.dd_reader(p, offset, length)
        return self._bulk_process(script, write=write, path=p, marked=True)

    def _bulk_process(self, script: str, *, write: bool, path: str,
                      marked: bool = False) -> BulkStream:
        assert self._openssh is not None
        argv, cipher = self._openssh
        what = "writing" if write else "reading"

        def on_exit(code: int, stderr: bytes) -> Exception | None:
            if code == 0:
                return None
            if code == 255 or code < 0:
                tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
                return HostUnreachable(self.name, f"connection to {self._where} lost while "
                                       f"{what} {path}" + (f": {tail[0]}" if tail else ""))
            return self._stream_error(code, what, path, stderr)

        def not_ready(code: int, stderr: bytes) -> str:
            # No login with our settings (no probe login first: the data process is the
            # probe). Later relays go straight to the asyncssh streams.
            tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [
                f"exit status {code}"]
            self._openssh_why = f"the ssh client did not log in ({tail[0]})"
            return f"{self.name}: {self._openssh_why}"

        return ProcessBulk([*argv, script if marked else bulk.READY_PRINTF + script],
                           write=write,
                           describe=f"openssh {cipher}", on_exit=on_exit,
                           ready_marker=bulk.READY, not_ready=not_ready,
                           ready_timeout=self.connect_timeout + 10)

    async def sha256(self, path: str) -> str:
        """The file's sha256, computed on the host (``sha256sum``)."""
        await self._connection()  # path() needs the remote home
        return await super().sha256(path)

    async def disk_free(self, path: str) -> int:
        """Free bytes for the user (``df -PB1``) on the nearest existing ancestor of ``path``."""
        await self._connection()
        p = self.path(path)
        full = (f"p={shlex.quote(p)}\n"
                'while [ ! -e "$p" ]; do p=$(dirname -- "$p"); done\n'
                'exec df -PB1 -- "$p"')
        out = (await self._exec(full, display=f"df -PB1 {p}")).check().stdout
        lines = out.strip().splitlines()
        # Filesystem 1-blocks Used Available Capacity Mounted-on: names may hold spaces,
        # so find the numbers in front of the capacity column.
        m = re.search(r"\s(\d+)\s+(\d+)\s+(\d+)\s+(?:\d+|-)%\s", lines[-1] + " ")
        if not m:
            raise OSError(errno.EIO, f"cannot parse df output on {self.name}: {out!r}", p)
        return int(m.group(3))
