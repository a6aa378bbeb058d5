"""Class 1: an unexpected error (OS, library, host) ends the run failed with its message;
Ctrl-C / SIGTERM of the CLI exit 130 / 143 with one line; detached runs keep going, runs
inside specdeck (relay) are marked interrupted. Nothing stays starting or running."""

from __future__ import annotations

import signal

import pytest

from tests.fault.conftest import (cli, local_plan, maybe_rows, no_traceback, pid_alive, popen_cli,
                                  relay_plan, rows, wait_for)


def _live(db):
    return rows(db, "SELECT id, state FROM runs WHERE state IN ('starting', 'running')")


@pytest.mark.parametrize("cwd, words", [
    ("afile/sub", ("Not a directory", "afile")),
    ("x" * 300, ("File name too long",)),
])
def test_filesystem_fault_at_launch_fails_the_run_with_its_message(tmp_path, cwd, words):
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "afile").write_text("a file, not a directory")
    plan = local_plan(tmp_path, f"""  - id: a
    content: launch into a bad cwd
    action: {{kind: shell, host: here, params: {{command: "echo hi", cwd: "{cwd}"}}}}
""")
    db = tmp_path / "s.db"
    res = cli("--state", db, "run", plan, "a")
    assert res.returncode == 1, res.stderr
    (state, error), = rows(db, "SELECT state, error FROM runs")
    assert state == "failed"
    assert all(w in error for w in words), error
    assert all(w in res.stderr for w in words)
    assert _live(db) == []
    st = cli("--state", db, "status", plan)
    assert st.returncode == 0 and "failed" in st.stdout


def test_host_fault_before_the_run_fails_the_item(tmp_path):
    (tmp_path / "wd").write_text("the workdir is a file")
    plan = local_plan(tmp_path, """  - id: a
    content: host cannot be prepared
    action: {kind: shell, host: here, params: {command: "echo hi"}}
  - id: b
    content: independent, still runs elsewhere
    action: {kind: manual}
""")
    db = tmp_path / "s.db"
    res = cli("--state", db, "run", plan, "a")
    assert res.returncode == 1, res.stderr
    assert "File exists" in res.stderr or "Not a directory" in res.stderr, res.stderr
    (status, reason), = rows(db, "SELECT status, reason FROM items WHERE item_id = 'a'")
    assert status == "failed" and str(tmp_path / "wd") in reason
    assert _live(db) == []


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "SIGTERM"),
                                             (signal.SIGINT, 130, "Ctrl-C")])
def test_signal_while_following_a_detached_run(tmp_path, kill_later, sig, code, word):
    plan = local_plan(tmp_path, """  - id: long
    content: outlives the CLI
    action: {kind: shell, host: here, params: {command: "echo started; sleep 60; echo never"}}
""")
    db = tmp_path / "s.db"
    p = popen_cli("--state", db, "run", plan, "long")
    pid = wait_for(lambda: maybe_rows(db, "SELECT pid FROM runs WHERE state = 'running'"),
                   what="the run to start")[0][0]
    kill_later.append(pid)
    wait_for(lambda: rows(db, "SELECT log_lines FROM runs")[0][0] >= 1, what="its first line")
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == code, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if word in ln]
    assert len(lines) == 1 and "keep going" in lines[0], err
    assert err.rstrip().splitlines()[-1] == lines[0]
    # the detached run keeps going and is still live in the store
    assert pid_alive(pid)
    assert rows(db, "SELECT state FROM runs") == [("running",)]
    res = cli("--state", db, "stop", plan, "long", "--yes", "--grace", "2")
    assert res.returncode == 0, res.stderr
    assert rows(db, "SELECT state FROM runs") == [("stopped",)]
    assert not pid_alive(pid)


def test_sigterm_during_an_in_process_relay_marks_it_interrupted(tmp_path):
    plan = relay_plan(tmp_path, 24)
    db = tmp_path / "s.db"
    p = popen_cli("--state", db, "run", plan, "copy")
    wait_for(lambda: maybe_rows(db, "SELECT 1 FROM runs WHERE state = 'running'"),
             what="the relay to run")
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert "Traceback" not in err
    (state, error), = rows(db, "SELECT state, error FROM runs")
    assert state == "interrupted" and "specdeck stopped" in error
    assert rows(db, "SELECT status FROM items WHERE item_id = 'copy'") == [("failed",)]
    res = cli("--state", db, "status", plan)
    no_traceback(res)
    assert "interrupted" in res.stdout
