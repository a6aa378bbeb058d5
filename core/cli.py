"""``specdeck``: the headless CLI. Its commands, output and exit statuses are a contract.

Exit statuses: 0 success; 1 an action failed; 2 invalid input (nothing was written; an
unusable state database too); 3 a host could not be reached; 130 / 143 interrupted by Ctrl-C /
SIGTERM (detached runs keep going, runs inside specdeck are marked interrupted).
Diagnostics and progress go to stderr; stdout carries only what a script asked for
(``status --json``, ``export``, ``logs``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sqlite3
import sys
import time
from pathlib import Path


from core.cli_conventions import VersionAction, autocomplete, hoist_globals, polish, \
    quiet_broken_pipe
from core.errors import InvalidInput, PlanError, SpecdeckError
from core.events import (Event, HostStateChanged, LogLinesReceived, LogStreamChanged, Notice,
                         Progress, RunEnded, RunStarted, StatusChanged)
from core.plan import Plan, load_plan, params_summary, plan_to_todos, todos_to_plan_yaml
from core.cli_render import paint, table
from core.text import collapse_cr, sanitize

GLYPHS = {"pending": "○", "in_progress": "◐", "done": "●", "failed": "✗", "skipped": "⊘"}


def _err(msg: str) -> None:
    # Messages quote file names, hosts' output and plan text: one sanitizer at the boundary.
    print(sanitize(msg, max_len=20000), file=sys.stderr, flush=True)


def open_store(plan: Plan, state: str | None):
    from core.store import Store, state_path_for

    return Store(state_path_for(plan, state))


class Printer:
    """Prints runner events on stderr for a person watching a terminal."""

    def __init__(self, *, quiet: bool = False):
        self.quiet = quiet
        self._last_progress: dict[str, float] = {}

    def __call__(self, ev: Event) -> None:
        ts = time.strftime("%H:%M:%S")
        if isinstance(ev, LogLinesReceived):
            if not self.quiet and not ev.from_progress:
                for line in ev.lines:
                    _err(f"  {ev.item_id} │ {sanitize(collapse_cr(line), newlines=False)}")
        elif isinstance(ev, RunStarted):
            verb = "attached to" if ev.attached else "started"
            where = f" on {ev.host}" if ev.host else ""
            _err(f"[{ts}] {ev.item_id}: {verb} run {ev.run_id}{where}"
                 + (f" (pid {ev.pid})" if ev.pid else ""))
        elif isinstance(ev, RunEnded):
            how = (f"signal {ev.signal}" if ev.signal else f"exit {ev.exit_code}"
                   if ev.exit_code is not None else "exit status unknown")
            _err(f"[{ts}] {ev.item_id}: run {ev.run_id} {paint(ev.state, ev.state, sys.stderr)}"
                 f" ({how})" + (f": {sanitize(ev.error)}" if ev.error else ""))
        elif isinstance(ev, StatusChanged):
            mark = paint(f"{GLYPHS.get(ev.status, '?')} {ev.status}", ev.status, sys.stderr)
            _err(f"[{ts}] {ev.item_id}: {mark}" + (f" ({ev.reason})" if ev.reason else ""))
        elif isinstance(ev, Progress):
            now = time.monotonic()
            # Phase lines (no figures) always print; meter updates at most twice a second.
            if (not ev.fields or ev.fields.get("final")
                    or now - self._last_progress.get(ev.item_id or "", 0) >= 0.5):
                self._last_progress[ev.item_id or ""] = now
                _err(f"[{ts}] {ev.item_id}: {ev.message}")
        elif isinstance(ev, HostStateChanged):
            if ev.state != "connected" or ev.reason:
                _err(f"[{ts}] host {ev.host}: {ev.state}" + (f" ({ev.reason})" if ev.reason else ""))
        elif isinstance(ev, LogStreamChanged):
            _err(f"[{ts}] {ev.item_id}: log stream {ev.state} ({ev.host}: {ev.reason})")
        elif isinstance(ev, Notice):
            _err(f"[{ts}] {paint(ev.message, ev.level, sys.stderr)}")


async def _with_runner(plan: Plan, args, fn, *, emit=None):
    from core.faults import watch_signals_in_loop
    from core.runner import Runner

    watch_signals_in_loop()
    store = open_store(plan, args.state)
    runner = Runner(plan, store, emit=emit or Printer(quiet=getattr(args, "quiet", False)))
    try:
        return await fn(runner)
    finally:
        await runner.close()
        store.close()


def _run_json(run: dict | None) -> dict | None:
    if not run:
        return None
    return {k: run.get(k) for k in ("id", "host", "state", "pid", "exit_code", "signal",
                                     "started_at", "ended_at")}


# -- commands ----------------------------------------------------------------------------
def cmd_validate(args) -> int:
    plan = load_plan(args.plan)
    kinds = sorted({it.action.kind for it in plan.items if it.action})
    manual = sum(1 for it in plan.items if it.manual)
    print(f"{args.plan}: ok: plan {plan.name!r}, {len(plan.items)} items "
          f"({manual} manual), {len(plan.hosts)} hosts, kinds: {', '.join(kinds) or 'none'}")
    return 0


def cmd_status(args) -> int:
    plan = load_plan(args.plan)

    from core import watch_detached

    async def go(runner):
        changes = []
        runner.watch = False  # status never waits for tau-over-training evals
        if not args.no_reconcile and (runner.store.live_runs() or runner.store.watchers(live=True)):
            changes = await runner.reconcile()
        st = runner.statuses()
        latest = runner.store.latest_runs()
        alerts = [e for e in runner.store.events() if e["kind"] == "alert"]
        watchers = {i: watch_detached.status_of(runner.store, r["id"]) for i, r in latest.items()}
        return changes, st, latest, alerts, watchers

    changes, st, latest, alerts, watchers = asyncio.run(_with_runner(plan, args, go,
                                                                     emit=lambda e: None))
    if args.json:
        out = {"plan": plan.name, "items": [{
            "id": it.id, "content": it.content, "priority": it.priority, "status": st[it.id],
            "needs": list(it.needs),
            "action": ({"kind": it.action.kind, "host": it.action.host,
                        "params": params_summary(it)} if it.action else None),
            "run": _run_json(latest.get(it.id)),
            **({"watcher": watchers[it.id]} if watchers.get(it.id) else {})} for it in plan.items],
            "alerts": [{"item": a["item_id"], "run": a["run_id"], "at": a["at"],
                        "message": a["message"]} for a in alerts]}
        print(json.dumps(out, indent=2))
        return 0
    for c in changes:
        how = ""
        if c.get("signal"):
            how = f" (signal {c['signal']})"
        elif c.get("exit_code") is not None:
            how = f" (exit {c['exit_code']})"
        _err(f"meanwhile: {c['item']}: run {c['run']} {c['was']} -> {c['now']}{how}"
             + (f": {c.get('error') or c.get('reason')}" if c.get("error") or c.get("reason") else ""))
    rows = []
    for it in plan.items:
        run = latest.get(it.id)
        kind = it.action.kind if it.action else "manual"
        where = f"@{it.action.host}" if it.action and it.action.host else ""
        r = ""
        if run:
            how = (f" signal {run['signal']}" if run["signal"] else
                   (f" exit {run['exit_code']}" if run["exit_code"] is not None else ""))
            r = f"{run['state']}{how} #{run['attempt']}"
        rows.append([f"{GLYPHS[st[it.id]]} {st[it.id]}", it.id, it.priority, kind + where,
                     it.content, r])
    table(["status", "item", "priority", "action", "what", "latest run"], rows,
          title=f"plan {plan.name} ({plan.path})", styles=[st[it.id] for it in plan.items],
          wrap={4})
    for a in alerts[-5:]:
        print(sanitize(f"  ALERT {time.strftime('%m-%d %H:%M', time.localtime(a['at']))} "
                       f"{a['item_id']}: {a['message']}"))
    return 0


def cmd_run(args) -> int:
    plan = load_plan(args.plan)
    if not args.items and not args.all:
        raise InvalidInput("name the items to run, or pass --all")
    if args.again and not args.items:
        raise InvalidInput("--again reruns the items you name; name them")
    for i in args.items:
        plan.item(i)
    ids = None if args.all else args.items

    async def go(runner):
        await runner.reconcile()
        if args.again:
            runner.again.update(args.items)
        return await runner.run_items(ids)

    summary = asyncio.run(_with_runner(plan, args, go))
    if summary["manual"]:
        _err(f"manual items waiting for the operator: {', '.join(summary['manual'])} "
             f"(`specdeck mark {args.plan} ITEM done`)")
    if summary["unreachable"]:
        return 3
    if summary["failed"]:
        for i in summary["failed"]:
            _err(f"failed: {i}  (log: `specdeck logs {args.plan} {i}`)")
        return 1
    if summary["unadopted"]:
        _err(f"not launched until a run started outside specdeck is adopted: "
             f"{', '.join(summary['unadopted'])} (`specdeck adopt`, see above)")
    if args.items and summary["waiting"] and not summary["unadopted"]:
        return 1
    return 0


def cmd_attach(args) -> int:
    plan = load_plan(args.plan)
    if args.item:
        plan.item(args.item)

    async def go(runner):
        await runner.reconcile()
        ran = await runner.attach([args.item] if args.item else None)
        if not ran:
            _err("no live runs" + (f" for {args.item}" if args.item else ""))

    asyncio.run(_with_runner(plan, args, go))
    return 0


def cmd_mark(args) -> int:
    plan = load_plan(args.plan)
    plan.item(args.item)

    async def go(runner):
        if args.status in ("done", "skipped", "pending") and runner.store.live_run(args.item):
            raise InvalidInput(f"item {args.item!r} has a live run; stop it first "
                               f"(`specdeck stop {args.plan} {args.item}`)")
        runner.mark(args.item, args.status)

    asyncio.run(_with_runner(plan, args, go, emit=lambda e: None))
    print(f"{args.item}: {args.status}")
    return 0


def cmd_logs(args) -> int:
    plan = load_plan(args.plan)
    plan.item(args.item)
    async def go(runner):
        store = runner.store
        run = store.latest_run(args.item)
        if run is None:
            raise InvalidInput(f"item {args.item!r} has no runs yet")
        out = sys.stdout.buffer
        printed = 0

        def flush() -> None:
            nonlocal printed
            data = store.log_bytes(run["id"], printed)
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
        if args.follow and store.live_run(args.item):
            task = asyncio.create_task(runner.attach([args.item]))
            while not task.done():
                flush()
                await asyncio.sleep(0.1)
            await task
            flush()
        final = store.run(run["id"])
        if final["state"] not in ("starting", "running"):
            how = (f"signal {final['signal']}" if final["signal"] else f"exit {final['exit_code']}"
                   if final["exit_code"] is not None else "exit status unknown")
            _err(f"[run {final['id']} {final['state']} ({how})]")

    asyncio.run(_with_runner(plan, args, go, emit=lambda e: None))
    return 0


def cmd_stop(args) -> int:
    plan = load_plan(args.plan)
    plan.item(args.item)

    async def go(runner):
        await runner.reconcile()
        live = runner.store.live_run(args.item)
        if live is None:
            # a command that exited may have left children running: those end too
            run, n = await runner.end_leftovers(args.item, grace_s=min(args.grace, 10.0))
            _err(f"{args.item}: run {run['id']}: ended {n} process(es) it left running" if n
                 else f"{args.item}: no live run")
            return 0
        what = (f"run {live['id']} of item {args.item!r} on host {live['host']!r} "
                + (f"(adopted {json.loads(live['adopt'])['what']}: its process tree)"
                   if live.get("adopt") else f"(process group {live['pid']})"))
        if not args.yes:
            if not sys.stdin.isatty():
                raise InvalidInput(f"refusing to stop {what} without confirmation",
                                   hint="pass --yes to stop without asking")
            sys.stderr.write(f"Stop {what}? SIGTERM, {args.grace:g}s grace, then SIGKILL [y/N] ")
            sys.stderr.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                _err("not stopped")
                return 1
        outcome = await runner.stop_run(live["id"], grace_s=args.grace)
        _err(f"{args.item}: run {live['id']} {outcome.state}"
             + (f" (signal {outcome.signal})" if outcome.signal else
                f" (exit {outcome.exit_code})" if outcome.exit_code is not None else
                " (exit status unknown)"))
        return 0

    return asyncio.run(_with_runner(plan, args, go))


def cmd_export(args) -> int:
    plan = load_plan(args.plan)

    async def go(runner):
        return runner.statuses()

    st = asyncio.run(_with_runner(plan, args, go, emit=lambda e: None))
    if args.markdown:
        from core.plan import plan_to_markdown

        sys.stdout.write(plan_to_markdown(plan, st))
        return 0
    text = json.dumps(plan_to_todos(plan, st), indent=2, ensure_ascii=False)
    # C1 controls (U+0080-U+009F) stay escaped: still the same JSON, safe on a terminal
    print(re.sub("[\x7f-\x9f]", lambda m: f"\\u{ord(m.group()):04x}", text))
    return 0


def cmd_import(args) -> int:
    from core.plan import load_todos, parse_plan

    src = Path(args.todos)
    todos = load_todos(src)
    out = Path(args.output)
    if out.is_dir() or args.output.endswith(os.sep):
        raise InvalidInput(f"{out}: is a directory; name the plan file to write",
                           hint=f"e.g. -o {out / 'plan.yaml'}")
    if out.exists() and not args.force:
        raise InvalidInput(f"{out}: already exists; not overwritten", hint="pass --force")
    if out.exists() and not out.is_file():
        raise InvalidInput(f"{out}: is not a regular file; not overwritten")
    text = todos_to_plan_yaml(todos, args.name or out.stem, str(src))
    parse_plan(text, str(out))  # what we write must validate
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise InvalidInput(f"{out}: cannot write: {e.strerror or e}",
                           hint="choose a writable path with -o") from None
    _err(f"wrote {out} ({len(todos)} items)")
    return 0


def cmd_ui(args) -> int:
    plan = load_plan(args.plan)
    if _UI_OPENER is None:
        raise SpecdeckError("the console is not part of this entry point",
                            hint=f"run `specdeck ui {args.plan}` (console.cli) or `python -m console`")
    return _UI_OPENER(plan, state=args.state)


_UI_OPENER = None
"""Set by ``console.cli`` (core never imports console): opens the Textual console."""


def cmd_demo(args) -> int:
    from core.demo import run_demo

    return run_demo(args)


def cmd_kinds(args) -> int:
    from core.actions import registry

    for k in registry.kinds():
        print(f"{k:<16} {registry.get(k).summary}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdeck", description=(
        "Plan, run and watch a speculative-decoding drafter campaign across SSH hosts."))
    p.add_argument("--state", help="state database (default: $SPECDECK_STATE, the plan's "
                   "state:, or $XDG_STATE_HOME/specdeck/<plan>.db); before or after COMMAND")
    p.add_argument("--version", action=VersionAction)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name, fn, help_, example=None):
        sp = sub.add_parser(name, help=help_, description=help_,
                            epilog=f"example:\n  {example}" if example else None)
        sp.set_defaults(fn=fn)
        return sp

    sp = add("validate", cmd_validate, "check a plan; exit 2 with file:line:col errors if invalid")
    sp.add_argument("plan")
    sp = add("status", cmd_status, "items with their status and latest run")
    sp.add_argument("plan")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--no-reconcile", action="store_true",
                    help="do not contact hosts to refresh live runs")
    sp = add("run", cmd_run, "run items whose needs are done, in dependency order")
    sp.add_argument("plan")
    sp.add_argument("items", nargs="*")
    sp.add_argument("--all", action="store_true", help="run every item that can run")
    sp.add_argument("--again", action="store_true",
                    help="run the named items again even when done (a new attempt)")
    sp.add_argument("-q", "--quiet", action="store_true", help="do not echo log lines")
    sp = add("attach", cmd_attach, "re-attach to live runs and follow them until they end")
    sp.add_argument("plan")
    sp.add_argument("item", nargs="?")
    sp.add_argument("-q", "--quiet", action="store_true", help="do not echo log lines")
    sp = add("mark", cmd_mark, "set an item's status by hand")
    sp.add_argument("plan")
    sp.add_argument("item")
    sp.add_argument("status", choices=["pending", "in_progress", "done", "skipped"])
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
    sp = add("export", cmd_export, "print the plan's state: todowrite JSON or a Markdown checklist")
    sp.add_argument("plan")
    fmt = sp.add_mutually_exclusive_group(required=True)
    fmt.add_argument("--todowrite", action="store_true",
                     help="todowrite JSON: [{content, status, priority, id, needs}]")
    fmt.add_argument("--markdown", action="store_true",
                     help="a Markdown checklist (- [x] done items), with ids and needs")
    sp = add("import", cmd_import, "make a plan of manual items from a todowrite JSON list")
    sp.add_argument("todos")
    sp.add_argument("-o", "--output", required=True, help="the plan file to write")
    sp.add_argument("--name", help="plan name (default: the output file's stem)")
    sp.add_argument("--force", action="store_true", help="overwrite an existing plan file")
    sp = add("ui", cmd_ui, "open the console on a plan")
    sp.add_argument("plan")
    sp = add("demo", cmd_demo, "run the embedded demo campaign locally")
    sp.add_argument("--dir", default=None, help="workspace (default: ./specdeck-demo)")
    sp.add_argument("--headless", action="store_true", help="print progress, no console")
    sp.add_argument("--quick", action="store_true", help="a shorter campaign (CI)")
    sp = add("kinds", cmd_kinds, "list the action kinds")
    _extend(sub, add)
    polish(p)
    return p


EXTRA_COMMANDS = ("core.cli_extra", "core.cli_metrics", "core.cli_conventions")


def _extend(sub, add) -> None:
    """Commands contributed by later modules (compare, diff, metrics, completion)."""
    import importlib

    for name in EXTRA_COMMANDS:
        importlib.import_module(name).register(add)


def main(argv: list[str] | None = None, *, ui_opener=None) -> int:
    """Run the CLI. ``ui_opener(plan, state=)`` opens the console (given by console.cli)."""
    global _UI_OPENER
    if ui_opener is not None:
        _UI_OPENER = ui_opener
    parser = build_parser()
    autocomplete(parser)
    from core.faults import Interruption, terminate_as_interrupt

    args, how = None, Interruption()
    try:
        args = parser.parse_args(hoist_globals(parser, sys.argv[1:] if argv is None else argv))
        with terminate_as_interrupt() as how:
            code = args.fn(args)
        sys.stdout.flush()  # a closed pipe shows here, not as a warning at exit
        return code
    except BrokenPipeError:
        return quiet_broken_pipe()
    except PlanError as e:
        for issue in e.issues:
            _err(str(issue))
        return 2
    except SpecdeckError as e:
        _err(f"specdeck: {e.message}")
        if e.hint:
            _err(f"  hint: {e.hint}")
        return e.exit_status
    except (KeyboardInterrupt, asyncio.CancelledError):
        plan = getattr(args, "plan", None) or "<plan.yaml>"
        _err(f"specdeck: {how.name}: detached runs keep going on their hosts (`specdeck attach "
             f"{plan}` follows them again); runs inside this specdeck were marked interrupted")
        return how.exit_status
    except sqlite3.DatabaseError as e:
        _err(f"specdeck: state database {getattr(args, 'state', None) or '(default)'}: {e}")
        _err("  hint: free disk space or fix the file's permissions; pass another --state "
             "to start afresh")
        return 2
    except RecursionError:
        _err("specdeck: the input is nested too deeply to process")
        return 2
    except Exception as e:  # noqa: BLE001 - no traceback ever reaches a user
        from core.faults import describe_fault

        _err(f"specdeck: {describe_fault(e)}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
