"""Every ``specdeck`` command's happy path and its usage error, through the installed entry
point: exit statuses, what goes to stdout and stderr, and nothing written on bad input."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time

import pytest

from core.state.store import Store
from tests.cli.conftest import PLAN, SPECDECK, spawn, specdeck, wait_for_line
from tests.unit.test_compare import _campaign


def _status(plan) -> dict:
    res = specdeck("status", plan, "--json", "--no-reconcile")
    assert res.returncode == 0, res.stderr
    return {i["id"]: i for i in json.loads(res.stdout)["items"]}


# -- happy paths -------------------------------------------------------------------------
def test_validate(plan):
    res = specdeck("validate", plan)
    assert res.returncode == 0, res.stderr
    assert res.stdout == (f"{plan}: ok: plan 'cli', 5 items (1 manual), 1 hosts, "
                          "kinds: shell\n")


def test_kinds_and_version():
    res = specdeck("kinds")
    assert res.returncode == 0 and res.stderr == ""
    kinds = [line.split()[0] for line in res.stdout.splitlines()]
    assert {"shell", "train", "eval", "relay", "venv"} <= set(kinds)
    res = specdeck("--version")
    assert res.returncode == 0 and res.stdout.startswith("specdeck 0.1.0")


def test_run_status_and_logs(plan):
    res = specdeck("run", plan, "after")  # its need first, in order
    assert res.returncode == 1 and "not run, waits on hello" in res.stderr
    res = specdeck("run", plan, "hello", "after")
    assert res.returncode == 0, res.stderr
    assert "hello │ hello from specdeck" in res.stderr and res.stdout == ""
    items = _status(plan)
    assert items["hello"]["status"] == "done" and items["after"]["status"] == "done"
    assert items["hello"]["run"]["exit_code"] == 0 and items["long"]["run"] is None
    table = specdeck("status", plan, env={"COLUMNS": "120"})
    assert table.returncode == 0 and "● done" in table.stdout and "plan cli" in table.stdout
    res = specdeck("logs", plan, "hello")
    assert res.returncode == 0 and res.stdout == "hello from specdeck\n"
    assert "succeeded (exit 0)" in res.stderr


def test_mark_export_and_import(plan, tmp_path):
    res = specdeck("mark", plan, "review", "done")
    assert (res.returncode, res.stdout) == (0, "review: done\n")
    res = specdeck("export", plan, "--todowrite")
    assert res.returncode == 0, res.stderr
    todos = json.loads(res.stdout)
    assert [(t["id"], t["status"]) for t in todos][-1] == ("review", "completed")
    md = specdeck("export", plan, "--markdown")
    assert md.returncode == 0 and "- [x] read the results and decide" in md.stdout
    (tmp_path / "todos.json").write_text(res.stdout)
    out = tmp_path / "imported.yaml"
    res = specdeck("import", tmp_path / "todos.json", "-o", out)
    assert res.returncode == 0 and f"wrote {out} (5 items)" in res.stderr
    res = specdeck("validate", out)
    assert res.returncode == 0 and "5 items (5 manual)" in res.stdout


def test_attach_follows_a_run_its_specdeck_left(tmp_path, monkeypatch):
    plan = tmp_path / "plan.yaml"
    gate = tmp_path / "gate"  # the run ends when the test says, not after a time a loaded CI outlasts
    plan.write_text(PLAN.format(wd=tmp_path / "wd",
                                long=f"0; until [ -e {gate} ]; do sleep 0.1; done"))
    monkeypatch.setenv("SPECDECK_STATE", str(tmp_path / "state.db"))
    proc = spawn("run", plan, "long")
    wait_for_line(proc, "long │ up")
    proc.kill()  # kill -9: the detached run goes on
    proc.wait(10)
    att = spawn("attach", plan, "long")
    try:
        seen = wait_for_line(att, "attached to run")
        gate.touch()
        rest = att.communicate(timeout=60)[1]
    finally:
        if att.poll() is None:
            att.kill()
    assert att.returncode == 0, "".join(seen) + rest
    assert "succeeded (exit 0)" in rest, rest
    assert specdeck("logs", plan, "long").stdout == "up\ndown\n"
    assert _status(plan)["long"]["status"] == "done"


def test_stop_ends_a_live_run(plan):
    proc = spawn("run", plan, "long")
    wait_for_line(proc, "long │ up")
    res = specdeck("stop", plan, "long", "--yes", "--grace", "2", timeout=60)
    assert res.returncode == 0, res.stderr
    assert "long: run" in res.stderr and "stopped" in res.stderr
    assert proc.wait(30) == 1  # its run failed: stopped
    assert _status(plan)["long"]["run"]["state"] == "stopped"


def test_adopt_makes_a_process_the_items_run(plan, tmp_path):
    log = tmp_path / "train.log"
    with open(log, "wb") as f:
        job = subprocess.Popen(["sh", "-c", "echo step 1; sleep 30"], stdout=f,
                               start_new_session=True)
    try:
        proc = spawn("adopt", plan, "train", "--pid", job.pid, "--log", log, "--from-start")
        wait_for_line(proc, "train │ step 1")
        item = _status(plan)["train"]
        assert item["status"] == "in_progress" and item["run"]["pid"] == job.pid
        res = specdeck("stop", plan, "train", "--yes", "--grace", "2", timeout=60)
        assert res.returncode == 0 and "stopped" in res.stderr, res.stderr
        # ended by the SIGTERM, not the grace's SIGKILL: sh killed by it, or (when the TERM
        # reached its sleep first, seen under a loaded parallel run) sh ending 128 + 15
        assert job.wait(20) in (-signal.SIGTERM, 128 + signal.SIGTERM)
        proc.wait(30)
        assert _status(plan)["train"]["run"]["state"] == "stopped"
    finally:
        if job.poll() is None:
            job.kill()


@pytest.fixture
def results(plan, tmp_path):
    """Eval rows (baseline, v4, v5 on 16 prompts) and two train attempts with configs."""
    store = Store(str(tmp_path / "state.db"))
    store.add_eval_results(_campaign())
    for n, lr in ((1, 1e-4), (2, 3e-4)):
        store.claim_run(f"t{n}", "train", "shell", "here", owner="test")
        store.update_run(f"t{n}", config={"lr": lr, "block": 16, "out_dir": f"runs/{n}"})
        store.add_metrics(f"t{n}", [(s, "loss", 2.0 / s) for s in range(1, 11)])
        store.end_run(f"t{n}", "succeeded", exit_code=0)
    store.close()
    return plan


def test_compare(results):
    res = specdeck("compare", results, "--json", "--pair", "v5", "v4")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    v5 = [o for o in data["overall"] if o["drafter"] == "v5"][0]
    assert v5["verdict"] == "better"
    md = specdeck("compare", results)  # piped: Markdown, the verdicts first
    assert md.returncode == 0 and md.stdout.startswith("Verdicts:\n- ")
    assert "\n| drafter | verdict |" in md.stdout


def test_diff(results):
    res = specdeck("diff", results, "train#1", "train#2")
    assert res.returncode == 0, res.stderr
    assert "lr" in res.stdout and "block" not in res.stdout
    assert "(also differ, as they do for any two runs: out_dir)" in res.stdout
    res = specdeck("diff", results, "train#1", "train#2", "--json")
    assert json.loads(res.stdout) == {"lr": {"train#1": 1e-4, "train#2": 3e-4}}


def test_metrics(results):
    res = specdeck("metrics", results, "train", "--csv")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "step,name,value,time" and lines[1].startswith("1,loss,2.0,")
    assert len(lines) == 11
    res = specdeck("metrics", results, "train", "--run", "1")
    assert res.returncode == 0 and "1..10" in res.stdout


def test_completion():
    res = specdeck("completion", "bash")
    assert res.returncode == 0 and "complete" in res.stdout and "specdeck" in res.stdout


def test_ui_opens_the_console_and_quits(plan):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen([str(SPECDECK), "ui", str(plan)], stdin=slave, stdout=slave,
                            stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    out, sent, t0 = b"", False, time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - t0 < 60:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
            if not sent and b"say hello" in out:
                os.write(master, b"q")
                sent = True
        assert sent, out.decode("utf-8", "replace")[-2000:]
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


# -- usage errors: exit 2, a message that names what is wrong, nothing on stdout ------------
USAGE = {
    "validate": (["validate", "{bad}"], "bad.yaml:20:15: item 'review': field 'priority'"),
    "status": (["status", "{missing}"], "missing.yaml: no such plan file"),
    "mark": (["mark", "{plan}", "review", "finished"], "invalid choice: 'finished'"),
    "export": (["export", "{plan}"], "export needs --todowrite or --markdown (a plan), or --out DIR"),
    "engines": (["engines", "{missing}"], "missing.yaml: no drafter config there"),
    "parity": (["parity", "{plan}", "hello"], "give at least two"),
    "card": (["card", "{plan}", "v5", "--drafter", "{missing}"], "no config.json there"),
    "import": (["import", "{todos}", "-o", "{plan}"], "already exists; not overwritten"),
    "kinds": (["kinds", "extra"], "unrecognized arguments: extra"),
    "run": (["run", "{plan}"], "name the items to run, or pass --all"),
    "attach": (["attach", "{plan}", "nope"], "no item 'nope' in plan 'cli'"),
    "logs": (["logs", "{plan}", "hello"], "item 'hello' has no runs yet"),
    "stop": (["stop", "{plan}"], "the following arguments are required: item"),
    "adopt": (["adopt", "{plan}", "train"],  # no --pid/--slurm-job/--tmux and no adopt: in the plan
              "item 'train' has no adopt: in the plan; say what to adopt"),
    "compare": (["compare", "{plan}", "--detect", "0"], "--detect 0.0: a tau difference"),
    "diff": (["diff", "{plan}", "train", "hello"], "item 'train' has no run with a recorded"),
    "metrics": (["metrics", "{plan}", "train"], "item 'train' has no runs yet"),
    "ui": (["ui"], "the following arguments are required: plan"),
    "serve": (["serve", "{plan}", "--bind", "0.0.0.0"], "needs --allow-remote"),
    "demo": (["demo", "--fast"], "unrecognized arguments: --fast"),
    "completion": (["completion", "tcsh"], "invalid choice: 'tcsh'"),
    "notify": (["notify", "--tset"], "unrecognized arguments: --tset"),
    "report": (["report", "{plan}", "--since", "yesterday-ish"], "--since 'yesterday-ish': give a duration"),
}


@pytest.mark.parametrize("command", sorted(USAGE))
def test_usage_error(command, plan, tmp_path):
    argv, words = USAGE[command]
    bad = tmp_path / "bad.yaml"
    bad.write_text(PLAN.format(wd=tmp_path, long=1).replace("priority: high",
                                                            "priority: urgent"))
    todos = tmp_path / "todos.json"
    todos.write_text('[{"content": "x", "status": "pending"}]')
    paths = {"plan": plan, "bad": bad, "missing": tmp_path / "missing.yaml", "todos": todos}
    before = plan.read_bytes()
    res = specdeck(*[a.format(**paths) for a in argv])
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert words in res.stderr, res.stderr
    assert res.stdout == "" and "Traceback" not in res.stderr
    assert plan.read_bytes() == before  # nothing written


HAPPY = {"validate": "test_validate", "kinds": "test_kinds_and_version",
         "run": "test_run_status_and_logs", "status": "test_run_status_and_logs",
         "logs": "test_run_status_and_logs", "mark": "test_mark_export_and_import",
         "export": "test_mark_export_and_import", "import": "test_mark_export_and_import",
         "attach": "test_attach_follows_a_run_its_specdeck_left",
         "stop": "test_stop_ends_a_live_run", "adopt": "test_adopt_makes_a_process_the_items_run",
         "compare": "test_compare", "diff": "test_diff", "metrics": "test_metrics",
         "completion": "test_completion", "ui": "test_ui_opens_the_console_and_quits",
         "serve": "tests.ui.test_serve.test_the_console_in_headless_chromium",
         "demo": "tests.cli.test_demo.test_demo_headless_quick_then_reuse",
         "engines": "tests.unit.test_engine_lint.test_cli_engines_json_and_bad_input",
         "card": "tests.ml.tasks.test_card.test_a_card_traces_every_figure_to_a_stored_result",
         "notify": "tests.unit.test_notify.test_notify_test_says_where_without_the_secret",
         "parity": "tests.cli.test_parity_cli.test_parity_of_three_items_names_the_rule_as_the_cause",
         "report": "tests.unit.test_report.test_the_report_lists_what_happened_in_order_in_every_format"}


def test_every_command_has_a_happy_path_and_a_usage_error():
    """A new command needs both tests here: the parser's commands are the tables' keys."""
    import importlib

    from console.cli import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert commands == set(USAGE) == set(HAPPY)
    for name in HAPPY.values():
        module, _, fn = name.rpartition(".")
        where = vars(importlib.import_module(module)) if module else globals()
        assert callable(where.get(fn)), name


def test_python_dash_m_is_the_same_cli():
    """``python -m console`` and ``python -m console.cli`` are the installed ``specdeck``;
    ``python -m core`` is not a CLI any more (core is a library)."""
    import sys

    want = specdeck("--version").stdout
    for module in ("console", "console.cli"):
        res = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                             text=True, timeout=60)
        assert (res.returncode, res.stdout) == (0, want), res.stderr
    res = subprocess.run([sys.executable, "-m", "core"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode != 0 and "cannot be directly executed" in res.stderr
