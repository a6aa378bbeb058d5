"""Autouse isolation: no test reads the developer's home, state or ssh config."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(autouse=True)
def _isolate(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.delenv("SPECDECK_STATE", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield


def run_cli(*args, cwd=None, env=None, timeout=120, input=None):
    """Run ``python -m console.cli`` (the real CLI) in a subprocess; returns CompletedProcess."""
    e = {**os.environ, **(env or {})}
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "console.cli", *map(str, args)], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=timeout, input=input)


def cli_until(state, *args, line: str) -> subprocess.Popen:
    """Start ``specdeck ARGS`` on the state file ``state`` in the background and read its
    stderr until a line holds ``line``; returns the process (still running)."""
    env = {**os.environ, "SPECDECK_STATE": str(state), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "console.cli", *map(str, args)], env=env,
                            stderr=subprocess.PIPE, text=True)
    for got in proc.stderr:
        if line in got:
            break
    return proc


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def slow_starts(monkeypatch):
    """Every detached launch waits (a slow host) until the test sets ``release`` (at most
    30 s): returns the event set when one begins, with its ``release`` event, so that a test
    acts while its run is still ``starting`` however loaded the machine is."""
    from core.capsules import jobs

    real = jobs.start
    launching = asyncio.Event()
    launching.release = asyncio.Event()

    async def slow_start(*a, **kw):
        launching.set()
        try:
            await asyncio.wait_for(launching.release.wait(), 30)
        except asyncio.TimeoutError:
            pass
        return await real(*a, **kw)

    monkeypatch.setattr(jobs, "start", slow_start)
    return launching


def procs_under(root) -> list[int]:
    """Processes whose working directory is under ``root`` (a local host's runs: counted to
    show that something was, or was not, launched)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(root)):
                out.append(int(pid))
        except OSError:
            continue
    return out
