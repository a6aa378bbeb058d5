"""A stop gives a run that saves on SIGTERM the whole grace: the run's shell waits for its
command, so the run is recorded as ended when the command is, not when the shell gets the
signal (before, the shell died at once and the saving command was killed 10 s later as a
leftover: a checkpoint that takes longer to write was lost)."""

from __future__ import annotations

import sys

from tests.fault.conftest import cli, local_plan, maybe_rows, popen_cli, rows, wait_for

SAVE_S = 12
"""Longer than the 10 s a stop gives the leftovers of a run that has ended."""

SAVER = f"""import signal, sys, time
asked = []
signal.signal(signal.SIGTERM, lambda *a: asked.append(1))
open("ready", "w").close()
while not asked:
    time.sleep(0.1)
print("saving", flush=True)
time.sleep({SAVE_S})
open("saved", "w").write("checkpoint")
print("saved", flush=True)
sys.exit(0)
"""


def test_fault_a_stop_waits_for_a_command_that_saves_on_sigterm(tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "saver.py").write_text(SAVER)
    plan = local_plan(tmp_path, f"""  - id: train
    content: saves its checkpoint when asked to stop
    action: {{kind: shell, host: here, params: {{command: "{sys.executable} saver.py && echo after"}}}}
""")
    db = tmp_path / "s.db"
    p = popen_cli("--state", db, "run", plan, "train", "-q")
    wait_for(lambda: maybe_rows(db, "SELECT 1 FROM runs WHERE state = 'running'"), 60, "the run")
    wait_for((wd / "ready").exists, 60, "the command to be ready")
    res = cli("--state", db, "stop", plan, "train", "--yes", "--grace", "120", timeout=180)
    assert res.returncode == 0, res.stderr
    assert (wd / "saved").read_text() == "checkpoint"  # written before the stop returned
    p.wait(timeout=60)
    assert rows(db, "SELECT state FROM runs") == [("stopped",)]
    log = cli("--state", db, "logs", plan, "train").stdout
    assert log.splitlines() == ["saving", "saved"]  # `&& echo after` never ran: the shell left with the stop
