"""The Session's verbs against a real SQLite store: the rules both faces share (no mark while
a run is live, a rerun checks needs, the tau step filter), the read-only opening that builds
no runner and no host, and what the verbs read back. Hosts are local folders; an ssh host
appears only where the test shows it is never built."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from core.errors import InvalidInput, SpecdeckError
from core.plans.planfile import load_plan
from core.state.records import EvalRow
from core.session import Session, at_step
from core.state.store import Store

PLAN = """\
name: sess
hosts:
  here: {{local: true, workdir: {root}/here}}
items:
  - id: a
    content: The need
    action: {{kind: shell, host: here, params: {{command: "echo a"}}}}
  - id: b
    content: Needs a
    needs: [a]
    action: {{kind: shell, host: here, params: {{command: "echo b"}}}}
  - id: review
    content: A manual step
"""


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(PLAN.format(root=tmp_path))
    return load_plan(path)


@pytest.fixture
def state(tmp_path):
    return tmp_path / "s.db"


def _row(drafter: str, role: str, step: int | None, prompt: str = "p1") -> EvalRow:
    return EvalRow(run_id=f"r-{drafter}", item_id="eval", drafter=drafter, role=role,
                   prompt_id=prompt, tau=3.0, rounds=[3, 3], per_position=[0.5], step=step)


def test_at_step_keeps_baselines_and_refuses_a_step_nobody_evaluated():
    rows = [_row("base", "baseline", None), _row("t@100", "drafter", 100),
            _row("t@200", "drafter", 200), _row("v5", "drafter", None)]
    assert [r.drafter for r in at_step(rows, 100)] == ["base", "t@100"]
    with pytest.raises(InvalidInput) as e:
        at_step(rows, 150)
    assert e.value.message == "no tau evaluated at step 150"
    assert e.value.hint == "evaluated steps: 100, 200"
    with pytest.raises(InvalidInput) as e:
        at_step([_row("base", "baseline", None)], 100)  # baselines alone are no answer
    assert "no checkpoint has been evaluated yet" in e.value.hint


async def test_eval_rows_read_the_store_with_the_step_filter(plan, state):
    s = Store(str(state))
    s.add_eval_results([_row("base", "baseline", None), _row("t@100", "drafter", 100),
                        _row("t@100", "drafter", 100, "p2")])
    async with Session.read(plan, store=s) as session:
        assert len(session.eval_rows()) == 3 and session.eval_rows("other") == []
        assert {r.prompt_id for r in session.eval_rows(step=100) if r.role == "drafter"} == {
            "p1", "p2"}
        with pytest.raises(InvalidInput):
            session.eval_rows(step=7)
    s.close()


async def test_mark_is_refused_while_a_run_is_live(plan, state):
    async with Session.open(plan, state=state) as session:
        session.store.claim_run("a-1", "a", "shell", "here", owner="test")
        for status in ("done", "skipped", "pending"):
            with pytest.raises(InvalidInput) as e:
                session.mark("a", status, stop_hint="x")
            assert e.value.message == "item 'a' has a live run; stop it first (x)"
        assert session.statuses()["a"] == "pending"  # nothing was written
        session.mark("a", "in_progress", stop_hint="x")  # what the item is: allowed
        session.store.update_run("a-1", state="running")  # launched, then it succeeds
        session.store.end_run("a-1", "succeeded", exit_code=0)
        session.mark("a", "done", stop_hint="x")
        assert session.statuses() == {"a": "done", "b": "pending", "review": "pending"}
        with pytest.raises(InvalidInput):
            session.mark("nope", "done", stop_hint="x")  # an unknown item names the plan


async def test_run_again_checks_needs_and_does_not_outlive_the_call(plan, state):
    """A rerun of an item marked done whose need is not done waits (nothing claimed), and the
    ask is gone afterwards: running everything later does not relaunch it."""
    async with Session.open(plan, state=state) as session:
        session.mark("b", "done", stop_hint="x")
        summary = await session.run(["b"], again=True)
        assert summary.waiting == ("b",) and session.runs_of("b") == []
        assert not session.runner.again
        with pytest.raises(InvalidInput):
            await session.run(None, again=True)  # again names its items

        session.mark("a", "done", stop_hint="x")
        summary = await session.run(["b"])  # done, not asked again: nothing runs
        assert summary.done == ("b",) and session.runs_of("b") == []
        summary = await session.run(["b"], again=True)  # its need done: a real run
        assert summary.done == ("b",)
        assert [r.state for r in session.runs_of("b")] == ["succeeded"]
        assert session.latest_run("b").attempt == 1 and session.live_run("b") is None


async def test_overview_and_refresh_without_anything_live(plan, state):
    s = Store(str(state))
    s.claim_run("a-1", "a", "shell", "here", owner="test")
    s.end_run("a-1", "failed", exit_code=2)
    s.set_status("a", "failed")
    s.journal("alert", "tau dropped", item_id="a", run_id="a-1")
    async with Session.read(plan, store=s) as session:
        assert await session.refresh() == []  # nothing live, nothing behind
        seen = session.overview()
        assert seen.statuses == {"a": "failed", "b": "pending", "review": "pending"}
        assert list(seen.latest) == ["a"] and seen.latest["a"].exit_code == 2
        assert [a.message for a in seen.alerts] == ["tau dropped"]
        assert seen.watchers == {} and session.watcher_status("a-1") is None
    s.close()


async def test_adopt_and_stop_refuse_what_has_no_run(plan, state):
    async with Session.open(plan, state=state) as session:
        with pytest.raises(InvalidInput, match="manual"):
            await session.adopt("review", None)
        with pytest.raises(SpecdeckError, match="not live"):
            await session.stop("nope-1", grace_s=1)
        run, n = await session.end_leftovers("a", grace_s=1)
        assert run is None and n == 0


def test_run_preview_says_the_attempt_and_where_it_runs(plan, state):
    s = Store(str(state))
    s.claim_run("a-1", "a", "shell", "here", owner="test")
    s.end_run("a-1", "failed", exit_code=1)
    session = Session.open(plan, store=s)
    would = session.run_preview("a")
    assert would.attempt == 2 and would.detached
    assert session.run_preview("b").attempt == 1
    s.close()


def test_read_builds_no_runner_nor_host(tmp_path):
    """A look (status with nothing live, compare, export) loads neither the runner nor an
    ssh host's transport, though the plan has an ssh host; a verb that needs the runner
    builds it then."""
    plan = tmp_path / "p.yaml"
    plan.write_text(textwrap.dedent("""\
        name: far
        hosts:
          gpu: {ssh: nobody@192.0.2.1, workdir: /w}
        items:
          - id: t
            content: train
            action: {kind: shell, host: gpu, params: {command: "true"}}
        """))
    code = textwrap.dedent(f"""\
        import asyncio, sys
        from core.plans.planfile import load_plan
        from core.session import Session

        async def main():
            async with Session.read(load_plan({str(plan)!r}), state={str(tmp_path / 's.db')!r}) as s:
                assert await s.refresh() == [] and s.statuses() == {{"t": "pending"}}
                s.overview(); s.eval_rows()
                assert "core.runs.runner" not in sys.modules and "asyncssh" not in sys.modules
                assert s.runner.hosts["gpu"].name == "gpu"  # built on first use
                assert "core.runs.runner" in sys.modules

        asyncio.run(main())
        """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
