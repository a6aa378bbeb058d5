"""One-row bf16 linears on this CPU: torch's kernel against other ways, at the bench target's shapes.

    python bench/bf16_rows.py [--threads 2] [--repeats 7] [--mb 560] [--clock wall|cpu]

A decode step is one-row linears over every weight: on a CPU without bf16 matrix instructions
it should run at memory bandwidth (2 bytes per weight read once). This bench streams
``--mb`` of bf16 weights shaped as the bench target's MLP (3481 x 1024; more matrices than any
cache holds) through one-row products, each way interleaved per repeat, and prints GB/s of
weights read (medians):

* ``torch``: ``F.linear(x, W)``, bf16 (what a decode step runs);
* ``no_mkldnn``: the same with oneDNN off (ATen's own bf16 gemv);
* ``mv``: ``torch.mv(W, x)``, bf16;
* ``transposed``: ``x @ Wt`` with the weight stored transposed ([in, out], contiguous);
* ``tiles``: the weight converted to float32 in blocks of 256 rows, each block's product in
  float32 (the float32 tiles of :mod:`core.ml.models.cpu_rows`, at one row);
* ``fp32``: ``F.linear`` on a float32 copy (the upper bound the issue rules out: twice the
  memory; its GB/s are float32 bytes);
* ``read``: ``W.sum()`` in bf16, a pure read of the same bytes (the bandwidth a kernel can reach).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--mb", type=int, default=560, help="bf16 weights streamed per pass")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: CPU seconds of this process on 1 thread (a loaded machine does not stretch them)")
    p.add_argument("--out-features", type=int, default=3481)
    p.add_argument("--in-features", type=int, default=1024)
    args = p.parse_args()

    import torch
    import torch.nn.functional as F

    if args.clock == "cpu":
        args.threads = 1
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    n, k = args.out_features, args.in_features
    count = max(1, args.mb * 10**6 // (2 * n * k))
    gen = torch.Generator().manual_seed(0)
    ws = [torch.randn(n, k, generator=gen).to(torch.bfloat16) for _ in range(count)]
    wts = [w.t().contiguous() for w in ws]
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
    xv = x[0]
    x32 = x.float()

    def no_mkldnn(fn):
        with torch.backends.mkldnn.flags(enabled=False):
            return fn()

    def tiles(w):
        return torch.cat([F.linear(x32, w[i:i + 256].float()) for i in range(0, w.shape[0], 256)], dim=1)

    ways = {"torch": lambda: [F.linear(x, w) for w in ws],
            "no_mkldnn": lambda: no_mkldnn(lambda: [F.linear(x, w) for w in ws]),
            "mv": lambda: [torch.mv(w, xv) for w in ws],
            "transposed": lambda: [x @ w for w in wts],
            "tiles": lambda: [tiles(w) for w in ws],
            "read": lambda: [w.sum() for w in ws]}
    w32 = None
    if args.mb * 2 * 10**6 < 8 * 10**9:
        w32 = [w.float() for w in ws]
        ways["fp32"] = lambda: [F.linear(x32, w) for w in w32]
    ref = torch.cat([F.linear(x32, w.float()) for w in ws[:2]], 1)
    got = {"torch": torch.cat([F.linear(x, w).float() for w in ws[:2]], 1), "tiles": torch.cat([tiles(w) for w in ws[:2]], 1)}
    secs: dict[str, list[float]] = {name: [] for name in ways}
    with torch.no_grad():
        for rep in range(args.repeats + 1):
            for name, fn in ways.items():
                t = clock()
                fn()
                if rep:
                    secs[name].append(clock() - t)
    nbytes = count * n * k * 2
    out = {"bench": "bf16_rows", "threads": args.threads, "clock": args.clock, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "loadavg": os.getloadavg(), "matrices": count, "shape": [n, k], "mb": round(nbytes / 1e6),
           "ms": {name: round(statistics.median(s) * 1e3, 2) for name, s in secs.items()},
           "gbs": {name: round((2 if name == "fp32" else 1) * nbytes / statistics.median(s) / 1e9, 2)
                   for name, s in secs.items()},
           "max_abs_diff_vs_fp32": {name: float((v - ref).abs().max()) for name, v in got.items()}}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
