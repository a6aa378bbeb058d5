"""The run capsule's wrapper and inspect scripts (core.capsules.jobs) in a real bash: a command
gone before the wrapper read its start time still reads as running, then ended, never lost."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from core.capsules import jobs


def _inspect(capsule: Path) -> str:
    script = jobs._INSPECT.format(d=str(capsule), notice=jobs.PREEMPT_NOTICE)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_command_reaped_before_its_start_was_read_is_running_then_ended(tmp_path):
    """Under load bash may reap a fast command before the wrapper reads its start time from
    /proc: the pid file then lacked a field, the next ones shifted, and inspect said ``lost``
    (a CI run saw ``echo after`` lost). A ``sed`` that answers nothing the first time stands
    in for the vanished /proc entry."""
    shim = tmp_path / "bin"
    shim.mkdir()
    real_sed = subprocess.run(["bash", "-c", "command -v sed"], capture_output=True, text=True,
                              check=True).stdout.strip()
    (shim / "sed").write_text(f"#!/bin/bash\nf={tmp_path}/first\n"
                              f"if [ ! -e \"$f\" ]; then : >\"$f\"; exit 0; fi\n"
                              f"exec {real_sed} \"$@\"\n")
    (shim / "sed").chmod(0o755)
    capsule = tmp_path / "cap"
    capsule.mkdir()
    gate = tmp_path / "gate"  # the command ends when the test says: no race with its checks
    (capsule / "cmd.sh").write_text(f"while [ ! -e {gate} ]; do sleep 0.05; done\n")
    (capsule / "wrapper.sh").write_text(jobs._WRAPPER)
    wrapper = subprocess.Popen(["bash", str(capsule / "wrapper.sh")],
                               env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"},
                               stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not (capsule / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    fields = (capsule / "pid").read_text().split()
    assert len(fields) == 5 and fields[1] == "0", fields  # the start unknown, nothing shifted
    assert _inspect(capsule) == f"running {fields[0]}"
    gate.touch()
    assert wrapper.wait(10) == 0
    assert _inspect(capsule) == "ended exit 0"
