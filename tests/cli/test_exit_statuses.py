"""The exit-status contract through the installed ``specdeck``: 0 ok, 1 an action failed
(whatever status the command on the host had), 2 invalid input, 3 a host unreachable; a
start that fails leaves no run ``starting``."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import specdeck


def _plan(tmp_path, host: str, command: str) -> str:
    p = tmp_path / "plan.yaml"
    p.write_text(f"""name: codes
hosts:
  h: {host}
items:
  - id: a
    content: the item
    action: {{kind: shell, host: h, params: {{command: {json.dumps(command)}}}}}
""")
    return p


def _run_of(plan) -> dict:
    res = specdeck("status", plan, "--json", "--no-reconcile")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["items"][0]["run"]


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECK_STATE", str(tmp_path / "state.db"))


@pytest.mark.parametrize("command, exit_code, signal", [
    ("exit 127", 127, None), ("exit 3", 3, None), ("exit 2", 2, None),
    ("kill -KILL $$$$", None, "KILL"), ("kill -TERM $$$$", None, "TERM")])  # $$: a literal $
def test_a_failed_run_exits_1_whatever_its_own_status(tmp_path, command, exit_code, signal):
    plan = _plan(tmp_path, f"{{local: true, workdir: {tmp_path / 'wd'}}}", command)
    res = specdeck("run", plan, "a")
    assert res.returncode == 1, res.stderr
    assert "failed: a" in res.stderr
    run = _run_of(plan)
    assert (run["state"], run["exit_code"], run["signal"]) == ("failed", exit_code, signal)


def test_a_start_that_fails_exits_1_and_leaves_no_run_starting(tmp_path):
    wd = tmp_path / "wd"
    (wd / ".specdeck").mkdir(parents=True)
    (wd / ".specdeck" / "runs").write_text("")  # capsules cannot be made: the start fails
    plan = _plan(tmp_path, f"{{local: true, workdir: {wd}}}", "echo never")
    res = specdeck("run", plan, "a")
    assert res.returncode == 1, res.stderr
    assert "Not a directory" in res.stderr and "Traceback" not in res.stderr
    run = _run_of(plan)
    assert run["state"] == "failed" and run["ended_at"] is not None


def test_an_unreachable_host_exits_3(tmp_path):
    plan = _plan(tmp_path, '{ssh: "nobody@127.0.0.1:1", workdir: /tmp/x}', "echo never")
    res = specdeck("run", plan, "a", timeout=60)
    assert res.returncode == 3, res.stderr
    assert "host 'h' unreachable: connection refused" in res.stderr
    assert _run_of(plan) is None
