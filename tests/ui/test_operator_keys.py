"""What the operator's keys mean: a stopped item stays stopped (A never relaunches it, r asks
first and does), s and d ask first on an action item, u shows where it undoes something, and
R on a succeeded train item says it trains again from step 0 (a failed one: which checkpoint
it resumes). Real Store, real Runner, local hosts; event-driven waits."""

from __future__ import annotations

from pathlib import Path

from console import messages as m
from console.screens.confirm import ConfirmModal
from console.widgets.plan_list import PlanPane, item_prompt
from core.plans.planfile import load_plan
from core.state.store import Store
from tests.conftest import procs_under
from tests.ui.conftest import build, pick, process_alive, running, settle, wait_for

PLAN = """\
name: ops
hosts:
  here: {{local: true, workdir: {root}/here}}
items:
  - id: slow
    content: Runs until stopped
    action: {{kind: shell, host: here, params: {{command: "echo started; exec sleep {slow_s}"}}}}
  - id: after-slow
    content: Needs what slow makes
    needs: [slow]
    action: {{kind: shell, host: here, params: {{command: "echo after"}}}}
  - id: stop-old
    content: Stop the old run
    action: {{kind: shell, host: here, params: {{command: "echo stopping"}}}}
  - id: train-new
    content: Needs the GPUs stop-old frees
    needs: [stop-old]
    action: {{kind: shell, host: here, params: {{command: "echo training"}}}}
  - id: report
    content: Only comes after stop-old
    after: [stop-old]
    action: {{kind: shell, host: here, params: {{command: "echo report"}}}}
  - id: train
    content: Train a drafter
    action: {{kind: train, host: here, params: {{config: train.yaml}}}}
"""

TRAIN_YAML = """\
target: target
out_dir: runs/default
drafter: {block_size: 8, num_layers: 2, target_layer_ids: [0, 2]}
data: {features: feats}
train: {max_steps: 20, batch_size: 1}
"""


def _plan(tmp_path: Path, slow_s: int = 60):
    """The plan; ``slow`` runs ``slow_s`` seconds (until stopped, for the tests that stop it)."""
    (tmp_path / "train.yaml").write_text(TRAIN_YAML)
    path = tmp_path / "ops.yaml"
    path.write_text(PLAN.format(root=tmp_path, slow_s=slow_s))
    return load_plan(path)


def of(messages, kind, **match):
    return [x for x in messages if isinstance(x, kind)
            and all(getattr(x, k) == v for k, v in match.items())]


async def _stop_selected(pilot) -> None:
    await pilot.press("x")
    await pilot.pause()
    assert isinstance(pilot.app.screen, ConfirmModal)
    await pilot.press("y")
    await settle(pilot)


async def test_a_stopped_item_is_never_relaunched_by_run_all(tmp_path):
    plan = _plan(tmp_path)
    store = Store(str(tmp_path / "state.db"))
    try:
        async with running(plan, store, select="slow") as (app, pilot, seen):
            await pilot.press("r", "y")
            started = await wait_for(seen, m.RunStarted, lambda x: x.item_id == "slow",
                                     pilot=pilot)
            await wait_for(seen, m.LogLinesArrived, lambda x: x.run_id == started.run_id,
                           pilot=pilot)
            await _stop_selected(pilot)
            assert app.statuses["slow"] == "stopped"
            line = item_prompt(plan.item("slow"), "stopped").renderables[0]
            assert line.plain.startswith("□ slow") and "red" not in str(line.spans[0].style)
            before = procs_under(tmp_path / "here")

            await pilot.press("A")
            await settle(pilot)
            assert len(store.runs_for_item("slow")) == 1  # A launched nothing for it
            assert [x.run_id for x in of(seen, m.RunStarted, item_id="slow")] == [
                started.run_id]
            assert procs_under(tmp_path / "here") == before == []
            assert app.statuses["slow"] == "stopped"
            assert app.statuses["after-slow"] == "pending"  # its need is stopped: it waits
            assert app.statuses["stop-old"] == "done"  # A ran what could run

            await pick(pilot, "slow")  # (A's cursor followed the runs it started)
            await pilot.press("r")  # r asks, saying it was stopped, and does run it
            await pilot.pause()
            modal = app.screen
            assert isinstance(modal, ConfirmModal) and "it was stopped" in modal.body
            await pilot.press("y")
            again = await wait_for(seen, m.RunStarted, lambda x: x.item_id == "slow"
                                   and x.run_id != started.run_id, pilot=pilot)
            assert store.run(again.run_id).attempt == 2
            await wait_for(seen, m.LogLinesArrived, lambda x: x.run_id == again.run_id,
                           pilot=pilot)
            pid = store.run(again.run_id).pid
            await _stop_selected(pilot)
            assert not process_alive(pid)
    finally:
        await_procs_gone(tmp_path)
        store.close()


async def test_run_again_checks_needs_as_the_cli_does(tmp_path):
    """R on an item marked done whose need is not done launches nothing and says what it
    waits on, as ``specdeck run ITEM --again`` does (tests/cli/test_operator_words.py::
    test_run_again_checks_needs_as_any_run); once the need is done, R runs it."""
    plan = _plan(tmp_path)
    store = Store(str(tmp_path / "state.db"))
    store.set_status("after-slow", "done")
    try:
        async with running(plan, store, select="after-slow") as (app, pilot, seen):
            await pilot.press("R")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmModal)
            await pilot.press("y")
            notice = await wait_for(seen, m.NoticePosted, lambda x: x.item_id == "after-slow"
                                    and "waits on" in x.message, pilot=pilot)
            await settle(pilot)
            assert "after-slow: not run, waits on slow (pending)" in notice.message
            assert store.runs_for_item("after-slow") == [] and not of(seen, m.RunStarted)
            assert app.statuses["after-slow"] == "done"

            store.set_status("slow", "done")
            app.action_reload()
            await pick(pilot, "after-slow")
            await pilot.press("R", "y")
            await wait_for(seen, m.RunEnded, lambda x: x.item_id == "after-slow", pilot=pilot)
            await settle(pilot)
            assert [r.state for r in store.runs_for_item("after-slow")] == ["succeeded"]
    finally:
        await_procs_gone(tmp_path)
        store.close()


async def test_skip_and_done_ask_first_and_u_shows_where_it_undoes(tmp_path):
    plan = _plan(tmp_path, slow_s=0)  # `A` below runs slow too: nothing here waits on it
    store = Store(str(tmp_path / "state.db"))
    seen: list = []
    app = build(plan, store)

    def footer_keys() -> set[str]:
        return {k.key for k in app.screen.query("FooterKey")}

    try:
        async with app.run_test(size=(140, 40), message_hook=seen.append) as pilot:
            await pick(pilot, "stop-old")
            assert "u" not in footer_keys()  # pending: nothing to undo
            await pilot.press("s")
            await pilot.pause()
            modal = app.screen
            assert isinstance(modal, ConfirmModal) and "Skip" in modal.title_text
            assert "train-new" in modal.body and "wait" in modal.body
            await pilot.press("n")
            await settle(pilot)
            assert app.statuses["stop-old"] == "pending"  # cancelled: nothing changed
            await pilot.press("d")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmModal) and "done" in app.screen.title_text
            await pilot.press("n")
            await settle(pilot)
            assert app.statuses["stop-old"] == "pending"

            await pilot.press("s")
            await pilot.pause()
            await pilot.press("y")
            await settle(pilot)
            assert app.statuses["stop-old"] == "skipped"
            assert "u" in footer_keys()  # skipped: u undoes it, and says so

            await pilot.press("A")  # the skipped need's dependent waits; `after` goes ahead
            await settle(pilot)
            assert app.statuses["train-new"] == "pending" and not store.runs_for_item(
                "train-new")
            assert app.statuses["report"] == "done"
            assert store.runs_for_item("stop-old") == []
            waits = [x.message for x in of(seen, m.NoticePosted) if x.item_id == "train-new"]
            assert any("stop-old (skipped, and train-new needs its output" in w for w in waits)

            await pick(pilot, "stop-old")
            await pilot.press("u")
            await settle(pilot)
            assert app.statuses["stop-old"] == "pending"
            assert "u" not in footer_keys()
    finally:
        await_procs_gone(tmp_path)
        store.close()


def await_procs_gone(tmp_path: Path) -> None:
    assert procs_under(tmp_path / "here") == []  # nothing of this plan left running


def _train_runs(store: Store, states: list[str]) -> None:
    for n, state in enumerate(states, 1):
        run_id = f"train-0101-{n:02d}"
        store.claim_run(run_id, "train", "train", "here", owner="test:1:1")
        store.update_run(run_id, state="running", capsule=f"/caps/{run_id}")
        store.add_artefact(run_id, "train", "checkpoint", f"/caps/{run_id}/out/step_{10 * n}.pt",
                           10 * n)
        store.end_run(run_id, state, exit_code=0 if state == "succeeded" else 1)
    store.set_status("train", "done" if states[-1] == "succeeded" else "failed")


async def test_again_on_a_train_item_says_fresh_or_which_checkpoint(tmp_path):
    plan = _plan(tmp_path)
    store = Store(str(tmp_path / "state.db"))
    _train_runs(store, ["succeeded"])
    try:
        async with running(plan, store, select="train", size=(140, 40)) as (app, pilot, _):
            await pilot.press("R")
            await pilot.pause()
            modal = app.screen
            assert isinstance(modal, ConfirmModal)
            assert "starts fresh at step 0 in its own output dir" in modal.body
            assert "attempt 1 succeeded" in modal.body and "--resume" in modal.body
            await pilot.press("n")
            await settle(pilot)
            assert len(store.runs_for_item("train")) == 1  # cancelled: nothing started
    finally:
        store.close()

    store = Store(str(tmp_path / "state2.db"))
    _train_runs(store, ["succeeded", "failed"])
    try:
        async with running(plan, store, select="train", size=(140, 40)) as (app, pilot, _):
            await pilot.press("r")
            await pilot.pause()
            body = app.screen.body
            assert "resumes attempt 2 (failed) from its checkpoint step_20.pt (step 20)" in body
            await pilot.press("n")
            await settle(pilot)
    finally:
        store.close()
