"""Serving commands: ``engines`` (how each engine will read a drafter), the drafter form of
``export`` (``export DRAFTER_DIR --out DIR``: the layouts engines load) and ``parity`` (one
drafter measured by several eval items: in process, under an engine's rule, through the
engine; the same drafter or not, equal or not and why), docs/serving.md.

Both run here, on the machine the CLI runs on: ``engines`` is pure Python
(:mod:`core.ml.engines.lint`); ``export`` needs the ``ml`` extra (torch) and runs
``core.ml.export`` in process, so its messages and exit status are that module's.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import InvalidInput
from core.ml.formats import strictjson


def cmd_engines(args) -> int:
    from core.ml.engines.lint import lint, render
    from core.ml.engines.rules import ENGINES, engine

    try:
        names = [engine(n).name for n in args.engine] if args.engine else list(ENGINES)
        result = lint(args.drafter, args.target, names)
    except InvalidInput:  # InvalidFile: the drafter's or the target's file, named with the key
        raise
    except ValueError as e:
        raise InvalidInput(str(e), hint="give a drafter directory (config.json + model.safetensors) "
                                        "or its config.json") from None
    if args.json:  # every number came through check_fields: finite, so strict JSON
        print(strictjson.dumps(result.to_dict(), indent=2))
    else:
        print(render(result), end="")
    return 0


def cmd_export_drafter(args) -> int:
    """``export DRAFTER_DIR --out DIR ...``: :mod:`core.ml.export` with the same options."""
    try:
        from core.ml.tasks import export
        from core.ml.formats.runio import run_main
    except ImportError as e:  # pragma: no cover - a laptop install without the ml extra
        raise InvalidInput(f"export of a drafter needs torch ({e})",
                           hint="install the ml extra: pip install 'specdeck[ml]'") from None
    argv = [args.plan, "--out", args.out, "--format", args.format, "--dtype", args.dtype]
    for flag, value in (("--target", args.target), ("--verifier", args.verifier), ("--llama-cpp", args.llama_cpp)):
        if value:
            argv += [flag, value]
    return run_main(export.main, argv)


def cmd_card(args) -> int:
    """``card PLAN LABEL --drafter DIR``: README.md, a model card whose every figure comes from
    the plan's stored eval results of LABEL (:mod:`core.tau.card`), into ``--out`` or stdout."""
    import sys

    from console.cli.output import load_plan, run_with
    from core.ml.measure.draftlen import parse_cost
    from core.tau.card import render

    try:
        cost = parse_cost(args.cost) if args.cost else None
    except ValueError as exc:
        raise InvalidInput(f"--cost {args.cost}: {exc}") from None
    if not (Path(args.drafter) / "config.json").is_file():
        raise InvalidInput(f"--drafter {args.drafter}: no config.json there (a drafter directory or its export)")
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise InvalidInput(f"--out {out}: exists and is not a directory")
    plan = load_plan(args.plan)

    async def go(session):
        return session.eval_rows(None)

    rows = run_with(plan, args, go, show_events=False, read=True)
    text = render(args.label, rows, args.drafter, plan=plan.name, base_model=args.base_model,
                  license=args.license, cost=cost)
    if out is None:
        print(text)
        return 0
    from core.ml.formats import export_swap
    from core.ml.formats.runio import atomic_write_text

    card = out / "README.md"
    try:  # a private temp file beside it, renamed over README.md (a link there is replaced, not followed)
        atomic_write_text(card, text + "\n")
        export_swap.set_own_mode(card, export_swap.FILE_MODE)  # readable by a server, as an export's files
    except OSError as exc:
        raise InvalidInput(f"--out {out}: could not write README.md ({exc.strerror or exc}); nothing else "
                           "there was changed") from None
    print(f"wrote {card}", file=sys.stderr)
    return 0


def cmd_parity(args) -> int:
    """``parity PLAN ITEM ITEM...``: :func:`core.ml.measure.parity.parity` over the items' latest
    results (read from their hosts), every pair the same drafter or not, equal or not, round by
    round, and why. Each side is labelled ``ITEM (harness)``, so two items measured through one
    harness never share a column. Exit 0, or 4 (``exit_codes.DIFFERENT_DRAFTERS``) when some
    pair measured different drafters: the report is printed all the same."""
    from console.cli import exit_codes
    from console.cli.output import err, load_plan, run_with
    from core.ml.measure.parity import different_drafters_line, name_of, parity

    if len(args.items) < 2:
        raise InvalidInput(f"parity compares results pairwise: got {len(args.items)} item, give at least two",
                           hint="name the eval items that measured the same drafter (offline, online, "
                                "engine_rule, engine)")
    twice = next((i for i in args.items if args.items.count(i) > 1), None)
    if twice is not None:
        raise InvalidInput(f"item {twice!r} is named twice: parity compares different items' results",
                           hint="name each eval item once; to measure one item twice, run it again into "
                                "another item")
    plan = load_plan(args.plan)
    for item in args.items:
        plan.item(item)

    async def go(session):
        return [await session.eval_result(i) for i in args.items]

    got = run_with(plan, args, go, show_events=False, read=True)
    report = parity([result for _, result in got],
                    [f"{item} ({name_of(result)})" for item, (_, result) in zip(args.items, got)])
    report["items"] = [{"item": i, "run": run.id, "side": side, "label": label}
                       for i, (run, _), side, label in zip(args.items, got, report["sides"], report["labels"])]
    if args.json:
        print(strictjson.dumps(report, indent=2))
    else:
        from console.cli.render import table

        table(["a", "b", "equal", "tokens", "rounds", "tau a / b", "likely cause"],
              [[p["a"], p["b"], "yes" if p["equal"] else "no",
                f"{p['prompts_tokens_equal']}/{p['num_prompts']}", f"{p['prompts_rounds_equal']}/{p['num_prompts']}",
                f"{_num(p['tau']['a'])} / {_num(p['tau']['b'])}", ", ".join(p["likely_causes"]) or "-"]
               for p in report["pairs"]])
    for note in dict.fromkeys(p["drafter"]["note"] for p in report["pairs"] if p["drafter"]["note"]):
        err(f"note: {note}")
    line = different_drafters_line(report)
    if line is None:
        return exit_codes.OK
    err(f"parity: {line}")
    err(f"  hint: name eval items of one drafter; `specdeck compare {args.plan}` compares drafters "
        "(--pair A B for two of them)")
    return exit_codes.DIFFERENT_DRAFTERS


def _num(x) -> str:
    return f"{x:.4f}" if isinstance(x, (int, float)) else "-"


def add_export_args(sp) -> None:
    """The drafter form's options, added to the plan form's ``export`` parser."""
    g = sp.add_argument_group("a drafter (export DRAFTER_DIR --out DIR): the files an engine loads")
    g.add_argument("--out", help="the directory to write: z-lab / Hugging Face, speculators or GGUF layout "
                   "(an earlier export there is swapped out whole; other files are left as they are)")
    g.add_argument("--format", choices=["zlab", "speculators", "gguf"], default="zlab",
                   help="zlab (vLLM, SGLang; default), speculators (vLLM), gguf (llama.cpp's converter)")
    g.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="weights dtype (default bf16)")
    g.add_argument("--target", help="the target's directory (needed by speculators and gguf)")
    g.add_argument("--verifier", help="speculators: the verifier id the serving host knows")
    g.add_argument("--llama-cpp", help="gguf: a llama.cpp tree with convert_hf_to_gguf.py "
                   "(default $SPECDECK_LLAMA_CPP)")


def register(add) -> None:
    sp = add("engines", cmd_engines, "how vLLM, SGLang and llama.cpp will read a drafter, and where it "
             "differs from what specdeck measures",
             example="specdeck engines drafters/v5 --target models/Qwen3.6-27B")
    sp.add_argument("drafter", help="a drafter directory or its config.json")
    sp.add_argument("--target", help="the target's directory (checks sizes, taps and mask token against it)")
    sp.add_argument("--engine", action="append", help="only this engine (vllm, sglang, llama.cpp); repeatable")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp = add("card", cmd_card, "a drafter's model card (README.md with Hugging Face front matter): its "
             "architecture, weights' sha256, tau by harness with the stored results named, the draft length "
             "to serve and what each engine does with it",
             example="specdeck card plans/v5.yaml v5 --drafter drafters/v5 --out serve/v5 --license apache-2.0")
    sp.add_argument("plan", help="the plan file whose stored eval results the card reports")
    sp.add_argument("label", help="the drafter's label in those results (as `compare` shows it)")
    sp.add_argument("--drafter", required=True, metavar="DIR", help="the drafter directory (or its export)")
    sp.add_argument("--out", metavar="DIR", help="write DIR/README.md (default: print the card)")
    sp.add_argument("--base-model", help="the target's Hugging Face id (front matter base_model)")
    sp.add_argument("--license", help="the license to state (front matter; default: other)")
    sp.add_argument("--cost", metavar="BASE,PER_TOKEN", help="a round's cost at draft length k in plain target "
                    "steps: adds the draft length to serve")
    sp = add("parity", cmd_parity, "one drafter measured by several eval items (offline, in process, under "
             "an engine's rule, through an engine): each pair the same drafter or not (exit 4 when not), equal "
             "or not, round by round, and why",
             example="specdeck parity plans/coding-eval.yaml eval-online eval-llama-rule eval-llama")
    sp.add_argument("plan", help="the plan file")
    sp.add_argument("items", nargs="+", metavar="ITEM", help="eval items (two or more), latest succeeded run each")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
