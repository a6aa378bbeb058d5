"""``specdeck metrics``: a run's stored curves out, as CSV, JSON lines or a summary table.

Every point the store holds for the run: JSON log lines, regexes, HF dict lines, TensorBoard
scalars (the tag is the name) and tau over training (``tau``, ``tau_pooled``, ...). CSV and
JSON lines carry ``step,name,value,time`` (``time``: Unix seconds when the point was made,
the event's wall time for TensorBoard, else when specdeck stored it).
"""

from __future__ import annotations

import asyncio
import csv
import json
import sys

from core.errors import InvalidInput
from core.planfile import load_plan

FIELDS = ("step", "name", "value", "time")


def pick_run(store, item_id: str, which: str | None) -> dict:
    """The run ``which`` names (an attempt number or a run id); default: the latest."""
    runs = store.runs_for_item(item_id)
    if not runs:
        raise InvalidInput(f"item {item_id!r} has no runs yet",
                           hint=f"start one: `specdeck run <plan> {item_id}`")
    if which is None:
        return runs[-1]
    for r in runs:
        if which in (str(r.attempt), r.id):
            return r
    have = ", ".join(f"{r.attempt} ({r.id})" for r in runs)
    raise InvalidInput(f"item {item_id!r} has no run {which!r}; its runs: {have}")


def cmd_metrics(args) -> int:
    from core.cli import _with_runner

    plan = load_plan(args.plan)
    plan.item(args.item)
    names = [n.strip() for n in args.names.split(",") if n.strip()] if args.names else None

    async def go(runner):
        run = pick_run(runner.store, args.item, args.run)
        return run, runner.store.metric_rows(run.id, names)

    run, rows = asyncio.run(_with_runner(plan, args, go, emit=lambda e: None))
    if args.csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(FIELDS)
        for r in rows:
            w.writerow([r.step, r.name, repr(r.value), f"{r.time:.3f}"])
        sys.stdout.flush()
        return 0
    if args.jsonl:
        for r in rows:
            sys.stdout.write(json.dumps({k: getattr(r, k) for k in FIELDS}) + "\n")
        sys.stdout.flush()
        return 0
    if not rows:
        print(f"{args.item}: run {run.id} (attempt {run.attempt}) has no metrics"
              + (f" named {', '.join(names)}" if names else ""), file=sys.stderr)
        return 0
    series: dict[str, list] = {}
    for r in rows:
        series.setdefault(r.name, []).append(r)
    from core.cli_render import table

    table(["name", "points", "steps", "last value"],
          [[n, str(len(s)), f"{s[0].step}..{s[-1].step}", f"{s[-1].value:.6g}"]
           for n, s in sorted(series.items())],
          title=f"{args.item}: run {run.id} (attempt {run.attempt})")
    return 0


def register(add) -> None:
    sp = add("metrics", cmd_metrics, "a run's stored curves: CSV, JSON lines or a summary",
             example="specdeck metrics plans/v5.yaml train-v5 --csv --names loss,tau > v5.csv")
    sp.add_argument("plan", help="the plan file (YAML)")
    sp.add_argument("item", help="the item whose run's metrics to print")
    sp.add_argument("--run", metavar="N", help="attempt number or run id (default: the latest)")
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--csv", action="store_true", help="CSV with header step,name,value,time")
    g.add_argument("--jsonl", action="store_true", help="one JSON object per point (same keys)")
    sp.add_argument("--names", metavar="A,B", help="only these metric names, comma-separated")
