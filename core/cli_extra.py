"""CLI commands over results: ``compare`` (the tau table) and ``diff`` (two runs' configs)."""

from __future__ import annotations

import asyncio
import json
import sys

from core.errors import InvalidInput
from core.plan import load_plan


def _flatten(d, prefix="") -> dict:
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = d
    return out


def cmd_compare(args) -> int:
    from core.cli import _with_runner
    from core.compare import build_comparison, to_csv, to_json, to_markdown

    if args.detect is not None and not args.detect > 0:
        raise InvalidInput(f"--detect {args.detect}: a tau difference above 0, e.g. 0.1")
    plan = load_plan(args.plan)
    if args.item:
        plan.item(args.item)

    async def go(runner):
        rows = runner.store.eval_results(args.item)
        if args.step is not None:
            rows = [r for r in rows if r["role"] == "baseline" or r["step"] == args.step]
        return rows

    rows = asyncio.run(_with_runner(plan, args, go, emit=lambda e: None))
    if not rows:
        raise InvalidInput(f"plan {plan.name!r} has no eval results yet"
                           + (f" for {args.item}" if args.item else ""),
                           hint="run an eval item first (`specdeck run PLAN ITEM`)")
    comp = build_comparison(rows, [tuple(p) for p in args.pair or ()],
                            **({"detect": args.detect} if args.detect is not None else {}))
    if args.json:
        print(to_json(comp))
    elif args.csv:
        sys.stdout.write(to_csv(comp))
    else:
        print(to_markdown(comp, pivot=args.pivot))
    return 0


def cmd_diff(args) -> int:
    from core.cli import _with_runner

    plan = load_plan(args.plan)
    for i in (args.item_a, args.item_b):
        plan.item(i)

    async def go(runner):
        out = []
        for i in (args.item_a, args.item_b):
            runs = [r for r in runner.store.runs_for_item(i) if r["config"]]
            if not runs:
                raise InvalidInput(f"item {i!r} has no run with a recorded config yet",
                                   hint="configs are recorded when a train run ends")
            out.append(json.loads(runs[-1]["config"]))
        return out

    a, b = asyncio.run(_with_runner(plan, args, go, emit=lambda e: None))
    fa, fb = _flatten(a), _flatten(b)
    keys = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)
                  and not k.startswith(("out", "resume", "data.", "seed_note")))
    if args.json:
        print(json.dumps({k: {args.item_a: fa.get(k), args.item_b: fb.get(k)} for k in keys},
                         indent=2))
        return 0
    if not keys:
        print(f"{args.item_a} and {args.item_b}: same settings")
        return 0
    w = max(len(k) for k in keys)
    print(f"{'setting':<{w}}  {args.item_a:<20} {args.item_b}")
    for k in keys:
        print(f"{k:<{w}}  {json.dumps(fa.get(k)):<20} {json.dumps(fb.get(k))}")
    return 0


def register(add) -> None:
    from core.adopt import register_cli

    register_cli(add)
    sp = add("compare", cmd_compare, "the tau table: prompt x drafter vs baseline")
    sp.add_argument("plan")
    sp.add_argument("--item", help="only this eval item's results")
    sp.add_argument("--step", type=int, help="only drafters evaluated at this training step")
    sp.add_argument("--pair", nargs=2, action="append", metavar=("A", "B"),
                    help="also compare drafter A with B on their shared prompts (paired test, "
                         "verdict); repeatable; their DDTree rows are paired too")
    sp.add_argument("--detect", type=float, metavar="TAU",
                    help="the tau difference 'how many prompts' estimates are for (default 0.1)")
    sp.add_argument("--pivot", action="store_true",
                    help="per-prompt table as prompts x drafters (baseline first, deltas beside)")
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true")
    g.add_argument("--csv", action="store_true")
    g.add_argument("--markdown", action="store_true", help="(default)")
    sp = add("diff", cmd_diff, "how two train runs' resolved configs differ")
    sp.add_argument("plan")
    sp.add_argument("item_a")
    sp.add_argument("item_b")
    sp.add_argument("--json", action="store_true")
