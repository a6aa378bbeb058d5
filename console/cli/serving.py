"""Serving commands: ``engines`` (how each engine will read a drafter) and the drafter form of
``export`` (``export DRAFTER_DIR --out DIR``: the layouts engines load), docs/serving.md.

Both run here, on the machine the CLI runs on: ``engines`` is pure Python
(:mod:`core.ml.engine_lint`); ``export`` needs the ``ml`` extra (torch) and runs
``core.ml.export`` in process, so its messages and exit status are that module's.
"""

from __future__ import annotations

import json

from core.errors import InvalidInput


def cmd_engines(args) -> int:
    from core.ml.engine_lint import lint, render
    from core.ml.engines import ENGINES, engine

    try:
        names = [engine(n).name for n in args.engine] if args.engine else list(ENGINES)
        result = lint(args.drafter, args.target, names)
    except ValueError as e:
        raise InvalidInput(str(e), hint="give a drafter directory (config.json + model.safetensors) "
                                        "or its config.json") from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render(result), end="")
    return 0


def cmd_export_drafter(args) -> int:
    """``export DRAFTER_DIR --out DIR ...``: :mod:`core.ml.export` with the same options."""
    try:
        from core.ml import export
        from core.ml.runio import run_main
    except ImportError as e:  # pragma: no cover - a laptop install without the ml extra
        raise InvalidInput(f"export of a drafter needs torch ({e})",
                           hint="install the ml extra: pip install 'specdeck[ml]'") from None
    argv = [args.plan, "--out", args.out, "--format", args.format, "--dtype", args.dtype]
    for flag, value in (("--target", args.target), ("--verifier", args.verifier), ("--llama-cpp", args.llama_cpp)):
        if value:
            argv += [flag, value]
    return run_main(export.main, argv)


def add_export_args(sp) -> None:
    """The drafter form's options, added to the plan form's ``export`` parser."""
    g = sp.add_argument_group("a drafter (export DRAFTER_DIR --out DIR): the files an engine loads")
    g.add_argument("--out", help="the directory to write: z-lab / Hugging Face, speculators or GGUF layout")
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
