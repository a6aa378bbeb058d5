"""The runner against a host in memory (tests/unit/fakehost.py) and a real SQLite store:
what run_items launches, holds and reports (a RunSummary), what reconcile finds (RunChange
records), what adopt refuses before recording anything, and that the reconcile a reconnect
starts is kept and ended by close. Real hosts: tests/integration."""

from __future__ import annotations

import json

import pytest

from core.plans.adopt_spec import AdoptSpec
from core.errors import InvalidInput
from core.hosts.base import HostState
from core.plans.planfile import parse_plan
from core.runs import life
from core.state.records import RunChange, RunSummary
from core.runs.runner import Runner
from core.state.store import Store
from tests.unit.fakehost import FakeHost


def _shell(iid: str, command: str, **extra) -> dict:
    return {"id": iid, "content": iid, **extra,
            "action": {"kind": "shell", "host": "gpu", "params": {"command": command}}}


ITEMS = [_shell("a", "make a"), _shell("b", "make b", needs=["a"]),
         {"id": "m", "content": "look at the curves"},
         _shell("f", "make f"), _shell("g", "make g", needs=["f"])]


@pytest.fixture
def world(tmp_path):
    """A plan on one fake host, its store and runner: ``(runner, store, host)``."""
    host = FakeHost(programs={"make a": (b"a\n", 0), "make b": (b"b\n", 0),
                              "make f": (b"oops\n", 1)})
    plan = parse_plan(json.dumps({"name": "unit", "hosts": {"gpu": {"local": True,
                                                                    "workdir": "/w"}},
                                  "items": ITEMS}), "unit.yaml")
    store = Store(tmp_path / "s.db")
    runner = Runner(plan, store, hosts={"gpu": host}, poll=0.01)
    yield runner, store, host
    store.close()


async def test_run_items_runs_needs_first_and_sums_up(world):
    runner, store, _ = world
    summary = await runner.run_items(None)
    assert isinstance(summary, RunSummary)
    assert sorted(summary.done) == ["a", "b"] and summary.failed == ("f",)
    assert summary.waiting == ("g",) and summary.manual == ("m",)
    assert not (summary.unreachable or summary.held or summary.started or summary.unadopted)
    a, b = store.latest_run("a"), store.latest_run("b")
    assert (a.state, b.state, store.latest_run("f").state) == ("succeeded", "succeeded", "failed")
    assert b.started_at >= a.ended_at  # b needs a: launched once a ended
    assert store.log_bytes(a.id) == b"a\n" and store.latest_run("g") is None
    assert runner.statuses() == {"a": "done", "b": "done", "m": "pending", "f": "failed",
                                 "g": "pending"}
    await runner.close()


async def test_an_unreachable_host_counts_as_such_and_launches_nothing(world):
    runner, store, host = world
    host.reachable = False
    summary = await runner.run_items(["a", "b"])
    assert summary.unreachable == ("a",) and summary.waiting == ("b",)
    assert not summary.failed and store.latest_run("a") is None
    await runner.close()


async def test_a_stopped_item_is_held_until_asked_again(world):
    runner, store, _ = world
    store.set_status("a", "stopped", reason="stopped by the operator")
    summary = await runner.run_items(["a"])
    assert summary.held == ("a",) and store.latest_run("a") is None
    runner.again.add("a")
    assert (await runner.run_items(["a"])).done == ("a",)
    assert store.latest_run("a").state == "succeeded"
    await runner.close()


async def test_reconcile_reports_what_ended_while_away_and_what_it_cannot_reach(world):
    runner, store, host = world
    host.held.update({"make a", "make f"})
    runner.detach = True  # start them and leave them to the host
    summary = await runner.run_items(["a", "f"])
    assert sorted(summary.started) == ["a", "f"]
    a, f = store.latest_run("a"), store.latest_run("f")
    host.end(a.capsule, 0, b"a\n")
    changes = await runner.reconcile()
    assert changes == [RunChange(a.id, "a", "running", "succeeded", exit_code=0)]
    assert runner.statuses()["a"] == "done" and store.log_bytes(a.id) == b"a\n"
    host.end(f.capsule, 2)
    host.reachable = False
    (change,) = await runner.reconcile()
    assert (change.run, change.was, change.now) == (f.id, "running", "unknown")
    assert "connection refused" in change.why and store.run(f.id).state == "running"
    host.reachable = True
    (change,) = await runner.reconcile()
    assert (change.now, change.exit_code) == ("failed", 2)
    await runner.close()


async def test_reconcile_interrupts_a_run_no_action_or_launch_is_behind(world):
    """life.settle's moves, through the runner: a live run whose item is no longer an action
    (``m`` is manual), and one still starting whose specdeck died before launching it, end
    interrupted, their items failed; a starting run another live specdeck owns is kept (this
    specdeck's own, found by its reconcile, is no longer being launched: interrupted)."""
    runner, store, host = world
    name, pid, start = life.owner_token().rsplit(":", 2)
    store.claim_run("m-1", "m", "shell", "gpu", owner=runner.owner)
    store.claim_run("a-1", "a", "shell", "gpu", owner=f"{name}:{pid}:{int(start) + 1}")
    store.claim_run("f-1", "f", "shell", "gpu", owner=life.owner_token())
    runner.owner = "another specdeck"  # f-1's launcher is alive and not this one
    changes = await runner.reconcile()
    assert sorted(changes, key=lambda c: c.run) == [
        RunChange("a-1", "a", "starting", "interrupted", error=life.NOT_LAUNCHED),
        RunChange("m-1", "m", "starting", "interrupted", error=life.NOT_AN_ACTION)]
    assert store.item_statuses() == {"a": "failed", "m": "failed"}
    assert store.status_history("m")[-1].reason == f"run m-1 interrupted: {life.NOT_AN_ACTION}"
    assert store.run("f-1").state == "starting"
    runner.owner = life.owner_token()  # this one: it is not launching it any more
    (change,) = await runner.reconcile()
    assert (change.run, change.now, change.error) == ("f-1", "interrupted", life.NOT_LAUNCHED)
    await runner.close()


async def test_adopt_refuses_before_recording_anything(world):
    runner, store, _ = world
    with pytest.raises(InvalidInput, match="'m' is manual"):
        await runner.adopt("m", AdoptSpec(pid=1234, log="/w/log"))
    with pytest.raises(InvalidInput, match="has no host 'cpu'"):
        await runner.adopt("a", AdoptSpec(pid=1234, log="/w/log"), host_name="cpu")
    assert store.runs_for_item("a") == [] and store.events(kinds=["adopted"]) == []
    await runner.close()


async def test_the_reconcile_a_reconnect_starts_is_kept_and_ended_by_close(world):
    runner, _, host = world
    runner.reconcile_on_reconnect = True
    await runner.host("gpu")
    host._set_status(HostState.RECONNECTING, "dropped")
    host._set_status(HostState.CONNECTED)
    (task,) = runner._reconciles  # referenced while it runs
    await runner.close()
    assert task.done() and not runner._reconciles
