"""Plan commands: ``validate``, ``status``, ``mark``, ``export``, ``import``, ``kinds``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import time
from pathlib import Path

from console.cli import serving
from console.cli.output import GLYPHS, err, load_plan, run_with
from console.cli.render import table
from core.errors import InvalidInput
from core.ml.formats import strictjson
from core.text import sanitize


def _run_json(run) -> dict | None:
    if not run:
        return None
    return {k: getattr(run, k) for k in ("id", "host", "state", "pid", "exit_code", "signal",
                                         "started_at", "ended_at")}


def cmd_validate(args) -> int:
    from core.capsules.metrics_sources import params_regex_warnings

    plan = load_plan(args.plan)
    for it in plan.items:  # warnings: the plan is valid, exit 0
        for w in params_regex_warnings(it.action.params) if it.action else ():
            err(f"{args.plan}: warning: item {it.id}: {w}")
    kinds = sorted({it.action.kind for it in plan.items if it.action})
    manual = sum(1 for it in plan.items if it.manual)
    print(f"{args.plan}: ok: plan {plan.name!r}, {len(plan.items)} items "
          f"({manual} manual), {len(plan.hosts)} hosts, kinds: {', '.join(kinds) or 'none'}")
    if plan.arms:
        print(f"  arms: {len(plan.arms.arms)} ({', '.join(plan.arms.names)}), each runs "
              f"{', '.join(plan.arms.templates)}" + (f"; compared with {plan.arms.against}"
                                                    if plan.arms.against else ""))
        for arm in plan.arms.arms:
            print(sanitize(f"  {arm.name}: {', '.join(it.id for it in plan.arm_items(arm.name))}"
                           f" ({'; '.join(arm.knob) or 'changes nothing'})"))
    return 0


def arm_rows(plan, st: dict[str, str]) -> list[dict]:
    """Per arm: its name, knob, items, how many are done and its state (status)."""
    from core.plans.arms import arm_state

    out = []
    for arm in plan.arms.arms if plan.arms else ():
        ids = [it.id for it in plan.arm_items(arm.name)]
        out.append({"arm": arm.name, "knob": list(arm.knob), "items": ids,
                    "done": sum(st[i] == "done" for i in ids),
                    "state": arm_state([st[i] for i in ids])})
    return out


def cmd_status(args) -> int:
    from core.actions.watch_eval.status import describe as describe_watcher
    from core.capsules.telemetry import describe as telemetry_line
    from core.plans.plan import params_summary

    plan = load_plan(args.plan)

    async def go(session):
        changes = [] if args.no_reconcile else await session.refresh()
        if not args.no_reconcile:
            await session.sample_hosts()
        return changes, session.overview()

    changes, seen = run_with(plan, args, go, show_events=False, read=True)
    st, latest, alerts, watchers = seen.statuses, seen.latest, seen.alerts, seen.watchers
    if args.json:
        out = {"plan": plan.name, "items": [{
            "id": it.id, "content": it.content, "priority": it.priority, "status": st[it.id],
            "needs": list(it.needs),
            **({"arm": it.arm, "template": it.template} if it.arm else {}),
            "action": ({"kind": it.action.kind, "host": it.action.host,
                        "params": params_summary(it)} if it.action else None),
            "run": _run_json(latest.get(it.id)),
            **({"watcher": dataclasses.asdict(watchers[it.id])} if watchers.get(it.id)
               else {})} for it in plan.items],
            "alerts": [{"item": a.item_id, "run": a.run_id, "at": a.at,
                        "message": a.message} for a in alerts],
            "hosts": seen.hosts, "cost": seen.costs.to_json() if seen.costs else None,
            **({"arms": arm_rows(plan, st)} if plan.arms else {})}
        print(strictjson.dumps(out, indent=2))
        return 0
    for c in changes:
        how = ""
        if c.signal:
            how = f" (signal {c.signal})"
        elif c.exit_code is not None:
            how = f" (exit {c.exit_code})"
        err(f"meanwhile: {c.item}: run {c.run} {c.was} -> {c.now}{how}"
            + (f": {c.why}" if c.why else ""))
    rows = []
    for it in plan.items:
        run = latest.get(it.id)
        kind = it.action.kind if it.action else "manual"
        where = f"@{it.action.host}" if it.action and it.action.host else ""
        r = ""
        if run:
            how = (f" signal {run.signal}" if run.signal else
                   (f" exit {run.exit_code}" if run.exit_code is not None else ""))
            r = f"{run.state}{how} #{run.attempt}"
        rows.append([f"{GLYPHS[st[it.id]]} {st[it.id]}", it.id, it.priority, kind + where,
                     it.content, r])
    # On a narrow terminal the ids stay whole (they are what the next command types): the
    # priority goes first, then the titles, the actions, the latest runs.
    table(["status", "item", "priority", "action", "what", "latest run"], rows,
          title=f"plan {plan.name} ({plan.path})", styles=[st[it.id] for it in plan.items],
          wrap={4}, fit=True, ids={1}, drop=(2, 4, 3, 5),
          more="a wider terminal, --json or a pipe (one whole row per item) shows them")
    for a in arm_rows(plan, st):
        print(sanitize(f"  arm {a['arm']}: {GLYPHS[a['state']]} {a['state']}, {a['done']}/"
                       f"{len(a['items'])} done ({'; '.join(a['knob']) or 'changes nothing'})"))
    for it in plan.items:
        if watchers.get(it.id):
            print(sanitize(f"  tau watch {it.id}: {describe_watcher(watchers[it.id])}"))
    for name, sample in seen.hosts.items():
        when = time.strftime("%m-%d %H:%M:%S", time.localtime(sample["at"]))
        print(sanitize(f"  host {name}: {telemetry_line(sample)} (sampled {when})"))
    for a in alerts[-5:]:
        print(sanitize(f"  ALERT {time.strftime('%m-%d %H:%M', time.localtime(a.at))} "
                       f"{a.item_id}: {a.message}"))
    for line in cost_lines(plan, seen.costs):
        print(sanitize(f"  {line}"))
    return 0


def cost_lines(plan, costs) -> list[str]:
    """``status``'s cost lines (issue 47 §3): the campaign's total so far, each arm's, each
    item's, and the hosts that ran something without a ``price:``; none when no host has one."""
    from core.runs.cost import fmt

    if costs is None or not any(h.price for h in plan.hosts.values()):
        return []
    out = [f"cost so far: {fmt(costs.total)} ({costs.hours:.2f} h of runs on priced hosts)"]
    if costs.arms:
        out.append("by arm: " + "; ".join(f"{a} {fmt(v)}" for a, v in costs.arms.items()))
    if costs.items:
        out.append("by item: " + "; ".join(f"{i} {fmt(v)}" for i, v in costs.items.items()))
    if costs.unpriced:
        out.append(f"not counted: runs on {', '.join(costs.unpriced)} (no price: in the plan)")
    return out


def cmd_mark(args) -> int:
    plan = load_plan(args.plan)
    plan.item(args.item)

    async def go(session):
        session.mark(args.item, args.status, stop_hint=f"`specdeck stop {args.plan} {args.item}`")

    run_with(plan, args, go, show_events=False)
    print(f"{args.item}: {args.status}")
    return 0


def cmd_export(args) -> int:
    if args.out is None and not (args.todowrite or args.markdown):
        raise InvalidInput("export needs --todowrite or --markdown (a plan), or --out DIR (a drafter)")
    if args.out is not None:
        if args.todowrite or args.markdown:
            raise InvalidInput("--out writes a drafter, --todowrite/--markdown print a plan: give one")
        return serving.cmd_export_drafter(args)
    plan = load_plan(args.plan)

    async def go(session):
        return session.statuses()

    st = run_with(plan, args, go, show_events=False, read=True)
    if args.markdown:
        from core.plans.todos import plan_to_markdown

        sys.stdout.write(plan_to_markdown(plan, st))
        return 0
    from core.plans.todos import plan_to_todos

    text = strictjson.dumps(plan_to_todos(plan, st), indent=2, ensure_ascii=False)
    # C1 controls (U+0080-U+009F) stay escaped: still the same JSON, safe on a terminal
    print(re.sub("[\x7f-\x9f]", lambda m: f"\\u{ord(m.group()):04x}", text))
    return 0


def cmd_import(args) -> int:
    from core.plans.planfile import plan_from_data
    from core.plans.todos import load_todos, plan_yaml, todos_to_plan

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
    doc = todos_to_plan(todos, args.name or out.stem, str(src))
    text = plan_yaml(doc)
    plan_from_data(doc, text, str(out))  # what we write must validate
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
    err(f"wrote {out} ({len(todos)} items)")
    return 0


def cmd_kinds(args) -> int:
    from core.actions import registry

    for k in registry.kinds():
        print(f"{k:<16} {registry.get(k).summary}")
    return 0


def register(add) -> None:
    sp = add("validate", cmd_validate, "check a plan; exit 2 with file:line:col errors if invalid")
    sp.add_argument("plan")
    sp = add("status", cmd_status, "items with their status and latest run")
    sp.add_argument("plan")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--no-reconcile", action="store_true",
                    help="do not contact hosts to refresh live runs")
    sp = add("mark", cmd_mark, "set an item's status by hand")
    sp.add_argument("plan")
    sp.add_argument("item")
    sp.add_argument("status", choices=["pending", "in_progress", "done", "skipped"])
    sp = add("export", cmd_export, "print the plan's state: todowrite JSON or a Markdown checklist; "
             "or write a drafter in the layout an engine loads (export DRAFTER_DIR --out DIR)")
    sp.add_argument("plan", metavar="PLAN|DRAFTER_DIR",
                    help="a plan file (--todowrite, --markdown) or a drafter directory (--out)")
    serving.add_export_args(sp)
    fmt = sp.add_mutually_exclusive_group()
    fmt.add_argument("--todowrite", action="store_true",
                     help="todowrite JSON: [{content, status, priority, id, needs}]")
    fmt.add_argument("--markdown", action="store_true",
                     help="a Markdown checklist (- [x] done items), with ids and needs")
    sp = add("import", cmd_import, "make a plan of manual items from a todowrite JSON list")
    sp.add_argument("todos")
    sp.add_argument("-o", "--output", required=True, help="the plan file to write")
    sp.add_argument("--name", help="plan name (default: the output file's stem)")
    sp.add_argument("--force", action="store_true", help="overwrite an existing plan file")
    sp = add("kinds", cmd_kinds, "list the action kinds")
