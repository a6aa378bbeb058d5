"""Cost of one speculative round against one plain decode step, at the campaign's proportions.

    python bench/eval_speed.py [--threads 2] [--context 512] [--rounds 12] [--repeats 2] [--arch qwen3]

What decides the operator's wait on the CPU eval host is not the demo's tiny pair but the cost
of a round on the real one: drafter forward + verify of B = 16 tokens + cache/state update,
against one plain decode step of the target. Here both models are random, built from config,
in bf16 (nothing downloaded):

* target: a Qwen3 of about 430 MB (12 layers, hidden 1024, vocab 32000) or, with
  ``--arch qwen3_5``, a hybrid of the same size (3 linear-attention layers per full one);
* drafter: the campaign's proportion, one drafter layer per 13 target layers (here 1), the
  target's hidden size, heads and MLP width, block size 16, 5 taps.

All three run through the same harness (:func:`core.ml.generate.chain_generate` /
:func:`~core.ml.generate.ddtree_generate` with a :class:`~core.ml.target.TargetRunner`) after a
``--context``-token prompt: a plain decode step (block size 1), a chain round (B = 16) and a
DDTree round (budget 16). Each figure is the median over ``--repeats`` runs of decode time per
round. Printed: a chain round and a DDTree round as multiples of a decode step, their parts
(drafter, verify + update), and the speedup they imply at tau = 3 and 6 (tau / ratio).
Goal: a chain round <= 1.5 decode steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def build_pair(root: Path, arch: str):
    import torch

    from bench.memory import build_target
    from core.ml import tiny
    from core.ml.target import load_target

    if arch == "qwen3":
        target_dir = build_target(root / "target", layers=12, hidden=1024, inter=3072, vocab=32000)
        target = load_target(target_dir, "cpu")
    else:
        from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        cfg = Qwen3_5TextConfig(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=12,
                                num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                                layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 3,
                                linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=64,
                                linear_value_head_dim=64, linear_conv_kernel_dim=4, tie_word_embeddings=False,
                                eos_token_id=2, pad_token_id=0)
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)
        try:
            target = Qwen3_5ForCausalLM(cfg).eval()
        finally:
            torch.set_default_dtype(torch.float32)
        with torch.no_grad():
            for p in target.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.02)
    tcfg = target.config.get_text_config()
    n = tcfg.num_hidden_layers
    taps = sorted({round(i * (n - 1) / 4) for i in range(5)})
    dcfg = tiny.tiny_drafter_config(tcfg, block_size=16, num_layers=max(1, round(n / 13)), target_layer_ids=taps,
                                    num_attention_heads=tcfg.num_attention_heads,
                                    num_key_value_heads=tcfg.num_key_value_heads, head_dim=tcfg.head_dim,
                                    intermediate_size=tcfg.intermediate_size)
    drafter = tiny.build_tiny_drafter(dcfg, seed=1, std=0.02).to(torch.bfloat16).eval()
    return target, drafter


def weight_mb(model) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=512, help="prompt tokens before the measured rounds")
    p.add_argument("--rounds", type=int, default=12, help="measured tokens per run (rounds for a random drafter)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--arch", choices=["qwen3", "qwen3_5"], default="qwen3")
    p.add_argument("--keep", help="build the target here and keep it (default: a temp dir)")
    args = p.parse_args()

    import torch

    from core.ml.generate import DFlashProposer, chain_generate, ddtree_generate
    from core.ml.target import TargetRunner

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="specdeck-speed-") as tmp:
        root = Path(args.keep or tmp)
        target, drafter = build_pair(root, args.arch)
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(4, 32000, (args.context,), generator=g).tolist()
        runner = TargetRunner(target, drafter.target_layer_ids)
        plain = TargetRunner(target, None)
        proposer = DFlashProposer(drafter, target)
        mask = 3
        runs: dict[str, list[dict]] = {"decode": [], "chain": [], "ddtree16": []}
        with torch.no_grad():
            for rep in range(args.repeats + 1):  # the first pass warms up and is dropped
                got = {
                    "decode": chain_generate(None, plain, prompt, args.rounds, 1, mask),
                    "chain": chain_generate(proposer, runner, prompt, args.rounds, 16, mask),
                    "ddtree16": ddtree_generate(proposer, runner, prompt, args.rounds, 16, mask, 16),
                }
                if rep:
                    for k, r in got.items():
                        n = len(r.rounds)
                        runs[k].append({"round_s": r.decode_s / n, "draft_s": r.draft_s / n,
                                        "verify_s": r.verify_s / n, "tokens_per_round": (r.target_tokens - len(prompt)) / n,
                                        "forwards_per_round": (r.target_forwards - 1) / n})
        med = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in runs.items()}
        step = med["decode"]["round_s"]
        out = {"bench": "eval_speed", "arch": args.arch, "threads": args.threads, "context": args.context,
               "target_mb": round(weight_mb(target), 1), "drafter_mb": round(weight_mb(drafter), 1),
               "drafter_layers": drafter.config.num_hidden_layers, "target_layers": target.config.get_text_config().num_hidden_layers,
               "decode_step_ms": round(step * 1e3, 2)}
        for k in ("chain", "ddtree16"):
            m = med[k]
            ratio = m["round_s"] / step
            out[k] = {"round_in_decode_steps": round(ratio, 3), "drafter_in_decode_steps": round(m["draft_s"] / step, 3),
                      "verify_update_in_decode_steps": round(m["verify_s"] / step, 3),
                      "target_tokens_per_round": m["tokens_per_round"], "target_forwards_per_round": m["forwards_per_round"],
                      "speedup_at_tau3": round(3 / ratio, 2), "speedup_at_tau6": round(6 / ratio, 2)}
        print(json.dumps(out), flush=True)
        for k, label in (("chain", "chain round (B=16)"), ("ddtree16", "DDTree-16 round")):
            o = out[k]
            print(f"{label}: {o['round_in_decode_steps']:.2f} decode steps (drafter {o['drafter_in_decode_steps']:.2f}, "
                  f"verify+update {o['verify_update_in_decode_steps']:.2f}); implied speedup "
                  f"{o['speedup_at_tau3']:.2f}x at tau 3, {o['speedup_at_tau6']:.2f}x at tau 6", flush=True)
        print(f"decode step {out['decode_step_ms']:.1f} ms on {args.threads} threads, target {out['target_mb']:.0f} MB "
              f"bf16 ({args.arch}), drafter {out['drafter_mb']:.0f} MB; goal: a chain round <= 1.5 decode steps",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
