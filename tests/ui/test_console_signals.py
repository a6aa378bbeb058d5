"""A console killed (SIGTERM) or losing its terminal (SIGHUP) leaves as ``q`` does: the close is
journaled (the next console's "meanwhile" starts from it), runs on hosts keep going, and the
exit status is the shell's for that signal. The real ``specdeck ui`` on a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT
from tests.fault.conftest import local_plan


def _plan(tmp_path):
    return local_plan(tmp_path, '  - id: a\n    content: a step\n    action: {kind: shell, '
                                'host: here, params: {command: "echo hi"}}\n', name="sig")


def _journal(state) -> list[str]:
    db = sqlite3.connect(state)
    try:
        return [k for (k,) in db.execute("SELECT kind FROM events ORDER BY id")]
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        db.close()


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_leaves_the_console_as_quit_does(tmp_path, sig, code):
    state = tmp_path / "s.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color",
           "COLUMNS": "120", "LINES": "40"}
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "console.cli", "ui", str(_plan(tmp_path)),
                             "--state", str(state)], stdin=slave, stdout=slave, stderr=slave,
                            env=env, start_new_session=True)
    os.close(slave)
    drain = threading.Thread(target=lambda: _drain(master), daemon=True)
    drain.start()  # the console's screen, read so it never blocks on a full terminal
    try:
        deadline = time.monotonic() + 60
        # journaled by on_ready's session worker, after on_mount put the signal handlers in place
        while "console_opened" not in _journal(state):
            assert proc.poll() is None and time.monotonic() < deadline, "the console did not open"
            time.sleep(0.2)
        proc.send_signal(sig)
        assert proc.wait(30) == code
        assert _journal(state)[-1] == "console_closed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def _drain(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return
