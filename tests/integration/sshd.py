"""Real OpenSSH servers on loopback addresses, for integration tests.

Each :class:`SshdServer` is one ``/usr/sbin/sshd -D -e -f <config>`` process listening on
its own 127.0.0.x address and a free port, with its own host key and ``authorized_keys``
generated under a temporary directory. A test gets distinct "hosts" by starting several
(all of 127/8 is local on Linux), and simulates a host going down and coming back with
:meth:`SshdServer.stop` / :meth:`SshdServer.start`, which reuse the same address, port and
host key so that a client's known_hosts entry stays valid across the restart.

:class:`SshClientHome` is the client side: an isolated ``$HOME`` whose ``~/.ssh`` holds a
client key under a non-default name, a ``config`` with one alias per server (HostName,
Port, User, IdentityFile, ProxyJump none) and a ``known_hosts``. Nothing here imports
asyncssh: keys come from ``ssh-keygen``, so the only importer of asyncssh stays
``core.hosts.ssh``.

Processes are stopped by PID: the listener and every process below it (sshd forks a
privileged monitor per connection, which outlives the listener unless killed too), so a
stopped server really drops its clients' connections, as a rebooted host would.
"""

from __future__ import annotations

import functools
import getpass
import os
import shutil
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.tiers import ONE_THREAD

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
SSH_AGENT = shutil.which("ssh-agent") or "/usr/bin/ssh-agent"
SSH_ADD = shutil.which("ssh-add") or "/usr/bin/ssh-add"
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The PATH after a ``path_first`` directory (sshd's own default, root's included)."""


def missing_tools() -> str | None:
    """Why real-sshd tests cannot run here, or None when they can."""
    if not os.path.exists(SSHD):
        return f"{SSHD} not found (apt-get install openssh-server openssh-client)"
    if not os.path.exists(SSH_KEYGEN):
        return "ssh-keygen not found (apt-get install openssh-client)"
    if os.geteuid() == 0:
        # sshd's privilege separation needs this directory; create it as apt's unit would.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    elif not os.path.isdir("/run/sshd"):
        return "/run/sshd is missing and only root can create it"
    return None


def keygen(path: Path, comment: str = "specdeck-test") -> Path:
    """Create an unencrypted ed25519 key pair at ``path`` (+ ``.pub``), replacing any."""
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)
    path.chmod(0o600)
    return path


def fingerprint(pub_path: Path) -> str:
    """The key's ``SHA256:...`` fingerprint, as ``ssh-keygen -l`` prints it."""
    out = subprocess.run([SSH_KEYGEN, "-l", "-E", "sha256", "-f", str(pub_path)],
                         check=True, capture_output=True, text=True).stdout
    return out.split()[1]


def free_port(address: str) -> int:
    """A TCP port that is free on ``address`` right now."""
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@functools.cache
def _supports_option(line: str) -> bool:
    """Whether this sshd accepts a config line (options come and go between versions)."""
    res = subprocess.run([SSHD, "-T", "-f", "/dev/null", "-o", line],
                         capture_output=True, text=True)
    return "Bad configuration option" not in res.stderr and "Unsupported option" not in res.stderr


def descendants(pid: int) -> list[int]:
    """PIDs below ``pid`` in the process tree (read from /proc), children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name (field 2) may contain spaces and parentheses: split after it.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class SshdServer:
    """One OpenSSH server on ``address:port``.

    Args:
        address: A loopback address (127.0.0.2, 127.0.0.3, ...).
        port: The TCP port (kept across restarts).
        root: Directory for its config, host key, authorized_keys and log.
        alias: The ``Host`` alias a client config uses for it.
        authorized_key: The client's public key line.
        user: The login user (the one running the tests).
        path_first: A directory put first on the sessions' PATH (a fake tool the host
            should seem to have, such as tests/fakegpu.py's ``nvidia-smi``); None: sshd's
            own PATH.
    """

    address: str
    port: int
    root: Path
    alias: str
    authorized_key: str
    user: str = field(default_factory=getpass.getuser)
    path_first: Path | None = None
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _log_lines: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.host_key_path.exists():
            keygen(self.host_key_path, comment=f"host-{self.alias}")
        self.remote_home.mkdir(exist_ok=True)
        self.authorized_keys.write_text(self.authorized_key.strip() + "\n")
        self.write_config()

    # -- files ---------------------------------------------------------------------------
    @property
    def host_key_path(self) -> Path:
        return self.root / "host_ed25519"

    @property
    def host_pub_path(self) -> Path:
        return self.root / "host_ed25519.pub"

    @property
    def remote_home(self) -> Path:
        """$HOME of the sessions this server starts (the login user's home on the "host")."""
        return self.root / "home"

    @property
    def authorized_keys(self) -> Path:
        return self.root / "authorized_keys"

    @property
    def config_path(self) -> Path:
        return self.root / "sshd_config"

    @property
    def log(self) -> str:
        """Everything sshd wrote to stderr so far (useful in failure messages)."""
        return "".join(self._log_lines)

    def write_config(self) -> None:
        lines = [
            f"ListenAddress {self.address}",
            f"Port {self.port}",
            f"HostKey {self.host_key_path}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            f"PidFile {self.root / 'sshd.pid'}",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "StrictModes no",
            "Subsystem sftp internal-sftp",
            # The session's $HOME is a fresh directory, so the remote shell never sources the
            # real user's ~/.bashrc (slow or blocking login scripts such as `pyenv init`), and
            # `~` on the "remote host" stays inside the test's temporary directory.
            # The test run's thread limits reach the "remote" processes too (tests/tiers.py).
            f"SetEnv HOME={self.remote_home}"
            + (f" PATH={self.path_first}:{STD_PATH}" if self.path_first else "")
            + "".join(f" {k}={os.environ[k]}" for k in ONE_THREAD if os.environ.get(k, "").isdigit()),
        ]
        # OpenSSH >= 9.8 throttles sources that fail often; tests fail on purpose.
        if _supports_option("PerSourcePenalties no"):
            lines.append("PerSourcePenalties no")
        self.config_path.write_text("\n".join(lines) + "\n")

    def host_key_line(self) -> str:
        """The server's public host key: ``ssh-ed25519 AAAA...`` (no comment)."""
        return " ".join(self.host_pub_path.read_text().split()[:2])

    def known_hosts_line(self) -> str:
        """The line ``ssh-keyscan -p PORT ADDRESS`` would print for this server."""
        host = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{host} {self.host_key_line()}"

    def fingerprint(self) -> str:
        return fingerprint(self.host_pub_path)

    def regenerate_host_key(self) -> None:
        """Give the server a new host key (takes effect at the next :meth:`start`)."""
        keygen(self.host_key_path, comment=f"host-{self.alias}-new")

    # -- process -------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        """Start sshd and return once it listens (it says so on stderr)."""
        if self.running:
            return
        listening = threading.Event()
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config_path)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

        def pump() -> None:
            # Drain stderr for the whole life of the process, so sshd never blocks on it.
            assert proc.stderr is not None
            for line in proc.stderr:
                self._log_lines.append(line)
                if "Server listening on" in line:
                    listening.set()
            listening.set()  # EOF: sshd exited; start() reports it

        threading.Thread(target=pump, name=f"sshd-log-{self.alias}", daemon=True).start()
        self._proc = proc
        if not listening.wait(timeout) or proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"sshd for {self.alias} did not start on "
                               f"{self.address}:{self.port}:\n{self.log}")

    def _signal_tree(self, sig: signal.Signals) -> None:
        assert self._proc is not None, "not running"
        for pid in [self._proc.pid] + descendants(self._proc.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def pause(self) -> None:
        """Freeze sshd and its sessions (SIGSTOP): connections stay open but go silent,
        as when a network drops without a reset or the host hangs."""
        self._signal_tree(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`pause` (SIGCONT)."""
        self._signal_tree(signal.SIGCONT)

    def stop(self) -> None:
        """Kill sshd and every session process below it, by PID, and wait for the listener."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        pids = [proc.pid] + descendants(proc.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


@dataclass
class SshClientHome:
    """An isolated ``$HOME`` with ``~/.ssh/{config,known_hosts}`` and a client key.

    The key has a non-default name (``~/.ssh/specdeck_test_ed25519``), so a connection that
    succeeds proves that ``IdentityFile`` from the config was used.
    """

    home: Path

    def __post_init__(self) -> None:
        self.ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        keygen(self.identity, comment="specdeck-client")
        self.config_path.touch()
        self.known_hosts.touch()

    @property
    def ssh_dir(self) -> Path:
        return self.home / ".ssh"

    @property
    def identity(self) -> Path:
        return self.ssh_dir / "specdeck_test_ed25519"

    @property
    def public_key(self) -> str:
        return self.identity.with_name(self.identity.name + ".pub").read_text().strip()

    @property
    def config_path(self) -> Path:
        return self.ssh_dir / "config"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    def add_alias(self, alias: str, *, hostname: str, port: int, user: str,
                  identity: str | None = "~/.ssh/specdeck_test_ed25519",
                  proxy_jump: str = "none") -> None:
        """Append a ``Host alias`` block (HostName, Port, User, IdentityFile, ProxyJump).

        With ``identity=None`` the block names no key: only the agent's (or a default
        ``~/.ssh/id_*``) can log in.
        """
        key = f"    IdentityFile {identity}\n    IdentitiesOnly yes\n" if identity else ""
        with self.config_path.open("a") as f:
            f.write(f"Host {alias}\n"
                    f"    HostName {hostname}\n"
                    f"    Port {port}\n"
                    f"    User {user}\n"
                    f"{key}"
                    f"    ProxyJump {proxy_jump}\n\n")

    def trust(self, line: str) -> int:
        """Append a known_hosts line; returns its line number (1-based)."""
        existing = self.known_hosts.read_text().splitlines()
        with self.known_hosts.open("a") as f:
            f.write(line.rstrip("\n") + "\n")
        return len(existing) + 1

    def forget_all(self) -> None:
        self.known_hosts.write_text("")


class SshAgent:
    """A private ``ssh-agent -D`` on a socket under a temporary directory, stopped by PID.

    Args:
        socket: Where the agent listens (becomes ``SSH_AUTH_SOCK``).
    """

    def __init__(self, socket: Path):
        self.socket = socket
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> None:
        self._proc = subprocess.Popen([SSH_AGENT, "-D", "-a", str(self.socket)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
        # It prints "SSH_AUTH_SOCK=...; export SSH_AUTH_SOCK;" once it listens.
        assert self._proc.stdout is not None
        ready = threading.Event()
        threading.Thread(target=lambda: (self._proc.stdout.readline(), ready.set()),
                         daemon=True).start()
        if not ready.wait(timeout) or not self.socket.exists():
            self.stop()
            raise RuntimeError("ssh-agent did not start")

    def add(self, key: Path) -> None:
        subprocess.run([SSH_ADD, "-q", str(key)], check=True, capture_output=True,
                       env={**os.environ, "SSH_AUTH_SOCK": str(self.socket)})

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
