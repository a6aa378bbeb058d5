"""specdeck's CPU eval against llama.cpp's ``llama-server`` on the same bench target, side by side.

    python bench/engine_speed.py [--arch qwen3|qwen3_5] [--threads 2] [--context 256]
                                 [--decode 32] [--repeats 5] [--engine-bin PATH]

The bench target of ``bench/eval_speed.py`` (the 27B's layout / 5, bf16, random; its one-layer
drafter too) is saved as a transformers directory with a tiny tokenizer (the converter pads the
vocabulary), converted to a bf16 GGUF with the converter kept next to the llama-server binary
(:func:`core.ml.engines.llama.gguf_of`, the one ``eval --engine llama.cpp`` uses) and served on
loopback by a plain ``llama-server`` (no draft model, ``-np 1``, ``--threads`` threads). Each
repeat then measures, interleaved, on the same ``--context``-token prompt:

* **decode**: ms per token of plain greedy decoding. specdeck: block size 1 through the harness
  (``eval --speedup``'s baseline) and transformers' own decode
  (:func:`core.ml.decoding.generate.greedy_generate`, what ``extract`` runs); llama.cpp:
  ``timings.predicted_ms / (predicted_n - 1)`` of a ``--decode``-token request (its clock starts
  at the first token, which the prefill produced);
  and the same decode with oneDNN off (``torch.backends.mkldnn.flags(enabled=False)``: ATen's own
  bf16 kernels, which ``bench/bf16_rows.py`` measures near the memory's rate at one row);
* **batch16**: 16 positions after a cached prefix. specdeck: the verify of a chain round
  (B = 16, eval's default kernels: float32 tiles on a CPU without bf16 matrix instructions),
  and the whole round; llama.cpp: ``timings.prompt_ms`` of the context + 16 new tokens after a
  request that cached the context (``prompt_n`` checked to be 16);
* **prefill**: the ``--context`` tokens from nothing. specdeck: the prefill of
  :func:`~core.ml.decoding.generate.greedy_generate` (float32 tiles); llama.cpp: ``prompt_ms``
  of an uncached request.

``--clock cpu`` (1 thread each): every figure is the CPU time of the work instead, which a
loaded machine does not stretch as it stretches wall time: specdeck's ``time.process_time``
(standing in for ``time.perf_counter`` in the harness's own timers), llama-server's threads'
run time from ``/proc/PID/task/*/schedstat`` around each request (its decode: a ``--decode``-token
request less a one-token one).

Printed: one JSON line, then a Markdown table (medians over repeats, the first pass dropped as
warm-up) with specdeck / llama.cpp ratios, the CPU and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from bench.eval_speed import BLOCK, MASK, RoundTimer, campaign_pair  # noqa: E402


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def save_target(target, out: Path) -> Path:
    """The bench target as a transformers directory (bf16 safetensors, a tiny tokenizer)."""
    from core.ml.demo import tiny

    target.save_pretrained(out, safe_serialization=True)
    tiny.tiny_tokenizer().save_pretrained(out)
    return out


def specdeck_repeat(target, drafter, prompt: list[int], decode: int) -> dict[str, float]:
    """One repeat of specdeck's figures, in ms."""
    import torch

    from core.ml.decoding.generate import DFlashProposer, chain_generate, greedy_generate
    from core.ml.models.cpu_rows import half_rows
    from core.ml.models.target import TargetRunner

    plain = TargetRunner(target, None)
    try:
        g = chain_generate(None, plain, prompt, decode, 1, MASK)
    finally:
        plain.close()
    out = {"decode_harness": g.decode_s / (g.target_forwards - 1)}
    with torch.backends.mkldnn.flags(enabled=False):  # ATen's own bf16 kernels instead of oneDNN's
        g = greedy_generate(target, prompt, decode)
    out["decode_aten"] = g.decode_s / (g.target_forwards - 1)
    with half_rows(target, drafter):
        g = greedy_generate(target, prompt, decode)
        out["decode"] = g.decode_s / (g.target_forwards - 1)
        out["prefill"] = g.prefill_s
        proposer, runner = DFlashProposer(drafter, target), TargetRunner(target, drafter.target_layer_ids)
        timer = RoundTimer(proposer, runner, target.get_output_embeddings())
        try:
            chain_generate(proposer, runner, prompt, 4 + BLOCK, BLOCK, MASK)
        finally:
            timer.close()
            runner.close()
    full = [r for r in timer.rounds if r["block"] == BLOCK]
    out["batch16"] = statistics.median(r["verify"] for r in full)
    out["round"] = statistics.median(r["round"] for r in full)
    return {k: v * 1e3 for k, v in out.items()}


def server_cpu_s(pid: int) -> float:
    """CPU seconds every thread of process ``pid`` has run (``/proc/PID/task/*/schedstat``, ns)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def engine_repeat(server, prompt: list[int], extra: list[int], decode: int, cpu: bool) -> dict[str, float]:
    """One repeat of llama-server's figures, in ms: its own timings, or (``cpu``) the CPU time its
    threads ran for each request (the decode: a ``decode``-token request less a one-token one,
    both after the cached prompt)."""
    def run(name, ids, n, cache, **extra_args):
        before = server_cpu_s(server.proc.pid)
        timings = server.completion(name, ids, n, cache_prompt=cache, **extra_args)["timings"]
        return timings, (server_cpu_s(server.proc.pid) - before) * 1e3

    cold, cold_cpu = run("prefill", prompt, 1, False)
    run("cache", prompt, 1, True)
    batch, batch_cpu = run("batch16", prompt + extra, 1, True)
    if batch.get("prompt_n") != BLOCK:
        raise SystemExit(f"llama-server evaluated {batch.get('prompt_n')} prompt tokens after the cached prefix, "
                         f"not {BLOCK}: its prompt cache did not hold")
    dec, dec_cpu = run("decode", prompt, decode, True, ignore_eos=True)  # the prefix cached
    if cpu:
        _, one_cpu = run("decode1", prompt, 1, True, ignore_eos=True)
        return {"prefill": cold_cpu, "batch16": batch_cpu, "decode": (dec_cpu - one_cpu) / (decode - 1)}
    return {"prefill": cold["prompt_ms"], "batch16": batch["prompt_ms"],
            "decode": dec["predicted_ms"] / (dec["predicted_n"] - 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=["qwen3", "qwen3_5"], default="qwen3")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=256, help="prompt tokens (the cached prefix)")
    p.add_argument("--decode", type=int, default=32, help="tokens per decode measurement")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: every figure in CPU seconds of the threads doing the work, on 1 thread each "
                   "(a loaded machine stretches wall time, not that)")
    p.add_argument("--engine-bin", help="llama-server (default: the newest scripts/build-llama-server build)")
    p.add_argument("--workdir", help="where the target, its GGUF and the server log go (default: a temporary dir)")
    args = p.parse_args()

    import torch

    from core.ml.engines.llama import LlamaServer, binary_info, converter_tree, find_binary, gguf_of

    binary = find_binary(args.engine_bin)
    if binary is None or not binary.is_file():
        raise SystemExit("no llama-server: build it with scripts/build-llama-server or pass --engine-bin")
    if args.clock == "cpu":
        args.threads = 1  # CPU time of one thread is its work; two threads' includes the waits between them
        time.perf_counter = time.process_time  # the harness's own timers (generate, RoundTimer) read CPU time
    torch.set_num_threads(args.threads)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    with tempfile.TemporaryDirectory(prefix="engine-speed-") as tmp:
        work = Path(args.workdir or tmp)
        target, drafter, _ = campaign_pair(args.arch)
        src = save_target(target, work / "target")
        t0 = time.monotonic()  # wall: the converter is another process
        gguf, _ = gguf_of(None, str(src), "target", "bf16", work, converter_tree(binary), str(src))
        convert_s = time.monotonic() - t0
        gen = torch.Generator().manual_seed(0)
        vocab = target.config.vocab_size
        prompt = torch.randint(4, vocab, (args.context,), generator=gen).tolist()
        extra = torch.randint(4, vocab, (BLOCK,), generator=gen).tolist()
        mine: list[dict] = []
        theirs: list[dict] = []
        server = LlamaServer(binary, gguf, None, 0, args.threads, args.context + args.decode + 2 * BLOCK, work)
        with server, torch.no_grad():
            for rep in range(args.repeats + 1):  # the first pass warms both up and is dropped
                a = specdeck_repeat(target, drafter, prompt, args.decode)
                b = engine_repeat(server, prompt, extra, args.decode, args.clock == "cpu")
                if rep:
                    mine.append(a)
                    theirs.append(b)
                print(f"repeat {rep}: specdeck {json.dumps({k: round(v, 1) for k, v in a.items()})} "
                      f"llama.cpp {json.dumps({k: round(v, 1) for k, v in b.items()})}", file=sys.stderr, flush=True)
    med = {k: statistics.median(r[k] for r in mine) for k in mine[0]}
    eng = {k: statistics.median(r[k] for r in theirs) for k in theirs[0]}
    out = {"bench": "engine_speed", "arch": args.arch, "threads": args.threads, "context": args.context,
           "clock": args.clock,
           "cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "loadavg_before": load_before, "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
           "target_mb": round(sum(p.numel() for p in target.parameters()) * 2 / 1e6, 1), "vocab": vocab,
           "engine": binary_info(binary)["version"], "convert_s": round(convert_s, 1), "repeats": args.repeats,
           "specdeck_ms": {k: round(v, 2) for k, v in med.items()}, "llama_cpp_ms": {k: round(v, 2) for k, v in eng.items()},
           "ratio": {k: round(med[k] / eng[k], 2) for k in eng} | {"round_over_batch16": round(med["round"] / eng["batch16"], 2),
                                                                   "decode_harness": round(med["decode_harness"] / eng["decode"], 2),
                                                                   "decode_aten": round(med["decode_aten"] / eng["decode"], 2)}}
    print(json.dumps(out), flush=True)
    r = out["ratio"]
    print(f"\n{out['cpu']} ({out['cpu_capability']}), {args.threads} thread{'s' if args.threads > 1 else ''}, load average {' '.join(load_before)} "
          f"before / {' '.join(out['loadavg_after'])} after; {args.clock} clock; bench target {args.arch} {out['target_mb']:.0f} MB bf16, "
          f"context {args.context}; medians of {args.repeats} interleaved repeats; {out['engine']}\n")
    print("| figure | specdeck ms | llama.cpp ms | specdeck / llama.cpp |\n|---|---:|---:|---:|")
    rows = [("decode, ms per token (transformers' own: extract)", "decode", "decode", r["decode"]),
            ("decode, ms per token (harness, B = 1: eval --speedup)", "decode_harness", "decode", r["decode_harness"]),
            ("decode, ms per token (transformers', oneDNN off: ATen's bf16 kernels)", "decode_aten", "decode",
             r["decode_aten"]),
            (f"{BLOCK} positions after a cached prefix (verify / batch)", "batch16", "batch16", r["batch16"]),
            (f"a chain round (B = {BLOCK}) against llama.cpp's {BLOCK}-token batch", "round", "batch16",
             r["round_over_batch16"]),
            (f"prefill of the {args.context}-token context", "prefill", "prefill", r["prefill"])]
    for name, a, b, ratio in rows:
        print(f"| {name} | {med[a]:.1f} | {eng[b]:.1f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
