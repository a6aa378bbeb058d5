"""CLI commands over results: ``compare`` (the tau table) and ``diff`` (two runs' configs)."""

from __future__ import annotations

import asyncio
import json
import sys

from core.errors import InvalidInput
from core.planfile import load_plan


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
            rows = [r for r in rows if r.role == "baseline" or r.step == args.step]
        return rows

    rows = asyncio.run(_with_runner(plan, args, go, emit=lambda e: None))
    if not rows:
        raise InvalidInput(f"plan {plan.name!r} has no eval results yet"
                           + (f" for {args.item}" if args.item else ""),
                           hint=f"run an eval item first (`specdeck run {args.plan} ITEM`)")
    comp = build_comparison(rows, [tuple(p) for p in args.pair or ()],
                            **({"detect": args.detect} if args.detect is not None else {}))
    if args.json:
        print(to_json(comp))
    elif args.csv:
        sys.stdout.write(to_csv(comp))
    else:
        from core.cli_render import colour_on, print_markdown_tables

        md = to_markdown(comp, pivot=args.pivot)
        if args.markdown or not colour_on(sys.stdout):
            print(md)  # piped: Markdown, ready to paste
        else:
            print_markdown_tables(md)
    return 0


WHERE_KEYS = ("out_dir", "out", "resume")
"""Top-level config keys that say where a run wrote or what it resumed from."""


def _diff_side(store, plan, spec: str) -> tuple[str, dict]:
    """``ITEM`` (its latest run with a recorded config) or ``ITEM#N`` (attempt N)."""
    item, _, attempt = spec.partition("#")
    plan.item(item)
    runs = [r for r in store.runs_for_item(item) if r.config]
    if attempt:
        if not attempt.isdigit():
            raise InvalidInput(f"{spec!r}: ITEM#N takes an attempt number")
        runs = [r for r in runs if r.attempt == int(attempt)]
        if not runs:
            have = ", ".join(f"#{r.attempt}" for r in store.runs_for_item(item)
                             if r.config) or "none"
            raise InvalidInput(f"item {item!r} has no attempt #{attempt} with a recorded "
                               f"config (recorded: {have})")
    if not runs:
        raise InvalidInput(f"item {item!r} has no run with a recorded config yet",
                           hint="a core.ml.train run records its resolved config when it "
                                "ends; a command: trainer, its argv and config file at launch")
    run = runs[-1]
    return f"{item}#{run.attempt}", run.config


def cmd_diff(args) -> int:
    from core.cli import _with_runner

    plan = load_plan(args.plan)

    async def go(runner):
        return [_diff_side(runner.store, plan, s) for s in (args.item_a, args.item_b)]

    (la, a), (lb, b) = asyncio.run(_with_runner(plan, args, go, emit=lambda e: None))
    fa, fb = _flatten(a), _flatten(b)
    missing = object()
    differ = sorted(k for k in set(fa) | set(fb) if fa.get(k, missing) != fb.get(k, missing))
    # where each run wrote (core.ml.train.config.RUN_KEYS, and a resume's source) is no setting
    where = [k for k in differ if k.split(".")[0] in WHERE_KEYS]
    keys = [k for k in differ if k not in where]
    if args.json:
        print(json.dumps({k: {la: fa.get(k), lb: fb.get(k)} for k in keys}, indent=2))
        return 0
    if not keys:
        print(f"{la} and {lb}: same settings")
        return 0
    from core.cli_render import table

    def show(d, k):
        return json.dumps(d[k], ensure_ascii=False) if k in d else "(absent)"

    table(["setting", la, lb], [[k, show(fa, k), show(fb, k)] for k in keys], wrap={1, 2})
    if where:
        print(f"(also differ, as they do for any two runs: {', '.join(where)})")
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
    g.add_argument("--markdown", action="store_true",
                   help="Markdown tables (the default when piped; on a terminal: wrapped tables)")
    sp = add("diff", cmd_diff, "every difference between two train runs' resolved configs")
    sp.add_argument("plan")
    sp.add_argument("item_a", metavar="ITEM[#N]", help="an item (its latest run) or ITEM#N, "
                    "its Nth attempt")
    sp.add_argument("item_b", metavar="ITEM[#N]", help="the other run, the same way")
    sp.add_argument("--json", action="store_true")
