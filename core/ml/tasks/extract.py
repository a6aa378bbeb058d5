"""``python -m core.ml.extract``: the target's greedy continuations and tapped features.

    python -m core.ml.extract --target DIR --prompts FILE.jsonl --layers IDS --out DIR
                              [--max-new-tokens N] [--device auto|cpu|cuda] [--dtype auto|...]
                              [--limit N] [--ignore-eos] [--no-chat-template] [--enable-thinking]

``--layers`` is a comma list of 0-based target decoder layers (``1,9,17,25,33``) or a drafter
directory / config.json to read ``target_layer_ids`` from. For each prompt: greedy decoding
(KV cache), then ONE forward over prompt + continuation with hooks on the tapped layers only,
giving ``features[S, K*H]`` (= ``hidden_states[id + 1]`` concatenated) and greedy ``labels[S]``
(argmax computed in chunks from the final hidden state, so full ``S x V`` logits never exist).
One prompt at a time, written at once (memory bounded per prompt); resumable: ids already in
the manifest are skipped. Layout: :mod:`core.ml.formats.featstore`.

For offline tau that must match an online run with ``--max-new-tokens N`` and block size B,
extract with at least ``N + B - 1`` new tokens.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.ml.formats import bounds
from core.ml.formats.runio import (Progress, UsageError, add_generation_args, check_flags, check_generation_args, emit,
                            provenance, run_main, say)


def parse_layers(value: str) -> list[int]:
    """``"1,9,17"`` or a drafter dir / config.json -> layer ids."""
    path = Path(value)
    if path.exists():
        from core.ml.formats.drafter_config import DFlashConfig

        return DFlashConfig.from_file(path).target_layer_ids  # InvalidFile names the file and the key
    try:
        ids = [int(x) for x in value.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"--layers {value!r}: give comma-separated ints or a drafter directory") from None
    if not ids:
        raise UsageError("--layers is empty")
    return ids


def target_fingerprint(path: str | Path) -> str:
    """Short hash of a target directory's config.json (volatile keys dropped) and weight file sizes."""
    import hashlib
    import json

    from core.text import read_json_file

    path = Path(path)
    cfg = read_json_file(path / "config.json", "target config")
    for k in ("transformers_version", "_name_or_path", "dtype", "torch_dtype"):
        cfg.pop(k, None)
    sizes = sorted((p.name, p.stat().st_size) for p in path.glob("*.safetensors"))
    blob = json.dumps({"config": cfg, "weights": sizes}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def check_target_dir(path: str) -> int | None:
    """The target's layer count, once its config.json is read and checked
    (:func:`core.ml.formats.drafter_config.read_target_config`) and every safetensors header of it is
    checked against its file.

    Raises:
        UsageError / InvalidFile: what is missing or wrong, by file and key (exit 2).
    """
    from core.ml.formats.drafter_config import read_target_config
    from core.ml.formats.safetensors_header import check_dir

    if not (Path(path) / "config.json").is_file():
        raise UsageError(f"--target {path}: no config.json there (expected a transformers model directory)")
    n = read_target_config(path).get("num_hidden_layers")
    check_dir(path)
    return n


def check_layers(layer_ids: Sequence[int], n: int | None, target: str) -> None:
    """Refuse (exit 2) target layers the target does not have."""
    bad = [i for i in layer_ids if n is not None and not 0 <= i < n]
    if bad:
        raise UsageError(f"--layers {list(layer_ids)}: {bad} are not layers of the target {target}, which has {n} "
                         f"(0..{n - 1}); give the drafter made for this target")


def labels_and_features(model: Any, ids: Any, layer_ids: Sequence[int], chunk: int = 256) -> tuple[Any, Any]:
    """One forward over ``ids`` [1, S] -> (features [S, K*H], labels [S] greedy argmax)."""
    import torch

    from core.ml.models.features import FeatureTap, decoder_parts

    parts = decoder_parts(model)
    norm = parts[1] if parts else None
    last: dict[str, Any] = {}
    handle = norm.register_forward_hook(lambda _m, _i, o: last.__setitem__("h", o)) if norm is not None else None
    try:
        with FeatureTap(model, layer_ids) as tap, torch.no_grad():
            kwargs: dict[str, Any] = {"use_cache": False}
            if tap.needs_hidden_states:
                kwargs["output_hidden_states"] = True
            if handle is not None:
                kwargs["logits_to_keep"] = 1
            out = model(ids, **kwargs)
            feats = tap.pop_from(getattr(out, "hidden_states", None))[0]
            if handle is not None:
                head = model.get_output_embeddings()
                h = last["h"][0]
                labels = torch.cat([head(h[i : i + chunk]).argmax(-1) for i in range(0, h.shape[0], chunk)])
            else:
                labels = out.logits[0].argmax(-1)
    finally:
        if handle is not None:
            handle.remove()
    return feats, labels


def engine_binary(args: Any) -> Path | None:
    """The llama-server ``--engine llama.cpp`` runs (None without ``--engine``).

    Raises:
        UsageError: none is built or the one named is not a file (exit 2, before anything loads).
    """
    if args.engine == "none":
        return None
    from core.ml.engines.llama import BUILD_HINT, find_binary

    binary = find_binary(args.engine_bin)
    if binary is None or not binary.is_file():
        where = f"--engine-bin {binary}: not a file" if binary is not None else "no llama-server found"
        raise UsageError(f"--engine llama.cpp: {where}; {BUILD_HINT}, or extract without --engine (torch decodes)")
    return binary


def engine_phase(args: Any, binary: Path | None, target_dir: Path, dtype: str, encoded: dict[str, list[int]],
                 out: Path, manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    """With ``--engine llama.cpp``: every prompt's continuation from llama-server and the engine's
    record for the manifest (``engine``; its ``checked`` and ``mismatches`` go on from a resumed
    extract's and are filled as prompts are checked)."""
    if binary is None or not encoded:
        return None
    from core.ml.engines.greedy import engine_continuations

    answers, record = engine_continuations(binary, target_dir, dtype, encoded, args.max_new_tokens,
                                           args.engine_threads, out / "engine", target_fingerprint(target_dir),
                                           args.engine_target)
    kept = (manifest or {}).get("engine", {})
    record |= {"checked": kept.get("checked", []), "mismatches": kept.get("mismatches", [])}
    return {"answers": answers, "record": record}


def continuation_and_features(model: Any, ids: list[int], pid: str, engine: dict[str, Any] | None, check: bool,
                              max_new: int, stops: Sequence[int], layer_ids: Sequence[int]) -> tuple[Any, ...]:
    """One prompt's ``(tokens, stopped, source, features, labels)``: the engine's continuation
    where it is torch's greedy (``source`` "llama.cpp"), else torch's own ("torch")."""
    import torch

    from core.ml.decoding.generate import finish_tokens, greedy_generate
    from core.ml.engines.greedy import ENGINE, TORCH, first_difference, labels_disagree, mismatch

    device = next(model.parameters()).device
    ref = None
    if engine is not None:
        answer = engine["answers"][pid]
        tokens, stopped = finish_tokens(answer.tokens, max_new, stops)
        record = engine["record"]
        bad = None
        if not stopped and len(tokens) < max_new:
            bad = mismatch(pid, f"the engine ended after {len(tokens)} tokens ({answer.stop_type}) at a token "
                                f"specdeck does not stop at")
        if bad is None and check:
            record["checked"].append(pid)
            ref = greedy_generate(model, ids, max_new, stops)
            at = first_difference(tokens, ref.tokens)
            if at is not None:
                bad = mismatch(pid, "torch's token-by-token greedy differs", at,
                               tokens[at] if at < len(tokens) else None,
                               ref.tokens[at] if at < len(ref.tokens) else None)
        if bad is None:
            feats, labels = labels_and_features(model, torch.tensor([ids + tokens], device=device), layer_ids)
            # a checked prompt is torch's greedy, token for token; the teacher-forced argmax (other
            # kernels than the decode's one-row ones) may still differ from it at a near tie
            off = None if ref is not None else labels_disagree(tokens, labels.tolist(), len(ids))
            if off is None:
                return tokens, stopped, ENGINE, feats, labels
            bad = mismatch(pid, "the teacher-forced forward's argmax differs", off[0], tokens[off[0]], off[1])
    gen = ref if ref is not None else greedy_generate(model, ids, max_new, stops)
    if engine is not None:  # what torch's greedy then said: the engine's tokens after all, or not
        bad["torch_greedy_equal"] = first_difference(tokens, gen.tokens) is None
        record["mismatches"].append(bad)
    feats, labels = labels_and_features(model, torch.tensor([ids + gen.tokens], device=device), layer_ids)
    return gen.tokens, gen.stopped, TORCH, feats, labels


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.extract", description="cache target greedy outputs and features")
    p.add_argument("--target", required=True, help="target model directory (transformers format)")
    p.add_argument("--prompts", required=True, help="JSONL: {id, prompt} or {id, input_ids} per line")
    p.add_argument("--layers", required=True, help="comma-separated 0-based layer ids, or a drafter dir")
    p.add_argument("--out", required=True, help="output directory (created; resumable)")
    add_generation_args(p, needs="the target", example="60G")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS")
    p.add_argument("--no-chat-template", action="store_true", help="encode text prompts raw")
    p.add_argument("--enable-thinking", action="store_true", help="chat template with thinking on")
    p.add_argument("--seed", type=int, default=0)
    e = p.add_argument_group("engine continuations (issue 49): llama.cpp decodes, torch takes the features")
    e.add_argument("--engine", choices=["none", "llama.cpp"], default="none",
                   help="llama.cpp: a plain llama-server produces the greedy continuations, each checked against "
                   "the teacher-forced forward's argmax (and, on --engine-check prompts, torch's own greedy); a "
                   "prompt where they differ takes torch's (default none: torch decodes)")
    e.add_argument("--engine-bin", help="llama-server (default: $SPECDECK_LLAMA_SERVER, else the newest build of "
                   "scripts/build-llama-server)")
    e.add_argument("--engine-target", help="the target's GGUF to serve (default: --target converted at --dtype with "
                   "the converter kept next to the binary, into OUT/engine)")
    e.add_argument("--engine-threads", type=int, default=min(2, os.cpu_count() or 1), help="CPU threads (default 2)")
    e.add_argument("--engine-check", type=int, default=4, help="prompts (the first N) whose continuation torch's "
                   "token-by-token greedy decodes too, compared token for token (default 4)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    n_layers = check_target_dir(args.target)
    target_dir = Path(args.target)
    layer_ids = parse_layers(args.layers)
    check_layers(layer_ids, n_layers, args.target)
    check_generation_args(args)
    check_flags(args, seed=bounds.seed64, engine_threads=bounds.count, engine_check=lambda v: bounds.count(v, 0))
    binary = engine_binary(args)
    from core.ml.measure.prompts import encode, file_sha256, kept_file, read_prompts, single_turn

    prompts = read_prompts(args.prompts, args.limit)
    single_turn(prompts, "extract")

    import torch

    from core.ml.formats import featstore
    from core.ml.models.cpu_rows import half_rows
    from core.ml.formats.drafter_config import read_target_config
    from core.ml.models.target import load_target, load_tokenizer, resolve_device, resolve_dtype, stop_token_ids

    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    from core.ml.formats.weights import checkpoint_dtype, gb, preflight, tensor_index, weight_bytes

    try:
        dtype = resolve_dtype(args.dtype, device, checkpoint_dtype(target_dir))
        names = [k for k in tensor_index(target_dir) if "visual" not in k and not k.startswith("mtp.")]
        needed = int(1.1 * weight_bytes(target_dir, names, dtype))  # 10 % for activations and the cache
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--target {target_dir}: {exc}") from exc
    preflight(needed, "extract", args.max_memory, "Run on a host with more memory, or raise --max-memory if the "
              "estimate is too strict.", device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fp = target_fingerprint(target_dir)
    settings = {"target_fingerprint": fp, "layer_ids": layer_ids, "max_new_tokens": args.max_new_tokens,
                "ignore_eos": args.ignore_eos, "chat_template": not args.no_chat_template,
                "enable_thinking": args.enable_thinking}
    manifest = featstore.load_manifest(out)
    if manifest is not None:
        diff = {k: (manifest.get("settings", {}).get(k), v) for k, v in settings.items() if manifest.get("settings", {}).get(k) != v}
        if diff:
            raise UsageError(f"--out {out} holds an extract made with other settings {diff}; use another --out")
    tokenizer = load_tokenizer(target_dir)
    todo = [p for p in prompts if p.id not in (manifest or {}).get("entries", {})]
    vocab = read_target_config(target_dir).get("vocab_size")
    if not isinstance(vocab, int):
        raise UsageError(f"--target {target_dir}/config.json states no vocab_size; give a transformers model directory")
    encoded = {p.id: encode(p, tokenizer, vocab, not args.no_chat_template, args.enable_thinking) for p in todo}
    # before torch loads the target: the two never hold it at once
    engine = engine_phase(args, binary, target_dir, str(dtype).removeprefix("torch."), encoded, out, manifest)
    say(f"loading target {target_dir} on {device}, dtype {str(dtype).removeprefix('torch.')}, needs about {gb(needed)}")
    model = load_target(target_dir, device, dtype)
    n_layers = model.config.get_text_config().num_hidden_layers
    if max(layer_ids) >= n_layers or min(layer_ids) < 0:
        raise UsageError(f"--layers {layer_ids}: the target has {n_layers} decoder layers (ids 0..{n_layers - 1})")
    stops = [] if args.ignore_eos else stop_token_ids(model, tokenizer)
    prov = provenance(seed=args.seed, task="extract", extra={"cpu_matmul": args.cpu_matmul})
    if manifest is None:
        manifest = {
            "format": featstore.FORMAT,
            "target": {"path": str(target_dir.resolve()), "fingerprint": fp, "model_type": model.config.model_type},
            "layer_ids": layer_ids,
            "hidden_size": model.config.get_text_config().hidden_size,
            "feature_dim": len(layer_ids) * model.config.get_text_config().hidden_size,
            "dtype": str(dtype).removeprefix("torch."),
            "settings": settings,
            "entries": {},
        }
    manifest["prompts"] = {"file": str(kept_file(args.prompts, out)), "sha256": file_sha256(args.prompts)}
    manifest["provenance"] = prov
    if engine is not None:
        manifest["engine"] = engine["record"]
    if len(todo) < len(prompts):
        say(f"resuming: {len(prompts) - len(todo)} prompts already extracted")
    progress = Progress("extract", len(prompts), "prompts")
    progress.done = len(prompts) - len(todo)
    with half_rows(model, enabled=args.cpu_matmul == "auto") as tiled:
        if tiled:
            name = str(dtype).removeprefix("torch.")
            say(f"{name} linears compute 8+ rows (prefill, features) in float32 tiles: this CPU has no {name} "
                "matrix instructions (--cpu-matmul torch keeps torch's kernels)")
        for i, prompt in enumerate(todo):
            t0 = time.perf_counter()
            ids = encoded[prompt.id]
            tokens, stopped, source, feats, labels = continuation_and_features(
                model, ids, prompt.id, engine, i < args.engine_check, args.max_new_tokens, stops, layer_ids)
            full = torch.tensor([ids + tokens], device=device)
            seq = featstore.CachedSequence(prompt.id, full[0], feats, labels, len(ids))
            rel = featstore.write_entry(out, seq)
            manifest["entries"][prompt.id] = {"file": rel, "prompt_len": len(ids), "num_tokens": int(full.shape[1]),
                                              "num_generated": len(tokens), "stopped": stopped,
                                              "tokens_from": source, "seconds": round(time.perf_counter() - t0, 3)}
            if engine is not None:
                manifest["entries"][prompt.id]["engine_s"] = round(engine["answers"][prompt.id].seconds, 3)
            featstore.save_manifest(out, manifest)
            del feats, labels, full
            progress.step(tokens=len(ids) + len(tokens), id=prompt.id)
    from core.ml.formats.runio import atomic_write_json

    atomic_write_json(out / "provenance.json", prov)
    sources = [e.get("tokens_from", "torch") for e in manifest["entries"].values()]
    emit("result", task="extract", path=str((out / featstore.MANIFEST).resolve()), prompts=len(manifest["entries"]),
         tokens_from={s: sources.count(s) for s in sorted(set(sources))},
         mismatches=len(manifest.get("engine", {}).get("mismatches", [])))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
