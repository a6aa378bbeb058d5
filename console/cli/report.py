"""``report``: the morning report (issue 47 §5, :mod:`core.runs.report`): what happened in a
campaign over a window, in order; plain text, ``--markdown`` for a chat message, ``--json`` for
scripts; ``--send`` sends it as a notification (core.runs.notify), so a cron line sends it
on a schedule: ``0 7 * * * specdeck report plans/v5.yaml --since 12h --send``."""

from __future__ import annotations

import sys
import time

from console.cli.output import load_plan, run_with


def cmd_report(args) -> int:
    from core.runs import report

    plan = load_plan(args.plan)
    now = time.time()
    since = report.parse_since(args.since, now)
    until = report.parse_since(args.until, now) if args.until else now
    if since >= until:
        from core.errors import InvalidInput

        raise InvalidInput(f"--since {args.since} is not before --until {args.until or 'now'}")

    async def go(session):
        rep = report.build(plan, session.store, since, until)
        sent = None
        if args.send:
            from core.runs import notify

            sent = await notify.send_from_console(
                session.store, f"report:{plan.name}:{since:.0f}-{until:.0f}",
                f"specdeck report: {plan.name}", report.to_markdown(rep), event="report")
        return rep, sent

    rep, sent = run_with(plan, args, go, show_events=False, read=not args.send)
    if args.json:
        print(report.to_json(rep))
    elif args.markdown:
        sys.stdout.write(report.to_markdown(rep))
    else:
        sys.stdout.write(report.to_text(rep))
    if sent is not None:
        said = {"sent": "sent as a notification", "already": "sent before (this window's report)",
                "off": "not sent: no notification target (`specdeck notify` says where to put one)",
                "failed": "NOT sent: the target did not take it (`specdeck notify --test` checks it)"}
        print(f"report: {said[sent]}", file=sys.stderr)
        return 1 if sent == "failed" else (2 if sent == "off" else 0)
    return 0


def register(add) -> None:
    sp = add("report", cmd_report, "what happened while you were away, in order: runs started "
             "and ended, checkpoints written and evaluated, tau over training, alerts, "
             "preemptions, disk and GPU incidents, cost",
             example="specdeck report plans/v5.yaml --since 12h --markdown")
    sp.add_argument("plan", help="the plan file (YAML)")
    sp.add_argument("--since", default="12h", metavar="WHEN",
                    help="from this long ago (12h, 90m, 2d) or this time (2026-12-06T22:00, UTC); "
                         "default 12h")
    sp.add_argument("--until", metavar="WHEN", help="to this long ago or this time (default: now)")
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="JSON for scripts")
    g.add_argument("--markdown", action="store_true", help="Markdown for a chat message")
    sp.add_argument("--send", action="store_true",
                    help="also send it (Markdown) to the notification target; from cron: a schedule")
