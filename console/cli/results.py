"""Result commands: ``compare`` (the tau table), ``diff`` (two runs' configs) and ``metrics``
(a run's stored curves: CSV, JSON lines or a summary table).

``metrics`` gives every point the store holds for the run: JSON log lines, regexes, HF dict
lines, TensorBoard scalars (the tag is the name) and tau over training (``tau``,
``tau_pooled``, ...). CSV and JSON lines carry ``step,name,value,time`` (``time``: Unix seconds
when the point was made, the event's wall time for TensorBoard, else when specdeck stored it).
"""

from __future__ import annotations

import csv
import json
import sys

from console.cli.output import load_plan, run_with
from core.errors import InvalidInput
from core.ml.formats import strictjson
from core.ml.measure.draftlen import advise, lines, parse_cost
from core.state.points import value_of


def _flatten(d, prefix="") -> dict:
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = d
    return out


def cmd_compare(args) -> int:
    from core.tau.table import build_comparison, to_csv, to_json

    if args.detect is not None and not args.detect > 0:
        raise InvalidInput(f"--detect {args.detect}: a tau difference above 0, e.g. 0.1")
    plan = load_plan(args.plan)
    if args.item:
        plan.item(args.item)

    async def go(session):
        from core.runs.cost import run_items_of

        rows = session.eval_rows(args.item, step=args.step)
        return rows, session.costs(), run_items_of(rows, session.store.run)

    rows, costs, run_items = run_with(plan, args, go, show_events=False, read=True)
    if not rows:
        raise InvalidInput(f"plan {plan.name!r} has no eval results yet"
                           + (f" for {args.item}" if args.item else ""),
                           hint=f"run an eval item first (`specdeck run {args.plan} ITEM`)")
    comp = build_comparison(rows, [tuple(p) for p in args.pair or ()], decide=plan.decisions,
                            **({"detect": args.detect} if args.detect is not None else {}))
    if args.arms is not None:
        return compare_arms(plan, args, comp)
    for why in comp.left_out + comp.target_warnings:  # said in every format
        print(f"{plan.name}: {why}", file=sys.stderr)
    advice = draft_lengths(rows, args.cost)
    from core.runs.cost import cost_per_tau

    spent = cost_per_tau(plan, comp, costs, run_items)
    if args.json:
        data = json.loads(to_json(comp))
        if advice is not None:
            data["draft_length"] = {label: a for label, a in advice}
        data["cost_per_tau"] = spent
        print(strictjson.dumps(data, indent=2, default=str))
    elif args.csv:
        sys.stdout.write(to_csv(comp))
    else:
        print_comparison(comp, pivot=args.pivot, markdown=args.markdown)
        print()
        if spent:
            print(cost_markdown(spent))
            print()
        if advice is None:
            print("draft length: give --cost BASE,PER_TOKEN (a round's cost in plain target steps at draft "
                  "length k: BASE + PER_TOKEN*k) for the expected speedup at each k and the one to serve")
        for label, a in advice or ():
            print("\n".join(lines(a, f"{label}: ")))
    return 0


def compare_arms(plan, args, comp) -> int:
    """``compare --arms [LABEL]``: each arm against LABEL (else ``arms.against``) and each
    other, Holm-corrected (:mod:`core.tau.arms`)."""
    from core.plans.arms import arm_labels
    from core.tau import arms as tau_arms

    if plan.arms is None:
        raise InvalidInput(f"plan {plan.name!r} declares no arms",
                           hint="--arms compares a plan's arms: declare them under arms: "
                                "(plans/README.md, \"Arms\")")
    against = args.arms or plan.arms.against
    if not against:
        raise InvalidInput(f"plan {plan.name!r}: --arms needs the reference drafter",
                           hint="give it (`--arms v4`) or set arms.against in the plan")
    taus = tau_arms.per_prompt(comp)
    if against not in taus:
        raise InvalidInput(f"--arms {against}: no eval result labelled {against!r} (labels: "
                           f"{', '.join(taus) or 'none'})", hint="run its eval item first")
    result = tau_arms.compare_arms(taus, arm_labels(plan), against)
    if args.json:
        print(strictjson.dumps(tau_arms.to_dict(result), indent=2))
    elif args.csv:
        raise InvalidInput("--arms prints Markdown or --json", hint="drop --csv")
    else:
        from console.cli.render import is_terminal, print_markdown_tables

        text = tau_arms.to_markdown(result)
        if args.markdown or not is_terminal(sys.stdout):
            print(text, end="")
        else:
            print_markdown_tables(text)
    return 0


def draft_lengths(rows, cost_text: str | None) -> list | None:
    """Issue 45 §3: per drafter, the expected speedup at each draft length under ``--cost``."""
    if cost_text is None:
        return None
    try:
        cost = parse_cost(cost_text)
    except ValueError as exc:
        raise InvalidInput(f"--cost {cost_text}: {exc}") from None
    by: dict[str, list] = {}
    for r in rows:
        tree = isinstance(r.settings, dict) and r.settings.get("tree_budget") is not None
        if r.rounds and not tree:  # a DDTree verifies a tree, not a chain of k drafts
            by.setdefault(r.drafter, []).append(r)
    out = []
    for label, rs in by.items():
        rounds = [[int(x) for x in r.rounds] for r in rs]
        declared = next((r.settings.get("block_size") for r in rs if isinstance(r.settings, dict)
                         and isinstance(r.settings.get("block_size"), int)), 0)
        # a round longer than the block it says it ran (an older result): the rounds decide
        out.append((label, advise(rounds, max(declared, max(max(r) for r in rounds)), cost)))
    return out


def cost_markdown(spent: list[dict]) -> str:
    """The tau table's cost part: cost per unit of tau gained over the baseline."""
    from core.runs.cost import fmt

    lines = ["Cost per unit of tau gained over the baseline (training cost: the train items each "
             "eval stands on but the baseline all share, wall time x the hosts' price):", "",
             "| drafter | cost | Δ macro tau | cost per +1 tau |", "|---|---:|---:|---:|"]
    for s in spent:
        per = fmt(s["per_tau"]) if s["per_tau"] else "no gain"
        lines.append(f"| {s['drafter']} | {fmt(s['cost'])} | {s['delta_tau']:+.3f} | {per} |")
    return "\n".join(lines)


def print_comparison(comp, *, pivot: bool, markdown: bool) -> None:
    """The verdicts and the summary first, then the details. Piped (or ``--markdown``):
    Markdown, every value whole, ready to paste; on a terminal: the summary fit to its
    width (columns left out by priority, never the drafter's name or the verdict), the
    details as wrapping tables."""
    from console.cli.render import is_terminal, print_markdown_tables
    from core.tau.table import details_markdown, summary_markdown, to_markdown, \
        verdicts_markdown

    if markdown or not is_terminal(sys.stdout):
        print(to_markdown(comp, pivot=pivot))
        return
    verdicts = verdicts_markdown(comp)
    if verdicts:
        print_markdown_tables(verdicts)
        print()
    print_markdown_tables(summary_markdown(comp), fit=True, wrap_headers=("note",))
    print()
    print_markdown_tables(details_markdown(comp, pivot=pivot))


WHERE_KEYS = ("out_dir", "out", "resume")
"""Top-level config keys that say where a run wrote or what it resumed from."""
RECORD = "record"
"""The prefix of the keys of a run's reproduction record (core.ml.formats.reproduce) in
``diff``: ``record.target.dtype``, ``record.git.dirty``..."""
RECORD_WHERE = ("record.git.diff", "record.config.out", "record.config.out_dir",
                "record.config.baseline_out", "record.config.resume")
"""Record keys that say where a run wrote (its own files), not how it ran."""


def _arm_train_item(plan, name: str) -> str:
    """An arm's name (``diff PLAN noise taps``): its item that records a config (its train
    item); anything else as given."""
    if plan.arms is None or name not in plan.arms.names or any(it.id == name for it in plan.items):
        return name
    trains = [it.id for it in plan.arm_items(name) if it.action and it.action.kind == "train"]
    if len(trains) != 1:
        raise InvalidInput(f"arm {name!r} has {len(trains) or 'no'} train items: name the item "
                           f"({', '.join(it.id for it in plan.arm_items(name))})")
    return trains[0]


def _record(run) -> dict | None:
    rec = (run.result or {}).get(RECORD) if isinstance(run.result, dict) else None
    return rec if isinstance(rec, dict) else None


def _diff_side(session, spec: str):
    """``ITEM`` (its latest run with a recorded config or record), ``ITEM#N`` (attempt N) or an
    arm's name (its train item): its label, its run and what diff compares (the config, and
    the record under ``record.``)."""
    item, _, attempt = spec.partition("#")
    item = _arm_train_item(session.plan, item)
    session.plan.item(item)
    runs = [r for r in session.runs_of(item) if r.config or _record(r)]
    if attempt:
        if not attempt.isdigit():
            raise InvalidInput(f"{spec!r}: ITEM#N takes an attempt number")
        recorded, runs = runs, [r for r in runs if r.attempt == int(attempt)]
        if not runs:
            have = ", ".join(f"#{r.attempt}" for r in recorded) or "none"
            raise InvalidInput(f"item {item!r} has no attempt #{attempt} with a recorded "
                               f"config (recorded: {have})")
    if not runs:
        raise InvalidInput(f"item {item!r} has no run with a recorded config yet",
                           hint="a core.ml.train run records its resolved config when it "
                                "ends; a command: trainer, its argv and config file at launch")
    run = runs[-1]
    flat = _flatten(run.config or {})
    rec = _record(run)
    if rec is not None:
        flat.update(_flatten(rec, RECORD))
    return f"{item}#{run.attempt}", run, flat


def cmd_diff(args) -> int:

    plan = load_plan(args.plan)

    async def go(session):
        return [_diff_side(session, s) for s in (args.item_a, args.item_b)]

    (la, ra, fa), (lb, rb, fb) = run_with(plan, args, go, show_events=False, read=True)
    missing = object()
    differ = sorted(k for k in set(fa) | set(fb) if fa.get(k, missing) != fb.get(k, missing))
    # where each run wrote (core.ml.train.config.RUN_KEYS, and a resume's source) is no setting
    where = [k for k in differ if k.split(".")[0] in WHERE_KEYS or k in RECORD_WHERE]
    keys = [k for k in differ if k not in where]
    unrecorded = [label for label, f in ((la, fa), (lb, fb))
                  if not any(k.startswith(RECORD + ".") for k in f)]
    if args.json:
        print(strictjson.dumps({k: {la: fa.get(k), lb: fb.get(k)} for k in keys}, indent=2))
        return 0
    for label in unrecorded:  # an older run, or a trainer that writes no provenance.json
        print(f"{label}: no reproduction record (specdeck, git, versions, target, data): "
              "only its config is compared", file=sys.stderr)
    if not keys:
        print(f"{la} and {lb}: same settings" + ("" if unrecorded else " and the same record"))
        return 0
    from console.cli.render import table

    def show(d, k):
        return json.dumps(d[k], ensure_ascii=False) if k in d else "(absent)"

    table(["setting", la, lb], [[k, show(fa, k), show(fb, k)] for k in keys], wrap={1, 2})
    for label, run, f in ((la, ra, fa), (lb, rb, fb)):
        if f.get("record.git.dirty") and f.get("record.git.diff"):
            print(f"{label}: its checkout was dirty; the diff is kept on {run.host}: "
                  f"{f['record.git.diff']}")
    if where:
        print(f"(also differ, as they do for any two runs: {', '.join(where)})")
    return 0


FIELDS = ("step", "name", "value", "time")


def pick_run(session, item_id: str, which: str | None):
    """The run ``which`` names (an attempt number or a run id); default: the latest."""
    runs = session.runs_of(item_id)
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
    plan = load_plan(args.plan)
    plan.item(args.item)
    names = [n.strip() for n in args.names.split(",") if n.strip()] if args.names else None

    async def go(session):
        run = pick_run(session, args.item, args.run)
        return run, session.store.metric_rows(run.id, names)

    run, rows = run_with(plan, args, go, show_events=False, read=True)
    # an older store may hold a NaN or infinite point (this version never stores one): left
    # out, and said, so --csv stays numeric and --jsonl strict JSON
    bad = [r for r in rows if None in (value_of(r.value), value_of(r.time))]
    if bad:
        rows = [r for r in rows if None not in (value_of(r.value), value_of(r.time))]
        print(f"{args.item}: {len(bad)} stored point(s) that are not finite numbers left out "
              f"(e.g. {bad[0].name} at step {bad[0].step})", file=sys.stderr)
    if args.csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(FIELDS)
        for r in rows:
            w.writerow([r.step, r.name, repr(r.value), f"{r.time:.3f}"])
        sys.stdout.flush()
        return 0
    if args.jsonl:
        for r in rows:
            sys.stdout.write(strictjson.dumps({k: getattr(r, k) for k in FIELDS})
                             + "\n")
        sys.stdout.flush()
        return 0
    if not rows:
        print(f"{args.item}: run {run.id} (attempt {run.attempt}) has no metrics"
              + (f" named {', '.join(names)}" if names else ""), file=sys.stderr)
        return 0
    series: dict[str, list] = {}
    for r in rows:
        series.setdefault(r.name, []).append(r)
    from console.cli.render import table

    table(["name", "points", "steps", "last value"],
          [[n, str(len(s)), f"{s[0].step}..{s[-1].step}", f"{s[-1].value:.6g}"]
           for n, s in sorted(series.items())],
          title=f"{args.item}: run {run.id} (attempt {run.attempt})")
    return 0


def register(add) -> None:
    sp = add("compare", cmd_compare, "the tau table: prompt x drafter vs baseline")
    sp.add_argument("plan")
    sp.add_argument("--item", help="only this eval item's results")
    sp.add_argument("--step", type=int, metavar="N",
                    help="only the drafters evaluated at training step N, with every baseline "
                         "(a step nobody evaluated: exit 2, naming the evaluated steps)")
    sp.add_argument("--pair", nargs=2, action="append", metavar=("A", "B"),
                    help="also compare drafter A with B on their shared prompts (paired test, "
                         "verdict); repeatable; their DDTree rows are paired too")
    sp.add_argument("--detect", type=float, metavar="TAU",
                    help="the tau difference 'how many prompts' estimates are for (default 0.1)")
    sp.add_argument("--cost", metavar="BASE,PER_TOKEN",
                    help="a round's cost in plain target steps at draft length k (BASE + PER_TOKEN*k): "
                         "adds the expected speedup at each k and the draft length to serve")
    sp.add_argument("--arms", nargs="?", const="", default=None, metavar="LABEL",
                    help="the plan's arms: each against LABEL (default: arms.against) and each "
                         "other, paired, verdicts Holm-corrected, each arm's knob beside it")
    sp.add_argument("--pivot", action="store_true",
                    help="per-prompt table as prompts x drafters (baseline first, deltas beside)")
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true")
    g.add_argument("--csv", action="store_true")
    g.add_argument("--markdown", action="store_true",
                   help="Markdown tables (the default when piped; on a terminal: wrapped tables)")
    sp = add("diff", cmd_diff, "every difference between two runs: config, and the record that "
             "reproduces each (specdeck, git commit and dirty tree, versions, target, data)")
    sp.add_argument("plan")
    sp.add_argument("item_a", metavar="ITEM[#N]", help="an item (its latest run) or ITEM#N, "
                    "its Nth attempt; or an arm's name (its train item: `diff PLAN noise taps`)")
    sp.add_argument("item_b", metavar="ITEM[#N]", help="the other run, the same way")
    sp.add_argument("--json", action="store_true")
    sp = add("metrics", cmd_metrics, "a run's stored curves: CSV, JSON lines or a summary",
             example="specdeck metrics plans/v5.yaml train-v5 --csv --names loss,tau > v5.csv")
    sp.add_argument("plan", help="the plan file (YAML)")
    sp.add_argument("item", help="the item whose run's metrics to print")
    sp.add_argument("--run", metavar="N", help="attempt number or run id (default: the latest)")
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--csv", action="store_true", help="CSV with header step,name,value,time")
    g.add_argument("--jsonl", action="store_true", help="one JSON object per point (same keys)")
    sp.add_argument("--names", metavar="A,B", help="only these metric names, comma-separated")
