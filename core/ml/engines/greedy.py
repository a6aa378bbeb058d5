"""Greedy continuations from llama.cpp for ``extract --engine llama.cpp``, and the checks that
keep them exact (issue 49 §3).

On a CPU host plain decoding is where ``extract`` spends its time (one target forward per
token), and llama.cpp's decode step is about twice as fast as torch's there
(``bench/engine_speed.py``). So the engine may produce the continuations: the target is
converted to a GGUF at extract's dtype (:func:`core.ml.engines.llama.gguf_of`, cached in the
output directory), a plain ``llama-server`` (no draft model) answers one greedy request of token
ids per prompt, and is ended before torch loads the target, so the two never hold it at once.

Torch still takes the hidden states, in one teacher-forced forward over prompt + continuation,
and that forward is the check: its argmax at every position (extract's ``labels``) must equal
the engine's next token, else the engine's continuation is not taken as torch's greedy and the
prompt's tokens come from torch (:func:`core.ml.decoding.generate.greedy_generate`). On a sample of
prompts torch's own token-by-token greedy runs too and decides alone: equal token for token, the
engine's are taken (the teacher-forced argmax, computed by other kernels than the decode's
one-row ones, may differ from both at a near tie). Every mismatch is
named (prompt, position, both tokens) and every prompt records which path produced its tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.ml.engines.llama import GGUF_TYPES, LlamaServer, binary_info, converter_tree, gguf_of
from core.ml.formats.runio import Progress, UsageError, say

ENGINE = "llama.cpp"
TORCH = "torch"


@dataclass
class Continuation:
    """The engine's answer to one prompt: its tokens (as many as it returned) and seconds taken."""

    tokens: list[int]
    seconds: float
    stop_type: str | None


def engine_continuations(binary: Path, target_dir: Path, dtype: str, prompts: dict[str, list[int]], max_new: int,
                         threads: int, workdir: Path, fingerprint: str,
                         gguf: str | None = None) -> tuple[dict[str, Continuation], dict[str, Any]]:
    """Every prompt's greedy continuation (at most ``max_new`` tokens) from a plain llama-server
    serving ``gguf`` when given, else ``target_dir`` converted at ``dtype`` (kept in ``workdir``
    under the target's ``fingerprint``, reused by a resumed extract); returns them by prompt id
    and the engine's record (binary, version, GGUF, the EOG ids it stops at, threads, log).

    Raises:
        UsageError: a dtype llama.cpp has no GGUF type for, or the conversion failed.
        TaskError: the server did not start or answered something that is not llama-server's.
    """
    if dtype not in GGUF_TYPES:
        raise UsageError(f"--engine {ENGINE}: no GGUF type for --dtype {dtype} (give float32, bfloat16 or float16)")
    info = binary_info(binary)
    workdir.mkdir(parents=True, exist_ok=True)
    outtype = GGUF_TYPES[dtype]
    kept = workdir / f"target-{fingerprint}-{outtype}.gguf"
    if gguf is not None:
        path, record = gguf_of(gguf, str(target_dir), "target", outtype, workdir, converter_tree(binary),
                               str(target_dir))
    elif kept.is_file():
        path, record = kept, {"gguf": str(kept.resolve()), "converted_from": str(target_dir.resolve()),
                              "outtype": outtype, "reused": True}
    else:
        made, record = gguf_of(None, str(target_dir), "target", outtype, workdir, converter_tree(binary),
                               str(target_dir))
        path = made.replace(kept)
        record["gguf"] = str(kept.resolve())
    longest = max((len(ids) for ids in prompts.values()), default=0)
    server = LlamaServer(binary, path, None, 0, threads, longest + max_new + 16, workdir)
    out: dict[str, Continuation] = {}
    progress = Progress("extract-engine", len(prompts), "prompts")
    say(f"generating {len(prompts)} continuations with llama-server ({info['version']}), log {server.log_path}")
    with server:
        eog = server.eog_ids()
        for pid, ids in prompts.items():
            t0 = time.perf_counter()
            resp = server.completion(pid, ids, max_new)
            out[pid] = Continuation([int(t) for t in resp["tokens"]][:max_new], time.perf_counter() - t0,
                                    resp.get("stop_type"))
            progress.step(tokens=len(out[pid].tokens), id=pid)
    return out, {**info, "target": record, "eog": eog, "threads": threads, "log": str(server.log_path.resolve())}


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter one's length when one is a
    prefix of the other), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def labels_disagree(tokens: Sequence[int], labels: Sequence[int], prompt_len: int) -> tuple[int, int] | None:
    """Where a teacher-forced forward's greedy ``labels`` (one per position of prompt + tokens)
    would not have produced ``tokens``: ``(index into tokens, torch's token)``, else None."""
    for i, tok in enumerate(tokens):
        want = int(labels[prompt_len - 1 + i])
        if want != tok:
            return i, want
    return None


def mismatch(pid: str, why: str, position: int | None = None, engine: int | None = None,
             torch: int | None = None) -> dict[str, Any]:
    """One named mismatch (the manifest's ``engine.mismatches`` row), said as it is found."""
    row = {"id": pid, "why": why, "position": position, "engine": engine, "torch": torch}
    at = "" if position is None else f" at new token {position} (engine {engine}, torch {torch})"
    say(f"prompt {pid}: llama.cpp's continuation is not torch's greedy: {why}{at}; its tokens come from torch")
    return row
