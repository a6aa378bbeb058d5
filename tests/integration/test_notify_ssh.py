"""Notifications from a real sshd host: a run that fails there is told once by its capsule, with
no specdeck running, at a JSON webhook on 127.0.0.1; the URL reaches the host through a 0600
file (the command's stdin), never an argv; reattaching sends nothing again."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.unit.test_notify import SECRET, cmdlines_with, env_for, no_secret_in_files
from tests.webhook import Webhook, wait_for

pytestmark = pytest.mark.integration


def test_a_run_failing_on_an_ssh_host_is_told_once_from_there(sshd, tmp_path):
    plan = tmp_path / "n.yaml"
    plan.write_text(json.dumps({
        "name": "nssh", "notify": ["failed"],
        "hosts": {"gpu": {"ssh": sshd.alias, "workdir": str(tmp_path / "remote"),
                          "python": sys.executable, "env": {"PYTHONPATH": str(ROOT)}}},
        "items": [{"id": "job", "content": "a remote job that fails",
                   "action": {"kind": "shell", "host": "gpu",
                              "params": {"command": "env; sleep 1; exit 4"}}}]}))
    hook = Webhook()
    try:
        state = tmp_path / "s.db"
        env = env_for(hook.port, state)
        res = run_cli("run", plan, "job", "--detach", env=env, timeout=120)
        assert res.returncode == 0, res.stderr
        leaks: list[str] = []
        wait_for(lambda: hook.got, 30, "the host's message",
                 every=lambda: leaks.extend(cmdlines_with(SECRET)))
        assert leaks == []
        res = run_cli("attach", plan, env=env, timeout=120)
        time.sleep(1.0)
        assert len(hook.got) == 1
        msg = hook.got[0][1]["title"] + " " + hook.got[0][1]["message"]
        for word in ("nssh", "job", "gpu", "exit 4", "failed"):
            assert word in msg, (word, msg)
        cap = next((tmp_path / "remote" / ".specdeck" / "runs").iterdir())
        assert (cap / "notify.url").stat().st_mode & 0o777 == 0o600
        db = sqlite3.connect(state)
        assert db.execute("select state, by from notifications").fetchall() == [("sent", "gpu")]
        assert db.execute("select state, exit_code from runs").fetchall() == [("failed", 4)]
        db.close()
        no_secret_in_files(plan, tmp_path / "remote", *Path(tmp_path).glob("s.db*"))
    finally:
        hook.close()
