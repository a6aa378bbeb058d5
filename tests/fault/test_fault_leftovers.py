"""Class 8: commands that leave children behind. A command exiting with background or
daemonised children (own group, own session, double fork) is reported with them, and
``stop`` ends them; stopping a live run ends its whole tree, not only its process group."""

from __future__ import annotations

import re

from tests.fault.conftest import cli, local_plan, maybe_rows, pid_alive, popen_cli, rows, wait_for

LEAVER = ("sleep 301 & setsid sleep 302 & (setsid sh -c 'sleep 303 & echo $! > daemon.pid' &);"
          " sleep 0.3; echo bye")


def _pids(text: str) -> list[int]:
    return [int(p) for p in re.findall(r"pid (\d+)", text)]


def test_leftover_children_are_reported_and_stop_ends_them(tmp_path, kill_later):
    plan = local_plan(tmp_path, f"""  - id: leaver
    content: exits leaving children
    action: {{kind: shell, host: here, params: {{command: "{LEAVER}"}}}}
""")
    db = tmp_path / "s.db"
    res = cli("--state", db, "run", plan, "leaver")
    (state, error), = rows(db, "SELECT state, error FROM runs")
    pids = _pids(error or "")
    kill_later.extend(pids)
    assert res.returncode == 0, res.stderr
    assert state == "succeeded"
    assert "left 3 processes running" in error and len(pids) == 3, error
    assert all(pid_alive(p) for p in pids)
    assert "stop" in res.stderr and "left 3 processes" in res.stderr
    assert rows(db, "SELECT COUNT(*) FROM events WHERE kind = 'leftovers'") == [(1,)]
    res = cli("--state", db, "stop", plan, "leaver", "--yes", "--grace", "2")
    assert res.returncode == 0 and "ended 3 process" in res.stderr, res.stderr
    wait_for(lambda: not any(pid_alive(p) for p in pids), 10, "the leftovers to end")
    res = cli("--state", db, "stop", plan, "leaver", "--yes")
    assert "no live run" in res.stderr


def test_stopping_a_live_run_ends_children_outside_its_group(tmp_path, kill_later):
    plan = local_plan(tmp_path, """  - id: tree
    content: a live run whose children left its group and session
    action: {kind: shell, host: here, params: {command: "setsid sleep 311 & (setsid sh -c 'sleep 312 & echo $! > d.pid' &); sleep 300"}}
""")
    db = tmp_path / "s.db"
    p = popen_cli("--state", db, "run", plan, "tree", "-q")
    wait_for(lambda: maybe_rows(db, "SELECT 1 FROM runs WHERE state = 'running'"), what="run")
    daemon_pid_file = tmp_path / "wd" / "d.pid"
    wait_for(daemon_pid_file.exists, what="the daemon")
    daemon = int(wait_for(lambda: daemon_pid_file.read_text().strip(), what="its pid"))
    kill_later.append(daemon)
    res = cli("--state", db, "stop", plan, "tree", "--yes", "--grace", "2")
    assert res.returncode == 0, res.stderr
    assert p.wait(timeout=30) == 1
    assert rows(db, "SELECT state FROM runs") == [("stopped",)]
    wait_for(lambda: not pid_alive(daemon), 10, "the daemonised child to end")
