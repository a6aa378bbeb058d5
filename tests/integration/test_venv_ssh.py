"""venv on a real sshd host: uv found or installed for the user, packages, check() done."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration
TORCH_WHEELS = Path("/opt/wheels")


def venv_plan(tmp_path: Path, alias: str, params: dict) -> Path:
    # This machine reaches the package index through a TLS proxy whose CA is in the local
    # environment; a real host would get the same line in its plan (see the venv hint).
    env = {k: os.environ[k] for k in ("SSL_CERT_FILE", "SSL_CERT_DIR") if k in os.environ}
    p = tmp_path / "v.yaml"
    p.write_text(json.dumps({
        "name": "venv", "hosts": {"ct129": {"ssh": alias, "workdir": str(tmp_path / "remote"),
                                            "env": env}},
        "items": [{"id": "venv", "content": "Set up venv on CT129 with uv",
                   "action": {"kind": "venv", "host": "ct129", "params": params}}]}))
    return p


def test_venv_with_uv_and_a_small_package_set(sshd, tmp_path):
    plan = venv_plan(tmp_path, sshd.alias, {"packages": ["six>=1.10"], "torch": "none",
                                            "install_self": False})
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "venv", env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "[venv] uv: uv " in res.stderr
    py = tmp_path / "remote" / ".venv" / "bin" / "python"
    out = subprocess.run([py, "-c", "import six; print(six.__version__)"], capture_output=True,
                         text=True, check=True).stdout
    from core.state.store import Store

    result = Store(tmp_path / "s.db").latest_run("venv").result
    assert result["versions"]["six"] == out.strip()
    # the venv satisfies the params: check() says done, nothing is reinstalled
    run_cli("mark", plan, "venv", "pending", env=env)
    res = run_cli("run", plan, "venv", env=env)
    assert res.returncode == 0 and "check: .venv has" in res.stderr


def test_unresolvable_package_fails_with_next_step(sshd, tmp_path):
    plan = venv_plan(tmp_path, sshd.alias, {"packages": ["specdeck-no-such-package-xyz==9.9"],
                                            "torch": "none", "install_self": False})
    res = run_cli("run", plan, "venv", env={"SPECDECK_STATE": str(tmp_path / "s.db")},
                  timeout=300)
    assert res.returncode == 1
    assert "does not resolve" in res.stderr and "params.packages" in res.stderr


@pytest.mark.slow
def test_venv_cpu_torch_and_specdeck_itself(sshd, tmp_path):
    wheels = sorted(TORCH_WHEELS.glob("torch-2.13.0+cpu-*.whl")) if TORCH_WHEELS.exists() else []
    if not wheels:
        pytest.skip("no torch 2.13.0 CPU wheel under /opt/wheels on this machine")
    plan = venv_plan(tmp_path, sshd.alias, {"torch": "cpu", "torch_version": "2.13.0+cpu",
                                            "torch_index": None,
                                            "find_links": [str(TORCH_WHEELS)]})
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "venv", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    py = tmp_path / "remote" / ".venv" / "bin" / "python"
    out = subprocess.run([py, "-c", "import torch, core.ml, transformers; print(torch.__version__)"],
                         capture_output=True, text=True, cwd="/", check=True).stdout
    assert out.strip() == "2.13.0+cpu"
