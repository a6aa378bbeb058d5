"""Peak RSS of ``core.ml.strip`` vs a plain ``torch.load`` on a synthetic training checkpoint.

    python bench/strip.py [--weights-mb 500] [--dir /tmp/specdeck-bench-strip] [--keep]

Builds a checkpoint like a trainer writes it: drafter weights (float32, about ``--weights-mb``
MB, exact z-lab tensor names), AdamW state (exp_avg + exp_avg_sq: 2x the weights), scheduler,
step and config: about 1.5 GB for 0.5 GB of weights. Each measurement runs in its own fresh
subprocess and reports that process's peak RSS (``VmHWM`` from /proc, else ``ru_maxrss``); the
checkpoint is also built in a subprocess so this parent stays small:

* baseline: the interpreter + torch import only;
* plain:    ``torch.load(path, map_location="cpu", weights_only=True)``;
* strip:    ``core.ml.tasks.strip.main([...])`` (mmap load + streaming safetensors write).

Goal: strip peak <= 0.6 x plain peak. Prints one JSON line per measurement and a summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import resource, sys, time
sys.path.insert(0, {repo!r})
import torch
mode, ckpt, out = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
if mode == "plain":
    obj = torch.load(ckpt, map_location="cpu", weights_only=True)
elif mode == "strip":
    from core.ml.tasks.strip import main
    import contextlib, io
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([ckpt, out]) == 0
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
try:  # VmHWM belongs to this process image (ru_maxrss can carry the forking parent's peak over exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
except OSError:
    pass
print(peak, dt)
"""


def make_checkpoint(path: Path, weights_mb: float) -> dict:
    import torch

    from core.ml.models.drafter import expected_tensors
    from core.ml.formats.drafter_config import DFlashConfig

    # A Qwen3-style drafter with H 1024, I 4096, 8/4 heads x 128, K 5 taps; L chosen for the size.
    H, I = 1024, 4096
    per_layer = 2 * H + (8 * 128) * H * 2 + (4 * 128) * H * 2 + 2 * 128 + 3 * I * H
    fixed = 5 * H * H + 2 * H
    layers = max(1, round((weights_mb * 1e6 / 4 - fixed) / per_layer))
    cfg = DFlashConfig(hidden_size=H, num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                       head_dim=128, intermediate_size=I, vocab_size=151936, block_size=16, mask_token_id=151669,
                       target_layer_ids=[1, 9, 17, 25, 33], num_target_layers=36)
    g = torch.Generator().manual_seed(0)
    model = {k: torch.randn(s, generator=g) * 0.02 for k, s in expected_tensors(cfg).items()}
    optim = {"state": {i: {"step": torch.tensor(100.0), "exp_avg": torch.randn_like(v), "exp_avg_sq": torch.rand_like(v)}
                       for i, v in enumerate(model.values())},
             "param_groups": [{"lr": 6e-4, "betas": (0.9, 0.95), "weight_decay": 0.0, "params": list(range(len(model)))}]}
    ckpt = {"model": model, "optimizer": optim, "scheduler": {"last_epoch": 100, "base_lrs": [6e-4]}, "step": 100,
            "config": cfg.to_dict()}
    torch.save(ckpt, path)
    return {"layers": layers, "weights_bytes": sum(v.numel() * 4 for v in model.values()),
            "checkpoint_bytes": path.stat().st_size}


def measure(mode: str, ckpt: Path, out: Path) -> tuple[int, float]:
    code = CHILD.format(repo=str(REPO))
    r = subprocess.run([sys.executable, "-c", code, mode, str(ckpt), str(out)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{mode} child failed:\n{r.stderr}")
    rss, dt = r.stdout.split()
    return int(rss), float(dt)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights-mb", type=float, default=500.0)
    p.add_argument("--dir", default="/tmp/specdeck-bench-strip")
    p.add_argument("--keep", action="store_true", help="keep the synthetic checkpoint")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "checkpoint.pt"
    t0 = time.perf_counter()
    code = (f"import sys, json; sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(Path(__file__).parent)!r});"
            f"from strip import make_checkpoint; print(json.dumps(make_checkpoint(__import__('pathlib').Path({str(ckpt)!r}), {args.weights_mb})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"building the checkpoint failed:\n{r.stderr}")
    info = json.loads(r.stdout.splitlines()[-1])
    print(json.dumps({"event": "info", "task": "bench_strip", **info, "build_s": round(time.perf_counter() - t0, 1)}))
    try:
        base, _ = measure("baseline", ckpt, work / "out")
        plain, t_plain = measure("plain", ckpt, work / "out")
        strip, t_strip = measure("strip", ckpt, work / "out")
        out_bytes = (work / "out" / "model.safetensors").stat().st_size
    finally:
        if not args.keep:
            ckpt.unlink(missing_ok=True)
            shutil.rmtree(work / "out", ignore_errors=True)
    mb = 1 / 2**20
    for name, rss, dt in (("baseline", base, 0.0), ("plain_torch_load", plain, t_plain), ("strip", strip, t_strip)):
        print(json.dumps({"event": "metric", "task": "bench_strip", "measure": name, "peak_rss_mb": round(rss * mb, 1),
                          "seconds": round(dt, 2)}))
    ratio = strip / plain
    print(json.dumps({"event": "result", "task": "bench_strip", "checkpoint_mb": round(info["checkpoint_bytes"] * mb, 1),
                      "weights_mb": round(info["weights_bytes"] * mb, 1), "out_mb": round(out_bytes * mb, 1),
                      "plain_peak_rss_mb": round(plain * mb, 1), "strip_peak_rss_mb": round(strip * mb, 1),
                      "baseline_rss_mb": round(base * mb, 1), "ratio": round(ratio, 3), "goal": "<= 0.6",
                      "ok": ratio <= 0.6}))
    print(f"peak RSS: plain torch.load {plain * mb:,.0f} MB | core.ml.strip {strip * mb:,.0f} MB | "
          f"ratio {ratio:.2f}x (goal <= 0.6x; interpreter+torch baseline {base * mb:,.0f} MB)", file=sys.stderr)
    return 0 if ratio <= 0.6 else 1


if __name__ == "__main__":
    raise SystemExit(main())
