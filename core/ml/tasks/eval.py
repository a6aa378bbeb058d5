"""``python -m core.ml.eval``: acceptance length (tau) of a DFlash drafter -> result.json.

    python -m core.ml.eval --target DIR --drafter DIR --prompts FILE.jsonl --out result.json
        [--mode online|offline] [--cache DIR] [--tree-budget K] [--block-size B]
        [--max-new-tokens N] [--device auto|cpu|cuda] [--dtype auto|float32|bfloat16|float16]
        [--limit N] [--ignore-eos] [--speedup] [--rows-per-pass R] [--seed S]
        [--temperature T [--top-p P] [--top-k K] [--samples N]] [--engine-rule ENGINE]
        [--baseline-drafter DIR --baseline-out PATH [--baseline-label L]
         --stop settled --min-difference D [--alpha A]]
        [--engine llama.cpp [--engine-bin PATH] [--engine-target GGUF|DIR] [--engine-drafter GGUF|DIR]
                            [--engine-threads N] [--engine-context N] [--engine-start-timeout S]]

online: chain speculative decoding (docs/evaluation.md §2) per prompt, greedy; with ``--tree-budget K`` also
DDTree with K nodes (docs/evaluation.md §3); with ``--speedup`` also a block-size-1 run through the same
harness (speedup = mean TPOT(B=1) / mean TPOT(run)). With ``--temperature T > 0`` the chain samples
(docs/evaluation.md §2, "Sampling": the reference's speculative sampling, lossless), each prompt
``--samples N`` times with its own seed (:func:`core.ml.models.sampling.sample_seed` of ``--seed``, the
prompt id and the sample index, recorded in each per-prompt row); DDTree and offline refuse it.
offline: tau from an extract cache (``--cache``, from ``core.ml.extract``), batched over all
anchors of a sequence (docs/evaluation.md §1): trajectory (top-level figures, comparable with online) and
all-anchor (``all_anchor``); with ``--tree-budget`` also DDTree offline (``ddtree``).
``--stop settled`` with ``--baseline-drafter``: a paired online eval, the drafter and the baseline
prompt by prompt, stopped as soon as the verdict is settled (:mod:`core.ml.measure.sequential`,
docs/evaluation.md §7) or at ``--limit`` prompts; both result.json files hold ``sequential``: the
verdict, the prompts it took and the prompts the fixed-size eval would have run.
``--engine llama.cpp``: the online chain measured through a real ``llama-server`` instead
(:mod:`core.ml.engines.llama`), in the same result.json shape, with ``engine`` (name, revision,
binary sha256, both EOS sets) and the engine's raw figures per prompt; ``compare`` pairs it
with an in-process result round for round.

stdout: JSON lines (progress per prompt, one metric line per method, then
``{"event": "result", "path": ...}``); result.json and provenance.json are written atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.ml.measure import harness
from core.ml.measure import tau as taulib
from core.ml.formats import bounds
from core.ml.formats.runio import (Progress, UsageError, add_generation_args, check_flags, check_generation_args, emit,
                            fixed_mmap_threshold, provenance, run_main, say, write_result)
from core.ml.models.sampling import Sampling, sample_seed, top_k_problem
from core.ml.models.sampling import add_arguments as add_sampling_arguments  # shared with core.ml.watcher

KIND = "specdeck-eval-v1"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.eval", description="measure drafter acceptance length (tau)")
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--drafter", required=True, help="drafter directory (config.json + model.safetensors)")
    p.add_argument("--prompts", required=True, help="JSONL prompts ({id, prompt}, {id, input_ids} or {id, turns}), "
                   "or zlab:NAME[:PATH], one of the reference's benchmark sets (docs/evaluation.md)")
    p.add_argument("--out", required=True, help="result.json path (provenance.json is written beside it)")
    p.add_argument("--mode", choices=["online", "offline"], default="online")
    p.add_argument("--cache", help="feature cache from core.ml.extract (offline mode)")
    p.add_argument("--tree-budget", type=int, help="also run DDTree with this many draft nodes")
    p.add_argument("--block-size", type=int, help="block size B (default: the drafter's; may be smaller)")
    p.add_argument("--label", help="the drafter's name in the progress and metric lines (v5, baseline): one "
                   "capsule measures a drafter and its baseline one after the other")
    add_generation_args(p, needs="the mode", example="40G")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS (online)")
    p.add_argument("--speedup", action="store_true", help="also time a block-size-1 run (online)")
    p.add_argument("--rows-per-pass", type=int, help="offline: block rows (anchors x B) per drafter pass "
                   "(default 512 on CPU, 4096 on CUDA)")
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--enable-thinking", action="store_true")
    add_sampling_arguments(p)
    s = p.add_argument_group("settled stop", "a paired eval that stops when its verdict is settled "
                             "(docs/evaluation.md §7)")
    s.add_argument("--baseline-drafter", help="the drafter to pair with, prompt by prompt (online chain)")
    s.add_argument("--baseline-out", help="its result.json path")
    s.add_argument("--baseline-label", default="baseline", help="its name in the progress lines and the verdict")
    s.add_argument("--stop", choices=["settled"], help="settled: stop when better, worse or no difference as large "
                   "as --min-difference is settled (--limit is the cap)")
    s.add_argument("--min-difference", type=float, help="the smallest tau difference that matters (> 0)")
    s.add_argument("--alpha", type=float, default=0.05, help="each verdict's error rate (default 0.05)")
    p.add_argument("--engine-rule", metavar="ENGINE", help="run the drafter under this engine's attention rule "
                   "(vllm, sglang, llama.cpp; core.ml.engines.rules), to measure tau as that engine serves it")
    e = p.add_argument_group("engine leg", "measure through a real engine instead of in process "
                             "(core.ml.engines.llama; docs/serving.md)")
    e.add_argument("--engine", choices=ENGINES, help="serve the drafter with this engine and measure its acceptance")
    e.add_argument("--engine-bin", help="the llama-server binary (default: $SPECDECK_LLAMA_SERVER, else the "
                   "newest build of scripts/build-llama-server)")
    e.add_argument("--engine-target", help="the target as a .gguf, or a directory to convert (default: --target)")
    e.add_argument("--engine-drafter", help="the drafter as a .gguf, or a directory to convert (default: --drafter)")
    e.add_argument("--engine-threads", type=int, default=min(2, os.cpu_count() or 1), help="CPU threads (default 2)")
    e.add_argument("--engine-context", type=int, default=4096, help="the server's context length (default 4096)")
    e.add_argument("--engine-start-timeout", type=float, default=300.0, metavar="S",
                   help="seconds to wait for the server to load the models and answer /health (default 300)")
    return p


ENGINES = ("llama.cpp",)
"""Engines ``--engine`` drives (vLLM and SGLang run on GPUs this host has not; core.ml.engine_clients)."""


def named(args: argparse.Namespace) -> dict[str, str]:
    """``{"label": ...}`` for the progress and metric lines of a run given ``--label`` (else
    nothing): which drafter a line measures, when one capsule measures two."""
    return {"label": args.label} if getattr(args, "label", None) else {}


def sampling_of(args: argparse.Namespace) -> Sampling:
    return Sampling(args.temperature, args.top_p, args.top_k)


def drafter_weights(drafter: str | os.PathLike[str]) -> dict[str, Any]:
    """What identifies the drafter's weights in result.json (``parity`` checks it first: two
    results of different drafters are never one drafter measured twice).

    ``fingerprint``: the first 16 hex digits of ``weights.sha256``, as results have always
    recorded it. ``weights``: ``sha256`` of the weights files' bytes, streamed in 16 MiB reads
    (one stream over the shards in :func:`core.ml.formats.weights.weight_files`' order; for a single
    ``model.safetensors``, that file's own sha256), the ``files``, their total ``bytes`` and
    latest ``mtime_ns`` (what a reader of a result without a digest can still compare).
    Both None when the drafter has no weights file (its load then fails).
    """
    from core.ml.formats.weights import weight_files

    try:
        files = weight_files(drafter)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, or an index that names none
        return {"fingerprint": None, "weights": None}
    h = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    stats = [path.stat() for path in files]
    return {"fingerprint": h.hexdigest()[:16],
            "weights": {"sha256": h.hexdigest(), "files": [path.name for path in files],
                        "bytes": sum(st.st_size for st in stats), "mtime_ns": max(st.st_mtime_ns for st in stats)}}


def validate(args: argparse.Namespace) -> None:
    """Cheap input checks before anything heavy is loaded: the flags first (UsageError names
    the argument), then the drafter's and target's files
    (:func:`core.ml.formats.drafter_config.check_drafter_dir`)."""
    from core.ml.formats.drafter_config import check_drafter_dir

    if not (Path(args.target) / "config.json").is_file():
        raise UsageError(f"--target {args.target}: no config.json there")
    if not (Path(args.drafter) / "config.json").is_file():
        raise UsageError(f"--drafter {args.drafter}: no config.json there")
    if not args.prompts.startswith("zlab:") and not Path(args.prompts).is_file():
        raise UsageError(f"--prompts {args.prompts}: file not found")
    validate_sampling(args)
    if args.mode == "offline":
        if not args.cache:
            raise UsageError("--mode offline needs --cache DIR (made by python -m core.ml.extract)")
        if not (Path(args.cache) / "manifest.json").is_file():
            raise UsageError(f"--cache {args.cache}: no manifest.json (run python -m core.ml.extract first)")
    check_generation_args(args)
    check_flags(args, tree_budget=lambda v: bounds.count(v, 0), block_size=bounds.count,
                rows_per_pass=bounds.count)
    if args.engine:
        validate_engine(args)
    validate_settled(args)
    if args.max_memory is not None:
        from core.ml.formats.weights import parse_bytes

        try:
            parse_bytes(args.max_memory)
        except ValueError as exc:
            raise UsageError(f"--max-memory {exc}") from None
    # the files last: the flags above are the cheaper checks, and each names its own flag
    check_drafter_dir(args.drafter, args.target)  # every field and header; taps within the target's layers


def validate_settled(args: argparse.Namespace) -> None:
    """What a settled stop needs: a baseline to pair with, where its result goes, a smallest
    difference that matters; an online greedy or single-sample chain, in process."""
    paired = [f for f in ("baseline_drafter", "baseline_out") if getattr(args, f)]
    if args.stop is None:
        if paired or args.min_difference is not None:
            flag = f"--{paired[0].replace('_', '-')}" if paired else "--min-difference"
            raise UsageError(f"{flag}: only with --stop settled (a paired eval that stops when settled)")
        return
    if len(paired) < 2:
        raise UsageError("--stop settled: give --baseline-drafter DIR and --baseline-out PATH (the pair it decides)")
    if not (Path(args.baseline_drafter) / "config.json").is_file():
        raise UsageError(f"--baseline-drafter {args.baseline_drafter}: no config.json there")
    if args.min_difference is None or not (0 < args.min_difference < bounds.COUNT_MAX):
        raise UsageError(f"--min-difference {args.min_difference}: give the smallest tau difference that matters, "
                         "a number > 0 (e.g. 0.25)")
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha {args.alpha}: an error rate between 0 and 1 (e.g. 0.05)")
    for flag, bad in (("--mode offline", args.mode != "online"), ("--tree-budget", args.tree_budget is not None),
                      ("--samples", args.samples > 1), ("--engine", bool(args.engine)), ("--speedup", args.speedup),
                      ("--engine-rule", bool(args.engine_rule))):
        if bad:
            raise UsageError(f"--stop settled with {flag}: the settled stop pairs one online chain per prompt "
                             "(in process, one sample); drop one of them")


def validate_engine(args: argparse.Namespace) -> None:
    """What the engine leg refuses, before any file is written (UsageError names the field)."""
    from core.ml.engines.llama import BUILD_HINT, find_binary

    refused = [("--mode offline", args.mode == "offline", "the engine decodes online"),
               ("--tree-budget", args.tree_budget is not None, "llama-server verifies a chain"),
               ("--temperature", args.temperature != 0, "parity is measured greedy"),
               ("--samples", args.samples != 1, "greedy decoding is deterministic"),
               ("--speedup", args.speedup, "the engine's timings are its own (timings.predicted_ms)"),
               ("--ignore-eos", args.ignore_eos, "llama.cpp's ignore_eos forbids EOS (a -inf bias) instead of "
                "generating past it, so the two would decode different tokens; leave EOS stopping on"),
               ("--engine-rule", args.engine_rule is not None, "the engine applies its own rule; measure specdeck "
                "under it in a separate eval with --engine-rule and no --engine")]
    for flag, bad, why in refused:
        if bad:
            raise UsageError(f"{flag} with --engine {args.engine}: {why}")
    check_flags(args, engine_threads=bounds.count, engine_context=lambda v: bounds.count(v, 16),
                engine_start_timeout=lambda v: bounds.seconds(v) or (None if v > 0 else f"{v!r}: must be more than 0"))
    for flag, value in (("--engine-target", args.engine_target), ("--engine-drafter", args.engine_drafter)):
        if value and not (Path(value).is_dir() or (Path(value).is_file() and value.endswith(".gguf"))):
            raise UsageError(f"{flag} {value}: neither a .gguf file nor a directory")
    binary = find_binary(args.engine_bin)
    if binary is None:
        raise UsageError(f"--engine {args.engine}: no llama-server found; {BUILD_HINT}")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise UsageError(f"--engine-bin {binary}: not an executable file; {BUILD_HINT}")
    args.engine_bin = str(binary)


def _config_json(directory: str) -> dict[str, Any] | None:
    """A model dir's config.json (None when it has no readable one: the checks that need it say so)."""
    import json

    try:
        data = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def validate_sampling(args: argparse.Namespace) -> None:
    """Sampling settings and what refuses them (UsageError: exit 2, nothing written)."""
    check_flags(args, seed=bounds.seed64)
    why = sampling_of(args).problem()
    if why:
        raise UsageError(f"--{why[0].replace('_', '-')} {why[1]}")
    check_flags(args, samples=bounds.count)
    why = top_k_problem(args.top_k, _config_json(args.target)) if args.top_k else None
    if why:
        raise UsageError(f"--top-k {why}")
    if args.temperature == 0:
        if args.samples > 1:
            raise UsageError(f"--samples {args.samples}: greedy decoding (--temperature 0) is deterministic, "
                             "every sample would repeat the first; set --temperature > 0 or drop --samples")
        return
    if args.mode == "offline":
        raise UsageError(f"--temperature {args.temperature}: offline tau compares the drafts with the target's "
                         "cached greedy continuation; at a temperature > 0 the target's continuation is random "
                         "and the cache holds one greedy sample of it, so offline tau is not defined there: "
                         "use --mode online (docs/evaluation.md §2, \"Sampling\")")
    if args.tree_budget is not None:
        raise UsageError(f"--tree-budget {args.tree_budget} with --temperature {args.temperature}: DDTree "
                         "verifies greedily (it walks the tree along the target's argmax) and there is no "
                         "lossless sampled tree verification (nor in the reference); drop --tree-budget to "
                         "sample the chain, or use --temperature 0 (docs/evaluation.md §3)")


def _summary(rows: list[dict[str, Any]], block_size: int) -> dict[str, Any]:
    """The tau figures of ``rows``; a sampled run's rows are its prompts' samples: ``num_prompts``
    counts prompts, ``num_generations`` the rows (every prompt has the same number, so the macro
    tau over rows is the mean over prompts of their samples' mean)."""
    out = taulib.summarize([r["rounds"] for r in rows], block_size)
    prompts = len({r["id"] for r in rows})
    if prompts != len(rows):
        out.update(num_prompts=prompts, num_generations=len(rows))
    return out


COUNTS = ("target_forwards", "target_tokens", "drafter_forwards")


def _counts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Noise-free cost: target forwards, tokens fed to the target (prefill included) and drafter
    forwards, in total, per round and per prompt."""
    total = {k: sum(r.get(k, 0) for r in rows) for k in COUNTS}
    n_rounds = sum(len(r.get("rounds", ())) for r in rows)
    verify_tokens = total["target_tokens"] - sum(r.get("prompt_len", 0) for r in rows if r.get("target_forwards"))
    return {**total, "rounds": n_rounds,
            "target_forwards_per_round": total["target_forwards"] / n_rounds if n_rounds else None,
            "verify_tokens_per_round": verify_tokens / n_rounds if n_rounds and total["target_forwards"] else None,
            "counts_per_prompt": [{"id": r["id"], "rounds": len(r.get("rounds", ())), **{k: r.get(k, 0) for k in COUNTS}}
                                  for r in rows]}


def _timing(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = sum(len(r["tokens"]) for r in rows)
    decode = sum(r.get("decode_s", 0.0) for r in rows)
    tpots = [r["decode_s"] / len(r["tokens"]) for r in rows if r.get("tokens") and r.get("decode_s")]
    return {
        "prefill_s": sum(r.get("prefill_s", 0.0) for r in rows), "decode_s": decode,
        "draft_s": sum(r.get("draft_s", 0.0) for r in rows), "verify_s": sum(r.get("verify_s", 0.0) for r in rows),
        "tokens": tokens, "tokens_per_s": tokens / decode if decode else None,
        "mean_tpot_s": sum(tpots) / len(tpots) if tpots else None, **_counts(rows),
    }


def stop_ids(args: argparse.Namespace, target: Any, tokenizer: Any) -> list[int]:
    """The stop ids of an online eval (none with ``--ignore-eos``), recorded in result.json."""
    from core.ml.models.target import stop_token_ids

    return [] if args.ignore_eos else stop_token_ids(target, tokenizer)


def template_settings(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """How text prompts were wrapped: whether the chat template ran, and with thinking on or
    off (docs/evaluation.md: off, unless ``--enable-thinking``). ``compare`` treats rows that
    differ here as not comparable."""
    applied = not args.no_chat_template and bool(getattr(tokenizer, "chat_template", None))
    return {"chat_template": applied, "thinking": bool(args.enable_thinking) if applied else None}


def cache_template(settings: dict[str, Any]) -> dict[str, Any]:
    """Offline, prompts were wrapped when the cache was extracted: its settings say how."""
    applied = settings.get("chat_template")
    return {"chat_template": applied, "thinking": bool(settings.get("enable_thinking")) if applied else None}


def run_online(args, target, tokenizer, drafter, prompts, block_size, last_blocks=taulib.SHRINK) -> dict[str, Any]:
    """The online figures: the chain (its last rounds run as ``last_blocks`` says,
    :func:`core.ml.measure.tau.end_block`), DDTree and the speed baseline when asked."""
    from core.ml.decoding.generate import DFlashProposer, chain_generate, ddtree_generate
    from core.ml.measure.prompts import encode
    from core.ml.models.target import TargetRunner, half_matmul_note

    stops = stop_ids(args, target, tokenizer)
    vocab = target.config.get_text_config().vocab_size
    runner = TargetRunner(target, drafter.target_layer_ids)
    proposer = DFlashProposer(drafter, target)
    plain = TargetRunner(target, None) if args.speedup else None
    chain_rows, tree_rows, ar_rows = [], [], []
    progress = Progress("eval", len(prompts) * args.samples, "prompts" if args.samples == 1 else "generations",
                        label=args.label)
    mask = drafter.mask_token_id
    sampling = sampling_of(args)
    # Sample by sample, so each sample's conversations follow that sample's own answers.
    for k, p in ((k, p) for k in range(args.samples) for p in prompts):
        seed = None if sampling.greedy else sample_seed(args.seed, p.id, k)
        ids = encode(p, tokenizer, vocab, not args.no_chat_template, args.enable_thinking)
        r = chain_generate(proposer, runner, ids, args.max_new_tokens, block_size, mask, stops, sampling, seed or 0,
                           last_blocks)
        p.answer = r.tokens  # a conversation's next turn follows the target's own answer
        chain_rows.append(_row(p.id, r, k, seed))
        extra: dict[str, Any] = {"tau": r.tau} if args.samples == 1 else {"tau": r.tau, "sample": k}
        if args.tree_budget is not None:
            t = ddtree_generate(proposer, runner, ids, args.max_new_tokens, block_size, mask, args.tree_budget, stops)
            if t.tokens != r.tokens:
                say(f"warning: prompt {p.id}: DDTree and chain outputs differ (float noise in the target's argmax?)")
            tree_rows.append(_row(p.id, t) | {"mean_tree_nodes": t.extra["mean_tree_nodes"]})
            extra["tau_ddtree"] = t.tau
        if plain is not None:
            ar_rows.append(_row(p.id, chain_generate(None, plain, ids, args.max_new_tokens, 1, mask, stops, sampling,
                                                     seed or 0), k, seed))
        progress.step(tokens=len(r.tokens), id=p.id, **extra)
    runner.close()
    result = {**_summary(chain_rows, block_size), "per_prompt": chain_rows, "timing": _timing(chain_rows)}
    if tree_rows:
        result["ddtree"] = {"budget": args.tree_budget, **_summary(tree_rows, block_size),
                            "per_prompt": tree_rows, "timing": _timing(tree_rows)}
        if last_blocks != taulib.SHRINK:  # no engine here verifies a tree: DDTree keeps the reference's end
            result["ddtree"]["end_of_generation"] = taulib.SHRINK
    if ar_rows:
        ar_tpot = _timing(ar_rows)["mean_tpot_s"]
        sp = {"baseline_mean_tpot_s": ar_tpot, "definition": "mean TPOT of the block-size-1 run / mean TPOT of the run"}
        for name, rows in (("chain", chain_rows), ("ddtree", tree_rows)):
            tpot = _timing(rows)["mean_tpot_s"] if rows else None
            sp[name] = ar_tpot / tpot if ar_tpot and tpot else None
        note = half_matmul_note(next(target.parameters()).device, next(target.parameters()).dtype)
        if note:
            sp["note"] = note
            say(f"notice: {note}")
        result["speedup"] = sp
        if sp.get("chain") and result.get("tau_pooled"):
            result["draft_length"] = _draft_length(chain_rows, block_size, result["tau_pooled"], sp["chain"])
    return result


def _draft_length(rows: list[dict[str, Any]], block_size: int, tokens: float, speedup: float) -> dict[str, Any]:
    """The draft length to serve on this host (issue 45 §3): a round's cost from the measured speedup
    at the full block, taking a 1-token verify as one plain step (docs/evaluation.md §7)."""
    from core.ml.measure.draftlen import Cost, advise

    per_token = max(0.0, (tokens / speedup - 1.0) / max(1, block_size - 1))
    out = advise([r["rounds"] for r in rows], block_size, Cost(1.0, per_token))
    out["cost_source"] = (f"eval --speedup on this host: speedup {speedup:.3f} at k={block_size - 1} with "
                          f"{tokens:.3f} tokens a round -> a round costs {tokens / speedup:.3f} plain steps")
    return out


def _row(pid: str, r: Any, sample: int = 0, seed: int | None = None) -> dict[str, Any]:
    """One generation's row: ``sample`` is its index among the prompt's samples, ``seed`` its
    generator's seed (None: greedy, nothing drawn)."""
    return {"id": pid, "sample": sample, "seed": seed, "tau": r.tau, "rounds": r.rounds, "tokens": r.tokens,
            "prompt_len": r.prompt_len,
            "stopped": r.stopped, "prefill_s": r.prefill_s, "decode_s": r.decode_s,
            "draft_s": r.draft_s, "verify_s": r.verify_s, "target_forwards": r.target_forwards,
            "target_tokens": r.target_tokens, "drafter_forwards": r.drafter_forwards}


def run_offline(args, target, drafter, prompts, block_size, last_blocks=taulib.SHRINK) -> dict[str, Any]:
    """The offline figures from the extract cache: the trajectory (its last rounds drafted as
    ``last_blocks`` says), all-anchor, and DDTree when asked."""
    import torch

    from core.ml.formats import featstore
    from core.ml.tasks.extract import target_fingerprint
    from core.ml.decoding.offline import sequence_streaks

    root = Path(args.cache)
    manifest = featstore.load_manifest(root)
    if manifest["target"]["fingerprint"] != target_fingerprint(args.target):
        raise UsageError(f"--cache {root} was extracted from another target ({manifest['target']['path']})")
    cached, taps = [int(x) for x in manifest["layer_ids"]], list(drafter.target_layer_ids)
    absent = [t for t in taps if t not in cached]
    if absent:
        raise UsageError(f"--cache {root} holds layers {cached}, the drafter taps {taps} "
                         f"(missing {absent}); extract again with --layers {','.join(map(str, taps))}")
    # A cache may hold more layers than the drafter taps (a trainer's cache also keeps the
    # final layer): its features are the layers side by side, so take the drafter's columns.
    cols = None if cached == taps else [cached.index(t) for t in taps]
    missing = [p.id for p in prompts if p.id not in manifest["entries"]]
    if missing:
        raise UsageError(f"--cache {root} has no features for prompts {missing[:5]}; run core.ml.extract on this prompts file")
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    traj_rows, all_rows, tree_traj_rows = [], [], []
    progress = Progress("eval", len(prompts), "prompts", label=args.label)
    for p in prompts:
        seq = featstore.read_entry(root, p.id, manifest["entries"][p.id])
        if cols is not None:
            h = seq.features.shape[-1] // len(cached)
            seq.features = torch.cat([seq.features[..., i * h:(i + 1) * h] for i in cols], dim=-1)
        rows = args.rows_per_pass or (4096 if drafter.fc.weight.device.type == "cuda" else 512)
        st = sequence_streaks(drafter, embed, head, seq, block_size, args.tree_budget, rows)
        _, rounds = st.trajectory(args.max_new_tokens, last_blocks=last_blocks)
        trounds = st.trajectory(args.max_new_tokens, tree=True)[1] if args.tree_budget is not None else None
        tokens = seq.generated[: args.max_new_tokens]
        counts = {"target_forwards": 0, "target_tokens": 0, "drafter_forwards": st.drafter_forwards}
        traj_rows.append({"id": p.id, "tau": taulib.mean_tau(rounds), "rounds": rounds, "tokens": tokens,
                          "prompt_len": seq.prompt_len, **counts})
        ar = st.all_anchor_rounds()
        all_rows.append({"id": p.id, "tau": taulib.mean_tau(ar), "rounds": ar, "num_anchors": len(ar)})
        extra: dict[str, Any] = {"tau": traj_rows[-1]["tau"]}
        if trounds is not None:
            tree_traj_rows.append({"id": p.id, "tau": taulib.mean_tau(trounds), "rounds": trounds, "tokens": tokens,
                                   "all_anchor_tau": taulib.mean_tau(st.all_anchor_rounds(tree=True)), **counts})
            extra["tau_ddtree"] = tree_traj_rows[-1]["tau"]
        progress.step(tokens=len(seq.generated), id=p.id, **extra)
    # Offline the target is never run (its features come from the cache); the drafter runs
    # once per pass of anchors, the trajectory and DDTree share those passes.
    result = {**_summary(traj_rows, block_size), "per_prompt": traj_rows, "offline_variant": "trajectory",
              "timing": _counts(traj_rows),
              "all_anchor": {**_summary(all_rows, block_size), "per_prompt": all_rows},
              "cache": {"path": str(root.resolve()), "dtype": manifest.get("dtype"),
                        "settings": manifest.get("settings")},
              "template": cache_template(manifest.get("settings") or {})}
    if tree_traj_rows:
        result["ddtree"] = {"budget": args.tree_budget, **_summary(tree_traj_rows, block_size), "per_prompt": tree_traj_rows,
                            "timing": _counts(tree_traj_rows)}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    validate(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from core.ml.measure.prompts import read_prompts, single_turn

    prompts = read_prompts(args.prompts, args.limit)
    if args.mode == "offline":
        single_turn(prompts, "eval --mode offline")

    if args.engine:
        return _main_engine(args, prompts)
    import torch

    torch.manual_seed(args.seed)
    with torch.no_grad():
        return _main(args, prompts)


def memory_preflight(args: argparse.Namespace, dtype: Any, device: Any) -> dict[str, Any]:
    """Bytes this mode loads (online: the target's text weights; offline: its embedding and
    head only) plus the drafter, 10 % on top for activations and caches; refused (exit 2)
    before anything is loaded when the host (or ``--max-memory``) has less."""
    from core.ml.formats.weights import embed_head_names, preflight, tensor_index, weight_bytes

    if args.mode == "online":
        names = [k for k in tensor_index(args.target) if "visual" not in k and not k.startswith("mtp.")]
    else:
        names = sorted(set(embed_head_names(args.target).values()))
    target_bytes = weight_bytes(args.target, names, dtype)
    try:
        drafter_bytes = weight_bytes(args.drafter, None, dtype)
    except (OSError, ValueError):
        drafter_bytes = 0
    needed = int(1.1 * (target_bytes + drafter_bytes))
    hint = ("Run on a host with more memory, use --mode offline (loads only the embedding and head), "
            "or raise --max-memory if the estimate is too strict." if args.mode == "online"
            else "Run on a host with more memory, or raise --max-memory if the estimate is too strict.")
    out = preflight(needed, f"eval --mode {args.mode}", args.max_memory, hint, device)
    return {**out, "target_bytes": target_bytes, "drafter_bytes": drafter_bytes,
            "loads": "full target" if args.mode == "online" else "embedding + lm_head"}


def record(args: argparse.Namespace, cfg: Any, prompts: list[Any], *, block_size: int, block_note: str | None,
           stops: list[int] | None, tokenizer: Any, model_type: str, num_layers: int,
           engine_rule: dict[str, Any] | None = None, last_blocks: str = taulib.SHRINK) -> dict[str, Any]:
    """What a result.json says it measured, in process or through an engine alike: ``compare``
    reads these fields to decide whether two results are comparable; ``end_of_generation`` is
    how the chain's last rounds ran (:func:`core.ml.measure.tau.end_block`), which ``parity`` reads."""
    from core.ml.tasks.extract import target_fingerprint
    from core.ml.measure.prompts import describe

    return {
        "kind": KIND,
        "definition": taulib.definition(args.temperature != 0, args.mode == "offline", last_blocks),
        "end_of_generation": last_blocks,
        "mode": args.mode,
        "method": "chain",
        **sampling_of(args).to_json(),
        "seed": args.seed,
        "samples": args.samples,
        "accounting": taulib.ACCOUNTING,
        "block_size": block_size,
        **({"block_size_note": block_note} if block_note else {}),
        "stop_token_ids": stops,
        "template": template_settings(args, tokenizer),
        "max_new_tokens": args.max_new_tokens,
        "target": {"path": str(Path(args.target).resolve()), "model_type": model_type,
                   "fingerprint": target_fingerprint(args.target), "num_layers": num_layers},
        "drafter": {"path": str(Path(args.drafter).resolve()), **drafter_weights(args.drafter),
                    "block_size": cfg.block_size, "target_layer_ids": cfg.target_layer_ids,
                    "mask_token_id": cfg.mask_token_id, "config_format": cfg.source_format, "family": cfg.family,
                    "attention": cfg.attention_summary(), **({"engine_rule": engine_rule} if engine_rule else {})},
        "prompts": describe(args.prompts, prompts),
    }


def reproduce_record(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    """What reproduces this eval (:mod:`core.ml.formats.reproduce`): the target as it ran, the
    prompts by digest, the arguments; a dirty checkout's diff beside the result."""
    from core.ml.formats.reproduce import args_config, reproduction, target_identity

    prompts = result.get("prompts") or {}
    return reproduction(Path(args.out).resolve().parent, config=args_config(args),
                        target=target_identity(args.target, result.get("dtype")),
                        data={"prompts": prompts.get("file"), "prompts_sha256": prompts.get("sha256"),
                              "prompt_count": prompts.get("count")})


def engine_reading(cfg: Any, drafter: str, name: str) -> dict[str, Any]:
    """The attention engine ``name`` runs this drafter with (:mod:`core.ml.engines.rules`' table), in
    the record ``--engine-rule`` writes; ``attention`` None when specdeck's config cannot state it."""
    from core.ml.formats.drafter_config import read_config_file
    from core.ml.engines.served import end_of_generation, engine_rule_config, same_rule
    from core.ml.engines.rules import engine

    raw = read_config_file(drafter)
    reading = engine(name).read(raw)
    out = {"engine": reading.engine, "revision": reading.revision, "specdeck_attention": cfg.attention_summary(),
           "end_of_generation": end_of_generation(name)}
    try:
        ruled = engine_rule_config(cfg, raw, name)
    except ValueError as exc:
        return {**out, "changed": None, "attention": None, "note": str(exc)}
    return {**out, "changed": not same_rule(cfg, ruled), "attention": ruled.attention_summary()}


def _main_engine(args: argparse.Namespace, prompts: list[Any]) -> int:
    """The engine leg: the same prompts and result.json shape, measured through llama-server."""
    from transformers import AutoConfig, GenerationConfig

    from core.ml.formats.drafter_config import DFlashConfig
    from core.ml.engines.llama import GGUF_TYPES, run_engine
    from core.ml.engines.served import end_of_generation
    from core.ml.models.target import load_tokenizer, stop_token_ids
    from core.ml.formats.weights import checkpoint_dtype

    try:
        cfg = DFlashConfig.from_file(args.drafter)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--drafter {args.drafter}: {exc}") from None
    block_size = args.block_size if args.block_size is not None else cfg.block_size
    if not 2 <= block_size <= cfg.block_size:
        raise UsageError(f"--block-size {block_size} with --engine {args.engine}: llama.cpp drafts at most the "
                         f"drafter's B-1 = {cfg.block_size - 1} tokens a round and at least 1; choose 2..{cfg.block_size}")
    try:
        tcfg = AutoConfig.from_pretrained(args.target)
        stored = checkpoint_dtype(args.target)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--target {args.target}: {exc}") from None
    dtype = args.dtype if args.dtype != "auto" else str(stored or "float32").removeprefix("torch.")
    if dtype not in GGUF_TYPES:
        raise UsageError(f"--dtype {args.dtype}: the engine leg converts to {', '.join(GGUF_TYPES)}")
    text = tcfg.get_text_config()
    args.vocab_size = text.vocab_size
    tokenizer = load_tokenizer(args.target)
    try:
        gen = GenerationConfig.from_pretrained(args.target)
    except OSError:
        gen = GenerationConfig.from_model_config(tcfg)
    stops = stop_token_ids(type("Target", (), {"generation_config": gen})(), tokenizer)
    say(f"drafter attention (specdeck's reading): {cfg.attention_text()}; measured through {args.engine}")
    figures = run_engine(args, prompts, tokenizer, stops, block_size, dtype, Path(args.out).resolve().parent / "llama.cpp",
                         Path(args.engine_bin))
    rows = figures["per_prompt"]
    result = {
        **record(args, cfg, prompts, block_size=block_size, block_note=None, stops=stops, tokenizer=tokenizer,
                 model_type=tcfg.model_type, num_layers=text.num_hidden_layers,
                 engine_rule=engine_reading(cfg, args.drafter, args.engine),
                 last_blocks=end_of_generation(args.engine)),
        "device": "cpu",
        "dtype": dtype,
        **_summary(rows, block_size), "per_prompt": rows, "timing": _timing(rows),
        "engine": figures["engine"],
    }
    result["harness"] = harness.of_result(result)
    if result["drafter"]["engine_rule"].get("attention"):  # what ran: the engine's reading of the config
        result["drafter"]["attention"] = result["drafter"]["engine_rule"]["attention"]
    emit("metric", task="eval", **named(args), method="chain", mode=args.mode, engine=args.engine, tau=result["tau"],
         tau_pooled=result["tau_pooled"], num_rounds=result["num_rounds"])
    eng = figures["engine"]
    out = write_result(args.out, result, provenance(seed=args.seed, task="eval", extra={
        "engine": {k: eng[k] for k in ("name", "revision", "version", "binary", "binary_sha256")},
        "eos": eng["eos"], "drafter_attention": cfg.attention_summary(), "reproduce": reproduce_record(args, result)}))
    emit("result", task="eval", path=str(out.resolve()))
    return 0


def _main(args: argparse.Namespace, prompts: list[Any]) -> int:
    from core.ml.models.cpu_rows import half_rows
    from core.ml.models.drafter import load_drafter, refuse_tree
    from core.ml.engines.served import use_engine_rule
    from core.ml.models.target import load_target, load_tokenizer, resolve_device, resolve_dtype
    from core.ml.formats.weights import checkpoint_dtype, gb, load_embed_head

    # Every round frees and re-allocates tensor-sized blocks (the caches grown by a row, a tree's logits): on
    # glibc's heap they fragment and the RSS creeps up over the prompts; with their own mmaps they go back.
    fixed_mmap_threshold()
    device = resolve_device(args.device)
    try:
        stored = checkpoint_dtype(args.target)
        dtype = resolve_dtype(args.dtype, device, stored)
        memory = memory_preflight(args, dtype, device)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--target {args.target}: {exc}") from exc
    try:
        drafter = load_drafter(args.drafter, device=device, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--drafter {args.drafter}: {exc}") from exc
    engine_rule = use_engine_rule(drafter, args.drafter, args.engine_rule) if args.engine_rule else None
    last_blocks = engine_rule["end_of_generation"] if engine_rule else taulib.SHRINK
    cfg = drafter.config
    if args.tree_budget is not None:
        try:
            refuse_tree(drafter)
        except ValueError as exc:
            raise UsageError(f"--tree-budget {args.tree_budget}: {exc}") from None
    say(f"drafter attention: {cfg.attention_text()}; family {cfg.family}")
    block_size = args.block_size if args.block_size is not None else cfg.block_size
    block_note = None
    if block_size > cfg.block_size:  # the reference allows it too: the drafter takes any block length
        block_note = (f"block size {block_size} is larger than the drafter's trained block size {cfg.block_size}: "
                      f"slots past {cfg.block_size - 1} were never trained")
        say(f"notice: {block_note}")
    what = "the whole target" if args.mode == "online" else "the target's embedding and LM head (memory-mapped)"
    say(f"loading {what} from {args.target} on {device}, dtype {str(dtype).removeprefix('torch.')} "
        f"(stored {str(stored).removeprefix('torch.') if stored else 'unknown'}); "
        f"needs about {gb(memory['needed_bytes'])}")
    if args.mode == "online":
        target = load_target(args.target, device, dtype)
    else:
        target = load_embed_head(args.target, device, dtype)
    tcfg = target.config.get_text_config()
    if tcfg.hidden_size != cfg.hidden_size:
        raise UsageError(f"drafter hidden_size {cfg.hidden_size} != target hidden_size {tcfg.hidden_size}: wrong target?")
    if max(cfg.target_layer_ids) >= tcfg.num_hidden_layers:
        raise UsageError(f"drafter taps layers {cfg.target_layer_ids} but the target has {tcfg.num_hidden_layers}")
    if cfg.mask_token_id >= tcfg.vocab_size:
        raise UsageError(f"drafter mask_token_id {cfg.mask_token_id} outside the target vocabulary {tcfg.vocab_size}")
    tokenizer = load_tokenizer(args.target)
    with half_rows(target, drafter, enabled=args.cpu_matmul == "auto") as tiled:
        if tiled:
            say(f"{tiled} {str(dtype).removeprefix('torch.')} linears compute 8+ rows in float32 tiles (this CPU has "
                f"no {str(dtype).removeprefix('torch.')} matrix instructions; --cpu-matmul torch keeps torch's kernels)")
        if args.stop == "settled":
            return _main_settled(args, target, tokenizer, drafter, prompts, block_size, block_note, last_blocks,
                                 engine_rule, memory, tiled, device, dtype)
        if args.mode == "online":
            figures = run_online(args, target, tokenizer, drafter, prompts, block_size, last_blocks)
        else:
            figures = run_offline(args, target, drafter, prompts, block_size, last_blocks)
    result = {
        **record(args, cfg, prompts, block_size=block_size, block_note=block_note,
                 stops=stop_ids(args, target, tokenizer) if args.mode == "online" else None,
                 tokenizer=tokenizer, model_type=target.config.model_type, num_layers=tcfg.num_hidden_layers,
                 engine_rule=engine_rule, last_blocks=last_blocks),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "memory": memory,
        "cpu_matmul": {"mode": args.cpu_matmul, "float32_tiled_linears": tiled},
        **figures,
    }
    result["harness"] = harness.of_result(result)
    if "all_anchor" in result:
        result["all_anchor"]["harness"] = harness.of_result(result, "all_anchor")
    emit("metric", task="eval", **named(args), method="chain", mode=args.mode, tau=result["tau"],
         tau_pooled=result["tau_pooled"], num_rounds=result["num_rounds"])
    if "ddtree" in result:
        emit("metric", task="eval", **named(args), method="ddtree", budget=args.tree_budget, mode=args.mode,
             tau=result["ddtree"]["tau"], tau_pooled=result["ddtree"]["tau_pooled"])
    if "all_anchor" in result:
        emit("metric", task="eval", **named(args), method="all_anchor", mode=args.mode, tau=result["all_anchor"]["tau"],
             tau_pooled=result["all_anchor"]["tau_pooled"])
    out = write_result(args.out, result, provenance(seed=args.seed, task="eval",
                                                    extra={"drafter_attention": cfg.attention_summary(),
                                                           "reproduce": reproduce_record(args, result)}))
    emit("result", task="eval", path=str(out.resolve()))
    return 0


def _main_settled(args, target, tokenizer, drafter, prompts, block_size, block_note, last_blocks, engine_rule,
                  memory, tiled, device, dtype) -> int:
    """The paired eval of ``--stop settled``: the drafter, then the baseline, prompt by prompt, until
    the confidence sequence settles the verdict or ``--limit`` (all prompts without it) is reached;
    both results are written as an ordinary eval writes them, each with ``sequential``."""
    from core.ml.measure.sequential import Sequential
    from core.ml.models.drafter import load_drafter

    base_args = argparse.Namespace(**{**vars(args), "drafter": args.baseline_drafter, "out": args.baseline_out,
                                      "label": args.baseline_label})
    try:
        base = load_drafter(args.baseline_drafter, device=device, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--baseline-drafter {args.baseline_drafter}: {exc}") from exc
    base_block = args.block_size if args.block_size is not None else base.config.block_size
    seq = Sequential(args.min_difference, len(prompts), args.alpha)
    rows: tuple[list, list] = ([], [])
    done: list[Any] = []
    for p in prompts:
        mine = run_online(args, target, tokenizer, drafter, [p], block_size, last_blocks)["per_prompt"][0]
        theirs = run_online(base_args, target, tokenizer, base, [p], base_block, last_blocks)["per_prompt"][0]
        rows[0].append(mine)
        rows[1].append(theirs)
        done.append(p)
        if mine["tau"] is not None and theirs["tau"] is not None and seq.add(mine["tau"], theirs["tau"]):
            break
    report = seq.report(args.label or "drafter", args.baseline_label)
    say(f"settled stop: {report['text']}")
    emit("metric", task="eval", **named(args), method="chain", sequential=report["verdict"],
         prompts=report["prompts"], fixed_prompts=report["fixed_prompts"])
    tcfg = target.config.get_text_config()
    for a, d, bs, note, rs in ((args, drafter, block_size, block_note, rows[0]),
                               (base_args, base, base_block, None, rows[1])):
        result = {
            **record(a, d.config, done, block_size=bs, block_note=note, stops=stop_ids(a, target, tokenizer),
                     tokenizer=tokenizer, model_type=target.config.model_type, num_layers=tcfg.num_hidden_layers,
                     engine_rule=engine_rule if a is args else None, last_blocks=last_blocks),
            "device": str(device), "dtype": str(dtype).removeprefix("torch."), "memory": memory,
            "cpu_matmul": {"mode": a.cpu_matmul, "float32_tiled_linears": tiled},
            **_summary(rs, bs), "per_prompt": rs, "timing": _timing(rs), "sequential": report,
        }
        result["harness"] = harness.of_result(result)
        out = write_result(a.out, result, provenance(seed=a.seed, task="eval",
                                                     extra={"drafter_attention": d.config.attention_summary(),
                                                            "reproduce": reproduce_record(a, result)}))
        emit("result", task="eval", **named(a), path=str(out.resolve()))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
