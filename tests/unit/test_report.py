"""Issue 47 §5: ``specdeck report PLAN --since``: what happened while the operator was away, in
the order it happened, from a real state database, in text, Markdown and JSON; ``--send`` sends
it once through a real JSON webhook on 127.0.0.1 (Apprise ``json://``)."""

from __future__ import annotations

import json
import time

import pytest

from core.runs import report
from core.state.store import Store
from tests.conftest import run_cli
from tests.webhook import Webhook

PLAN = """name: night
hosts:
  gpu: {{local: true, workdir: {wd}/gpu, price: {{per_gpu_hour: 2.0, gpus: 2}}}}
  ev: {{local: true, workdir: {wd}/ev, price: {{per_hour: 1.0}}}}
items:
  - id: train-v5
    content: train v5
    action: {{kind: train, host: gpu, params: {{command: "true"}}}}
  - id: train-v6
    content: train v6
    action: {{kind: train, host: gpu, params: {{command: "true"}}}}
  - id: eval-v5
    content: measure v5
    action: {{kind: eval, host: ev, params: {{drafter: d, target: t}}}}
  - id: old
    content: ran long before the window
    action: {{kind: shell, host: ev, params: {{command: "true"}}}}
"""

EXPECTED = [  # (kind, the entry's words), in the order they happened
    ("run_started", "train-v5 #1 started on gpu"),
    ("checkpoint_written", "train-v5: checkpoint at step 100 written"),
    ("checkpoint_evaluated", "train-v5: checkpoint at step 100 evaluated on ev: tau 2.100"),
    ("disk", "gpu: disk /data: 3.1 GiB free"),
    ("checkpoint_written", "train-v5: checkpoint at step 200 written"),
    ("checkpoint_evaluated", "train-v5: checkpoint at step 200 evaluated on ev: tau 2.600"),
    ("gpu", "train-v5: GPU 0 idle for 10 min"),
    ("alert", "train-v5: tau fell from 2.600 to 1.900"),
    ("checkpoint_written", "train-v5: checkpoint at step 300 written"),
    ("checkpoint_evaluated", "train-v5: checkpoint at step 300 evaluated on ev: tau 1.900"),
    ("preemption", "train-v5: run v5-1 preempted: Slurm requeued job 7"),
    ("checkpoint", "train-v5: step_100.pt deleted (keep: 2)"),
    ("run_ended", "train-v5 #1 succeeded (exit 0)"),
    ("run_started", "train-v6 #1 started on gpu"),
    ("preemption", "train-v6 #1 preempted"),
    ("run_started", "eval-v5 #1 started on ev"),
    ("run_ended", "eval-v5 #1 succeeded (exit 0)"),
]


@pytest.fixture
def night(tmp_path):
    """A campaign's night: every kind of thing the report lists, journaled through the store
    as the runner, the trainer's checkpoints, tau over training and telemetry record them."""
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN.format(wd=tmp_path))
    state = tmp_path / "s.db"
    s = Store(str(state))
    t0 = time.time() - 6 * 3600
    s.claim_run("old-1", "old", "shell", "ev", owner="t")
    s.end_run("old-1", "succeeded", exit_code=0)
    s.update_run("old-1", started_at=t0 - 20 * 3600, ended_at=t0 - 19 * 3600)  # 1 h, a day ago
    clock = iter(range(10_000))

    def tick():  # each thing a minute after the last, so the order is the journal's
        return t0 + 60 * next(clock)

    def at(table, key, value, col="at"):
        s.db.execute(f"UPDATE {table} SET {col} = ? WHERE {key}", [value])
        s.db.conn.commit()

    s.claim_run("v5-1", "train-v5", "train", "gpu", owner="t")
    s.update_run("v5-1", state="running", started_at=tick())
    for step, tau in ((100, 2.1), (200, 2.6), (300, 1.9)):
        s.add_artefact("v5-1", "train-v5", "checkpoint", f"/ck/step_{step}.pt", step)
        at("artefacts", f"step = {step}", tick())
        s.watch_ingest("v5-1", "train-v5", step, state="done", tau=tau, host="ev",
                       metrics=[(step, "tau", tau)])
        at("watch_evals", f"step = {step}", tick())
        at("metrics", f"name = 'tau' AND step = {step}", tick())
        if step == 100:
            s.alert_once("disk_low", "disk /data: 3.1 GiB free", host="gpu")
            at("events", "kind = 'alert'", tick())
        if step == 200:
            s.alert_once("gpu_idle", "GPU 0 idle for 10 min", item_id="train-v5", run_id="v5-1", host="gpu")
            at("events", "kind = 'alert' AND data LIKE '%gpu_idle%'", tick())
            s.journal("alert", "tau fell from 2.600 to 1.900", item_id="train-v5", run_id="v5-1",
                      data={"alert": "tau_drop", "step": 300})
            at("events", "kind = 'alert' AND data LIKE '%tau_drop%'", tick())
    # a Slurm requeue (core.actions.train journals it; the run goes on) and checkpoint
    # retention (the watcher's deletions), under the kinds their writers journal
    s.journal("run_requeued", "run v5-1 preempted: Slurm requeued job 7 (restart 1)",
              item_id="train-v5", run_id="v5-1", data={"job": "7", "restart": 1})
    at("events", "kind = 'run_requeued'", tick())
    s.journal("checkpoints_deleted", "step_100.pt deleted (keep: 2)", item_id="train-v5", run_id="v5-1")
    at("events", "kind = 'checkpoints_deleted'", tick())
    s.end_run("v5-1", "succeeded", exit_code=0)
    s.update_run("v5-1", ended_at=tick())
    s.claim_run("v6-1", "train-v6", "train", "gpu", owner="t")
    s.update_run("v6-1", state="running", started_at=tick())
    s.end_run("v6-1", "preempted", signal="SIGTERM", error="the node was reclaimed")  # a state h47a adds
    s.update_run("v6-1", ended_at=tick())
    s.claim_run("ev-1", "eval-v5", "eval", "ev", owner="t")
    s.update_run("ev-1", state="running", started_at=tick())
    s.end_run("ev-1", "succeeded", exit_code=0, result={"tau": 2.6})
    s.update_run("ev-1", ended_at=tick())
    s.close()
    return plan, state


def test_the_report_lists_what_happened_in_order_in_every_format(night):
    plan, state = night
    res = run_cli("--state", state, "report", plan, "--since", "12h", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    got = [(e["kind"], e["text"]) for e in doc["entries"]]
    assert len(got) == len(EXPECTED), got
    for (kind, text), (want_kind, words) in zip(got, EXPECTED):
        assert kind == want_kind and text.startswith(words), (kind, text)
    assert [e["at"] for e in doc["entries"]] == sorted(e["at"] for e in doc["entries"])
    assert "old" not in {e["item"] for e in doc["entries"]}  # before the window
    assert doc["counts"] == {"run_started": 3, "run_ended": 2, "preemption": 2, "checkpoint_written": 3,
                             "checkpoint_evaluated": 3, "alert": 1, "disk": 1, "gpu": 1, "checkpoint": 1}
    (curve,) = doc["tau_over_training"]
    assert curve["points"] == [[100, 2.1], [200, 2.6], [300, 1.9]] and curve["best"] == [200, 2.6]
    # cost: train-v5 ran 15 min, train-v6 1 min on gpu (4.0/h), eval-v5 1 min on ev (1.0/h);
    # the old run's hour is in the total, not in the window
    window, total = doc["cost"]["window"]["USD"], doc["cost"]["total"]["USD"]
    assert window == pytest.approx(16 / 60 * 4.0 + 1 / 60 * 1.0, rel=1e-6)
    assert total == pytest.approx(window + 1.0, rel=1e-6)

    text = run_cli("--state", state, "report", plan, "--since", "12h")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("specdeck report: plan night, ")
    assert lines[1] == ("3 run(s) started, 2 ended, 3 checkpoint(s) written, 3 evaluated, 1 alert(s), "
                        "2 preemption(s), 2 disk/GPU incident(s)")
    shown = [ln for ln in lines[3:3 + len(EXPECTED)]]
    for ln, (_, words) in zip(shown, EXPECTED):
        assert words in ln, (ln, words)
    assert "  train-v5: 100: 2.100, 200: 2.600, 300: 1.900; best 2.600 at step 200 (3 new)" in lines
    assert f"  in this window USD {window:,.2f}; so far USD {total:,.2f}" in lines
    assert "PREEMPTED   train-v6 #1 preempted (signal SIGTERM)" in text.stdout

    md = run_cli("--state", state, "report", plan, "--since", "12h", "--markdown").stdout
    items = [ln for ln in md.splitlines() if ln.startswith("- `")]
    assert len(items) == len(EXPECTED) and all(w in ln for ln, (_, w) in zip(items, EXPECTED))
    assert md.startswith("**specdeck report: night**") and "**tau over training**" in md
    assert "**PREEMPTED** train-v6 #1 preempted" in md and "**DISK** gpu: disk /data" in md


def test_a_window_is_a_window(night):
    plan, state = night
    doc = json.loads(run_cli("--state", state, "report", plan, "--since", "2d", "--until", "12h",
                             "--json").stdout)
    assert [(e["kind"], e["item"]) for e in doc["entries"]] == [("run_started", "old"), ("run_ended", "old")]
    assert doc["tau_over_training"] == [] and doc["cost"]["window"]["USD"] == pytest.approx(1.0)


@pytest.mark.parametrize("args,words", [
    (["--since", "yesterday"], "--since 'yesterday': give a duration back from now (12h, 90m, 2d)"),
    (["--since", "1h", "--until", "2h"], "--since 1h is not before --until 2h"),
])
def test_a_bad_window_is_refused(night, args, words):
    plan, state = night
    res = run_cli("--state", state, "report", plan, *args)
    assert res.returncode == 2 and words in res.stderr and res.stdout == ""


def test_send_sends_the_markdown_once(night):
    plan, state = night
    hook = Webhook()
    try:
        env = {"SPECDECK_NOTIFY": f"json://127.0.0.1:{hook.port}/hook", "SPECDECK_NOTIFY_BACKOFF": "0.2"}
        until = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 3600))
        args = ("--state", state, "report", plan, "--since", "2026-01-01T00:00", "--until", until, "--send")
        res = run_cli(*args, env=env)
        assert res.returncode == 0 and "report: sent as a notification" in res.stderr, res.stderr
        ((path, body),) = hook.got
        assert body["title"] == "specdeck report: night" and "- `" in body["message"]
        assert "**PREEMPTED** train-v6 #1 preempted" in body["message"]
        again = run_cli(*args, env=env)  # the same window's report: once across every specdeck
        assert again.returncode == 0 and "sent before" in again.stderr and len(hook.got) == 1
    finally:
        hook.close()


def test_since_reads_durations_and_times():
    assert report.parse_since("12h", 100_000.0) == 100_000.0 - 12 * 3600
    assert report.parse_since("90m", 10_000.0) == 10_000.0 - 5400
    assert report.parse_since("1970-01-02T00:00", 0) == 86400.0
    assert report.parse_since("1970-01-02T00:00+01:00", 0) == 86400.0 - 3600
