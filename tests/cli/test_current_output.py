"""What specdeck shows is current or says it is not, and reads for a person and a script
(issue 29, points 4 and 5), through the installed ``specdeck``: ``logs`` of a live run
shows its newest line; ``run --detach`` exits 0 with the run id; printed hints run as
printed without specdeck on PATH; a mistyped ``--state`` is refused; piped tables carry
whole values; ``| head -1`` exits 141; ``compare`` on a real 120-column terminal (tmux)
keeps every drafter's name and verdict."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from core.state.store import Store
from tests.cli.conftest import SPECDECK, specdeck
from tests.fault.conftest import wait_for

GATED = """name: gated
hosts:
  here: {{local: true, workdir: {wd}}}
items:
  - id: gated
    content: prints a line, then its newest line when told, then waits to be told to end
    action: {{kind: shell, host: here, params: {{command: "echo first; while [ ! -f {go} ]; do sleep 0.05; done; echo the-newest-line; while [ ! -f {end} ]; do sleep 0.05; done"}}}}
  - id: after
    content: needs gated
    needs: [gated]
    action: {{kind: shell, host: here, params: {{command: "echo after"}}}}
"""


@pytest.fixture
def gated(tmp_path):
    plan = tmp_path / "gated.yaml"
    plan.write_text(GATED.format(wd=tmp_path / "wd", go=tmp_path / "go", end=tmp_path / "end"))
    yield plan, tmp_path / "s.db"
    (tmp_path / "go").touch()
    (tmp_path / "end").touch()


def test_detach_then_logs_of_the_live_run_shows_its_newest_line(gated, tmp_path):
    plan, state = gated
    res = specdeck("run", plan, "gated", "after", "--detach", "--state", state)
    assert res.returncode == 0, res.stderr
    item, run_id = res.stdout.split()  # ITEM RUN_ID on stdout, as sbatch prints its job id
    assert item == "gated" and run_id.startswith("gated-")
    assert "started detached" in res.stderr and "logs" in res.stderr and "-f` follows" in res.stderr
    assert "waiting for the started runs to end: after" in res.stderr
    log = tmp_path / "wd" / ".specdeck" / "runs" / run_id / "log"
    wait_for(lambda: log.is_file() and "first" in log.read_text(), what="the run's first line")
    (tmp_path / "go").touch()
    wait_for(lambda: "the-newest-line" in log.read_text(), what="the newest line on the host")
    # nobody followed the run since it started: the stored copy had nothing of this
    out = specdeck("logs", plan, "gated", "--state", state)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "first\nthe-newest-line\n"
    assert f"run {run_id} is live" in out.stderr and f"logs {plan} gated -f` follows" in out.stderr
    status = json.loads(specdeck("status", plan, "--json", "--state", state).stdout)
    st = {i["id"]: i for i in status["items"]}
    assert st["gated"]["run"]["state"] == "running" and st["after"]["run"] is None
    (tmp_path / "end").touch()
    done = specdeck("logs", plan, "gated", "--state", state)  # its end is picked up first
    assert done.stdout == "first\nthe-newest-line\n" and "succeeded (exit 0)" in done.stderr


def test_logs_of_a_live_run_whose_host_is_away_says_how_old_the_copy_is(tmp_path):
    plan = tmp_path / "away.yaml"
    plan.write_text(f"""name: away
hosts:
  gone: {{ssh: "nobody@127.0.0.1:1", workdir: /tmp/nowhere}}
items:
  - id: t
    content: a run on a host that went away
    action: {{kind: shell, host: gone, params: {{command: "true"}}}}
""")
    state = tmp_path / "s.db"
    s = Store(str(state))
    s.claim_run("t-1", "t", "shell", "gone", owner="elsewhere:1:1")
    s.update_run("t-1", state="running", pid=4242, capsule="/tmp/nowhere/.specdeck/runs/t-1")
    s.append_log("t-1", 0, b"stored line\n")
    s.close()
    res = specdeck("logs", plan, "t", "--state", state)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "stored line\n"
    assert re.search(r"this is the stored copy of its log \(stored \d\d:\d\d:\d\d, \d+ s ago\)",
                     res.stderr), res.stderr
    assert f"logs {plan} t -f` follows it" in res.stderr


def _path_without_specdeck() -> str:
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "specdeck").exists()]
    return os.pathsep.join(keep)


def _suggested(stderr: str) -> list[str]:
    return re.findall(r"`([^`]*specdeck [^`]*)`", stderr)


def test_printed_hints_run_as_printed_without_specdeck_on_path(plan, tmp_path):
    env = {"PATH": _path_without_specdeck()}
    assert shutil.which("specdeck", path=env["PATH"]) is None
    assert specdeck("run", plan, "hello", env=env).returncode == 0
    res = specdeck("run", plan, "hello", env=env)  # already done: says how to run it again
    hints = _suggested(res.stderr)
    assert hints and all(h.startswith(shlex.quote(str(SPECDECK)) + " ") for h in hints), res.stderr
    again = next(h for h in hints if "--again" in h)
    ran = subprocess.run(again, shell=True, env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0 and "hello │ hello from specdeck" in ran.stderr, ran.stderr
    # a hint of the error path (main's `hint:` line) too
    res = specdeck("compare", plan, env=env)
    assert res.returncode == 2 and f"{SPECDECK} run {plan} ITEM" in res.stderr
    # with this specdeck on PATH, a hint says just `specdeck`
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "specdeck").symlink_to(SPECDECK)
    res = specdeck("run", plan, "hello", env={"PATH": f"{bindir}{os.pathsep}{env['PATH']}"})
    assert f"`specdeck run {plan} hello --again`" in res.stderr, res.stderr


@pytest.mark.parametrize("cmd", [["status"], ["logs", "hello"], ["compare"], ["export",
                                                                             "--todowrite"]])
def test_a_mistyped_state_is_refused_by_commands_that_read_it(plan, tmp_path, cmd):
    typo = tmp_path / "stat.db"
    res = specdeck(cmd[0], plan, *cmd[1:], "--state", typo)
    assert res.returncode == 2, res.stderr
    assert f"state database {typo}: does not exist" in res.stderr and res.stdout == ""
    assert not typo.exists() and not list(tmp_path.glob("stat.db*"))


def test_commands_that_record_state_start_a_new_one(plan, tmp_path):
    from console.cli import build_parser
    from console.cli.conventions import STATE_USE

    new = tmp_path / "new" / "campaign.db"
    assert specdeck("mark", plan, "review", "done", "--state", new).returncode == 0
    assert new.is_file()
    res = specdeck("status", plan, "--json", "--state", new)
    assert [i["status"] for i in json.loads(res.stdout)["items"] if i["id"] == "review"] == [
        "done"]
    # every command is in the one table that decides
    (subs,) = [a for a in build_parser()._actions if hasattr(a, "choices") and a.choices
               and "run" in a.choices]
    assert set(subs.choices) == set(STATE_USE)


LONG_ID = "train-baseline-with-a-long-identifier"
LONG_TITLE = "Train the baseline drafter " + "with every option the v5 campaign uses " * 3


def test_status_piped_prints_whole_ids_one_row_per_line(tmp_path):
    plan = tmp_path / "wide.yaml"
    plan.write_text(json.dumps({"name": "wide", "hosts": {"here": {
        "local": True, "workdir": str(tmp_path / "w")}}, "items": [
        {"id": LONG_ID, "content": LONG_TITLE, "action": {
            "kind": "shell", "host": "here", "params": {"command": "exit 4"}}},
        {"id": "review", "content": "decide"}]}))
    state = tmp_path / "s.db"
    assert specdeck("run", plan, LONG_ID, "--state", state, env={"COLUMNS": "80"}).returncode == 1
    res = specdeck("status", plan, "--state", state, env={"COLUMNS": "80"})
    assert res.returncode == 0 and "…" not in res.stdout
    (row,) = [ln for ln in res.stdout.splitlines() if "failed" in ln]  # `| grep failed`
    assert LONG_ID in row and LONG_TITLE.strip() in row and "failed exit 4 #1" in row
    assert row.split()[:3] == ["✗", "failed", LONG_ID]


def test_head_1_through_a_real_pipe_exits_141(tmp_path):
    items = [{"id": f"item-{i:04d}", "content": f"item number {i} " + "x" * 60}
             for i in range(1500)]  # well over a pipe's 64 KiB buffer
    plan = tmp_path / "big.yaml"
    plan.write_text(json.dumps({"name": "big", "hosts": {}, "items": items}))
    state = tmp_path / "s.db"
    assert specdeck("mark", plan, "item-0000", "done", "--state", state).returncode == 0
    sh = (f"{shlex.quote(str(SPECDECK))} status {plan} --state {shlex.quote(str(state))} "
          "| head -1; echo \"rc=${PIPESTATUS[0]}\"")
    res = subprocess.run(["bash", "-c", sh], capture_output=True, text=True, timeout=120)
    assert res.stdout.splitlines() == [f"plan big ({plan})", "rc=141"], res
    assert res.stderr == ""


# -- a real terminal ---------------------------------------------------------------------
def _tmux(width: int, height: int, command: str, timeout: float = 60.0) -> str:
    """Run ``command`` in a detached tmux of ``width`` x ``height`` and return everything it
    printed (scrollback included)."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    sock = f"sd-{uuid.uuid4().hex[:8]}"
    base = ["tmux", "-L", sock, "-f", "/dev/null"]
    marker = "__specdeck_done__"
    try:
        # The pane may start at tmux's default size and be resized a moment later, and the
        # shell's COLUMNS may be the first size: the program asks the terminal itself.
        sized = f'while [ "$(stty size)" != "{height} {width}" ]; do sleep 0.05; done'
        subprocess.run(base + ["new-session", "-d", "-x", str(width), "-y", str(height),
                               f"{sized}; env -u COLUMNS -u LINES {command}; "
                               f"echo {marker} $?; sleep 120"], check=True)
        subprocess.run(base + ["set-option", "-g", "history-limit", "20000"], check=True)

        def captured():
            out = subprocess.run(base + ["capture-pane", "-p", "-J", "-S", "-"],
                                 capture_output=True, text=True).stdout
            return out if marker in out else None

        return wait_for(captured, timeout, what=f"`{command}` in tmux")
    finally:
        subprocess.run(base + ["kill-server"], capture_output=True)


def _compare_store(state: Path) -> None:
    from tests.unit.test_compare import _campaign

    names = {"base": "train-baseline", "v4": "train-v5@60", "v5": "train-v5@240",
             "v5 ddtree-8": "train-v5@240 ddtree-8", "v4 ddtree-8": "train-v5@60 ddtree-8"}
    s = Store(str(state))
    s.add_eval_results([dataclasses.replace(r, drafter=names[r.drafter]) for r in _campaign()])
    s.close()


COMPARE_PLAN = """name: cmp
hosts:
  ev: {{local: true, workdir: {wd}}}
items:
  - id: eval
    content: evaluate the drafters against the baseline
    action: {{kind: eval, host: ev, params: {{drafter: drafters/v5, target: models/t}}}}
"""


def test_compare_on_a_120_column_terminal_keeps_every_drafter_and_verdict(tmp_path):
    plan = tmp_path / "cmp.yaml"
    plan.write_text(COMPARE_PLAN.format(wd=tmp_path / "ev"))
    state = tmp_path / "s.db"
    _compare_store(state)
    screen = _tmux(120, 50, f"{shlex.quote(str(SPECDECK))} compare {plan} --state {state}")
    assert f"__specdeck_done__ 0" in screen, screen
    lines = screen.splitlines()
    assert lines[0] == "Verdicts:"
    head = next(i for i, ln in enumerate(lines) if ln.startswith("drafter "))
    assert "…" not in "\n".join(lines[:head + 12])  # (the p_k chart's legend has one)
    assert lines[head].split()[:4] == ["drafter", "verdict", "macro", "tau"]
    summary = lines[head + 2:lines.index("", head)]
    verdicts = {"train-baseline (baseline)": None, "train-v5@60": "≈ no difference",
                "train-v5@240": "▲ better", "train-v5@240 ddtree-8": "▲ better",
                "train-v5@60 ddtree-8": "▲ better"}
    for name, verdict in verdicts.items():
        (row,) = [ln for ln in summary if ln.startswith(name + "  ")]
        assert verdict is None or verdict in row, row
    # (capture -J joins what the terminal itself wrapped: the table drew within 120)
    assert all(len(ln) <= 120 for ln in lines[head:head + 2] + summary)
    assert "(left out at 120 columns:" in screen, screen  # what a wider terminal shows
    # the verdicts and the summary lead; the per-prompt details come after
    assert head < next(i for i, ln in enumerate(lines) if ln.startswith("prompt "))


def test_compare_piped_is_whole_markdown_led_by_the_verdicts(tmp_path):
    plan = tmp_path / "cmp.yaml"
    plan.write_text(COMPARE_PLAN.format(wd=tmp_path / "ev"))
    state = tmp_path / "s.db"
    _compare_store(state)
    res = specdeck("compare", plan, "--state", state, env={"COLUMNS": "80"})
    assert res.returncode == 0 and "…" not in res.stdout.split("```")[0]
    lines = res.stdout.splitlines()
    assert lines[0] == "Verdicts:"
    assert "| train-v5@240 | ▲ better | 3.099 |" in res.stdout
    assert any(ln.startswith("| train-v5@60 | ≈ no difference |") for ln in lines)
