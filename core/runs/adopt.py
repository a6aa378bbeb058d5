"""Adopting runs specdeck did not start: a PID (nohup torchrun), a Slurm job, a tmux session.

An operator who joins a campaign mid-way has runs started by hand. ``specdeck adopt PLAN
ITEM --pid PID --log PATH`` (or ``--slurm-job ID`` / ``--tmux SESSION``), an item's
``adopt:`` field in the plan, or the console's item pane makes such a run one of the item's
runs, and from then on it is like any other:

* **log**: followed into the store exactly once from the adoption point (the start of the
  line being written when it was adopted; the file's start with ``--from-start``), across
  disconnects and restarts: the store keeps ``log_base``, the byte of the file where its
  copy starts (:func:`core.capsules.jobs.follow` reads from ``log_base + offset``). Without a log
  path: the PID's stdout when it is a file, the Slurm job's ``StdOut``, or (tmux) the pane's
  output from now on, piped into the adoption's capsule with ``tmux pipe-pane``.
* **end**: a PID is running while ``/proc/PID`` has the start time (and boot id) seen at
  adoption, so a recycled PID is never taken for it; its exit status is unknown to anyone
  but its parent, so its end is recorded as ``lost`` *saying so*, never as an invented
  exit code. A Slurm job's state and exit code come from ``squeue`` / ``scontrol`` /
  ``sacct`` (``sacct -c`` reads the jobcomp file where there is no slurmdbd). A tmux
  session's panes are kept on exit (``remain-on-exit``), so a dead pane tells its status.
* **stop**: the PID's process group (when it leads it or its leader is gone) and every
  descendant get SIGTERM, the grace, then SIGKILL; a Slurm job is ``scancel``-ed; a tmux
  session's pane processes are ended the same way and the session killed.

The runner sees an adopted run through :class:`Adopted`, which wraps the item's action
(so a train item keeps its metrics, checkpoint events and ``watch_eval``) and replaces how
the run is inspected, followed and stopped. Nothing here reads the store or takes the
runner: each function is given what it reads (statuses, runs), and
:meth:`core.runs.runner.Runner.adopt` records the adoption (as every run is started by the
runner). What an ``adopt:`` says and how it is parsed is :mod:`core.plans.adopt_spec`'s.

**Never twice.** An item whose status is ``in_progress`` with no run specdeck knows (it was
started outside specdeck) is never launched: :func:`unadopted` says why and which ``adopt``
command to use, and a ``stop`` item aimed at it has nothing to stop until it is adopted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import posixpath
import shlex
import time
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from core.capsules import jobs
from core.runs import life
from core.actions.base import Action
from core.plans.adopt_spec import JOB_ID, PID_MAX, AdoptSpec, parse_pid
from core.errors import ActionFailed, InvalidInput
from core.ml.formats import strictjson

if TYPE_CHECKING:
    from core.hosts.base import Host
    from core.plans.plan import Item, Plan
    from core.state.records import Run

PID_FILE_MAX = 64
"""A pid file holds one number: a larger one is not read."""


def adopt_hint(where: str, item_id: str) -> str:
    """The commands that adopt an item's run started outside specdeck, or say that nothing
    runs (``where``: the plan's path, else its name)."""
    return (f"`specdeck adopt {shlex.quote(where)} {item_id} --pid PID --log PATH` (or "
            f"--slurm-job ID / --tmux SESSION), or `specdeck mark {shlex.quote(where)} "
            f"{item_id} pending` if nothing runs")

PF_KTHREAD = 0x00200000
"""``/proc/PID/stat`` flags bit of a kernel thread (never a run, even for root)."""
_BOOT = "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo noboot)"
UNKNOWN_EXIT = ("the adopted run ended; its exit status is unknown (specdeck did not start "
                "it, so nothing recorded how it ended)")


# -- never twice -------------------------------------------------------------------------
def unadopted(plan: "Plan", item: "Item", statuses: Mapping[str, str],
              live_run: Callable[[str], "Run | None"]) -> str | None:
    """Why ``item`` must not be launched now (a run started outside specdeck), or None.

    Args:
        plan: The plan ``item`` is in (a stop item's target is looked up in it).
        statuses: Every item's status (the store's, else the plan's).
        live_run: An item id's live run as the store knows it, or None.
    """
    where = str(plan.path) if plan.path else plan.name
    if statuses.get(item.id) == "in_progress" and item.adopt is None \
            and live_run(item.id) is None:
        return (f"{item.id}: in_progress with no run specdeck knows (started outside "
                f"specdeck?): not launched again; adopt it: {adopt_hint(where, item.id)}")
    if item.action is not None and item.action.kind == "stop" and item.action.params is not None:
        target = plan.item(item.action.params.item)
        if statuses.get(target.id) == "in_progress" and live_run(target.id) is None:
            return (f"{item.id}: nothing to stop until {target.id} is adopted (in_progress "
                    f"with no run specdeck knows): {adopt_hint(where, target.id)}")
    return None


def from_plan(item: "Item", status: str, runs: Sequence["Run"]) -> bool:
    """Adopt the run the item's ``adopt:`` names (instead of launching one): while it is
    in_progress (``status``), or before specdeck has run it at all (no ``runs``); a rerun
    after its end launches."""
    return item.adopt is not None and (status == "in_progress" or not runs)


def adopting(item: "Item", running: Iterable["Item"]) -> bool:
    """``item`` stops an item that is being adopted from its plan's ``adopt:`` right now."""
    if item.action is None or item.action.kind != "stop" or item.action.params is None:
        return False
    return any(r.id == item.action.params.item and r.adopt is not None for r in running)


# -- probing what is adopted -------------------------------------------------------------
async def _regular_file(host, path: str) -> tuple[str, int]:
    """``("ok", size)`` for a readable regular file (never opened: a FIFO or a device
    would block or never end), else ``(why, 0)``: "no such file", "not a regular file"..."""
    q = shlex.quote(path)
    res = await host.run(f"f={q}; if [ ! -e \"$f\" ]; then echo missing; "
                         f"elif [ ! -f \"$f\" ]; then echo notfile; "
                         f"elif [ ! -r \"$f\" ]; then echo unreadable; "
                         f"else echo \"ok $(stat -L -c %s \"$f\")\"; fi")
    words = res.stdout.split()
    what = words[0] if words else "missing"
    if what == "ok" and len(words) == 2 and words[1].isascii() and words[1].isdigit():
        return "ok", int(words[1])
    return {"notfile": "not a regular file (a FIFO, a device or a directory)",
            "unreadable": "not readable by the host's user"}.get(what, "no such file"), 0


async def _log_start(host, path: str, *, must_exist: bool, from_start: bool) -> int:
    """The byte of ``path`` the stored log starts at: 0, or the start of the line now written."""
    what, size = await _regular_file(host, path)
    if what != "ok":
        if what == "no such file" and not must_exist:
            return 0
        raise InvalidInput(f"log {path} on {host.name}: {what}",
                           hint="give the file the run writes its output to (--log PATH)")
    if from_start or size == 0:
        return 0
    back = min(size, 1 << 16)
    tail = await host.read_from(path, size - back, back)
    nl = tail.rfind(b"\n")
    if nl < 0:
        return size - back if back < size else 0
    return size - back + nl + 1


def _ancestry() -> set[int]:
    """This specdeck process and its ancestors (never adopted, never signalled)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _is_specdeck(cmdline: str) -> bool:
    words = cmdline.split()
    if ".specdeck/runs/" in cmdline:
        return True
    heads = [posixpath.basename(w) for w in words[:2]]
    entry = (["-m", "console.cli"], ["-m", "console"], ["-m", "core"])  # core: older versions
    return "specdeck" in heads or any(words[i:i + 2] in entry for i in range(min(len(words), 3)))


async def _probe_pid(host: "Host", spec: AdoptSpec, log: str | None,
                     live_runs: Iterable["Run"]) -> dict:
    pid = spec.pid
    if pid is None:
        path = host.path(spec.pid_file)
        hint = "point pid_file at the file the launch wrote $! into"
        what, size = await _regular_file(host, path)
        if what == "ok" and size > PID_FILE_MAX:
            what = f"{size:,} bytes: too large for a pid file (it holds one number)"
        if what != "ok":
            raise InvalidInput(f"pid_file {path} on {host.name}: {what}", hint=hint)
        try:
            pid = parse_pid(await host.read_from(path, 0, PID_FILE_MAX))
        except ValueError as e:
            raise InvalidInput(f"pid_file {path} on {host.name}: {e}", hint=hint) from None
    if not 1 < pid <= PID_MAX:
        raise InvalidInput(f"pid {pid}: not a process that can be adopted (PIDs run "
                           f"2..{PID_MAX})")
    res = await host.run(
        f"p={pid}; st=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null) || {{ echo gone; exit 0; }}; "
        f"case \"$st\" in Z*) echo gone; exit 0;; esac; "
        f"echo \"ok $(awk '/^Uid:/{{print $2; exit}}' /proc/$p/status) $(id -u) {_BOOT} "
        f"$(echo \"$st\" | cut -d' ' -f3) $(echo \"$st\" | cut -d' ' -f20) "
        f"$(echo \"$st\" | cut -d' ' -f7)\"; "
        f"readlink /proc/$p/fd/1 2>/dev/null || echo; "
        f"tr '\\0' ' ' </proc/$p/cmdline 2>/dev/null | head -c 400; echo")
    lines = res.stdout.split("\n")
    head = lines[0].split()
    if not head or head[0] != "ok" or len(head) < 7:
        raise InvalidInput(f"pid {pid} on {host.name}: no such process",
                           hint="`ps -ef` on the host lists its processes")
    _, uid, me, boot, pgid, pstart, flags = head[:7]
    stdout_target = lines[1].strip() if len(lines) > 1 else ""
    cmdline = lines[2].strip() if len(lines) > 2 else ""
    if not cmdline or (flags.isdigit() and int(flags) & PF_KTHREAD):
        raise InvalidInput(f"pid {pid} on {host.name} is a kernel thread or has no command "
                           "line: not a run to adopt",
                           hint="`ps -ef` on the host lists its processes ([name] in "
                                "brackets: a kernel thread)")
    if uid != me:
        raise InvalidInput(f"pid {pid} on {host.name} belongs to another user (uid {uid}, "
                           f"the host's user is uid {me}): specdeck could not stop it")
    if _is_local(host) and pid in _ancestry() or _is_specdeck(cmdline):
        raise InvalidInput(f"pid {pid} on {host.name} is specdeck's own ({cmdline[:80]!r}), "
                           "not a run to adopt")
    for r in live_runs:
        if r.host == host.name and r.pid == pid:
            raise InvalidInput(f"pid {pid} on {host.name} is run {r.id} of item "
                               f"{r.item_id!r}, which specdeck already follows",
                               hint=f"`specdeck attach PLAN {r.item_id}`")
    if log is None:
        if stdout_target.startswith("/") and not stdout_target.startswith(("/dev/", "/proc/")) \
                and not stdout_target.endswith(" (deleted)"):
            log = stdout_target
        else:
            raise InvalidInput(f"pid {pid} on {host.name} writes its output to "
                               f"{stdout_target or 'nothing'!r}, not a file",
                               hint="give its log file with --log PATH")
    base = await _log_start(host, log, must_exist=True, from_start=spec.from_start)
    return {"how": "pid", "pid": pid, "pstart": pstart, "boot": boot, "pgid": int(pgid),
            "log": log, "base": base, "what": f"pid {pid}", "cmdline": cmdline[:200]}


async def _probe_slurm(host: "Host", spec: AdoptSpec, log: str | None) -> dict:
    job = spec.slurm_job
    if not job or not JOB_ID.fullmatch(job):
        raise InvalidInput(f"Slurm job id {job!r}: a job id is digits")
    res = await host.run(f"scontrol -o show job {shlex.quote(job)}")
    if res.exit_status == 127:
        raise InvalidInput(f"{host.name} has no scontrol: is it the cluster's login node?",
                           hint="--host names the plan host Slurm answers on")
    fields = dict(w.split("=", 1) for w in res.stdout.split() if "=" in w) if res.ok else {}
    if not fields.get("JobState"):
        acct = await host.run(f"sacct -n -P -X -j {shlex.quote(job)} -o State 2>/dev/null; "
                              f"sacct -c -n -P -j {shlex.quote(job)} -o State 2>/dev/null")
        if not acct.stdout.strip():
            raise InvalidInput(f"Slurm job {job} on {host.name}: unknown to scontrol and sacct",
                               hint="`squeue -u $USER` lists your jobs")
    if log is None:
        log = fields.get("StdOut")
        if not log or "%" in log:
            raise InvalidInput(f"Slurm job {job} on {host.name}: its output file is not known "
                               f"({log or 'scontrol has no StdOut'})",
                               hint="give it with --log PATH")
        must = False
    else:
        must = True
    base = await _log_start(host, log, must_exist=must, from_start=spec.from_start)
    return {"how": "slurm", "job": job, "log": log, "base": base,
            "what": f"Slurm job {job} ({fields.get('JobName', '?')}, {fields.get('JobState', 'ended')})"}


async def _tmux(host, *args: str):
    return await host.run(["tmux", *args])


async def _probe_tmux(host: "Host", spec: AdoptSpec, log: str | None) -> dict:
    s = spec.tmux
    res = await _tmux(host, "list-panes", "-s", "-t", f"={s}", "-F", "#{pane_pid} #{pane_dead}")
    if not res.ok:
        raise InvalidInput(f"tmux session {s!r} on {host.name}: no such session",
                           hint="`tmux ls` on the host lists its sessions")
    panes = [ln.split() for ln in res.stdout.splitlines() if ln.strip()]
    if log is not None:
        base = await _log_start(host, log, must_exist=True, from_start=spec.from_start)
    else:
        base = 0
    return {"how": "tmux", "session": s, "log": log, "base": base,
            "pane_pid": int(panes[0][0]) if panes else None, "what": f"tmux session {s}"}


async def probe(host: "Host", spec: AdoptSpec, live_runs: Iterable["Run"]) -> dict:
    """Check what ``spec`` names exists and may be adopted; raises InvalidInput otherwise.
    ``live_runs``: the runs specdeck follows (a pid one of them runs is never adopted)."""
    log = None
    if spec.log is not None:
        log = spec.log if spec.log.startswith("/") else host.path(spec.log)
    if spec.how == "pid":
        return await _probe_pid(host, spec, log, live_runs)
    return await (_probe_slurm if spec.how == "slurm" else _probe_tmux)(host, spec, log)


# -- adopting (recorded by core.runs.runner.Runner.adopt) -------------------------------------
def refuse(plan: "Plan", item: "Item", action: Action | None, host_name: str | None,
           live: "Run | None") -> None:
    """Raise InvalidInput when ``item`` cannot adopt a run on ``host_name`` now (a manual or
    in-process item, a host not in the plan, a run already live); nothing is recorded."""
    if action is None or not action.detached:
        raise InvalidInput(f"item {item.id!r} is "
                           + ("manual" if action is None else f"{item.action.kind}, run inside specdeck")
                           + ": only an item with a detached action (shell, train, eval...) "
                           "can adopt a run")
    if host_name not in plan.hosts:
        raise InvalidInput(f"plan {plan.name!r} has no host {host_name!r} "
                           f"(hosts: {', '.join(plan.hosts)})")
    if live is not None:
        raise InvalidInput(f"item {item.id!r} already has live run {live.id} on "
                           f"{live.host}", hint="stop it first, or `specdeck attach`")


async def locate(host: "Host", spec: AdoptSpec, live_runs: Iterable["Run"]) -> dict:
    """What ``spec`` names on ``host``, checked (:func:`probe`), with its log's inode: the
    adoption's record (``Run.adopt``). Bad input raises InvalidInput."""
    info = await probe(host, spec, live_runs)
    ident = await host.identity(info["log"]) if info["log"] else None
    if ident:  # the log's inode: a rotation (even while no specdeck follows) is noticed
        info["log_ident"] = " ".join(ident.split()[1:3])
    return info


async def enter(host: "Host", spec: AdoptSpec, live_runs: Iterable["Run"], run_id: str
                ) -> tuple[dict, str]:
    """Find what ``spec`` names (:func:`locate`) and make run ``run_id``'s capsule for it:
    (the adoption's record, the capsule). Bad input raises InvalidInput, nothing made."""
    info = await locate(host, spec, live_runs)
    capsule = jobs.capsule_path(host, run_id)
    await make_capsule(host, info, capsule)
    return info, capsule


async def make_capsule(host: "Host", info: dict, capsule: str) -> None:
    """The adoption's capsule on its host: ``adopted.json`` (and, for tmux, the panes kept
    on exit, the pane's output piped into its log when no log was given)."""
    await host.makedirs(capsule)
    if info["how"] == "tmux":
        await _tmux_keep(host, info, capsule)
    await host.write_file(f"{capsule}/adopted.json", strictjson.dumps(info, indent=1).encode())


async def _tmux_keep(host, info: dict, capsule: str) -> None:
    """Keep the session's panes on exit (their status is the run's end); without a log
    file, pipe the first pane's output into the capsule's log from now on."""
    s = info["session"]
    res = await _tmux(host, "list-windows", "-t", f"={s}", "-F", "#{window_id}")
    for wid in res.stdout.split():
        await _tmux(host, "set-option", "-w", "-t", wid, "remain-on-exit", "on")
    if info["log"] is None:
        info["log"] = f"{capsule}/log"
        await host.write_file(info["log"], b"")
        await _tmux(host, "pipe-pane", "-o", "-t", f"={s}:",
                    f"cat >> {shlex.quote(info['log'])}")


# -- what the runner uses ----------------------------------------------------------------
def info_of(run: "Run | None") -> dict | None:
    return run.adopt if run is not None else None


def wrap(action, run: "Run | None"):
    """The action to run ``run`` through: :class:`Adopted` for an adopted run."""
    info = info_of(run)
    return Adopted(action, info) if info and action is not None else action


class Adopted(Action):
    """An item's action seen through an adopted run: inspect, follow and stop the adopted
    thing (its pid, Slurm job or tmux session); metrics, watch_eval and finish are the item's
    action's (its follow reads the adopted log)."""

    detached = True

    def __init__(self, inner: Action, info: dict):
        super().__init__(inner.params)
        self.kind = inner.kind
        self.inner = inner
        self.info = info

    def metrics_regex(self):
        return self.inner.metrics_regex()

    def metrics_spec(self):
        return self.inner.metrics_spec()

    async def inspect(self, ctx, host, run: "Run") -> jobs.CapsuleState:
        how = self.info["how"]
        if how == "pid":
            st = await _inspect_pid(host, self.info)
        elif how == "slurm":
            from core.capsules import slurm

            st = await slurm.inspect(host, dataclasses.replace(run, job_id=self.info["job"]))
        else:
            st = await _inspect_tmux(host, self.info)
        if st.state == "lost" and ctx.stop_requested(run.id):
            return jobs.CapsuleState("ended")  # it ended because it was stopped
        return st

    async def follow(self, ctx, host, run: "Run", on_lines) -> jobs.CapsuleState:
        # the item's action follows (train: metrics, checkpoints and watch_eval alongside),
        # reading the adopted log and asking this wrapper whether it ended
        return await self.inner.follow(ctx, host, run, on_lines, log_path=self.info["log"],
                                       inspector=lambda: self.inspect(ctx, host, run))

    async def stop(self, ctx, host, run: "Run", grace_s: float) -> jobs.CapsuleState:
        how = self.info["how"]
        if how == "slurm":
            from core.capsules import slurm

            return await slurm.cancel(host, dataclasses.replace(run, job_id=self.info["job"]),
                                      grace_s=grace_s)
        if how == "pid":
            st = await _inspect_pid(host, self.info)
            if st.state != "running":
                return st
            await _stop_tree(host, [self.info["pid"]], grace_s)
            return jobs.CapsuleState("ended")
        st = await _inspect_tmux(host, self.info)
        if st.state == "running":
            res = await _tmux(host, "list-panes", "-s", "-t", f"={self.info['session']}", "-F",
                              "#{pane_pid} #{pane_dead}")
            roots = [int(w[0]) for w in (ln.split() for ln in res.stdout.splitlines())
                     if len(w) == 2 and w[1] == "0"]
            await _stop_tree(host, roots, grace_s)
            st = jobs.CapsuleState("ended")
        await _tmux(host, "kill-session", "-t", f"={self.info['session']}")
        return st if st.state == "ended" else jobs.CapsuleState("ended")

    async def finish(self, ctx, outcome):
        try:
            return await self.inner.finish(ctx, outcome)
        except ActionFailed as e:
            if outcome.state == life.LOST:
                raise ActionFailed(f"item {ctx.item.id!r}: {UNKNOWN_EXIT}",
                                   hint=f"check `specdeck logs PLAN {ctx.item.id}`; if it "
                                        f"finished well, `specdeck mark PLAN {ctx.item.id} done`"
                                   ) from e
            if outcome.state == life.STOPPED and outcome.exit_code is None and not outcome.signal:
                raise ActionFailed(f"item {ctx.item.id!r}: the adopted {self.info['what']} "
                                   "was stopped (its exit status is unknown)") from e
            raise


async def _inspect_pid(host, info: dict) -> jobs.CapsuleState:
    p = int(info["pid"])
    res = await host.run(f"echo \"$(sed 's/.*) //' /proc/{p}/stat 2>/dev/null | cut -d' ' -f1,20)"
                         f" {_BOOT}\"", check=True)
    words = res.stdout.split()  # state, start time, boot id (a zombie has ended)
    if len(words) == 3 and words[0] != "Z" and words[1] == info["pstart"] \
            and words[2] == info["boot"]:
        return jobs.CapsuleState("running", pid=info["pid"])
    return jobs.CapsuleState("lost")


#: How long a dead pane's exit status may take to be known (tmux marks the pane dead when its
#: pty closes, and knows the status once it has reaped the process: on a loaded host, later).
TMUX_STATUS_WAIT_S = 5.0


async def _inspect_tmux(host, info: dict) -> jobs.CapsuleState:
    """The session's state from its panes (kept on exit): running while one lives, else the
    first pane's exit status or signal. A pane dead before tmux has its status is asked again,
    up to :data:`TMUX_STATUS_WAIT_S`; then, or with the session gone, ``lost``."""
    waited = 0.0
    while True:
        res = await _tmux(host, "list-panes", "-s", "-t", f"={info['session']}", "-F",
                          "#{pane_dead} #{pane_dead_status} #{pane_dead_signal}")
        if not res.ok:
            return jobs.CapsuleState("lost")  # the session is gone, and its status with it
        # one field each, empty ones kept: "1  9" is a pane killed by signal 9, not exit 9
        panes = [(ln.split(" ") + ["", ""])[:3] for ln in res.stdout.splitlines() if ln.strip()]
        if not panes or any(dead != "1" for dead, _, _ in panes):
            return jobs.CapsuleState("running", pid=info.get("pane_pid"))
        _, status, sig = panes[0]
        if sig.isdigit() and sig != "0":
            return jobs.CapsuleState("ended", None, jobs.signame(int(sig)))
        if status.isdigit():
            return jobs.CapsuleState("ended", int(status), None)
        if waited >= TMUX_STATUS_WAIT_S:
            return jobs.CapsuleState("lost")
        await asyncio.sleep(0.1)  # dead, its status not known yet (not reaped): ask again
        waited += 0.1


def _is_local(host) -> bool:
    from core.hosts.local import LocalHost

    return isinstance(host, LocalHost)


async def _ps(host) -> tuple[dict[int, tuple[int, int, str]], set[int]]:
    """The host's process table ``{pid: (ppid, pgid, start)}`` and the asking shell's
    ancestry (never signalled)."""
    res = await host.run("echo $$; ps -e -o pid=,ppid=,pgid=,stat=,lstart=", check=True)
    lines = res.stdout.splitlines()
    table: dict[int, tuple[int, int, str]] = {}
    for ln in lines[1:]:
        w = ln.split(None, 4)
        if len(w) == 5 and w[0].isdigit() and not w[3].startswith("Z"):  # zombies have ended
            table[int(w[0])] = (int(w[1]), int(w[2]), w[4].strip())
    mine: set[int] = set()
    cur = int(lines[0]) if lines and lines[0].strip().isdigit() else 0
    if _is_local(host):
        mine |= _ancestry()
    while cur > 1 and cur not in mine:
        mine.add(cur)
        cur = table.get(cur, (0, 0, ""))[0]
    return table, mine


def _tree(table: dict, roots: list[int]) -> set[int]:
    """``roots``, their descendants and, for a root that leads its process group or whose
    group's leader is gone, the rest of that group (a nohup'd pipeline)."""
    out = {r for r in roots if r in table}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    frontier = list(out)
    while frontier:
        for c in children.get(frontier.pop(), []):
            if c not in out:
                out.add(c)
                frontier.append(c)
    for r in list(out & set(roots)):
        pg = table[r][1]
        if pg == r or pg not in table or pg in out:
            out |= {p for p, (_, g, _) in table.items() if g == pg}
    return out


async def _stop_tree(host, roots: list[int], grace_s: float, poll: float = 0.2) -> None:
    """SIGTERM to ``roots``' process trees, ``grace_s``, SIGKILL to what is left."""
    known: dict[int, str] = {}  # pid -> start time: a recycled pid is never signalled

    async def alive() -> list[int]:
        table, mine = await _ps(host)
        for p in _tree(table, [r for r in roots if r in table] + list(known)):
            if p not in mine and (p not in known or known[p] == table[p][2]):
                known.setdefault(p, table[p][2])
        return [p for p, start in known.items() if p in table and table[p][2] == start
                and p not in mine]

    async def kill(sig: str, pids: list[int]) -> None:
        if pids:
            await host.run(f"kill -{sig} {' '.join(map(str, pids))} 2>/dev/null; true")

    await kill("TERM", await alive())
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        left = await alive()
        if not left:
            return
        await kill("TERM", [p for p in left if p not in roots])  # late children
        await asyncio.sleep(poll)
    for _ in range(50):
        left = await alive()
        if not left:
            return
        await kill("KILL", left)
        await asyncio.sleep(poll)
