"""Cost of one speculative round against one plain decode step, at the campaign's proportions.

    python bench/eval_speed.py [--arch qwen3|qwen3_5|both] [--threads 2] [--context 256]
                               [--rounds 4] [--repeats 3]

What decides the operator's wait on the CPU eval host is the cost of a round on the real pair,
Qwen3.6-27B (64 layers, hidden 5120, vocab 248320: its LM head is about 5 % of the weights) with
its 5-layer drafter, against one plain decode step of the target. Here both models are random,
built from config, in bf16 (nothing downloaded), at those proportions scaled to this machine:

* target: the 27B's layout with every width divided by 5 (hidden 1024, MLP 3481, 64-wide heads
  in the 27B's head counts' proportions; ``qwen3_5``: 3 gated delta-net layers per
  full-attention one, as the 27B; ``qwen3``: all full attention), as many layers as give the
  one-layer drafter the 27B drafter's share of the weights (about 17-19), and the vocabulary
  that gives its LM head (and its embedding) the 27B's share;
* drafter: one layer, the 27B drafter's widths / 5, block size 16, 5 taps. The shares are
  printed for both pairs (the 27B's counted on ``meta``).

Each repeat runs, interleaved, plain decoding (block size 1 through the harness, the baseline of
``eval --speedup``; transformers' own decode, :func:`core.ml.decoding.generate.greedy_generate`, is timed
too: for a hybrid target on a CPU without bf16 instructions its depthwise conv in bf16 runs
channel by channel and makes it about 3x slower), a chain generation (B = 16) and a DDTree-16
generation through the harness (:func:`~core.ml.decoding.generate.chain_generate`,
:func:`~core.ml.decoding.generate.ddtree_generate`, a :class:`~core.ml.models.target.TargetRunner`) after the same
``--context``-token prompt; with ``--cpu-matmul both`` (the default) the generations run once
with eval's default kernels (``auto``: many-row bf16 linears in float32 tiles on a CPU without
bf16 matrix instructions, :mod:`core.ml.models.cpu_rows`) and once with torch's own (rows
``MODE@torch``). Only full-width rounds count (the last ones shrink to what is left). Each round
is split by timing hooks into drafter (its layers), draft LM head (B-1 positions), tree build,
verify (the target's forward, its LM head and taps included), update (cache / recurrent state)
and the rest; each part is a share of the decode step measured in the same repeat (the mean of
one measured before the generations and one after), and the figures are medians over repeats.
Printed: the round in decode steps, its parts, and the speedup it implies at tau 3, 6 and 8
(tau / round). Goals (issue 34): Qwen3 chain <= 1.35, DDTree-16 <= 1.5; hybrid chain <= 1.5,
DDTree-16 <= 1.7.

A round's verify is a forward of B rows; a decode step one of one row, which streams the weights
and is bound by memory bandwidth. B rows need 2 B flops per weight, so the round can approach one
decode step only where the CPU's float rate per byte of bandwidth is well above B. The bench
prints what this CPU allows (:func:`roofline`): the cost of a B-row bf16 linear against a one-row
one, the best float32 rate, the decode step's bandwidth, and the verify's floor in decode steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

BLOCK, BUDGET, MASK = 16, 16, 3
# Qwen3.6-27B (tests/ml/train/test_campaign_config.py's config.json) and its published drafter
# (plans/train/qwen3.6-27b-v5.yaml).
CAMPAIGN = dict(hidden_size=5120, num_hidden_layers=64, vocab_size=248320, intermediate_size=17408,
                num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128)
CAMPAIGN_DRAFTER = dict(num_layers=5, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        intermediate_size=17408)
SCALE, LAYERS = 5, 13  # widths / 5; 64 / 5 layers to start from (then as many as give the drafter its share)


def scaled(cfg: dict, scale: int) -> dict:
    """The 27B's widths / ``scale``, heads 64 wide, head counts in the same proportions."""
    out = dict(cfg, hidden_size=cfg["hidden_size"] // scale, intermediate_size=cfg["intermediate_size"] // scale)

    def heads(name: str, dim: str, group: int = 1) -> int:  # a multiple of `group` (GQA)
        return max(1, round(cfg[name] * cfg[dim] / scale / 64 / group)) * group

    out["num_key_value_heads"] = heads("num_key_value_heads", "head_dim")
    out["num_attention_heads"] = heads("num_attention_heads", "head_dim", out["num_key_value_heads"])
    out["head_dim"] = 64
    if "linear_num_key_heads" in cfg:
        out["linear_num_key_heads"] = heads("linear_num_key_heads", "linear_key_head_dim")
        out["linear_num_value_heads"] = heads("linear_num_value_heads", "linear_value_head_dim", out["linear_num_key_heads"])
        out["linear_key_head_dim"] = out["linear_value_head_dim"] = 64
    return out


def target_config(arch: str, sizes: dict, layers: int):
    from transformers import Qwen3Config
    from transformers.models.qwen3_5 import Qwen3_5TextConfig

    common = dict(vocab_size=sizes["vocab_size"], hidden_size=sizes["hidden_size"], num_hidden_layers=layers,
                  intermediate_size=sizes["intermediate_size"], num_attention_heads=sizes["num_attention_heads"],
                  num_key_value_heads=sizes["num_key_value_heads"], head_dim=sizes["head_dim"],
                  tie_word_embeddings=False, eos_token_id=2, pad_token_id=0)
    if arch == "qwen3":
        return Qwen3Config(**common)
    kinds = [("full_attention" if i % 4 == 3 else "linear_attention") for i in range(layers)]
    return Qwen3_5TextConfig(**common, layer_types=kinds, linear_conv_kernel_dim=4,
                             **{k: sizes[k] for k in sizes if k.startswith("linear_")})


def build(arch: str, sizes: dict, drafter_sizes: dict, layers: int, device: str = "cpu"):
    """Target and drafter (bf16; random, std 0.02, unless on ``meta``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from core.ml.demo import tiny

    cfg = target_config(arch, sizes, layers)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            target = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    finally:
        torch.set_default_dtype(torch.float32)
    taps = sorted({round(1 + i * (layers - 3) / 4) for i in range(5)})
    dcfg = tiny.tiny_drafter_config(cfg, block_size=BLOCK, target_layer_ids=taps,
                                    num_layers=drafter_sizes["num_layers"],
                                    **{k: v for k, v in drafter_sizes.items() if k != "num_layers"})
    if device == "meta":
        from core.ml.models.drafter import DFlashDrafter

        with torch.device("meta"):
            return target, DFlashDrafter(dcfg)
    with torch.no_grad():
        for p in target.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return target, tiny.build_tiny_drafter(dcfg, seed=1, std=0.02).to(torch.bfloat16).eval()


def shares(target, drafter) -> dict:
    """The LM head's and the drafter's share of the target's weights (parameters)."""
    total = sum(p.numel() for p in target.parameters())
    return {"params": total, "head_share": round(target.get_output_embeddings().weight.numel() / total, 4),
            "drafter_share": round(sum(p.numel() for p in drafter.parameters()) / total, 4)}


def campaign_pair(arch: str):
    """The bench pair: the 27B's layout / SCALE, the vocabulary solved for the 27B's head share
    (the hybrid 27B's, for a dense ``qwen3`` bench pair too)."""
    big = shares(*build("qwen3_5", CAMPAIGN, CAMPAIGN_DRAFTER, CAMPAIGN["num_hidden_layers"], "meta"))
    sizes, dsizes = scaled(CAMPAIGN, SCALE), scaled(dict(CAMPAIGN_DRAFTER, hidden_size=5120), SCALE)
    dsizes = {k: v for k, v in dsizes.items() if k != "hidden_size"} | {"num_layers": 1}

    def vocab_for(layers: int) -> int:  # V H = r (body + 2 V H)
        body_target, _ = build(arch, dict(sizes, vocab_size=64), dsizes, layers, "meta")
        body = sum(p.numel() for p in body_target.parameters()) - 2 * 64 * sizes["hidden_size"]
        r = big["head_share"]
        return int(round(r * body / (sizes["hidden_size"] * (1 - 2 * r)) / 64) * 64)

    # the drafter's share falls as 1 / layers: the layer count that gives the 27B's
    first = shares(*build(arch, dict(sizes, vocab_size=vocab_for(LAYERS)), dsizes, LAYERS, "meta"))
    layers = round(LAYERS * first["drafter_share"] / big["drafter_share"])
    target, drafter = build(arch, dict(sizes, vocab_size=vocab_for(layers)), dsizes, layers)
    return target, drafter, big


class RoundTimer:
    """Per-round part times of one generation, from hooks on the drafter, the LM head and the
    runner's verify / commit calls (the harness itself is untouched)."""

    def __init__(self, proposer, runner, head) -> None:
        self.rounds: list[dict] = []
        self._cur: dict = {}
        self._mark: dict[str, float] = {}
        self._in_draft = False
        for name in ("draft", "propose"):
            self._wrap(proposer, name, self._draft)
        for name in ("verify_chain", "verify_tree"):
            self._wrap(runner, name, self._verify)
        for name in ("commit_chain", "commit_tree"):
            self._wrap(runner, name, self._commit)
        self._hooks = []
        for module, part in ((proposer.drafter, "drafter"), (head, "head")):
            self._hooks.append(module.register_forward_pre_hook(lambda *_, p=part: self._start(p)))
            self._hooks.append(module.register_forward_hook(lambda *_, p=part: self._stop(p)))

    def _wrap(self, obj, name, around) -> None:
        fn = getattr(obj, name)
        setattr(obj, name, lambda *a, **k: around(fn, *a, **k))

    def _start(self, part: str) -> None:
        self._mark[part] = time.perf_counter()

    def _stop(self, part: str) -> None:
        if part == "head" and not self._in_draft:
            return  # the target's own head: part of verify
        key = "draft_head" if part == "head" else part
        self._cur[key] = self._cur.get(key, 0.0) + time.perf_counter() - self._mark[part]

    def _draft(self, fn, block, *a, **k):
        self._cur = {"start": time.perf_counter(), "block": len(block)}
        self._in_draft = True
        try:
            return fn(block, *a, **k)
        finally:
            self._in_draft = False
            self._cur["draft_end"] = time.perf_counter()

    def _verify(self, fn, tokens, *a, **k):
        t = time.perf_counter()
        out = fn(tokens, *a, **k)
        self._cur["tree_build"] = t - self._cur["draft_end"]
        self._cur["verify"] = time.perf_counter() - t
        return out

    def _commit(self, fn, *a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        end = time.perf_counter()
        c = self._cur
        c["update"] = end - t
        c["round"] = end - c.pop("start")
        c.pop("draft_end")
        c["other"] = c["round"] - sum(c.get(p, 0.0) for p in PARTS)
        self.rounds.append(c)
        return out

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


PARTS = ("drafter", "draft_head", "tree_build", "verify", "update")


def roofline(target, step_s: float, threads: int) -> dict:
    """What this CPU allows a verify of ``BLOCK`` positions, from one of the target's own MLP
    weights: the cost of a ``BLOCK``-row bf16 linear against a one-row one (the decode step's
    kind), the best float32 rate measured (256 rows: bf16 without native instructions is computed
    in float32), the bytes per second the decode step streams, and the least a ``BLOCK``-position
    verify can cost in decode steps at that rate (2 x BLOCK flops per weight), whatever the kernel."""
    import torch
    import torch.nn.functional as F

    weight = target.model.layers[0].mlp.up_proj.weight.detach()
    w32 = weight.float()

    def secs(w, rows: int, n: int = 20) -> float:
        x = torch.randn(rows, w.shape[1], dtype=w.dtype)
        for _ in range(3):
            F.linear(x, w)
        t = time.perf_counter()
        for _ in range(n):
            F.linear(x, w)
        return (time.perf_counter() - t) / n

    one, block, block32, wide32 = secs(weight, 1), secs(weight, BLOCK), secs(w32, BLOCK), secs(w32, 256, 5)
    params = sum(p.numel() for p in target.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in target.parameters())
    peak = 2 * 256 * weight.numel() / wide32
    return {"threads": threads, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "bf16_rows_block_over_1": round(block / one, 2), "fp32_rows_block_over_bf16_1": round(block32 / one, 2),
            "fp32_peak_gflops": round(peak / 1e9, 1), "decode_gbs": round(nbytes / step_s / 1e9, 2),
            "bf16_block_gflops": round(2 * BLOCK * weight.numel() / block / 1e9, 1),
            "verify_floor_steps": round(2 * BLOCK * params / peak / step_s, 2)}


def bench_arch(arch: str, args) -> dict:
    import torch

    from core.ml.models.cpu_rows import half_rows
    from core.ml.decoding.generate import DFlashProposer, chain_generate, ddtree_generate, greedy_generate
    from core.ml.models.target import TargetRunner

    target, drafter, big = campaign_pair(arch)
    mine = shares(target, drafter)
    prompt = torch.randint(4, target.config.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    head = target.get_output_embeddings()
    runs = {"chain": lambda p, r: chain_generate(p, r, prompt, args.rounds + BLOCK, BLOCK, MASK),
            "ddtree16": lambda p, r: ddtree_generate(p, r, prompt, args.rounds + BLOCK, BLOCK, MASK, BUDGET)}
    kernels = ["auto", "torch"] if args.cpu_matmul == "both" else [args.cpu_matmul]
    modes = {(mode if kernel == kernels[0] else f"{mode}@{kernel}"): (run, kernel)
             for kernel in kernels for mode, run in runs.items()}
    ratios: dict[str, list[dict]] = defaultdict(list)
    steps, hf_steps, tiled = [], [], 0

    def decode_step() -> float:  # block size 1 through the same harness, as eval --speedup's baseline
        plain = TargetRunner(target, None)
        try:
            g = chain_generate(None, plain, prompt, args.rounds + 1, 1, MASK)
        finally:
            plain.close()
        return g.decode_s / (g.target_forwards - 1)

    with torch.no_grad():
        for rep in range(args.repeats + 1):  # the first pass warms up and is dropped
            before = decode_step()
            g = greedy_generate(target, prompt, args.rounds + 1)  # transformers' own decode, for reference
            hf_step = g.decode_s / (g.target_forwards - 1)
            parts = {}
            for mode, (run, kernel) in modes.items():
                proposer, runner = DFlashProposer(drafter, target), TargetRunner(target, drafter.target_layer_ids)
                timer = RoundTimer(proposer, runner, head)
                try:
                    with half_rows(target, drafter, enabled=kernel == "auto") as n:
                        tiled = max(tiled, n)
                        run(proposer, runner)
                finally:
                    timer.close()
                    runner.close()
                parts[mode] = [r for r in timer.rounds if r["block"] == BLOCK]
            step = (before + decode_step()) / 2  # the decode step around the rounds: a drifting machine evens out
            for mode, full in parts.items():
                if rep and full:
                    ratios[mode].append({f: statistics.median(r.get(f, 0.0) for r in full) / step
                                         for f in ("round", *PARTS, "other")} | {"rounds": len(full)})
            if rep:
                steps.append(step)
                hf_steps.append(hf_step)
    out = {"bench": "eval_speed", "arch": arch, "threads": args.threads, "context": args.context,
           "load_average": os.getloadavg()[0], "campaign_27b": big, "bench_pair": mine,
           "target_mb": round(mine["params"] * 2 / 1e6, 1), "vocab": target.config.vocab_size,
           "cpu_matmul": args.cpu_matmul, "tiled_layers": tiled,
           "decode_step_ms": round(statistics.median(steps) * 1e3, 2),
           "transformers_decode_step_ms": round(statistics.median(hf_steps) * 1e3, 2),
           "roofline": roofline(target, statistics.median(steps), args.threads)}
    for mode, rows in ratios.items():
        m = {f: round(statistics.median(r[f] for r in rows), 3) for f in rows[0]}
        m["round_range"] = [round(min(r["round"] for r in rows), 3), round(max(r["round"] for r in rows), 3)]
        m.update({f"speedup_at_tau{t}": round(t / m["round"], 2) for t in (3, 6, 8)})
        out[mode] = m
    return out


def report(o: dict) -> None:
    print(json.dumps(o), flush=True)
    goals = {"qwen3": {"chain": 1.35, "ddtree16": 1.5}, "qwen3_5": {"chain": 1.5, "ddtree16": 1.7}}[o["arch"]]
    for mode in [k for k in o if k.split("@")[0] in goals]:
        m, base = o[mode], mode.split("@")[0]
        parts = ", ".join(f"{p} {m[p]:.2f}" for p in (*PARTS, "other") if p != "tree_build" or base != "chain")
        print(f"{o['arch']} {mode}: round {m['round']:.2f} decode steps (goal <= {goals[base]}; {m['round_range'][0]:.2f}"
              f"..{m['round_range'][1]:.2f} over repeats): {parts}; implied speedup {m['speedup_at_tau3']:.2f}x at tau 3, "
              f"{m['speedup_at_tau6']:.2f}x at tau 6, {m['speedup_at_tau8']:.2f}x at tau 8", flush=True)
    b, c, r = o["bench_pair"], o["campaign_27b"], o["roofline"]
    print(f"{o['arch']}: this CPU ({r['cpu_capability']}): a {BLOCK}-row bf16 linear costs {r['bf16_rows_block_over_1']:.1f} "
          f"one-row ones ({r['bf16_block_gflops']:.0f} GFLOP/s), a float32 one {r['fp32_rows_block_over_bf16_1']:.1f}; "
          f"at its best float32 rate ({r['fp32_peak_gflops']:.0f} GFLOP/s) and the decode step's {r['decode_gbs']:.1f} GB/s, "
          f"verifying {BLOCK} positions costs at least {r['verify_floor_steps']:.2f} decode steps, whatever the kernel", flush=True)
    print(f"{o['arch']}: decode step {o['decode_step_ms']:.1f} ms (block size 1 through the harness, eval --speedup's "
          f"baseline; transformers' own decode {o['transformers_decode_step_ms']:.1f} ms) on {o['threads']} threads "
          f"(load {o['load_average']:.1f}; --cpu-matmul {o['cpu_matmul']}: {o['tiled_layers']} linears in float32 "
          f"tiles under auto), "
          f"target {o['target_mb']:.0f} MB bf16, vocab {o['vocab']}; LM head {b['head_share']:.1%} of the weights "
          f"(27B: {c['head_share']:.1%}), drafter {b['drafter_share']:.1%} (27B: {c['drafter_share']:.1%})", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=["qwen3", "qwen3_5", "both"], default="both")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=256, help="prompt tokens before the measured rounds")
    p.add_argument("--rounds", type=int, default=4, help="full-width rounds per generation")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cpu-matmul", choices=["auto", "torch", "both"], default="both",
                   help="as eval's: auto computes many-row bf16 linears in float32 tiles on a CPU without bf16 "
                        "matrix instructions (core.ml.models.cpu_rows); torch keeps torch's kernels; both (default): "
                        "each repeat runs both, interleaved (rows MODE@torch)")
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    for arch in (["qwen3", "qwen3_5"] if args.arch == "both" else [args.arch]):
        report(bench_arch(arch, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
