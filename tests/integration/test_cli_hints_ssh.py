"""Connection failures name the hop that failed and print ssh commands OpenSSH accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.sshd import free_port

pytestmark = pytest.mark.integration


def _plan(tmp_path: Path, target: str) -> Path:
    p = tmp_path / "h.yaml"
    p.write_text(json.dumps({
        "name": "h", "hosts": {"gpu": {"ssh": target, "workdir": str(tmp_path / "r")}},
        "items": [{"id": "job", "content": "x", "action": {
            "kind": "shell", "host": "gpu", "params": {"command": "echo hi"}}}]}))
    return p


def test_dead_jump_host_is_named(sshd_factory, ssh_home, tmp_path):
    (target,) = sshd_factory(1)
    dead = free_port("127.0.0.9")
    ssh_home.add_alias("deadjump", hostname="127.0.0.9", port=dead, user=target.user)
    ssh_home.add_alias("behind", hostname=target.address, port=target.port, user=target.user,
                       proxy_jump="deadjump")
    res = run_cli("run", _plan(tmp_path, "behind"), "job", timeout=60)
    assert res.returncode == 3, res.stderr
    assert "the jump host deadjump (ProxyJump of behind) failed" in res.stderr
    assert "try `ssh deadjump`" in res.stderr


def test_live_jump_dead_target_says_the_hop_past_it_failed(sshd_factory, ssh_home, tmp_path):
    (jump,) = sshd_factory(1)
    dead = free_port("127.0.0.9")
    ssh_home.add_alias("behind", hostname="127.0.0.9", port=dead, user=jump.user,
                       proxy_jump=jump.alias)
    res = run_cli("run", _plan(tmp_path, "behind"), "job", timeout=60)
    assert res.returncode == 3, res.stderr
    assert f"through the jump host {jump.alias}, which answered" in res.stderr


def test_unreachable_user_host_port_hint_uses_dash_p(sshd_available, ssh_home, tmp_path):
    port = free_port("127.0.0.9")
    res = run_cli("run", _plan(tmp_path, f"me@127.0.0.9:{port}"), "job", timeout=60)
    assert res.returncode == 3, res.stderr
    assert f"`ssh -p {port} me@127.0.0.9`" in res.stderr
    assert f"ssh me@127.0.0.9:{port}" not in res.stderr
