"""Class 2 of issue 28: the log follower never dies of one line. A fault while parsing a line,
storing its points or showing it is caught per line and journaled once; the run's state
follows its process (running while it runs, then its exit status), never the parser's
fate. A plan's metrics regex runs with a bound on time per line, so catastrophic
backtracking costs a bounded moment, and ``validate`` warns about nested quantifiers."""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.capsules import metrics_sources
from core.plans.planfile import parse_plan
from core.runs.runner import Runner
from core.state.store import Store
from tests.fault.conftest import cli, digest, local_plan, rows


def _script(tmp_path, flag, exit_code: int = 0):
    """Prints good and poisoned lines, waits for ``flag``, prints more, exits."""
    s = tmp_path / "trainer.sh"
    s.write_text(f"""echo '{{"step": 1, "loss": 1.0}}'
echo 'BOOM step 2'
echo '{{"step": 3, "loss": 0.5}}'
echo 'POISON'
n=0; while [ ! -e {flag} ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done
echo 'BOOM step 4'
echo '{{"step": 5, "loss": 0.25}}'
exit {exit_code}
""")
    return s


def _plan(tmp_path, script):
    return parse_plan(f"""
name: fo
hosts:
  here: {{local: true, workdir: {tmp_path / 'wd'}}}
items:
  - id: m
    content: a trainer whose lines trip the parser
    action: {{kind: shell, host: here, params: {{command: "bash {script}",
              metrics: {{regex: ['step (?P<step>\\d+) (?P<x>\\w*)'], hf_dicts: true}}}}}}
""")


async def _until(pred, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def _run_with_fault(tmp_path, exit_code: int = 0):
    flag = tmp_path / "go"
    script = _script(tmp_path, flag, exit_code)
    before = digest(script)
    store = Store(tmp_path / "s.db")
    runner = Runner(_plan(tmp_path, script), store, poll=0.05)
    task = asyncio.create_task(runner.run_item(runner.plan.item("m")))
    await _until(lambda: store.latest_run("m") is not None
                 and b"POISON" in store.log_bytes(store.latest_run("m").id))
    run = store.latest_run("m")
    assert run.state == "running"  # the faults came and went: the run follows its process
    flag.touch()
    status = await task
    await runner.close()
    assert digest(script) == before
    return store, store.run(run.id), status


def _notes(store):
    return {e.data["source"]: e.message for e in store.events(kinds=["metrics_dropped"])}


@pytest.mark.parametrize("exit_code, status, state", [(0, "done", "succeeded"),
                                                      (7, "failed", "failed")])
async def test_a_line_whose_parse_raises_is_kept_and_told_once(tmp_path, monkeypatch, exit_code,
                                                               status, state):
    real = metrics_sources.LineMetrics.parse

    def parse(self, line):
        if b"BOOM" in line:
            raise ValueError("injected parser fault")
        return real(self, line)

    monkeypatch.setattr(metrics_sources.LineMetrics, "parse", parse)
    store, run, got = await _run_with_fault(tmp_path, exit_code)
    assert (got, run.state, run.exit_code) == (status, state, exit_code)
    assert run.log_lines == 6 and store.log_bytes(run.id).count(b"BOOM") == 2
    assert [(p.step, p.name) for p in store.metric_rows(run.id)] == [
        (1, "loss"), (3, "loss"), (5, "loss")]
    notes = _notes(store)
    assert list(notes) == ["log parser"]  # one notice, though two lines failed
    assert "injected parser fault" in notes["log parser"] and "line is kept" in notes["log parser"]


async def test_points_that_fail_to_store_never_cost_their_lines(tmp_path, monkeypatch):
    real = Store.append_log

    def append_log(self, run_id, offset, data, metrics=(), artefacts=()):
        if b"POISON" in data and metrics:
            raise OverflowError("injected: Python int too large to convert to SQLite INTEGER")
        return real(self, run_id, offset, data, metrics, artefacts)

    monkeypatch.setattr(Store, "append_log", append_log)
    store, run, got = await _run_with_fault(tmp_path)
    assert (got, run.state, run.exit_code) == ("done", "succeeded", 0)
    assert run.log_lines == 6 and store.log_bytes(run.id).endswith(b"BOOM step 4\n"
                                                                 b'{"step": 5, "loss": 0.25}\n')
    notes = _notes(store)
    assert list(notes) == ["log store"] and "the lines are kept" in notes["log store"]
    assert (5, "loss") in [(p.step, p.name) for p in store.metric_rows(run.id)]


async def test_a_display_fault_never_ends_the_follower(tmp_path, monkeypatch):
    import core.runs.runner

    def describe(line):
        raise KeyError("injected display fault")

    monkeypatch.setattr(core.runs.runner, "describe", describe)
    store, run, got = await _run_with_fault(tmp_path)
    assert (got, run.state, run.log_lines) == ("done", "succeeded", 6)
    assert [p.step for p in store.metric_rows(run.id)] == [1, 3, 5]
    assert list(_notes(store)) == ["log display"]


BAD_RX = r"(?P<step>\d+) (?P<v>(a+)+)$"


def test_catastrophic_regex_is_bounded_per_line_and_told(tmp_path):
    lines = []
    for i in range(1, 9):
        lines += [f"{i} " + "a" * 3000 + "!", f"ok {i} v={i * 10}"]
    f = tmp_path / "lines.txt"
    f.write_text("\n".join(lines) + "\n")
    before = digest(f)
    plan = local_plan(tmp_path, f"""  - id: m
    content: a regex that backtracks catastrophically on the a-lines
    action:
      kind: shell
      host: here
      params:
        command: "cat {f}"
        metrics: {{regex: [{json.dumps(BAD_RX)}, 'ok (?P<step>\\d+) v=(?P<good>\\d+)']}}
""")
    val = cli("validate", plan)
    assert val.returncode == 0 and "warning: item m: metrics regex" in val.stderr, val.stderr
    assert "nested quantifiers" in val.stderr and val.stderr.count("warning") == 1
    db = tmp_path / "s.db"
    t0 = time.monotonic()
    res = cli("--state", db, "run", plan, "m", timeout=300)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert took < 60, took  # unbounded, one such line takes longer than the universe's age
    assert rows(db, "SELECT state, exit_code, log_lines FROM runs") == [("succeeded", 0, 16)]
    assert cli("--state", db, "logs", plan, "m").stdout == f.read_text()
    assert rows(db, "SELECT step, name, value FROM metrics ORDER BY step") == [
        (i, "good", i * 10.0) for i in range(1, 9)]
    notes = dict(rows(db, "SELECT json_extract(data, '$.source'), message FROM events "
                          "WHERE kind = 'metrics_dropped'"))
    assert sorted(notes) == ["regex 1", "regex 1 off"], notes
    assert "ran over 50 ms" in notes["regex 1"] and "no longer applied" in notes["regex 1 off"]
    assert digest(f) == before


def test_regex_timeout_bounds_one_line():
    p = metrics_sources.LineMetrics([BAD_RX, r"(?P<step>\d+) v=(?P<good>\d+)"])
    t0 = time.monotonic()
    assert p.parse(b"1 " + b"a" * 5000 + b"!") == []
    assert time.monotonic() - t0 < 2.0
    assert [s for s, _ in p.notices] == ["regex 1"]
    for _ in range(3):
        p.parse(b"1 " + b"a" * 5000 + b"!")
    assert p.strikes == [3, 0]
    assert [s for s, _ in p.notices] == ["regex 1", "regex 1 off"]
    t0 = time.monotonic()
    assert p.parse(b"1 " + b"a" * 5000 + b"!") == []  # no longer applied: no time spent on it
    assert time.monotonic() - t0 < metrics_sources.REGEX_TIMEOUT_S
    assert p.parse(b"3 v=4") == [(3, "good", 4)]  # the other regex goes on


@pytest.mark.parametrize("rx, warned", [(r"(?P<step>\d+) (?P<v>(a+)+)$", True),
                                        (r"(?P<step>\d+)(?P<v>(\w*)*)", True),
                                        (r"(?P<step>\d+) (?P<v>(?:x|y){2,}z+)", False),
                                        (r"step (?P<step>\d+) loss (?P<loss>[\d.]+)", False),
                                        (r"(?P<step>\d+)(?P<v>(ab){1,3})", False)])
def test_validate_warns_about_nested_quantifiers_only(rx, warned):
    assert bool(metrics_sources.regex_warnings(rx)) is warned


_num = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                 st.integers(-(10 ** 30), 10 ** 30).map(str),
                 st.integers(19, 400).map(lambda n: "9" * n),
                 st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "inf", "1e400", "x"]))
_line = st.one_of(
    st.builds(lambda s, v: f'{{"step": {s}, "loss": {v}, "a": [{v}, {{"b": {v}}}]}}', _num, _num),
    st.builds(lambda s, v: f"step {s} loss {v}", _num, _num),
    st.builds(lambda s, v: f"{{'loss': {v}, 'global_step': {s}}}", _num, _num),
    st.builds(lambda v: f"{{'loss': {v}, 'epoch': 0.5}}", _num),
    st.builds(lambda s: f'{{"event": "checkpoint", "step": {s}, "path": "c{s[:20]}.pt"}}', _num),
    st.builds(lambda s: f"{s} " + "a" * 40 + "!", _num),
    st.text(max_size=30).map(lambda t: t.replace("\n", " ").replace("\r", " ")))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_line, min_size=1, max_size=25))
def test_fuzz_the_follower_stores_every_line_of_hostile_metric_output(tmp_path_factory, lines):
    from core.hosts.local import LocalHost
    from core.capsules.jobs import CapsuleState, follow

    d = tmp_path_factory.mktemp("f")
    log = d / "log"
    data = ("\n".join(lines) + "\n").encode()
    log.write_bytes(data)
    store = Store(d / "s.db")
    store.claim_run("r", "m", "shell", "here", owner="t")
    parser = metrics_sources.LineMetrics([r"step (?P<step>\S+) loss (?P<loss>\S+)", BAD_RX],
                                         hf_dicts=True)

    async def ended():
        return CapsuleState("ended", 0)

    st_ = asyncio.run(follow(LocalHost("here", workdir=str(d)), store, "r", str(d), regex=parser,
                             inspector=ended, log_path=str(log), poll=0.01))
    assert st_.state == "ended"
    assert store.log_bytes("r") == data  # never a lost line
    assert store.run("r").log_lines == len(lines)
    for p in store.metric_rows("r"):
        assert -(2 ** 63) <= p.step < 2 ** 63 and math.isfinite(p.value)
    store.close()
