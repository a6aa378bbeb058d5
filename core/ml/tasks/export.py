"""``python -m core.ml.export``: a drafter directory -> the files a serving engine loads.

    python -m core.ml.export DRAFTER_DIR --out DIR [--format zlab|speculators|gguf]
                             [--dtype bf16|fp32] [--target DIR] [--verifier ID] [--llama-cpp DIR]

``DRAFTER_DIR`` is anything :func:`core.ml.models.drafter.load_drafter` reads: a ``core.ml.strip``
output, a published z-lab drafter, a speculators directory. Formats (docs/serving.md §1):

* ``zlab`` (default): the z-lab / Hugging Face layout vLLM and SGLang load natively
  (``config.json`` + ``model.safetensors``), the layout ``convert_hf_to_gguf.py`` reads.
* ``speculators``: the layout of ``speculators`` 0.9.0 (``speculators_model_type: dflash``),
  which vLLM also loads: the same body tensors, and a config naming the verifier (``--target``
  for its architecture, ``--verifier`` for the id the serving host knows it by).
* ``gguf``: llama.cpp's own converter (``convert_hf_to_gguf.py`` of a llama.cpp tree,
  ``--llama-cpp`` or ``$SPECDECK_LLAMA_CPP``) run on a z-lab export, with ``--target``.

Weights are bf16 by default (the published drafters' dtype; a trainer's fp32 doubles the
size). The export's files are written world-readable (0644, the folders it creates 0755)
whatever the umask: a server running as another user must read them. Nothing else in or
around ``--out`` is touched: :mod:`core.ml.formats.export_swap` stages the whole export on the
destination's own filesystem and swaps it in, so the folder holds the earlier export or the
new one, never a mix (docs/serving.md §1, "What an export writes and touches"). Before
anything is written the drafter is read with every engine's table (:mod:`core.ml.engines.lint`
through :func:`engine_warnings`); after, the *written* config is read again, and every way an
engine would run the export otherwise than specdeck measured the source is printed as a
warning and kept in ``provenance.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.ml.formats import export_swap
from core.ml.formats.runio import TaskError, UsageError, atomic_write_json, emit, provenance, run_main, say

FORMATS = ("zlab", "speculators", "gguf")
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
SPECULATORS_VERSION = "0.9.0"
"""The speculators release whose config and converter the speculators layout was checked
against (tests/ml/tasks/test_export.py runs its converter and validation)."""
NON_LAYER_KEYS = ("architectures", "auto_map", "block_size", "dflash_config", "num_target_layers")
"""z-lab keys that are not Qwen3 layer fields (the rest goes to ``transformer_layer_config``)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.export", description="write a drafter in an engine's layout")
    p.add_argument("drafter", help="drafter directory (config.json + model.safetensors)")
    p.add_argument("--out", required=True, help="directory to write (created if missing; an earlier export "
                   "there is replaced, other files are left as they are)")
    p.add_argument("--format", choices=FORMATS, default="zlab")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--target", help="the target's directory (speculators: its architecture; gguf: its tokenizer; "
                   "any format: sizes, taps and mask checked against it)")
    p.add_argument("--verifier", help="speculators: the verifier id or path the serving host loads "
                   "(default: --target as given)")
    p.add_argument("--llama-cpp", help="gguf: a llama.cpp tree holding convert_hf_to_gguf.py and gguf-py "
                   "(default: $SPECDECK_LLAMA_CPP)")
    p.add_argument("--draft-length", type=int, metavar="K",
                   help="the draft length to serve (1..B-1; `specdeck compare --cost` advises one): written "
                        "into provenance.json's engine settings (default: B-1, the whole block)")
    return p


def validate(args: argparse.Namespace) -> None:
    """Refuse bad input before any weights are read or anything is written (exit 2): the
    drafter's config.json field by field and its weights' header against the file, the target's
    config.json, and whether the drafter fits that target
    (:func:`core.ml.formats.drafter_config.check_drafter_dir`)."""
    from core.ml.formats.drafter_config import check_drafter_dir

    src = Path(args.drafter)
    if not (src / "config.json").is_file():
        raise UsageError(f"{src}: no config.json there (a drafter directory holds config.json + model.safetensors)")
    if args.target and not (Path(args.target) / "config.json").is_file():
        raise UsageError(f"--target {args.target}: no config.json there")
    if args.format in ("speculators", "gguf") and not args.target:
        raise UsageError(f"--format {args.format} needs --target DIR (the target's directory)")
    out = Path(args.out)
    if out.resolve() == src.resolve():
        raise UsageError(f"--out {out} is the drafter directory itself; choose another")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    info = check_drafter_dir(args.drafter, args.target)  # every field, every header, the drafter against the target
    block = getattr(info, "block_size", None)
    if args.draft_length is not None and (args.draft_length < 1 or (block and args.draft_length > block - 1)):
        raise UsageError(f"--draft-length {args.draft_length}: the drafter proposes 1..{(block or 2) - 1} "
                         "tokens a round (B-1)")
    if args.format == "gguf":
        llama_cpp_tree(args)


def cached_converter() -> Path | None:
    """The converter scripts/build-llama-server kept next to its newest build: the revision the
    engine leg serves with (core.ml.engines.llama), so an export and that engine agree."""
    from core.ml.engines.llama import converter_tree, find_binary

    binary = find_binary()
    return converter_tree(binary) if binary is not None else None


def llama_cpp_tree(args: argparse.Namespace) -> Path:
    """The llama.cpp tree for ``--format gguf`` (refused, saying what is needed, when absent)."""
    root = args.llama_cpp or os.environ.get("SPECDECK_LLAMA_CPP") or cached_converter()
    need = ("--format gguf runs llama.cpp's own convert_hf_to_gguf.py: run scripts/build-llama-server (it keeps "
            "the converter of the llama.cpp it builds), or pass --llama-cpp DIR (or set SPECDECK_LLAMA_CPP) to a "
            "llama.cpp tree, e.g. the one vendored in the llama-cpp-python 0.3.36 sdist "
            "(pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36, unpack it, "
            "DIR = llama_cpp_python-0.3.36/vendor/llama.cpp; docs/serving.md §4)")
    if not root:
        raise UsageError(need)
    tree = Path(root).expanduser()
    if not (tree / "convert_hf_to_gguf.py").is_file() or not (tree / "gguf-py").is_dir():
        raise UsageError(f"{tree}: no convert_hf_to_gguf.py and gguf-py there. {need}")
    return tree


def speculators_config(cfg: Any, target: dict[str, Any], verifier: str, dtype: str) -> dict[str, Any]:
    """The ``speculators`` 0.9.0 DFlash config for z-lab config ``cfg`` (our own construction of
    its documented fields; tests check it against the package's converter and validation)."""
    zlab = cfg.to_dict()
    layer = {k: v for k, v in zlab.items() if k not in NON_LAYER_KEYS}
    layer.update({"model_type": "qwen3", "dtype": dtype})
    causal, _ = cfg.causality()
    # speculators' only causality key: sliding layers non-causal (full ones always are)
    non_causal = not any(causal)
    return {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.vocab_size,
        "block_size": cfg.block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],  # hidden_states indices
        "mask_token_id": cfg.mask_token_id,
        "sliding_window_non_causal": non_causal,
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.block_size - 1,
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": verifier, "architectures": list(target.get("architectures") or [])},
        },
        "dtype": dtype,
        "tie_word_embeddings": False,
    }


def engine_warnings(src: Any, written: Path, target: str | None) -> list[dict[str, str]]:
    """How each engine would read the written config otherwise than specdeck reads the source."""
    from core.ml.engines.lint import compare, lint

    result = lint(written, target)
    out = []
    for reading in result.readings:
        mine = [f for f in compare(reading, src) if f.kind == "differs"]
        own = [f for f in reading.findings if f.kind in ("missing", "refused") or
               (f.kind == "differs" and f.field != "attention")]
        for f in mine + [f for f in own if f not in mine]:
            out.append({"engine": reading.engine, "kind": f.kind, "field": f.field, "message": f.message})
    for f in result.target_findings:
        out.append({"engine": "target", "kind": f.kind, "field": f.field, "message": f.message})
    return out


def write_gguf(args: argparse.Namespace, zlab_dir: Path, out: Path, dtype: str) -> Path:
    """Run llama.cpp's converter on a z-lab export; returns the GGUF path."""
    tree = llama_cpp_tree(args)
    gguf = out / "drafter.gguf"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "gguf-py"), str(tree),
                                                         os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(tree / "convert_hf_to_gguf.py"), str(zlab_dir), "--target-model-dir",
           str(Path(args.target).resolve()), "--outtype", "bf16" if dtype == "bfloat16" else "f32", "--outfile", str(gguf)]
    say(f"running {' '.join(cmd)}")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise UsageError(f"llama.cpp's convert_hf_to_gguf.py failed (exit {proc.returncode}):\n{tail}")
    return gguf


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    validate(args)
    import torch

    from core.ml.engines.lint import target_config
    from core.ml.measure.draftlen import engine_settings
    from core.ml.models.drafter import CONFIG_NAME, WEIGHTS_NAME, load_drafter, save_drafter
    from core.ml.formats.runio import atomic_target
    from core.ml.formats.safetensors_stream import save_streaming

    try:
        drafter = load_drafter(args.drafter)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{args.drafter}: {exc}") from exc
    cfg = drafter.config
    target = target_config(args.target) if args.target else {}
    dtype = DTYPES[args.dtype]
    written = ["drafter.gguf"] if args.format == "gguf" else [CONFIG_NAME, WEIGHTS_NAME]
    names = (*written, "provenance.json")
    dest, stage = export_swap.open_stage(export_swap.resolve(Path(args.out), names))
    handed = False  # from commit on, the stage is commit's: it may hold what the error tells to keep
    try:
        if args.format == "speculators":
            with atomic_target(stage / WEIGHTS_NAME) as t:
                save_streaming(drafter.state_dict(), t, metadata={"format": "pt"}, dtype=getattr(torch, dtype))
            atomic_write_json(stage / CONFIG_NAME, speculators_config(cfg, target, args.verifier or args.target, dtype),
                              allow_nan=False)
        else:
            save_drafter(drafter, stage, dtype=getattr(torch, dtype))
        warnings = engine_warnings(cfg, stage, args.target)
        if args.format == "gguf":
            write_gguf(args, stage, stage, dtype)
            for name in (CONFIG_NAME, WEIGHTS_NAME):
                (stage / name).unlink()
        k = args.draft_length or cfg.block_size - 1
        settings = {"draft_length": k, "advised": args.draft_length is not None, **engine_settings(k)}
        prov = provenance(task="export", extra={"source": str(Path(args.drafter).resolve()), "format": args.format,
                                                "dtype": dtype, "files": written, "engine_warnings": warnings,
                                                "engine_settings": settings})
        atomic_write_json(stage / "provenance.json", prov)
        for name in names:
            export_swap.set_own_mode(stage / name, export_swap.FILE_MODE)
        handed = True
        export_swap.commit(dest, stage, names)
    except OSError as exc:  # before the swap (a full disk, say): nothing in --out has changed
        raise TaskError(f"could not write the export ({exc.filename}: {exc.strerror or exc}); {args.out} is "
                        "unchanged: fix the cause and export again") from exc
    finally:
        if not handed and stage.exists():
            shutil.rmtree(stage, ignore_errors=True)  # our own private folder, never the destination
    for w in warnings:
        say(f"warning: {w['engine']}: {w['kind']} {w['field']}: {w['message']}")
    out = dest.real
    size = sum((out / n).stat().st_size for n in written)
    emit("result", task="export", path=str(out), format=args.format, dtype=dtype, files=written,
         bytes=size, warnings=len(warnings))
    say(f"wrote {args.format} drafter to {args.out} ({', '.join(written)}; {size / 2**20:.1f} MiB, {dtype}); "
        f"{len(warnings)} engine warning(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
