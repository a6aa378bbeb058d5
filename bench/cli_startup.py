"""The CLI's own start-up: what a command costs before it does anything.

Times ``specdeck --version``, ``validate``, ``status`` and ``compare`` on the demo plan (15
items, ``core.demo``'s, written into a temporary workspace; its state holds a finished run of
every item and one eval's tau rows so ``status`` and ``compare`` show what they show after a
campaign) against the interpreter alone (``python -c pass``), measured in the same run: the
commands are interleaved, round after round, so a machine loaded by others slows each of
them alike, and the table gives medians and each command's difference to the baseline.

Goal (issue 34): ``--version`` within 0.25 s and ``status`` within 0.6 s of ``python -c pass``.
Run: .venv/bin/python bench/cli_startup.py [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.demo import write_workspace  # noqa: E402
from core.state.records import EvalRow  # noqa: E402
from core.state.store import Store  # noqa: E402

GOALS = {"--version": 0.25, "status": 0.6}
"""The most a command may take above ``python -c pass`` (seconds)."""


def campaign_state(plan: Path, state: Path) -> int:
    """Record a finished run of every item of ``plan`` and one eval's tau rows (a drafter
    and its baseline over 8 prompts); return the number of items."""
    from core.plans.planfile import load_plan

    items = load_plan(plan).items
    store = Store(state)
    for it in items:
        kind = it.action.kind if it.action else "manual"
        store.claim_run(f"{it.id}-1", it.id, kind, it.action.host if it.action else None,
                        owner="bench")
        store.end_run(f"{it.id}-1", "succeeded", exit_code=0)
        store.set_status(it.id, "done")
    settings = {"mode": "online", "block_size": 8, "tree_budget": None, "target": "code",
                "prompts": "coding", "definition": "tau = accepted + 1"}
    rows = []
    for role, drafter, base in (("drafter", "v5", 3), ("baseline", "baseline", 1)):
        for p in range(8):
            rounds = [base + (p + k) % 4 for k in range(12)]
            pp = [sum(1 for r in rounds if r - 1 >= k) / len(rounds) for k in range(1, 8)]
            rows.append(EvalRow(run_id="eval-v5-1", item_id="eval-v5", drafter=drafter,
                                role=role, prompt_id=f"p{p}", tau=sum(rounds) / len(rounds),
                                rounds=rounds, per_position=pp, settings=settings))
    store.add_eval_results(rows)
    store.close()
    return len(items)


def once(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: "
                         f"{done.stderr.decode(errors='replace')[-2000:]}")
    return dt


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "demo"
        plan = write_workspace(root, quick=True)
        n = campaign_state(plan, root / "state.db")
        env = {**os.environ, "NO_COLOR": "1"}
        env.pop("SPECDECK_STATE", None)
        # an installed specdeck runs from .pyc files: let the warm-up round write them (a
        # PYTHONDONTWRITEBYTECODE shell would otherwise time the compiler in every command)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        cli = [py, "-m", "console.cli"]
        cmds = {"python -c pass": [py, "-c", "pass"],
                "--version": cli + ["--version"],
                "validate": cli + ["validate", str(plan)],
                "status": cli + ["status", str(plan)],
                "compare": cli + ["compare", str(plan)]}
        for argv in cmds.values():  # warm the page cache and the .pyc files
            once(argv, env)
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(rounds):
            for name, argv in cmds.items():
                times[name].append(once(argv, env))
    load = os.getloadavg()
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["python -c pass"]
    print(f"CLI start-up: demo plan ({n} items), {rounds} interleaved rounds, medians; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'command':<16} {'median s':>9} {'min s':>7} {'- baseline s':>13} {'ratio':>6}  goal")
    for name, m in med.items():
        goal = GOALS.get(name)
        mark = "" if goal is None else (f"<= {goal:.2f} s above: "
                                        + ("met" if m - base <= goal else "NOT MET"))
        print(f"{name:<16} {m:9.3f} {min(times[name]):7.3f} {m - base:13.3f} "
              f"{m / base:6.2f}  {mark}")


if __name__ == "__main__":
    main()
