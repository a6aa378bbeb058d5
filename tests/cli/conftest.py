"""The CLI tier: every command through the INSTALLED ``specdeck`` entry point (the console
script next to this interpreter, as ``pip install`` wrote it), never ``python -m``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SPECDECK = Path(sys.executable).parent / "specdeck"


def specdeck(*args, env=None, cwd=None, timeout=120, input=None) -> subprocess.CompletedProcess:
    """Run the installed ``specdeck`` with ``args``; returns the CompletedProcess (text)."""
    if not SPECDECK.is_file():
        pytest.fail(f"{SPECDECK}: no installed specdeck entry point; `pip install -e .` first")
    e = {**os.environ, **(env or {})}
    e.pop("PYTHONPATH", None)  # what is installed, not this checkout by path
    return subprocess.run([str(SPECDECK), *map(str, args)], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=timeout, input=input)


def spawn(*args, env=None) -> subprocess.Popen:
    """Start the installed ``specdeck`` in the background, stderr readable line by line."""
    e = {**os.environ, **(env or {})}
    e.pop("PYTHONPATH", None)
    return subprocess.Popen([str(SPECDECK), *map(str, args)], env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_line(proc: subprocess.Popen, text: str) -> list[str]:
    """Read ``proc``'s stderr until a line contains ``text``; the lines read."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"{text!r} never came; stderr was:\n{''.join(seen)}")


PLAN = """name: cli
hosts:
  here: {{local: true, workdir: {wd}}}
items:
  - id: hello
    content: say hello
    action: {{kind: shell, host: here, params: {{command: "echo hello from specdeck"}}}}
  - id: after
    content: after hello
    needs: [hello]
    action: {{kind: shell, host: here, params: {{command: "echo after"}}}}
  - id: long
    content: a run that takes a while
    action: {{kind: shell, host: here, params: {{command: "echo up; sleep {long}; echo down"}}}}
  - id: train
    content: a trainer started by hand, then adopted
    action: {{kind: shell, host: here, params: {{command: "true"}}}}
  - id: review
    content: read the results and decide
    priority: high
"""


@pytest.fixture
def plan(tmp_path, monkeypatch) -> Path:
    """A plan on the local host, its state in ``tmp_path/state.db`` ($SPECDECK_STATE)."""
    p = tmp_path / "plan.yaml"
    p.write_text(PLAN.format(wd=tmp_path / "wd", long=30))
    monkeypatch.setenv("SPECDECK_STATE", str(tmp_path / "state.db"))
    return p
