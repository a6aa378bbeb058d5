"""Fixtures for integration tests against real OpenSSH servers on 127.0.0.x.

* ``ssh_home``: an isolated ``$HOME`` (so the developer's ``~/.ssh`` is never read) with a
  client key, an empty ``config`` and ``known_hosts``; ``SSH_AUTH_SOCK`` is unset.
* ``sshd_factory``: ``sshd_factory(n)`` starts ``n`` servers on 127.0.0.2, 127.0.0.3, ...
  (free ports, own host keys), adds a ``Host sshdN`` alias for each to ``~/.ssh/config``
  and, unless ``trust=False``, their keys to ``~/.ssh/known_hosts``. All are stopped by PID
  at teardown.
* ``sshd``: one such server; ``ssh_host``: a connected ``SSHHost`` through its alias.
* ``ssh_agent``: a private ssh-agent exported as ``SSH_AUTH_SOCK``.

The tests skip, saying why, where ``/usr/sbin/sshd`` is missing (CI installs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tests.integration.slurm import SlurmCluster, missing
from tests.shared import build_once
from tests.integration.sshd import (
    SshAgent,
    SshClientHome,
    SshdServer,
    free_port,
    missing_tools,
)


@pytest.fixture(scope="session")
def sshd_available() -> None:
    """Skip unless OpenSSH's sshd and ssh-keygen are installed."""
    reason = missing_tools()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def ssh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SshClientHome:
    """An isolated $HOME with ~/.ssh (client key, config, known_hosts); no ssh-agent."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return SshClientHome(home)


@pytest.fixture
def sshd_factory(sshd_available, ssh_home: SshClientHome, tmp_path: Path
                 ) -> Callable[..., list[SshdServer]]:
    """``make(n=1, *, trust=True, path_first=None)``: start n more sshd servers, each with a
    config alias (``path_first``: a directory first on their sessions' PATH)."""
    servers: list[SshdServer] = []

    def make(n: int = 1, *, trust: bool = True, path_first: Path | None = None
             ) -> list[SshdServer]:
        out = []
        for _ in range(n):
            i = len(servers)
            address = f"127.0.0.{2 + i}"
            alias = f"sshd{i}"
            server = SshdServer(address=address, port=free_port(address),
                                root=tmp_path / f"sshd-{i}", alias=alias,
                                authorized_key=ssh_home.public_key, path_first=path_first)
            servers.append(server)
            server.start()
            ssh_home.add_alias(alias, hostname=address, port=server.port, user=server.user)
            if trust:
                ssh_home.trust(server.known_hosts_line())
            out.append(server)
        return out

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def ssh_agent(sshd_available, ssh_home: SshClientHome, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> SshAgent:
    """A private ssh-agent, exported as SSH_AUTH_SOCK for the test."""
    agent = SshAgent(tmp_path / "agent.sock")
    agent.start()
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent.socket))
    yield agent
    agent.stop()


@pytest.fixture
def sshd(sshd_factory) -> SshdServer:
    """One running, trusted sshd reachable as the alias ``sshd0``."""
    return sshd_factory(1)[0]


@pytest.fixture
async def ssh_host(sshd: SshdServer, tmp_path: Path):
    """An SSHHost connected through the ``sshd0`` alias, workdir under tmp_path."""
    from core.hosts.ssh import SSHHost

    host = SSHHost("remote", target=sshd.alias, workdir=str(tmp_path / "remote-wd"),
                   env={"SPECDECK_HOST_VAR": "from host"}, connect_timeout=5.0)
    await host.connect()
    yield host
    await host.close()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """A tiny random Qwen3 target, drafter and prompts on disk (``python -m core.ml.tiny``),
    built once per test run and shared read-only (tests copy what they change)."""
    import subprocess
    import sys

    def build(root: Path) -> None:
        subprocess.run([sys.executable, "-m", "core.ml.tiny", str(root), "--fit-steps", "0"],
                       check=True, capture_output=True, cwd=Path(__file__).resolve().parents[2])

    return build_once(tmp_path_factory, "tiny-models", build)


@pytest.fixture
def slurm(tmp_path):
    """A real single-node Slurm cluster for one test (skipped where Slurm is not installed)."""
    why = missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path / "slurm")
    cluster.start()
    yield cluster
    cluster.stop()
