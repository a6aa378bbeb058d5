"""Notifications (core.runs.notify, core.ml.notify): a run's end told from its capsule with no
specdeck running, once, through a real JSON webhook on 127.0.0.1 (Apprise ``json://``); the
URL in no argv, plan, database row or log."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.webhook import Webhook, free_port, wait_for


SECRET = "tok-5e3c7a1f9b"
"""The URL's secret part: searched for everywhere it must not be."""


def write_plan(tmp_path: Path, command: str, events: str = "[failed, succeeded]") -> Path:
    plan = tmp_path / "p.yaml"
    plan.write_text(textwrap.dedent(f"""\
        name: nplan
        notify: {events}
        hosts:
          here:
            local: true
            workdir: {tmp_path}/here
            python: {sys.executable}
            env: {{PYTHONPATH: "{ROOT}"}}
        items:
          - id: train
            content: a run that fails
            action: {{kind: shell, host: here, params: {{command: "{command}"}}}}
        """))
    return plan


def env_for(port: int, state: Path, **more) -> dict:
    return {"SPECDECK_NOTIFY": f"json://127.0.0.1:{port}/hook/{SECRET}", "SPECDECK_STATE":
            str(state), "SPECDECK_NOTIFY_BACKOFF": "0.2", **more}


def cmdlines_with(secret: str) -> list[str]:
    out = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            raw = p.read_bytes()
        except OSError:
            continue
        if secret.encode() in raw:
            out.append(raw.replace(b"\0", b" ").decode(errors="replace"))
    return out


def capsule_of(tmp_path: Path) -> Path:
    caps = list((tmp_path / "here" / ".specdeck" / "runs").iterdir())
    assert len(caps) == 1
    return caps[0]


def no_secret_in_files(*roots: Path) -> None:
    for root in roots:
        for f in [root] if root.is_file() else root.rglob("*"):
            if f.is_file() and f.name != "notify.url":
                assert SECRET.encode() not in f.read_bytes(), f"the secret URL is in {f}"


@pytest.mark.slow
def test_a_failed_run_is_told_once_by_its_host_with_no_specdeck_running(tmp_path):
    hook = Webhook()
    try:
        state = tmp_path / "state.db"
        # the command keeps its environment: the URL must not be in it (nor in its log)
        plan = write_plan(tmp_path, "env >seen_env; env; sleep 1.5; echo boom; exit 3")
        env = env_for(hook.port, state)
        res = run_cli("run", plan, "train", "--detach", env=env, timeout=60)
        assert res.returncode == 0, res.stderr
        # specdeck has exited: the host alone tells the end. Meanwhile no process's argv
        # (the command's, the wrapper's, the notifier's) carries the URL.
        leaks: list[str] = []
        ours: list[str] = []  # the scan sees the run's own processes (it can find a leak)

        def scan():
            leaks.extend(cmdlines_with(SECRET))
            ours.extend(cmdlines_with(str(tmp_path / "here")))
        wait_for(lambda: hook.got, 20, "the webhook's message", every=scan)
        assert leaks == []
        assert any("cmd.sh" in c for c in ours) and any("wrapper.sh" in c for c in ours)
        time.sleep(1.0)  # a duplicate would come now
        assert len(hook.got) == 1
        path, msg = hook.got[0]
        assert path == f"/hook/{SECRET}"
        text = msg["title"] + " " + msg["message"]
        for word in ("nplan", "train", "here", "exit 3", "failed"):
            assert word in text, (word, text)

        cap = capsule_of(tmp_path)
        assert oct((cap / "notify.url").stat().st_mode & 0o777) == "0o600"
        assert json.loads((cap / "notify.run_end").read_text())["state"] == "sent"

        # Reattaching (twice: a second specdeck) records it and sends nothing again.
        for _ in range(2):
            res = run_cli("attach", plan, env=env, timeout=60)
            assert res.returncode in (0, 1), res.stderr
        time.sleep(0.5)
        assert len(hook.got) == 1
        db = sqlite3.connect(state)
        run = db.execute("select state, exit_code from runs").fetchall()
        assert run == [("failed", 3)]
        rows = db.execute("select event, state, target, by from notifications").fetchall()
        assert rows == [("run_end", "sent", f"json://127.0.0.1:{hook.port}", "here")]
        journal = [m for (m,) in db.execute("select message from events where kind='notified'")]
        assert len(journal) == 1 and f"json://127.0.0.1:{hook.port}" in journal[0]
        db.close()
        # The secret is in no plan, database byte, log, the command's environment or other
        # capsule file.
        assert "SPECDECK_STATE" in (tmp_path / "here" / "seen_env").read_text()
        no_secret_in_files(plan, tmp_path / "here", *tmp_path.glob("state.db*"))
        assert SECRET not in res.stdout + res.stderr
    finally:
        hook.close()


@pytest.mark.slow
def test_a_webhook_down_for_a_while_delays_the_message_but_never_loses_or_doubles_it(tmp_path):
    port = free_port()
    state = tmp_path / "state.db"
    plan = write_plan(tmp_path, "exit 5")
    env = env_for(port, state)
    res = run_cli("run", plan, "train", "--detach", env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    wait_for(lambda: (tmp_path / "here" / ".specdeck" / "runs").is_dir(), 10, "the capsule")
    cap = capsule_of(tmp_path)

    def tries() -> int:
        try:
            return json.loads((cap / "notify.run_end").read_text()).get("tries", 0)
        except (OSError, ValueError):
            return 0
    wait_for(lambda: tries() >= 3, 20, "three refused tries")
    assert (cap / "exit").read_text().split() == ["exit", "5"]  # recorded before any try
    res = run_cli("attach", plan, env=env, timeout=60)  # its end is recorded meanwhile
    db = sqlite3.connect(state)
    assert db.execute("select state, exit_code from runs").fetchall() == [("failed", 5)]
    assert db.execute("select count(*) from notifications").fetchone() == (0,)  # trying
    db.close()
    hook = Webhook(port)  # the target comes back
    try:
        wait_for(lambda: hook.got, 20, "the delayed message")
        time.sleep(1.5)  # further retries would land now
        assert len(hook.got) == 1
        assert "exit 5" in hook.got[0][1]["message"]
        rec = json.loads((cap / "notify.run_end").read_text())
        assert rec["state"] == "sent" and rec["tries"] >= 4
        res = run_cli("attach", plan, env=env, timeout=60)  # a later look journals it
        db = sqlite3.connect(state)
        assert db.execute("select state, by from notifications").fetchall() == [("sent", "here")]
        assert len(db.execute("select id from events where kind='notified'").fetchall()) == 1
        db.close()
        assert len(hook.got) == 1
        no_secret_in_files(tmp_path / "here", *tmp_path.glob("state.db*"))
    finally:
        hook.close()


@pytest.mark.slow
def test_a_target_never_reached_is_recorded_not_sent_and_journaled(tmp_path):
    state = tmp_path / "state.db"
    plan = write_plan(tmp_path, "true")
    env = env_for(free_port(), state, SPECDECK_NOTIFY_PATIENCE="1")
    res = run_cli("run", plan, "train", "--detach", env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    wait_for(lambda: (tmp_path / "here" / ".specdeck" / "runs").is_dir(), 10, "the capsule")
    cap = capsule_of(tmp_path)
    wait_for(lambda: (cap / "notify.run_end").exists() and json.loads(
        (cap / "notify.run_end").read_text())["state"] == "failed", 20, "giving up")
    res = run_cli("attach", plan, env=env, timeout=60)
    db = sqlite3.connect(state)
    assert db.execute("select state, exit_code from runs").fetchall() == [("succeeded", 0)]
    assert db.execute("select state from notifications").fetchall() == [("failed",)]
    (msg,) = db.execute("select message from events where kind='notify_failed'").fetchone()
    assert "NOT sent" in msg and "notify --test" in msg
    db.close()
    no_secret_in_files(tmp_path / "here", *tmp_path.glob("state.db*"))


def test_notify_test_says_where_without_the_secret(tmp_path):
    hook = Webhook()
    try:
        res = run_cli("notify", "--test", env={
            "SPECDECK_NOTIFY": f"json://127.0.0.1:{hook.port}/hook/{SECRET}"})
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == (f"sent a test message to json://127.0.0.1:{hook.port} "
                                      "(from $SPECDECK_NOTIFY)")
        assert len(hook.got) == 1 and hook.got[0][0] == f"/hook/{SECRET}"
    finally:
        hook.close()


def test_the_config_file_must_be_its_owners_alone(tmp_path):
    conf = Path(os.environ["HOME"]) / ".config" / "specdeck" / "notify"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"# mine\njson://127.0.0.1:9/hook/{SECRET}\n")
    conf.chmod(0o644)
    res = run_cli("notify", "--test", env={"SPECDECK_NOTIFY": ""})
    assert res.returncode == 2
    assert "chmod 600" in res.stderr and SECRET not in res.stderr + res.stdout
    conf.chmod(0o600)
    res = run_cli("notify", env={"SPECDECK_NOTIFY": ""})
    assert res.returncode == 0
    assert res.stdout.startswith(f"notifications go to json://127.0.0.1:9 (from {conf})")


@pytest.mark.parametrize("text, want", [
    ("notify: [failed, faild]", "p.yaml:2:18: field 'notify': notify: unknown event 'faild'"),
    ("notify: json://127.0.0.1/x", "p.yaml:2:9: field 'notify': notify: names events, not a "
                                   "target"),
    ("notify: [ntfy://ntfy.sh/topic]", "p.yaml:2:10: field 'notify': notify: a notification "
                                       "URL is a secret"),
    ("notify: {failed: true}", "p.yaml:2:9: field 'notify': notify: a list of events"),
    ("notify: [lost, stal]", "p.yaml:2:16: field 'notify': notify: unknown event 'stal'"),
])
def test_bad_notify_fields_are_refused_by_file_line(text, want):
    from core.errors import PlanError
    from core.plans.planfile import parse_plan

    with pytest.raises(PlanError) as e:
        parse_plan(f"name: x\n{text}\nitems: []\n", "p.yaml")
    assert str(e.value.issues[0]).startswith(want), str(e.value.issues[0])


def test_the_target_is_described_without_its_secret_parts():
    from core.runs.notify import describe

    assert describe("json://user:pw@127.0.0.1:8080/hook?token=x") == "json://127.0.0.1:8080"
    assert describe("ntfy://ntfy.sh/mytopic") == "ntfy://ntfy.sh"
    # a token where a host would be is not shown
    assert describe("slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7F") == "slack://…"
    assert describe("discord://4174216298/JHMHI8qBe7bk2ZwO5U711o3dV") == "discord://…"
    assert describe("ntfy://my-secret-topic") == "ntfy://…"


async def test_an_alert_the_console_raises_is_sent_once_across_specdecks(tmp_path, monkeypatch):
    """A tau alert journaled by an ``on: console`` watcher is sent by the specdeck that raised
    it, once: a second specdeck raising the same one (step) sends nothing; an alert its host
    told itself (a detached watcher's drop) is not sent from here."""
    from core.plans.planfile import load_plan
    from core.runs.runner import Runner, _Context
    from core.state.store import Store

    hook = Webhook()
    monkeypatch.setenv("SPECDECK_NOTIFY", f"json://127.0.0.1:{hook.port}/a/{SECRET}")
    try:
        plan = load_plan(write_plan(tmp_path, "true", "[tau_drop, tau_flat]"))
        state = tmp_path / "state.db"
        item = plan.item("train")
        for _ in range(2):  # two specdecks on one state
            store = Store(state)
            runner = Runner(plan, store)
            ctx = _Context(runner, item, None, "run-1")
            ctx.journal("alert", "tau 2.0 at step 60 is 33% below the best", data={
                "alert": "tau_drop", "step": 60})
            ctx.journal("alert", "tau 2.0 at step 80 is 33% below the best", data={
                "alert": "tau_drop", "step": 80, "sent_by_host": True})
            await runner.close()  # waits for what it is sending
            store.close()
        assert len(hook.got) == 1
        assert "train" in hook.got[0][1]["title"] and "step 60" in hook.got[0][1]["message"]
        db = sqlite3.connect(state)
        assert db.execute("select key, state, by from notifications").fetchall() == [
            ("alert:run-1:tau_drop@60", "sent", "console")]
        db.close()
        no_secret_in_files(*tmp_path.glob("state.db*"))
    finally:
        hook.close()


@pytest.fixture
def hook():
    h = Webhook()
    yield h
    h.close()


def sleeping_run(tmp_path: Path, hook: Webhook) -> tuple[Path, dict, Path]:
    """A detached run of ``sleep 60`` whose plan notifies its stop, loss or failure: (plan,
    env, state)."""
    state = tmp_path / "state.db"
    plan = write_plan(tmp_path, "sleep 60", "[stopped, lost, failed]")
    env = env_for(hook.port, state)
    assert run_cli("run", plan, "train", "--detach", env=env, timeout=60).returncode == 0
    return plan, env, state


@pytest.mark.slow
def test_a_stopped_run_is_told_as_stopped(tmp_path, hook):
    plan, env, _ = sleeping_run(tmp_path, hook)
    res = run_cli("stop", plan, "train", "--yes", "--grace", "5", env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    wait_for(lambda: hook.got, 20, "the stop's message")
    time.sleep(0.5)
    assert len(hook.got) == 1
    assert "stopped" in hook.got[0][1]["title"] and "failed" not in hook.got[0][1]["title"]


@pytest.mark.slow
def test_a_lost_run_is_told_once_by_the_specdeck_that_finds_it(tmp_path, hook):
    # its wrapper and command killed: no exit status; the next look finds it lost
    plan, env, state = sleeping_run(tmp_path, hook)
    cap = capsule_of(tmp_path)
    wait_for(lambda: (cap / "pid").exists(), 10, "the run's pid")
    pid, _, _, wpid, _ = (cap / "pid").read_text().split()
    for p in (wpid, pid):
        os.kill(int(p), 9)
    for _ in range(2):
        run_cli("attach", plan, env=env, timeout=60)
    time.sleep(0.5)
    assert len(hook.got) == 1, hook.got
    assert "lost" in hook.got[0][1]["title"] and "train" in hook.got[0][1]["message"]
    db = sqlite3.connect(state)
    assert ("lost",) in db.execute("select state from runs").fetchall()
    assert db.execute("select count(*) from notifications where by='console' and "
                      "state='sent'").fetchone() == (1,)
    db.close()
