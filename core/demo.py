"""``specdeck demo``: a whole campaign on this machine, on the embedded default.

Two local "hosts" (two workdirs standing for the training host and the eval host), SQLite
state inside the demo workspace, and only what this build has. The demo plan is written to
``<dir>/demo.yaml`` and run; a second run reuses what exists (checks mark items done).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

DEMO_PLAN = """\
name: demo
hosts:
  train: {{local: true, workdir: {train}}}
  eval: {{local: true, workdir: {eval}}}
items:
  - id: make-data
    content: Write a toy dataset on the training host
    priority: high
    action:
      kind: shell
      host: train
      params: {{command: "mkdir -p data && seq 1 1000 > data/numbers.txt", creates: data/numbers.txt}}
  - id: train
    content: Train (a stand-in that prints JSON metrics)
    needs: [make-data]
    action:
      kind: shell
      host: train
      params:
        command: >-
          for s in $(seq 1 20); do
          echo "{{\\"step\\": $s, \\"loss\\": $(awk "BEGIN {{print 4/$s}}")}}"; sleep 0.05; done
  - id: review
    content: Read the curves and decide
    needs: [train]
"""


def run_demo(args) -> int:
    from core.cli import Printer
    from core.plan import load_plan
    from core.runner import Runner
    from core.store import Store

    root = Path(args.dir or "specdeck-demo").resolve()
    root.mkdir(parents=True, exist_ok=True)
    plan_path = root / "demo.yaml"
    plan_path.write_text(DEMO_PLAN.format(train=root / "hosts" / "train",
                                          eval=root / "hosts" / "eval"))
    plan = load_plan(plan_path)
    state = args.state or str(root / "state.db")
    print(f"demo workspace: {root}\nplan: {plan_path}\nstate: {state}", file=sys.stderr)

    async def go():
        store = Store(state)
        runner = Runner(plan, store, emit=Printer(quiet=True))
        try:
            await runner.reconcile()
            summary = await runner.run_items(None)
        finally:
            await runner.close()
            store.close()
        return summary

    summary = asyncio.run(go())
    if not args.headless and sys.stdout.isatty():
        from core import cli

        if cli._UI_OPENER is not None:
            return cli._UI_OPENER(plan, state=state)
    from core.cli import main as cli_main

    cli_main(["--state", state, "status", str(plan_path), "--no-reconcile"])
    return 1 if summary["failed"] else 0
