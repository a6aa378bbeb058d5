"""Real sshd hosts on loopback for the benchmarks (the test fixtures' classes, outside pytest)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.sshd import SshClientHome, SshdServer, free_port, missing_tools  # noqa: E402


@contextlib.contextmanager
def sshd_hosts(n: int):
    """Start n trusted sshd servers (aliases sshd0..) with an isolated HOME; yield (servers, tmp)."""
    why = missing_tools()
    if why:
        sys.exit(f"bench needs OpenSSH: {why}")
    with tempfile.TemporaryDirectory(prefix="specdeck-bench-") as d:
        tmp = Path(d)
        old_home = os.environ.get("HOME")
        home = tmp / "home"
        home.mkdir()
        os.environ["HOME"] = str(home)
        os.environ.pop("SSH_AUTH_SOCK", None)
        client = SshClientHome(home)
        servers = []
        try:
            for i in range(n):
                addr = f"127.0.0.{2 + i}"
                s = SshdServer(address=addr, port=free_port(addr), root=tmp / f"sshd{i}",
                               alias=f"sshd{i}", authorized_key=client.public_key)
                s.start()
                client.add_alias(s.alias, hostname=addr, port=s.port, user=s.user)
                client.trust(s.known_hosts_line())
                servers.append(s)
            yield servers, tmp
        finally:
            for s in servers:
                s.stop()
            if old_home is not None:
                os.environ["HOME"] = old_home


def ssh_argv(tmp: Path, alias: str) -> list[str]:
    """An OpenSSH client command for ``alias`` that uses the isolated home (OpenSSH reads the
    passwd home, not $HOME, so config, known_hosts and key are named explicitly)."""
    home = tmp / "home" / ".ssh"
    return ["ssh", "-F", str(home / "config"), "-o", f"UserKnownHostsFile={home / 'known_hosts'}",
            "-i", str(home / "specdeck_test_ed25519"), "-o", "IdentitiesOnly=yes", alias]
