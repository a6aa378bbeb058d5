"""A run's life (core.runs.life): the transition table as a real store keeps it (SQLite on a
temp file), the run-state -> item-status mapping, what reconcile decides, what an end and a
reconcile write (life.end, life.settle), and that every state the code writes is one the table
names (read from core/ with ast)."""

from __future__ import annotations

import ast
import itertools
from functools import partial
from pathlib import Path

import pytest

from core.capsules.jobs import CapsuleState
from core.errors import RunMoveRefused
from core.runs import life
from core.runs.events import RunEnded, StatusChanged
from core.state.records import ENDED_STATES, LIVE_STATES, Run
from core.state.store import Store
from tests.conftest import ROOT


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "state.db", transitions=life.TRANSITIONS)


def _run_in(store: Store, run_id: str, state: str) -> None:
    """A run of item ``it-<run_id>`` brought to ``state`` by allowed moves only."""
    store.claim_run(run_id, f"it-{run_id}", "shell", "h", owner="me")
    if state == life.STARTING:
        return
    if state in life.TRANSITIONS[life.STARTING] and state != life.RUNNING:
        assert store.end_run(run_id, state)
        return
    store.update_run(run_id, state=life.RUNNING)
    if state != life.RUNNING:
        assert store.end_run(run_id, state)


ALLOWED = [(frm, to) for frm, tos in life.TRANSITIONS.items() for to in sorted(tos)]
REFUSED = [(frm, to) for frm, to in itertools.product(life.STATES, life.STATES)
           if to not in life.TRANSITIONS[frm]]


def test_the_table_names_every_state_and_ended_states_go_nowhere():
    assert set(life.TRANSITIONS) == set(life.STATES)
    assert set(life.STATES) == {"starting", "running", "succeeded", "failed", "stopped", "lost",
                                "interrupted", "preempted"}
    assert all(not life.TRANSITIONS[s] for s in life.ENDED)
    assert all(to in life.STATES for tos in life.TRANSITIONS.values() for to in tos)
    assert life.CLAIMED == life.STARTING
    # the store's copy (its SQL asks for live runs) is life's
    assert (life.LIVE, life.ENDED) == (LIVE_STATES, ENDED_STATES)
    assert len(ALLOWED) == 11 and len(REFUSED) == 8 * 8 - 11


@pytest.mark.parametrize("frm, to", ALLOWED)
def test_every_allowed_move_is_kept_with_its_journal_entry(store, frm, to):
    _run_in(store, "r", frm)
    assert store.run("r").state == frm
    if to in life.ENDED:
        assert store.end_run("r", to, exit_code=0 if to == life.SUCCEEDED else 1)
        kinds = [e.kind for e in store.events() if e.run_id == "r"]
        assert kinds[0] == life.CLAIM_JOURNAL and kinds[-1] == life.journal_kind(to)
        assert life.ended_by(kinds[-1]) == to and store.run("r").ended_at is not None
    else:
        store.update_run("r", state=to, pid=42)
        assert store.run("r").pid == 42
    assert store.run("r").state == to and life.can_move(frm, to)


@pytest.mark.parametrize("frm, to", REFUSED)
def test_a_move_the_table_lacks_is_refused(store, frm, to):
    _run_in(store, "r", frm)
    with pytest.raises(RunMoveRefused) as e:
        store.update_run("r", state=to, pid=7)
    assert e.value.message.startswith(f"run r: {frm} -> {to} is not a move a run makes")
    assert "TRANSITIONS" in e.value.hint
    assert (store.run("r").state, store.run("r").pid) == (frm, None)  # nothing was written
    if to in life.ENDED and frm in life.LIVE:  # an end is a move too
        with pytest.raises(RunMoveRefused):
            store.end_run("r", to)
        assert store.run("r").state == frm and not life.can_move(frm, to)


def test_an_ended_run_never_moves_again(store):
    _run_in(store, "r", life.SUCCEEDED)
    with pytest.raises(RunMoveRefused) as e:
        store.update_run("r", state=life.RUNNING)
    assert e.value.message == ("run r: succeeded -> running is not a move a run makes (a "
                               "succeeded run moves to nothing: it has ended); nothing was "
                               "written")
    assert store.run("r").state == life.SUCCEEDED
    assert not store.end_run("r", life.FAILED)  # a second end: the idempotent no-op
    assert store.run("r").state == life.SUCCEEDED
    with pytest.raises(RunMoveRefused, match="no such run -> running"):
        store.update_run("nope", state=life.RUNNING)


def test_a_store_without_the_table_checks_nothing(tmp_path):
    s = Store(tmp_path / "bare.db")
    s.claim_run("r", "it", "shell", "h", owner="me")
    assert s.end_run("r", life.SUCCEEDED)  # starting -> succeeded: a bare store keeps it
    assert s.transitions is None


def test_run_state_to_item_status():
    assert life.RUN_TO_ITEM == {"succeeded": "done", "failed": "failed", "stopped": "stopped",
                                "lost": "failed", "interrupted": "failed", "preempted": "failed"}
    assert set(life.RUN_TO_ITEM) == set(life.ENDED)
    assert life.ended_reason("r1", life.FAILED, "exit 3") == "run r1 failed: exit 3"
    assert life.ended_reason("r1", life.SUCCEEDED, None) == "run r1 succeeded"


def test_an_end_writes_the_run_its_item_and_the_events_once(store):
    _run_in(store, "r", life.RUNNING)
    told = []
    assert life.end(store, told.append, "it-r", "r", life.FAILED, error="exit 3", exit_code=3)
    run = store.run("r")
    assert (run.state, run.exit_code, run.signal, run.error) == ("failed", 3, None, "exit 3")
    assert store.item_statuses()["it-r"] == "failed"
    change = store.status_history("it-r")[-1]
    assert (change.status, change.reason, change.run_id) == ("failed", "run r failed: exit 3", "r")
    assert told == [StatusChanged("it-r", "failed", "run r failed: exit 3"),
                    RunEnded("it-r", "r", "failed", 3, None, "exit 3")]
    # a second end (another follower's, a stop's): nothing more written, nothing told
    assert not life.end(store, told.append, "it-r", "r", life.SUCCEEDED, exit_code=0)
    assert store.run("r").state == "failed" and len(store.status_history("it-r")) == 1
    assert len(told) == 2


def _claimed(store: Store, run_id: str, owner: str, *, running: bool = False,
             capsule: str | None = None) -> Run:
    store.claim_run(run_id, f"it-{run_id}", "shell", "h", owner=owner)
    if running:
        store.update_run(run_id, state=life.RUNNING, pid=7, capsule=capsule)
    return store.run(run_id)


def test_settle_writes_what_reconcile_decides(store):
    told, me = [], life.owner_token()
    settle = partial(life.settle, store, told.append, here=False)
    # the item is no longer an action: interrupted, whoever owns it
    run = _claimed(store, "gone", me, running=True)
    assert settle(run, detached=None, st=None, capsule=None, me=me) == life.INTERRUPT
    assert (store.run("gone").state, store.run("gone").error) == ("interrupted",
                                                                   life.NOT_AN_ACTION)
    assert store.item_statuses()["it-gone"] == "failed" and told[-1].state == "interrupted"
    # launched while the store still said starting: recorded running, its pid and capsule
    run = _claimed(store, "up", "other")
    assert settle(run, detached=True, st=CapsuleState("running", pid=42), capsule="/c/up",
                  me=me) == life.FOLLOW
    assert (store.run("up").state, store.run("up").pid, store.run("up").capsule) == (
        "running", 42, "/c/up")
    # ended while nobody watched, its capsule known: finished by the runner, nothing written
    run = _claimed(store, "done", "other", running=True, capsule="/c/done")
    assert settle(run, detached=True, st=CapsuleState("ended", 0, pid=9), capsule="/c/x",
                  me=me) == life.FINISH
    assert (store.run("done").state, store.run("done").pid, store.run("done").capsule) == (
        "running", 7, "/c/done")
    # another live specdeck is launching it: kept as it is; this specdeck's own: interrupted
    run = _claimed(store, "busy", me)
    assert settle(run, detached=True, st=CapsuleState("nopid"), capsule="/c/busy",
                  me="another specdeck") == life.KEEP
    assert store.run("busy").state == "starting"
    assert settle(run, detached=True, st=CapsuleState("nopid"), capsule="/c/busy",
                  me=me) == life.INTERRUPT
    assert (store.run("busy").state, store.run("busy").error) == ("interrupted",
                                                                   life.NOT_LAUNCHED)
    # an in-process run whose specdeck died
    host, pid, start = me.rsplit(":", 2)
    run = _claimed(store, "orphan", f"{host}:{pid}:{int(start) + 1}", running=True)
    assert settle(run, detached=False, st=None, capsule=None, me=me) == life.INTERRUPT
    assert store.run("orphan").error == life.OWNER_GONE
    assert [e.run_id for e in told if isinstance(e, RunEnded)] == ["gone", "busy", "orphan"]


@pytest.mark.parametrize("state, stopped, outcome", [
    (CapsuleState("ended", 0), False, "succeeded"), (CapsuleState("ended", 1), False, "failed"),
    (CapsuleState("ended", None, "TERM"), False, "failed"),
    (CapsuleState("ended", None, "TERM"), True, "stopped"), (CapsuleState("lost"), False, "lost"),
    (CapsuleState("ended", None, "TERM", preempted="Slurm PREEMPTED (job 7)"), False, "preempted"),
    (CapsuleState("lost", preempted="Slurm NODE_FAIL (job 7)"), False, "preempted"),
    (CapsuleState("ended", 143, None, preempted="spot reclaim notice: x"), True, "stopped")])
def test_outcome_of_a_capsule_state(state, stopped, outcome):
    got = life.outcome_of(state, stopped=stopped, capsule="/c", run_id="r1")
    assert (got.state, got.exit_code, got.signal, got.capsule) == (outcome, state.exit_code,
                                                                   state.signal, "/c")


def test_results_that_cannot_be_read_fail_a_success_only():
    ok, lost = (life.outcome_of(CapsuleState(*a), run_id="r") for a in (("ended", 0), ("lost",)))
    assert life.after_failed_finish(ok) == life.FAILED
    assert life.after_failed_finish(lost) == life.LOST


def _runs(*states: str) -> list[Run]:
    return [Run(f"r{i}", "it", state=s, attempt=i) for i, s in enumerate(states, 1)]


def test_failures_count_since_the_last_success_or_stop():
    assert life.failures(_runs("failed", "succeeded", "failed", "lost", "interrupted")) == 2
    assert life.failures(_runs("failed", "stopped")) == 0
    assert life.retries_left(2, _runs("failed")) == 2
    assert life.retries_left(2, _runs("failed", "lost", "failed")) == 0


class _Item:
    id, retries, on_preempt = "t", 0, "fail"


class _Resuming:
    id, retries, on_preempt = "t", 2, "resume"


def test_a_preemption_uses_up_no_retry_and_on_preempt_resume_relaunches():
    preempted = [Run("r1", "it", state="preempted", attempt=1, error="Slurm PREEMPTED (job 7)")]
    assert life.failures(_runs("failed", "preempted", "preempted")) == 1
    assert life.retries_left(2, _runs("preempted", "preempted")) == 2  # all of them left
    assert life.retries_left(2, _runs("failed", "preempted")) == 2
    assert life.again(_Resuming(), "failed", preempted) == (
        "t: preempted (Slurm PREEMPTED (job 7)); launched again (on_preempt: resume), its "
        "retries unchanged (2 of 2 left)")
    assert life.held(_Resuming(), "failed", preempted, asked=False, plan="p") is None
    # on_preempt: fail (the default): held like a failure, still counted as none
    assert life.again(_Item(), "failed", preempted) is None
    assert life.held(_Item(), "failed", preempted, asked=False, plan="p").startswith("t: failed")
    # a real failure after preemptions: the first retry of two
    runs = _runs("preempted", "failed")
    assert life.again(_Resuming(), "failed", runs) == "t: failed; retry 1 of 2 (its plan's retries)"
    assert life.again(_Resuming(), "done", runs) is None


def test_what_holds_an_item_back():
    assert "--again" in life.held(_Item(), "stopped", _runs("stopped"), asked=True, plan="p")
    assert life.held(_Item(), "failed", _runs("failed"), asked=False, plan="p").startswith(
        "t: failed; retried only when asked (`specdeck run p t`")
    assert life.held(_Item(), "failed", _runs("failed"), asked=True, plan="p") is None
    # specdeck interrupted it: no failure of the work, it resumes unasked
    assert life.held(_Item(), "failed", _runs("interrupted"), asked=False, plan="p") is None


@pytest.mark.parametrize("state, capsule, alive, mine, decided", [
    ("starting", "nopid", True, False, (life.KEEP, None)),  # another specdeck launches it
    ("starting", "nopid", True, True, (life.INTERRUPT, life.NOT_LAUNCHED)),
    ("starting", "missing", False, False, (life.INTERRUPT, life.NOT_LAUNCHED)),
    ("starting", "running", False, False, (life.FOLLOW, None)),
    ("running", "running", None, False, (life.FOLLOW, None)),
    ("running", "ended", None, False, (life.FINISH, None)),
    ("running", "lost", None, False, (life.FINISH, None)),
    ("running", "missing", True, False, (life.FINISH, None)),  # launched: its end is read
])
def test_what_reconcile_decides_for_a_detached_run(state, capsule, alive, mine, decided):
    run = Run("r", "it", state=state)
    assert life.reconcile(run, detached=True, capsule=capsule, owner_alive=alive, mine=mine,
                          here=False) == decided


@pytest.mark.parametrize("alive, here, decided", [
    (False, False, (life.INTERRUPT, life.OWNER_GONE)), (False, True, (life.INTERRUPT,
                                                                      life.OWNER_GONE)),
    (True, False, (life.FOLLOW, None)), (None, False, (life.FOLLOW, None)),
    (True, True, (life.KEEP, None))])
def test_what_reconcile_decides_for_an_in_process_run(alive, here, decided):
    run = Run("r", "it", state="running")
    assert life.reconcile(run, detached=False, capsule=None, owner_alive=alive, mine=False,
                          here=here) == decided


def test_reconcile_interrupts_a_run_whose_item_is_no_longer_an_action():
    for alive in (True, False, None):
        assert life.reconcile(Run("r", "it", state="running"), detached=None, capsule=None,
                              owner_alive=alive, mine=True, here=True) == (
            life.INTERRUPT, life.NOT_AN_ACTION)


def test_stop_grace():
    assert life.launch_wait_s(5) == 120.0 and life.launch_wait_s(300) == 300
    assert life.cancel_wait_s(0) == 1.0 and life.cancel_wait_s(30) == 30
    assert life.stop_requested(Run("r", "it", error=life.STOP_REQUESTED))
    assert not life.stop_requested(Run("r", "it", error="boom")) and not life.stop_requested(None)


def test_this_process_owns_and_is_alive():
    me = life.owner_token()
    assert life.owner_alive(me) is True
    host, pid, start = me.rsplit(":", 2)
    assert life.owner_alive(f"{host}:{pid}:{int(start) + 1}") is False  # a later process
    assert life.owner_alive(f"elsewhere-{host}:{pid}:{start}") is None
    assert life.owner_alive(None) is False and life.owner_alive("garbage") is False


# -- every state the code writes is one life names ------------------------------------------
WRITERS = {"update_run": ("state", None), "end_run": ("state", 1), "_end": ("state", 2),
           "end": ("state", 4)}
"""call name -> (keyword, position) of the state it writes (``end``: :func:`life.end`)."""


def written_states(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, state) for every run state written in ``tree``: literals, or ``life.NAME``
    resolved (bare in life itself), passed to the store's writes, the runner's ``_end`` and
    life's ``end``, and the ``"state"`` of the row a claim inserts."""
    out = []

    def value(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "life"):
            return getattr(life, node.attr)
        if isinstance(node, ast.Name) and isinstance(getattr(life, node.id, None), str):
            return getattr(life, node.id)
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "claim_run":
            for d in ast.walk(node):
                if isinstance(d, ast.Dict):
                    out += [(v.lineno, value(v)) for k, v in zip(d.keys, d.values)
                            if isinstance(k, ast.Constant) and k.value == "state"]
        if not isinstance(node, ast.Call):
            continue
        f = node.func  # ``x.end_run(...)``, or a bare ``end(...)`` in life itself
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if name not in WRITERS:
            continue
        kw, pos = WRITERS[name]
        args = [k.value for k in node.keywords if k.arg == kw]
        if pos is not None and len(node.args) > pos:
            args.append(node.args[pos])
        out += [(node.lineno, value(a)) for a in args if value(a) is not None]
    return out


def test_every_state_the_code_writes_is_one_life_names():
    found = {}
    for path in sorted((ROOT / "core").rglob("*.py")):
        for line, state in written_states(ast.parse(path.read_text())):
            found[f"{path.relative_to(ROOT)}:{line}"] = state
    unnamed = {where: s for where, s in found.items() if s not in life.STATES}
    assert not unnamed, f"run states written that core/runs/life.py does not name: {unnamed}"
    # the scan saw the writes that matter: a claim, a launch, every end the runner records
    assert found["core/state/store.py:" + str(_claim_line())] == life.CLAIMED
    assert {life.RUNNING, life.SUCCEEDED, life.FAILED, life.STOPPED,
            life.INTERRUPTED} <= set(found.values())
    # life's own moves: a reconcile's interrupt, a launched run found still starting
    assert {f for f, s in found.items() if f.startswith("core/runs/life.py:")} and {
        s for f, s in found.items() if f.startswith("core/runs/life.py:")} == {
        life.RUNNING, life.INTERRUPTED}


def _claim_line() -> int:
    text = (ROOT / "core/state/store.py").read_text().splitlines()
    return next(i for i, ln in enumerate(text, 1) if '"state": "starting", "owner"' in ln)


def test_the_scan_catches_a_state_life_does_not_name():
    tree = ast.parse("store.update_run(r, state='paused')\nself._end(i, r, 'done')\n"
                     "store.end_run(r, life.LOST)\nend(s, e, i, r, 'gone')\n")
    assert written_states(tree) == [(1, "paused"), (2, "done"), (3, "lost"), (4, "gone")]
