"""Which of v5's three fixes moves tau at the demo's scale (issue 48 §1).

Takes a demo workspace that `specdeck demo` has written and run at least up to ``features``
(its target, its features and its trainer configs), and trains the demo's drafter once per
arm and seed, with the demo's own overrides and step count (``--quick``: 120 steps, 8 prompts;
else 240 steps, 16 prompts): ``v4`` (plans/train/v4-legacy.yaml), ``v5`` (plans/train/v5.yaml)
and v4 with one fix each (docs/training.md §4):

* ``v4+noise``: ``noise.target: fc_input`` (noise only on the drafter's conditioning);
* ``v4+taps``: ``fc_layers: taps`` (the last target layer reserved for the target logits);
* ``v4+loss``: hard CE with position decay (``soft_kl_weight 0``, ``streak_weighting false``,
  gamma by block size).

Each drafter is stripped and its chain tau measured on the coding set (the demo's eval
settings), then each arm is compared with v4 of the same seed, paired over prompts
(core.tau.stats: the sign-flip test and the interval that inverts it)::

    python bench/demo_fixes.py specdeck-demo --quick --seeds 0 1 2

Prints one line per arm and seed, and a summary per arm over seeds; ``--json`` writes the
per-prompt taus. Nothing in the workspace is changed (the arms go under ``WS/fixes/``).
An arm whose ``eval/result.json`` exists is not trained again (a demo's own v4 and v5 results,
``result-drafter.json`` of its eval capsules, can be put there: the script reproduces them).

Recorded (2 shared CPUs under load, about 26 min per arm; quick, seed 0, chain tau, 8 prompts):
v4 1.838; v4+noise 1.947 (+0.11, 95 % CI +0.00..+0.23, p = 0.062); v4+taps 2.115 (+0.28,
+0.16..+0.38, p = 0.016); v4+loss 1.427 (-0.41, -0.51..-0.32, p = 0.008); v5 1.448 (-0.39,
-0.47..-0.32, p = 0.008).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.demo import demo_overrides  # noqa: E402
from core.tau import stats  # noqa: E402

V5_LOSS = {"loss.soft_kl_weight": 0.0, "loss.streak_weighting": False, "loss.gamma": None,
           "loss.temperature": 1.0}
ARMS = {"v4": ("v4-legacy.yaml", {}), "v5": ("v5.yaml", {}),
        "v4+noise": ("v4-legacy.yaml", {"noise.target": "fc_input"}),
        "v4+taps": ("v4-legacy.yaml", {"fc_layers": "taps"}),
        "v4+loss": ("v4-legacy.yaml", V5_LOSS)}


def sh(*argv) -> None:
    res = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        sys.exit(f"{' '.join(map(str, argv))}\n{res.stderr[-3000:]}")


def arm(ws: Path, name: str, seed: int, quick: bool) -> dict[str, float]:
    cfg, extra = ARMS[name]
    over, steps, limit = demo_overrides(quick)
    out = ws / "fixes" / ("quick" if quick else "full") / f"{name}-s{seed}"
    result = out / "eval" / "result.json"
    if not result.exists():
        train = ws / "hosts" / "train"
        sets = {**over, "target": str(train / "models/code-target"),
                "data.features": str(train / "features/train"), "seed": seed, **extra}
        sh(sys.executable, "-m", "core.ml.train", "--config", ws / "train" / cfg, "--out",
           out / "ckpt", *[a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")])
        sh(sys.executable, "-m", "core.ml.strip", out / "ckpt" / f"step_{steps}.pt", out / "drafter")
        sh(sys.executable, "-m", "core.ml.eval", "--target", train / "models/code-target",
           "--drafter", out / "drafter", "--prompts", ROOT / "plans/prompts/coding.jsonl",
           "--out", result, "--limit", limit, "--max-new-tokens", 48)
    res = json.loads(result.read_text())
    return {str(p["id"]): float(p["tau"]) for p in res["per_prompt"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workspace", type=Path)
    ap.add_argument("--quick", action="store_true", help="the quick demo's settings")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--json", type=Path, help="write the per-prompt taus here")
    args = ap.parse_args()
    ws = args.workspace.resolve()
    taus: dict[str, dict[int, dict[str, float]]] = {}
    for seed in args.seeds:
        for name in ["v4"] + [a for a in args.arms if a != "v4"]:
            t0 = time.monotonic()
            taus.setdefault(name, {})[seed] = tau = arm(ws, name, seed, args.quick)
            base = taus["v4"][seed]
            line = f"seed {seed}  {name:9} tau {sum(tau.values()) / len(tau):.3f}"
            if name != "v4":
                shared = [p for p in tau if p in base]
                res = stats.paired([tau[p] for p in shared], [base[p] for p in shared],
                                   name=f"{name}|v4|{seed}")
                line += "  " + res.text(name, "v4")
            print(f"{line}  ({time.monotonic() - t0:.0f} s)", flush=True)
    print("\nper arm, mean over seeds of (arm - v4) in macro tau:")
    for name in args.arms:
        if name == "v4":
            continue
        deltas = [sum(taus[name][s].values()) / len(taus[name][s])
                  - sum(taus["v4"][s].values()) / len(taus["v4"][s]) for s in args.seeds]
        print(f"  {name:9} " + " ".join(f"{d:+.3f}" for d in deltas)
              + f"  mean {sum(deltas) / len(deltas):+.3f}")
    if args.json:
        args.json.write_text(json.dumps(taus, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
