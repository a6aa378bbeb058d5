"""What an operator's words mean, through the installed ``specdeck``: a stopped item stays
stopped (``run --all`` never relaunches it, only ``run ITEM --again``), a failed one is retried
only when named or by its plan's ``retries:``, a skipped need's dependent waits while an
``after:`` one goes ahead, and ``--again`` on a succeeded train item trains again from step 0
in a directory of its own (``--resume`` continues it instead)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import spawn, specdeck, wait_for_line
from tests.conftest import procs_under

PLAN = """name: ops
hosts:
  here: {{local: true, workdir: {wd}}}
items:
  - id: slow
    content: runs until stopped
    action: {{kind: shell, host: here, params: {{command: "echo up; exec sleep 60"}}}}
  - id: after-slow
    content: needs what slow makes
    needs: [slow]
    action: {{kind: shell, host: here, params: {{command: "echo after"}}}}
  - id: broken
    content: always fails
    action: {{kind: shell, host: here, params: {{command: "echo broken; exit 3"}}}}
  - id: flaky
    content: fails twice, then works
    retries: 2
    action: {{kind: shell, host: here, params: {{command: "n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; echo try $n; [ $n -ge 2 ]"}}}}
  - id: gate
    content: skipped by the operator
    action: {{kind: shell, host: here, params: {{command: "echo gate"}}}}
  - id: uses-gate
    content: needs gate's output
    needs: [gate]
    action: {{kind: shell, host: here, params: {{command: "echo uses"}}}}
  - id: after-gate
    content: only comes after gate
    after: [gate]
    action: {{kind: shell, host: here, params: {{command: "echo after gate"}}}}
"""


@pytest.fixture
def ops(tmp_path, monkeypatch):
    p = tmp_path / "ops.yaml"
    p.write_text(PLAN.format(wd=tmp_path / "wd"))
    monkeypatch.setenv("SPECDECK_STATE", str(tmp_path / "state.db"))
    return p


def attempts(tmp_path, item: str) -> int:
    con = sqlite3.connect(tmp_path / "state.db")
    try:
        return con.execute("SELECT COUNT(*) FROM runs WHERE item_id = ?", [item]).fetchone()[0]
    finally:
        con.close()


def statuses(plan) -> dict:
    res = specdeck("status", plan, "--json")
    assert res.returncode == 0, res.stderr
    return {i["id"]: i for i in json.loads(res.stdout)["items"]}


def start_and_stop(plan, *run_args) -> None:
    proc = spawn("run", plan, "slow", *run_args)
    try:
        wait_for_line(proc, "│ up")
        res = specdeck("stop", plan, "slow", "--yes", "--grace", "5")
        assert res.returncode == 0, res.stderr
        assert proc.wait(timeout=60) == 1  # its item did not finish: it was stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_a_stopped_item_is_launched_again_only_by_run_again(ops, tmp_path):
    start_and_stop(ops)
    st = statuses(ops)
    assert st["slow"]["status"] == "stopped" and st["slow"]["run"]["state"] == "stopped"
    table = specdeck("status", ops).stdout
    assert "□ stopped" in table and "✗" not in table.split("slow")[0].splitlines()[-1]

    assert procs_under(tmp_path / "wd") == []
    res = specdeck("run", ops, "--all")
    assert res.returncode == 1  # broken failed; slow was not touched
    assert "slow: stopped by the operator; launched again only when asked" in res.stderr
    assert f"specdeck run {ops} slow --again" in res.stderr
    assert "after-slow: not run, waits on slow (stopped" in res.stderr
    assert attempts(tmp_path, "slow") == 1 and procs_under(tmp_path / "wd") == []

    res = specdeck("run", ops, "after-slow")  # a dependent's need is no reason either
    assert res.returncode == 1 and attempts(tmp_path, "slow") == 1
    res = specdeck("run", ops, "slow")  # naming it without --again: says how
    assert res.returncode == 1 and "--again" in res.stderr and attempts(tmp_path, "slow") == 1
    assert procs_under(tmp_path / "wd") == []

    start_and_stop(ops, "--again")  # the explicit ask: a new attempt
    assert attempts(tmp_path, "slow") == 2
    assert statuses(ops)["slow"]["status"] == "stopped"


def test_a_failed_item_is_retried_when_named_or_by_its_retries(ops, tmp_path):
    specdeck("mark", ops, "slow", "done")
    specdeck("mark", ops, "gate", "done")
    res = specdeck("run", ops, "--all")
    assert res.returncode == 1
    assert attempts(tmp_path, "broken") == 1
    assert attempts(tmp_path, "flaky") == 3  # two failures, two retries, then done
    assert "flaky: failed; retry 1 of 2" in res.stderr and "retry 2 of 2" in res.stderr
    st = statuses(ops)
    assert st["flaky"]["status"] == "done" and st["broken"]["status"] == "failed"

    res = specdeck("run", ops, "--all")  # a failure without retries left waits to be asked
    assert "broken: failed; retried only when asked" in res.stderr
    assert attempts(tmp_path, "broken") == 1 and res.returncode == 0
    res = specdeck("run", ops, "broken")  # named: asked
    assert res.returncode == 1 and attempts(tmp_path, "broken") == 2


def test_a_skipped_need_waits_and_an_after_goes_ahead(ops, tmp_path):
    for i in ("slow", "broken", "flaky"):
        specdeck("mark", ops, i, "done")
    assert specdeck("mark", ops, "gate", "skipped").returncode == 0
    res = specdeck("run", ops, "--all")
    assert res.returncode == 0, res.stderr
    assert ("uses-gate: not run, waits on gate (skipped, and uses-gate needs its output: run "
            "it, or write `after: [gate]`") in res.stderr
    st = statuses(ops)
    assert st["uses-gate"]["status"] == "pending" and attempts(tmp_path, "uses-gate") == 0
    assert st["after-gate"]["status"] == "done"
    assert attempts(tmp_path, "gate") == 0


def test_after_and_retries_are_validated(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(f"""name: bad
hosts:
  here: {{local: true, workdir: {tmp_path}}}
items:
  - id: a
    content: a
    after: [nope, a]
    retries: 1000
""")
    res = specdeck("validate", p)
    assert res.returncode == 2
    assert "field 'after': after unknown item 'nope'" in res.stderr
    assert "an item cannot come after itself" in res.stderr
    assert "retries must be a whole number from 0 to 100, got 1000" in res.stderr


TRAIN_PLAN = """name: tr
hosts:
  here: {{local: true, workdir: {ws}, python: {python}}}
items:
  - id: train
    content: train a tiny drafter
    action:
      kind: train
      host: here
      params:
        config: base.yaml
        overrides: {{train.max_steps: 12, train.log_every: 4, train.checkpoint_every: 6}}
"""


def _metrics(plan, run: int) -> list[dict]:
    res = specdeck("metrics", plan, "train", "--run", str(run), "--jsonl")
    assert res.returncode == 0, res.stderr
    return [json.loads(x) for x in res.stdout.splitlines()]


def _out_dir(tmp_path, attempt: int) -> str:
    con = sqlite3.connect(tmp_path / "state.db")
    try:
        (res,) = con.execute("SELECT result FROM runs WHERE item_id = 'train' AND attempt = ?",
                             [attempt]).fetchone()
    finally:
        con.close()
    return json.loads(res)["out"]


def test_again_on_a_succeeded_train_item_trains_from_step_0_in_a_new_dir(
        tmp_path, tmp_path_factory, monkeypatch):
    pytest.importorskip("torch")
    from core.ml.demo import tiny
    from tests.ml.train.test_train import workspace

    ws = workspace(tmp_path_factory, tiny, tiny.build_tiny_target("qwen3", seed=0))
    plan = ws / "tr.yaml"
    plan.write_text(TRAIN_PLAN.format(ws=ws, python=sys.executable))
    monkeypatch.setenv("SPECDECK_STATE", str(tmp_path / "state.db"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    res = specdeck("run", plan, "train", timeout=600)
    assert res.returncode == 0, res.stderr
    first = _metrics(plan, 1)
    assert min(p["step"] for p in first) == 4 and max(p["step"] for p in first) == 12

    res = specdeck("run", plan, "train", "--again", timeout=600)
    assert res.returncode == 0, res.stderr
    assert "attempt 2 starts fresh at step 0 in its own output dir (attempt 1 succeeded" in \
        res.stderr
    second = _metrics(plan, 2)
    assert {p["step"] for p in second if p["name"] == "loss"} == {4, 8, 12}  # trained again
    out1, out2 = _out_dir(tmp_path, 1), _out_dir(tmp_path, 2)
    assert out1 != out2
    assert sorted(x.name for x in Path(out2).glob("step_*.pt")) == ["step_12.pt", "step_6.pt"]
    assert (Path(out1) / "step_12.pt").is_file()  # attempt 1's checkpoints untouched

    res = specdeck("run", plan, "train", "--again", "--resume", timeout=600)
    assert res.returncode == 0, res.stderr
    assert "attempt 3 resumes attempt 2 (succeeded) from its checkpoint step_12.pt" in res.stderr
    assert _out_dir(tmp_path, 3) == out2


def test_run_again_checks_needs_as_any_run(ops, tmp_path):
    """``--again`` asks for one more attempt, not for skipping the needs: an item marked done
    whose need is not done waits (exit 1, nothing launched), and runs once its need is done.
    The console's R does the same (tests/ui/test_operator_keys.py::
    test_run_again_checks_needs_as_the_cli_does)."""
    assert specdeck("mark", ops, "after-slow", "done").returncode == 0
    res = specdeck("run", ops, "after-slow", "--again")
    assert res.returncode == 1, res.stderr
    assert "after-slow: not run, waits on slow (pending)" in res.stderr
    assert attempts(tmp_path, "after-slow") == 0 and procs_under(tmp_path / "wd") == []
    assert statuses(ops)["after-slow"]["status"] == "done"

    assert specdeck("mark", ops, "slow", "done").returncode == 0
    res = specdeck("run", ops, "after-slow", "--again")
    assert res.returncode == 0, res.stderr
    assert "│ after" in res.stderr and attempts(tmp_path, "after-slow") == 1
