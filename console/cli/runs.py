"""Run commands: ``run``, ``attach``, ``logs``, ``stop`` and ``adopt``."""

from __future__ import annotations

import json
import os
import sys

from console.cli import exit_codes
from console.cli.output import err, load_plan, run_with
from core.errors import InvalidInput
from core.text import collapse_cr, sanitize


def cmd_run(args) -> int:
    plan = load_plan(args.plan)
    if not args.items and not args.all:
        raise InvalidInput("name the items to run, or pass --all")
    if args.again and not args.items:
        raise InvalidInput("--again reruns the items you name; name them")
    if args.resume and not args.items:
        raise InvalidInput("--resume resumes the items you name; name them")
    for i in args.items:
        plan.item(i)
    ids = None if args.all else args.items

    async def go(session):
        await session.reconcile()
        summary = await session.run(ids, again=args.again, resume=args.resume,
                                    detach=args.detach)
        live = {i: session.live_run(i) for i in summary.started}
        return summary, {i: r.id for i, r in live.items() if r}

    summary, started = run_with(plan, args, go)
    for item_id, run_id in started.items():
        # stdout: the run id alone, for a script (as sbatch prints the job id)
        print(f"{item_id} {run_id}", flush=True)
        err(f"{item_id}: run {run_id} started detached; `specdeck attach {args.plan} {item_id}` "
            f"or `specdeck logs {args.plan} {item_id} -f` follows it, `specdeck status "
            f"{args.plan}` shows where it stands")
    if summary.manual:
        err(f"manual items waiting for the operator: {', '.join(summary.manual)} "
            f"(`specdeck mark {args.plan} ITEM done`)")
    for i in summary.unrecorded:  # what became of its run, and what to do: said above
        err(f"not recorded: {i}  (the state disk took no more writes; see above)")
    if not summary.unreachable:
        for i in summary.failed:
            err(f"failed: {i}  (log: `specdeck logs {args.plan} {i}`)")
        if summary.unadopted and not summary.failed:
            err(f"not launched until a run started outside specdeck is adopted: "
                f"{', '.join(summary.unadopted)} (`specdeck adopt`, see above)")
    if args.detach and not (summary.failed or summary.unreachable or summary.unrecorded):
        if summary.waiting:
            err(f"waiting for the started runs to end: {', '.join(summary.waiting)} "
                f"(run them then: `specdeck run {args.plan} {' '.join(summary.waiting)}`)")
        return exit_codes.OK
    return exit_codes.for_run(summary, named=bool(args.items))


def cmd_attach(args) -> int:
    plan = load_plan(args.plan)
    if args.item:
        plan.item(args.item)

    async def go(session):
        await session.reconcile()
        ran = await session.attach([args.item] if args.item else None)
        if not ran:
            err("no live runs" + (f" for {args.item}" if args.item else ""))

    run_with(plan, args, go)
    return 0


LOG_CATCH_UP_S = 30.0
"""How long ``logs`` waits for a live run's host to hand over the lines it has not stored."""


async def _catch_up(session, run, plan_arg: str, item_id: str):
    """A live run's newest lines into the store before ``logs`` prints it (the run's state
    first, as ``status`` refreshes it); the run as it now stands. When the host cannot
    give them, say on stderr how old the stored copy is and that ``-f`` follows."""
    import time

    run, why = await session.catch_up_log(run, timeout_s=LOG_CATCH_UP_S)
    if why:
        at = session.store.log_stored_at(run.id)
        age = (f"stored {time.strftime('%H:%M:%S', time.localtime(at))}, "
               f"{_ago(time.time() - at)} ago" if at else "nothing stored yet")
        err(f"[run {run.id} is live; this is the stored copy of its log ({age}): {why}; "
            f"`specdeck logs {plan_arg} {item_id} -f` follows it]")
    return run


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s // 3600} h"


def cmd_logs(args) -> int:
    import asyncio

    plan = load_plan(args.plan)
    plan.item(args.item)

    async def go(session):
        store = session.store
        run = session.latest_run(args.item)
        if run is None:
            raise InvalidInput(f"item {args.item!r} has no runs yet")
        if run.live and not args.follow:
            run = await _catch_up(session, run, args.plan, args.item)
        out = sys.stdout.buffer
        printed = 0

        def flush() -> None:
            nonlocal printed
            data = store.log_bytes(run.id, printed)
            if data:
                text = data.decode("utf-8", "replace")
                if not args.raw:  # a tqdm bar's \r redraws: the last one, as a terminal shows
                    text = "\n".join(collapse_cr(x) for x in text.split("\n"))
                if sys.stdout.isatty():
                    text = "\n".join(sanitize(x, newlines=False) for x in text.split("\n"))
                out.write(text.encode())
                out.flush()
                printed += len(data)

        flush()
        if args.follow and session.live_run(args.item):
            task = asyncio.create_task(session.attach([args.item]))
            while not task.done():
                flush()
                await asyncio.sleep(0.1)
            await task
            flush()
        final = store.run(run.id)
        if not final.live:
            how = (f"signal {final.signal}" if final.signal else f"exit {final.exit_code}"
                   if final.exit_code is not None else "exit status unknown")
            err(f"[run {final.id} {final.state} ({how})]")
        elif not args.follow:
            err(f"[run {final.id} is live: its log up to now; `specdeck logs {args.plan} "
                f"{args.item} -f` follows it]")

    run_with(plan, args, go, show_events=False, read=True)
    return 0


def cmd_stop(args) -> int:
    plan = load_plan(args.plan)
    plan.item(args.item)

    async def go(session):
        await session.reconcile()
        live = session.live_run(args.item)
        if live is None:
            # a command that exited may have left children running: those end too
            run, n = await session.end_leftovers(args.item, grace_s=min(args.grace, 10.0))
            err(f"{args.item}: run {run.id}: ended {n} process(es) it left running" if n
                else f"{args.item}: no live run")
            return 0
        what = (f"run {live.id} of item {args.item!r} on host {live.host!r} "
                + (f"(adopted {live.adopt['what']}: its process tree)"
                   if live.adopt else f"(process group {live.pid})"))
        if not args.yes:
            if not sys.stdin.isatty():
                raise InvalidInput(f"refusing to stop {what} without confirmation",
                                   hint="pass --yes to stop without asking")
            sys.stderr.write(f"Stop {what}? SIGTERM, {args.grace:g}s grace, then SIGKILL [y/N] ")
            sys.stderr.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                err("not stopped")
                return exit_codes.FAILED
        outcome = await session.stop(live.id, grace_s=args.grace)
        err(f"{args.item}: run {live.id} {outcome.state}"
            + (f" (signal {outcome.signal})" if outcome.signal else
               f" (exit {outcome.exit_code})" if outcome.exit_code is not None else
               " (exit status unknown)"))
        return 0

    return run_with(plan, args, go)


def cmd_adopt(args) -> int:
    from core.plans.adopt_spec import AdoptSpec, parse_pid

    plan = load_plan(args.plan)
    item = plan.item(args.item)
    log = args.log
    host_name = args.host or (item.action.host if item.action else None)
    if host_name is not None and host_name in plan.hosts and plan.hosts[host_name].local \
            and log and not log.startswith(("/", "~")):
        log = os.path.abspath(log)  # a path typed here, for this machine
    try:
        pid = parse_pid(args.pid) if args.pid is not None else None
    except ValueError as e:
        raise InvalidInput(f"--pid {args.pid[:40]!r}: {e}") from None
    spec = AdoptSpec(pid=pid, slurm_job=args.slurm_job, tmux=args.tmux, log=log,
                     from_start=args.from_start)
    if pid is None and args.slurm_job is None and args.tmux is None:
        if item.adopt is None:  # without one: what the item's adopt: in the plan names
            raise InvalidInput(f"item {item.id!r} has no adopt: in the plan; say what to "
                               "adopt", hint="--pid PID, --slurm-job ID or --tmux SESSION")
        spec = item.adopt

    async def go(session):
        await session.reconcile()
        return await session.adopt(item.id, spec, host_name=args.host)

    status = run_with(plan, args, go)
    return exit_codes.OK if status in ("done", "in_progress") else exit_codes.FAILED


def register(add) -> None:
    sp = add("run", cmd_run, "run items whose needs are done, in dependency order")
    sp.add_argument("plan")
    sp.add_argument("items", nargs="*")
    sp.add_argument("--all", action="store_true", help="run every item that can run")
    sp.add_argument("--again", action="store_true",
                    help="run the named items again even when done or stopped (a new "
                         "attempt; a succeeded train item trains again from step 0)")
    sp.add_argument("--resume", action="store_true",
                    help="the new attempt of a train item resumes the earlier one's newest "
                         "checkpoint (the default only after a failed or stopped attempt)")
    sp.add_argument("--detach", action="store_true",
                    help="start the runs and exit 0 without following them (prints ITEM RUN_ID "
                         "per run; in-process actions such as relay still run to their end)")
    sp.add_argument("-q", "--quiet", action="store_true", help="do not echo log lines")
    sp = add("attach", cmd_attach, "re-attach to live runs and follow them until they end")
    sp.add_argument("plan")
    sp.add_argument("item", nargs="?")
    sp.add_argument("-q", "--quiet", action="store_true", help="do not echo log lines")
    sp = add("logs", cmd_logs, "print the latest run's log (stored copy)")
    sp.add_argument("plan")
    sp.add_argument("item")
    sp.add_argument("-f", "--follow", action="store_true", help="follow a live run")
    sp.add_argument("--raw", action="store_true",
                    help="the log byte for byte (carriage-return redraws kept)")
    sp = add("stop", cmd_stop, "stop an item's live run (asks first)")
    sp.add_argument("plan")
    sp.add_argument("item")
    sp.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    sp.add_argument("--grace", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL")
    sp = add("adopt", cmd_adopt, "make a run started outside specdeck an item's run, and "
             "follow it")
    sp.add_argument("plan")
    sp.add_argument("item")
    g = sp.add_mutually_exclusive_group()  # none: the item's adopt: in the plan
    g.add_argument("--pid", help="a process (nohup torchrun...) on the item's host")
    g.add_argument("--slurm-job", metavar="ID", help="a Slurm job id (the host is the login node)")
    g.add_argument("--tmux", metavar="SESSION", help="a tmux session on the item's host")
    sp.add_argument("--log", help="the file its output goes to, on the host (relative: to "
                    "its workdir; to here for a local host); default: the PID's stdout file, "
                    "the job's StdOut, the tmux pane from now on")
    sp.add_argument("--from-start", action="store_true",
                    help="store the log from the file's start, not from now")
    sp.add_argument("--host", help="the plan host it runs on (default: the item's)")
    sp.add_argument("-q", "--quiet", action="store_true", help="do not echo log lines")
