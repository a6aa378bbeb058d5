"""Console commands: ``ui`` opens the Textual console on a plan, ``demo`` runs the embedded
demo campaign (in the console on a terminal, else headless, printing the tau table).

Textual loads only when the console opens: importing this module does not load it.
"""

from __future__ import annotations

import argparse
import sys
import time

from console.cli import exit_codes
from console.cli.output import Printer, err, load_plan


def open_console(plan, *, state: str | None = None, autorun: bool = False) -> int:
    """Open the Textual console on ``plan`` until the user quits (``autorun``: run every
    runnable item once it is up)."""
    from console.app import run_console  # Textual loads only when the console opens

    return run_console(plan, state=state, autorun=autorun)


def cmd_ui(args) -> int:
    return open_console(load_plan(args.plan), state=args.state)


def cmd_demo(args) -> int:
    from console.cli.plans import cmd_status
    from core.demo import open_workspace, results_text, run_campaign
    from core.session import run_in_session

    quick = bool(args.quick)
    root, plan_path, state = open_workspace(args.dir, quick, args.state)
    plan = load_plan(plan_path)
    err(f"demo workspace: {root}\nplan: {plan_path}\nstate: {state}")
    if not args.headless and sys.stdout.isatty():
        code = open_console(plan, state=state, autorun=True)
        err(f"reopen the demo: `specdeck ui {plan_path}` (state: {state})")
        return code
    t0 = time.monotonic()
    summary, rows, over = run_in_session(plan, run_campaign, state=state,
                                         emit=Printer(quiet=True))
    dt = time.monotonic() - t0
    cmd_status(argparse.Namespace(plan=str(plan_path), state=state, json=False,
                                  no_reconcile=True))
    sys.stdout.write(results_text(rows, over))
    err(f"\ndemo wall time: {dt:.0f} s ({'quick' if quick else 'full'})")
    err(f"next: `specdeck ui {plan_path}` or `specdeck compare {plan_path}` "
        f"(the plan records its state: {state})")
    return exit_codes.for_run(summary, named=False)


def register(add) -> None:
    sp = add("ui", cmd_ui, "open the console on a plan")
    sp.add_argument("plan")
    sp = add("demo", cmd_demo, "run the embedded demo campaign locally")
    sp.add_argument("--dir", default=None, help="workspace (default: ./specdeck-demo)")
    sp.add_argument("--headless", action="store_true", help="print progress, no console")
    sp.add_argument("--quick", action="store_true", help="a shorter campaign (CI)")
