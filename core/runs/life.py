"""A run's life: its states, the moves between them, and what each move makes of its item.

::

    claimed ──> starting ──> running ──> succeeded | failed | stopped | lost | interrupted
                                         | preempted
                   └──────────────────> failed | stopped | interrupted  (never launched)

``claimed`` is the row :meth:`~core.state.store.Store.claim_run` inserts, in state
``starting``: nothing is launched yet. ``running`` is a launched run (a detached command in its
capsule, an in-process action, or an adopted process). Following (``attach``) and adopting are
ways of watching or entering a run, not states of it. An ended run never moves again (ending is
idempotent: a second end is a no-op, not a move).

- ``lost``: a launched run whose capsule shows neither a process nor an exit status (the host
  rebooted, the capsule was wiped). Only a launched run is ever lost: a ``starting`` run whose
  capsule has no pid was never launched, so it is ``interrupted``.
- ``preempted``: the host took the run away, no fault of the work: a Slurm job that ended
  PREEMPTED or NODE_FAIL, or a process killed by SIGTERM while its host's spot reclaim notice
  stood (:func:`preempted_by`). Never counted against ``retries:``; with ``on_preempt:
  resume`` its item launches again at once (a train item resumes from its last checkpoint).
  A job Slurm requeues itself stays ``running`` (it resumes in place); each requeue is
  journaled ``run_requeued`` (:func:`core.capsules.slurm.noting_requeues`).
- ``interrupted``: specdeck itself went away (Ctrl-C, its process died) before or while the run
  ran inside it. No fault of the work: the item resumes without being asked.

The store keeps what this module says: :data:`TRANSITIONS` is the table its writes are checked
against (``Store(..., transitions=)``; the runner and :func:`core.session.open_store` hand it
over), so a move not listed here is refused with :class:`~core.errors.RunMoveRefused`. The
moves the runner makes after a launch are written here, with what each records: :func:`end`
(the run's end, its item's status, the events told) and :func:`settle` (a reconcile's
interrupt, or a launched run found still ``starting``); the runner asks, passing its store
and its ``emit``.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from core.capsules.jobs import CapsuleState, Outcome
    from core.plans.plan import Item
    from core.runs.events import Event
    from core.state.records import Run
    from core.state.store import Store

STARTING = "starting"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
STOPPED = "stopped"
LOST = "lost"
INTERRUPTED = "interrupted"
PREEMPTED = "preempted"

CLAIMED = STARTING
"""What a claim writes: the run exists, nothing of it is launched."""
LIVE = (STARTING, RUNNING)
ENDED = (SUCCEEDED, FAILED, STOPPED, LOST, INTERRUPTED, PREEMPTED)
STATES = LIVE + ENDED

TRANSITIONS: dict[str, frozenset[str]] = {
    STARTING: frozenset({RUNNING, FAILED, STOPPED, INTERRUPTED}),
    RUNNING: frozenset({RUNNING, SUCCEEDED, FAILED, STOPPED, LOST, INTERRUPTED, PREEMPTED}),
    **{s: frozenset() for s in ENDED},
}
"""state -> the states a run in it may move to (``running -> running`` records a capsule or
pid found later)."""

RUN_TO_ITEM = {SUCCEEDED: "done", FAILED: "failed", STOPPED: "stopped", LOST: "failed",
               INTERRUPTED: "failed", PREEMPTED: "failed"}
"""What a run's end makes of its item's status (a live run's item is ``in_progress``)."""
ITEM_WHILE_LIVE = "in_progress"

FRESH_START = (SUCCEEDED, STOPPED)
"""Ends after which an item's failures are counted anew (:func:`failures`)."""
COUNTED_FAILURES = (FAILED, LOST)
"""The ends ``retries:`` counts: an interrupted or preempted run is no fault of the work."""

STOP_REQUESTED = "stop requested"
"""The error a stop writes on a live run first: any process's follower then ends it stopped."""
OWNER_GONE = "the specdeck process running it exited; run it again to resume"
NOT_LAUNCHED = "specdeck stopped before the run was launched"
NOT_AN_ACTION = "item is no longer an action"
"""A live run whose item the plan no longer binds to an action: reconcile interrupts it."""


def journal_kind(state: str) -> str:
    """The journal entry the store writes when a run moves to ``state`` (its claim:
    :data:`CLAIM_JOURNAL`)."""
    return f"run_{state}"


CLAIM_JOURNAL = "run_claimed"
END_JOURNAL = {journal_kind(s): s for s in ENDED}
"""Journal kind -> the end it records."""


def ended_by(kind: str) -> str | None:
    """The end a journal entry records, or None for any other entry."""
    return END_JOURNAL.get(kind)


def can_move(frm: str, to: str) -> bool:
    return to in TRANSITIONS.get(frm, frozenset())


def ended_reason(run_id: str, state: str, error: str | None) -> str:
    """The reason recorded with the item's status when its run ends."""
    return f"run {run_id} {state}" + (f": {error}" if error else "")


def end(store: "Store", emit: Callable[["Event"], None], item_id: str, run_id: str, state: str,
        *, error: str | None = None, result: dict | None = None, exit_code: int | None = None,
        signal: str | None = None) -> bool:
    """The move to an end (``state``) and what it writes: the run's record, its item's status
    (:data:`RUN_TO_ITEM`, :func:`ended_reason`), then ``StatusChanged`` and ``RunEnded`` told
    to ``emit``. False, writing nothing more, when the run had ended already (ending is
    idempotent: whoever ends it first records it)."""
    from core.runs.events import RunEnded, StatusChanged  # not for `specdeck --help` (render)

    if not store.end_run(run_id, state, exit_code=exit_code, signal=signal, error=error,
                         result=result):
        return False
    status, reason = RUN_TO_ITEM[state], ended_reason(run_id, state, error)
    store.set_status(item_id, status, reason=reason, run_id=run_id)
    emit(StatusChanged(item_id, status, reason))
    emit(RunEnded(item_id, run_id, state, exit_code, signal, error))
    return True


# -- counting failures --------------------------------------------------------------------
def failures(runs: list[Run]) -> int:
    """Failed (or lost) runs since the last success or stop, of runs oldest first."""
    n = 0
    for r in reversed(runs):
        if r.state in FRESH_START:
            break
        n += r.state in COUNTED_FAILURES
    return n


def retries_left(retries: int, runs: list[Run]) -> int:
    """Launches left to a failed item without asking: its ``retries:`` less the failures
    since its last success (or stop), the first one not counted (a preempted or interrupted
    run is none: the first failure after one still gets every retry)."""
    return retries - max(failures(runs), 1) + 1


def again(item: "Item", status: str, runs: list[Run]) -> str | None:
    """Why ``run --all`` launches an item again right after its run ended (the notice it
    shows), or None: a preempted run whose item says ``on_preempt: resume``, or a failure
    its ``retries:`` still cover. A preemption uses up no retry."""
    if status != "failed":
        return None
    if runs and runs[-1].state == PREEMPTED and resumes(runs[-1], item):
        return (f"{item.id}: preempted ({(runs[-1].error or 'by its host').splitlines()[0]}); launched again "
                f"(on_preempt: resume), its retries unchanged ({retries_left(item.retries, runs)} "
                f"of {item.retries} left)")
    if item.retries and retries_left(item.retries, runs) > 0:
        return (f"{item.id}: failed; retry {failures(runs)} of {item.retries} (its plan's "
                "retries)")
    return None


def held(item: "Item", status: str, runs: list[Run], *, asked: bool, plan: str) -> str | None:
    """Why an item whose needs are met is not launched, or None: a stopped item waits to be
    asked ``--again`` (console ``r``), whoever asks; a failed one for being named (``asked``)
    or its plan's ``retries:``. One whose latest run specdeck interrupted resumes."""
    if status == "stopped":
        return (f"{item.id}: stopped by the operator; launched again only when asked "
                f"(`specdeck run {plan} {item.id} --again`, or r in the console)")
    if (status == "failed" and not asked and retries_left(item.retries, runs) <= 0
            and not resumes(runs[-1] if runs else None, item)):
        used = f", its {item.retries} retries used" if item.retries else ""
        return (f"{item.id}: failed{used}; retried only when asked (`specdeck run {plan} "
                f"{item.id}`, or r in the console)")
    return None


def resumes(latest: Run | None, item: "Item | None" = None) -> bool:
    """A run specdeck interrupted is no failure of the work: its item launches again; so is
    a preempted one whose item says ``on_preempt: resume``."""
    if latest is None:
        return False
    return latest.state == INTERRUPTED or (
        latest.state == PREEMPTED and getattr(item, "on_preempt", None) == "resume")


def stop_requested(run: Run | None) -> bool:
    return run is not None and run.error == STOP_REQUESTED


# -- how a detached run ended -------------------------------------------------------------
def outcome_of(state: "CapsuleState", *, stopped: bool = False, capsule: str = "",
               run_id: str = "") -> "Outcome":
    """A capsule's state as a run's end: an exit status is a success (0, no signal), a
    failure, or a stop when one was asked; no process and no exit status is ``lost``."""
    from core.capsules.jobs import Outcome  # the actions' record of it (they sit below runs)

    if state.preempted and not stopped:
        return Outcome(PREEMPTED, state.exit_code, state.signal, capsule, run_id,
                       preempted=state.preempted)
    if state.state == "ended":
        ok = state.exit_code == 0 and state.signal is None
        st = STOPPED if stopped else (SUCCEEDED if ok else FAILED)
        return Outcome(st, state.exit_code, state.signal, capsule, run_id)
    return Outcome(LOST, None, None, capsule, run_id)


def outcome_of_run(run: "Run") -> "Outcome":
    """An ended run's record as the outcome a stop reports."""
    from core.capsules.jobs import Outcome

    return Outcome(run.state, run.exit_code, run.signal, run.capsule or "", run.id)


def after_failed_finish(outcome: Outcome) -> str:
    """A run whose results could not be read: it keeps how it ended (preempted stays
    preempted), a success fails."""
    return outcome.state if outcome.state != SUCCEEDED else FAILED


# -- reconcile: what the host says against what the store says ----------------------------
KEEP, INTERRUPT, FOLLOW, FINISH = "keep", "interrupt", "follow", "finish"


def reconcile(run: "Run", *, detached: bool | None, capsule: str | None,
              owner_alive: bool | None, mine: bool, here: bool) -> tuple[str, str | None]:
    """What a reconcile does with a live run the store holds, from what its host says, and
    the error an interrupt records:

    - its item no longer an action (``detached`` None): interrupted (:data:`NOT_AN_ACTION`);
    - in process (``detached`` False): a dead owner interrupted it; one alive in another
      process (``here`` False) may be followed (:data:`FOLLOW`); else :data:`KEEP`;
    - detached, its capsule saying ``capsule`` (``running``, ``ended``, ``lost``, ``nopid``,
      ``missing``): a ``starting`` run with no pid was never launched, so it is interrupted
      unless another live specdeck (``owner_alive`` True, not ``mine``) is launching it
      (:data:`KEEP`); else it runs (:data:`FOLLOW`) or ended or was lost while nobody watched
      (:data:`FINISH`: its log is drained and its end read).
    """
    if detached is None:
        return INTERRUPT, NOT_AN_ACTION
    if not detached:
        if owner_alive is False:
            return INTERRUPT, OWNER_GONE
        return (KEEP if here else FOLLOW), None
    if capsule in ("nopid", "missing") and run.state == STARTING:
        return (KEEP, None) if owner_alive is True and not mine else (INTERRUPT, NOT_LAUNCHED)
    return (FOLLOW if capsule == RUNNING else FINISH), None


def settle(store: "Store", emit: Callable[["Event"], None], run: "Run", *,
           detached: bool | None, st: "CapsuleState | None", capsule: str | None, me: str,
           here: bool) -> str:
    """Reconcile a live run: :func:`reconcile` decides (its owner's liveness read here, ``me``
    the reconciling specdeck's :func:`owner_token`), and the move is written: an interrupt
    ends the run (:func:`end`); a detached run to follow or finish (``st``: its capsule's
    state) that the store still has ``starting``, or without a capsule, is recorded running
    with its pid and ``capsule`` (where its capsule is). Returns the decision: what is left
    to the runner is following (:data:`FOLLOW`) or finishing (:data:`FINISH`) it."""
    do, why = reconcile(run, detached=detached, capsule=st.state if st else None,
                        owner_alive=owner_alive(run.owner), mine=run.owner == me, here=here)
    if do == INTERRUPT:
        end(store, emit, run.item_id, run.id, INTERRUPTED, error=why)
    elif detached and do != KEEP and (run.state == STARTING or not run.capsule):
        store.update_run(run.id, state=RUNNING, pid=st.pid, capsule=run.capsule or capsule)
    return do


# -- stop grace ----------------------------------------------------------------------------
def launch_wait_s(grace_s: float) -> float:
    """How long a stop waits for a ``starting`` run to be launched (or not) by whoever starts
    it, before it asks to be tried again: a launch may take minutes (a venv, a transfer)."""
    return max(120.0, grace_s)


def cancel_wait_s(grace_s: float) -> float:
    """How long a stop waits for a cancelled in-process action to record its end."""
    return max(grace_s, 1.0)


# -- who owns an in-process run ------------------------------------------------------------
def _proc_start(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return ""


def owner_token() -> str:
    """Who runs in-process work: ``host:pid:start`` of this specdeck process."""
    return f"{socket.gethostname()}:{os.getpid()}:{_proc_start(os.getpid())}"


def owner_alive(owner: str | None) -> bool | None:
    """True/False for an owner on this machine; None when it is another machine's."""
    if not owner:
        return False
    try:
        hostname, pid, start = owner.rsplit(":", 2)
    except ValueError:
        return False
    if hostname != socket.gethostname():
        return None
    return _proc_start(int(pid)) == start and start != ""


# -- a full state disk ---------------------------------------------------------------------
def after_disk_full(live: Run | None, *, plan: str, item_id: str, mount: str, owner: str) -> str:
    """What became of an item's run when the state disk refused a write (the run itself is
    never ended for it: its host keeps it, and a later ``attach`` or ``status`` records it)."""
    follow = (f"`specdeck attach {plan} {item_id}` (or `specdeck logs {plan} {item_id} -f`)")
    space = f"free space on {mount}, then"
    again = f"{space} run it again (`specdeck run {plan} {item_id}`)"
    if live is None:
        return f"nothing of it was started: {again}"
    if live.capsule:
        return (f"its run {live.id} goes on on {live.host} (in {live.capsule}); its log is "
                f"stored up to line {live.log_lines} and its end is not: {space} {follow} "
                "stores the rest and its end, as its host says")
    if live.state == STARTING:
        return (f"its run {live.id} may have started on {live.host}: {space} `specdeck "
                f"status {plan}` finds out, and {follow} follows it")
    if live.owner == owner:
        return f"its run {live.id} ran inside this specdeck and ended with it: {again}"
    return (f"its run {live.id} runs inside another specdeck ({live.owner}), which "
            "records it")


def caught_up(host: str, lines_before: int, after, st) -> str:
    """The journal's ``log_caught_up`` line: a run's log stored to its end after its end was."""
    how = (f"signal {st.signal}" if st.signal else f"exit {st.exit_code}"
           if st.exit_code is not None else st.state)
    return (f"stored the rest of its log from {host}: {after.log_lines - lines_before} more "
            f"lines, {after.log_lines} in all (its command ended: {how}; the run stays "
            f"{after.state})")
