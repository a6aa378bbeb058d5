"""The headless CLI contract, exercised through the real `python -m console.cli` on the local host."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli_until, run_cli


def write_plan(tmp: Path, body: str, name: str = "p.yaml") -> Path:
    p = tmp / name
    p.write_text(body)
    return p


def shell_plan(tmp: Path, name: str, item_id: str, content: str, command: str) -> Path:
    """A plan ``name`` of one item, ``item_id``, that runs shell ``command`` on a local host
    (workdir ``tmp/w``)."""
    return write_plan(tmp, f"""
name: {name}
hosts:
  here: {{local: true, workdir: {tmp / 'w'}}}
items:
  - id: {item_id}
    content: {content}
    action: {{kind: shell, host: here, params: {{command: "{command}"}}}}
""")


PLAN = """
name: order
hosts:
  here: {{local: true, workdir: {wd}}}
items:
  - id: a
    content: first
    action: {{kind: shell, host: here, params: {{command: "echo a >> {trace}"}}}}
  - id: b
    content: second
    needs: [a]
    action: {{kind: shell, host: here, params: {{command: "echo b >> {trace}; exit 7"}}}}
  - id: c
    content: after the failure
    needs: [b]
    action: {{kind: shell, host: here, params: {{command: "echo c >> {trace}"}}}}
  - id: m
    content: by hand
    priority: high
  - id: d
    content: after the manual one
    needs: [m]
    action: {{kind: shell, host: here, params: {{command: "echo d >> {trace}"}}}}
"""


def test_run_order_failure_and_status_json(tmp_path):
    trace = tmp_path / "trace"
    plan = write_plan(tmp_path, PLAN.format(wd=tmp_path / "w", trace=trace))
    env = {"SPECDECK_STATE": str(tmp_path / "state.db")}
    res = run_cli("run", plan, "--all", env=env)
    assert res.returncode == 1, res.stderr
    assert trace.read_text() == "a\nb\n"  # dependency order; c and d never ran
    assert "manual items waiting" in res.stderr

    res = run_cli("status", plan, "--json", env=env)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["plan"] == "order"
    items = {i["id"]: i for i in doc["items"]}
    assert list(items) == ["a", "b", "c", "m", "d"]
    for it in doc["items"]:
        assert set(it) == {"id", "content", "priority", "status", "needs", "action", "run"}
    assert items["a"]["status"] == "done"
    assert items["b"]["status"] == "failed"
    assert items["c"]["status"] == "pending"
    assert items["d"]["status"] == "pending"
    assert items["m"]["action"] is None and items["m"]["run"] is None
    run = items["b"]["run"]
    assert set(run) == {"id", "host", "state", "pid", "exit_code", "signal", "started_at",
                        "ended_at"}
    assert run["exit_code"] == 7 and run["state"] == "failed" and run["host"] == "here"
    assert run["signal"] is None and run["ended_at"] >= run["started_at"]
    assert items["b"]["action"] == {"kind": "shell", "host": "here", "params": {
        "command": f"echo b >> {trace}; exit 7", "args": [], "cwd": None, "creates": None,
        "metrics": None}}

    # the operator ticks the manual item; d becomes runnable; b can be run again (attempt 2)
    assert run_cli("mark", plan, "m", "done", env=env).returncode == 0
    res = run_cli("run", plan, "d", env=env)
    assert res.returncode == 0, res.stderr
    assert trace.read_text() == "a\nb\nd\n"
    res = run_cli("run", plan, "b", env=env)
    assert res.returncode == 1
    doc = json.loads(run_cli("status", plan, "--json", env=env).stdout)
    b = [i for i in doc["items"] if i["id"] == "b"][0]
    db = sqlite3.connect(tmp_path / "state.db")
    attempts = [r[0] for r in db.execute("SELECT attempt FROM runs WHERE item_id='b' ORDER BY attempt")]
    assert attempts == [1, 2]
    assert b["run"]["exit_code"] == 7

    # the log of a run is stored and printed by `logs`
    res = run_cli("logs", plan, "a", env=env)
    assert res.returncode == 0 and res.stdout == ""  # a's output went to the trace file
    assert "succeeded" in res.stderr


def test_args_reach_the_command_literally(tmp_path):
    hostile = ["$(touch x)", "; touch y", "`touch z`", "' ; touch q #", "a b\nc"]
    plan = write_plan(tmp_path, f"""
name: inj
hosts:
  here: {{local: true, workdir: {tmp_path / 'w'}}}
vars:
  v: "$(touch v1); touch v2"
items:
  - id: a
    content: hostile args
    action:
      kind: shell
      host: here
      params:
        command: "printf '<%s>\\\\n' ${{v}}"
        args: {json.dumps(hostile)}
""")
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "a", env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    wd = tmp_path / "w"
    for name in ("x", "y", "z", "q", "v1", "v2"):
        assert not (wd / name).exists() and not (tmp_path / name).exists(), name
    out = run_cli("logs", plan, "a", env=env).stdout
    assert out == "".join(f"<{s}>\n" for s in ["$(touch v1); touch v2"] + hostile)


def test_kill_9_of_the_cli_mid_run_corrupts_nothing(tmp_path):
    plan = shell_plan(tmp_path, "k9", "long", "prints for a while",
                      "for i in $(seq 1 30); do echo line $i; sleep 0.05; done")
    state = tmp_path / "s.db"
    env = {**os.environ, "SPECDECK_STATE": str(state), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "console.cli", "run", str(plan), "long"], env=env,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # wait until the run is live and streaming
        if "line 3" in line:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    db = sqlite3.connect(state)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT state FROM runs").fetchone()[0] == "running"
    db.close()
    deadline = time.time() + 20
    while time.time() < deadline:  # the detached run goes on without specdeck
        caps = list((tmp_path / "w" / ".specdeck" / "runs").glob("*/exit"))
        if caps:
            break
        time.sleep(0.1)
    assert caps and caps[0].read_text().strip() == "exit 0"
    res = run_cli("status", plan, env={"SPECDECK_STATE": str(state)})
    assert res.returncode == 0, res.stderr
    assert "meanwhile: long: run" in res.stderr and "running -> succeeded" in res.stderr
    assert "done" in res.stdout
    log = run_cli("logs", plan, "long", env={"SPECDECK_STATE": str(state)}).stdout
    assert log.splitlines() == [f"line {i}" for i in range(1, 31)]


def test_todowrite_round_trip(tmp_path):
    todos = [
        {"content": "Set up venv on CT129 with uv + CPU torch + transformers",
         "status": "completed", "priority": "high"},
        {"content": "Copy checkpoint from kpro6 host to CT129 (relay through local)",
         "status": "in_progress", "priority": "high"},
        {"content": "Strip optimizer state", "status": "pending", "priority": "medium"},
        {"content": "Strip optimizer state", "status": "pending", "priority": "low"},
    ]
    src = tmp_path / "todos.json"
    src.write_text(json.dumps(todos))
    out = tmp_path / "plans" / "campaign.yaml"
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("import", src, "-o", out, env=env)
    assert res.returncode == 0, res.stderr
    assert run_cli("validate", out).returncode == 0
    res = run_cli("export", out, "--todowrite", env=env)
    exported = json.loads(res.stdout)
    ids = [t.pop("id") for t in exported]  # ids are kept (and needs, when items have any)
    assert exported == todos
    assert ids == ["set-up-venv-on-ct129-with-uv-cpu-torch", "copy-checkpoint-from-kpro6-host-to-ct129",
                   "strip-optimizer-state", "strip-optimizer-state-2"]
    # statuses change in the store; the export follows, the YAML is untouched
    yaml_before = out.read_text()
    status = json.loads(run_cli("status", out, "--json", env=env).stdout)
    ids = [i["id"] for i in status["items"]]
    assert run_cli("mark", out, ids[1], "done", env=env).returncode == 0
    assert run_cli("mark", out, ids[2], "in_progress", env=env).returncode == 0
    todos[1]["status"] = "completed"
    todos[2]["status"] = "in_progress"
    assert json.loads(run_cli("export", out, "--todowrite", env=env).stdout) == [
        {**t, "id": i} for t, i in zip(todos, ids)]
    assert out.read_text() == yaml_before
    # importing over an existing plan is refused and writes nothing
    res = run_cli("import", src, "-o", out, env=env)
    assert res.returncode == 2 and "already exists" in res.stderr
    assert out.read_text() == yaml_before


def test_import_rejects_bad_entries(tmp_path):
    src = tmp_path / "t.json"
    src.write_text(json.dumps([{"content": "ok", "status": "pending"}, {"status": "weird"}]))
    res = run_cli("import", src, "-o", tmp_path / "x.yaml")
    assert res.returncode == 2 and "entry #2" in res.stderr
    assert not (tmp_path / "x.yaml").exists()
    src.write_text("[{]")
    res = run_cli("import", src, "-o", tmp_path / "x.yaml")
    assert res.returncode == 2 and f"{src}:1:" in res.stderr


def test_stop_needs_confirmation_and_ends_as_stopped(tmp_path):
    plan = shell_plan(tmp_path, "st", "sleeper", "runs until stopped",
                      "echo up; sleep 600")
    state = tmp_path / "s.db"
    proc = cli_until(state, "run", plan, "sleeper", line="│ up")
    res = run_cli("stop", plan, "sleeper", env={"SPECDECK_STATE": str(state)})
    assert res.returncode == 2 and "--yes" in res.stderr  # no tty, no --yes: refused
    res = run_cli("stop", plan, "sleeper", "--yes", "--grace", "5",
                  env={"SPECDECK_STATE": str(state)})
    assert res.returncode == 0, res.stderr
    assert "stopped (signal TERM)" in res.stderr
    assert proc.wait(timeout=20) == 1  # the following `run` saw its item end unfinished
    doc = json.loads(run_cli("status", plan, "--json", env={"SPECDECK_STATE": str(state)}).stdout)
    assert doc["items"][0]["status"] == "stopped"  # the operator's decision, not a failure
    assert doc["items"][0]["run"]["state"] == "stopped"
    assert doc["items"][0]["run"]["signal"] == "TERM"


def test_run_on_a_live_item_attaches_instead_of_starting_a_second_run(tmp_path):
    gate = tmp_path / "gate"  # the run ends only once the second CLI has attached, however loaded the machine
    plan = shell_plan(tmp_path, "att", "job", "work that waits for the test",
                      f"echo start; while [ ! -e {gate} ]; do sleep 0.1; done; echo end")
    state = tmp_path / "s.db"
    first = cli_until(state, "run", plan, "job", line="│ start")
    watchdog = threading.Timer(90, gate.touch)  # a second run started instead would otherwise wait forever
    watchdog.start()
    second = cli_until(state, "run", plan, "job", line="is live; attaching")
    watchdog.cancel()
    gate.touch()
    rest = second.communicate(timeout=60)[1]
    assert second.returncode == 0, rest
    assert "│ end" in rest
    assert first.wait(timeout=30) == 0
    db = sqlite3.connect(state)
    assert db.execute("SELECT COUNT(*), MAX(state) FROM runs").fetchone() == (1, "succeeded")
    assert run_cli("logs", plan, "job", env={"SPECDECK_STATE": str(state)}).stdout == "start\nend\n"
