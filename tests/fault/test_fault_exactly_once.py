"""Class 5: exactly once in every path. ``stop`` drains the log into the store before it
records the end (nobody followed the run); a second specdeck meeting an in-process run
(a relay) owned by another waits for it and reports its true outcome; ``logs -f`` follows it."""

from __future__ import annotations

import os
import signal

from tests.fault.conftest import (cli, local_plan, maybe_rows, popen_cli, relay_plan, rows,
                                  wait_for)


def test_stop_drains_a_log_nobody_followed(tmp_path, kill_later):
    plan = local_plan(tmp_path, """  - id: count
    content: counts, traps TERM and says so
    action: {kind: shell, host: here, params: {command: "trap 'echo got TERM; exit 3' TERM; i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo line $i; sleep 0.005; done"}}
""")
    db = tmp_path / "s.db"
    p = popen_cli("--state", db, "run", plan, "count", "-q")
    pid = wait_for(lambda: maybe_rows(db, "SELECT pid FROM runs WHERE state = 'running'"),
                   what="the run")[0][0]
    kill_later.append(pid)
    wait_for(lambda: rows(db, "SELECT log_lines FROM runs")[0][0] > 5, what="some lines")
    p.send_signal(signal.SIGKILL)  # nobody follows the run any more
    p.wait()
    capsule, = rows(db, "SELECT capsule FROM runs")[0]
    log = tmp_path / "log-size"
    wait_for(lambda: os.path.getsize(f"{capsule}/log") > 4000, what="more output")
    res = cli("--state", db, "stop", plan, "count", "--yes", "--grace", "5")
    assert res.returncode == 0, res.stderr
    (state, lines, offset), = rows(db, "SELECT state, log_lines, log_offset FROM runs")
    assert state == "stopped"
    on_host = open(f"{capsule}/log", "rb").read()
    assert on_host.endswith(b"got TERM\n")
    assert offset == len(on_host) and lines == on_host.count(b"\n")
    logs = cli("--state", db, "logs", plan, "count")
    assert logs.stdout.encode() == on_host
    assert not log.exists()


def test_second_specdeck_waits_for_an_in_process_relay_and_reports_its_outcome(tmp_path):
    plan = relay_plan(tmp_path, 20)
    src = tmp_path / "a"
    db = tmp_path / "s.db"
    first = popen_cli("--state", db, "run", plan, "copy")
    wait_for(lambda: maybe_rows(db, "SELECT 1 FROM runs WHERE state = 'running'"),
             what="the relay")
    follower = popen_cli("--state", db, "logs", plan, "copy", "-f")
    second = cli("--state", db, "run", plan, "copy", timeout=120)
    assert first.wait(timeout=120) == 0
    assert second.returncode == 0, second.stderr
    assert "attached to run" in second.stderr and "succeeded" in second.stderr
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert "succeeded" in err and "Traceback" not in err
    assert out.encode() == cli("--state", db, "logs", plan, "copy").stdout.encode()
    assert rows(db, "SELECT state, attempt FROM runs") == [("succeeded", 1)]
    assert (tmp_path / "b" / "f.bin").read_bytes() == (src / "f.bin").read_bytes()
