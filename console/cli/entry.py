"""The ``specdeck`` command line: the parser (each theme module adds its commands) and
:func:`main`, which runs a command and turns whatever it raises into one message on stderr
and an exit status (:mod:`console.cli.exit_codes`)."""

from __future__ import annotations

import argparse
import sys

from console.cli import conventions, exit_codes, notify, plans, report, results, runs, serving, ui
from console.cli.conventions import VersionAction, autocomplete, check_state, hoist_globals, \
    polish, quiet_broken_pipe
from console.cli.output import err
from core.errors import PlanError, SpecdeckError


def _cancelled() -> type[BaseException]:
    """asyncio's CancelledError, looked up only when an error reaches its clause: a command
    that never ran a loop does not load asyncio for it."""
    import asyncio

    return asyncio.CancelledError


def _database_error() -> type[BaseException]:
    """sqlite3's DatabaseError, looked up as :func:`_cancelled` is."""
    import sqlite3

    return sqlite3.DatabaseError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdeck", description=(
        "Plan, run and watch a speculative-decoding drafter campaign across SSH hosts."))
    p.add_argument("--state", help="state database (default: $SPECDECK_STATE, the plan's "
                   "state:, or $XDG_STATE_HOME/specdeck/<plan>.db); before or after COMMAND")
    p.add_argument("--version", action=VersionAction)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name, fn, help_, example=None):
        sp = sub.add_parser(name, help=help_, description=help_,
                            epilog=f"example:\n  {example}" if example else None)
        sp.set_defaults(fn=fn)
        return sp

    for theme in (plans, runs, results, report, serving, notify, ui, conventions):
        theme.register(add)
    polish(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: the command line); return its exit status."""
    parser = build_parser()
    autocomplete(parser)
    args, how = None, None
    try:
        args = parser.parse_args(hoist_globals(parser, sys.argv[1:] if argv is None else argv))
        check_state(args)
        from core.faults import terminate_as_interrupt

        with terminate_as_interrupt() as how:
            code = args.fn(args)
        sys.stdout.flush()  # a closed pipe shows here, not as a warning at exit
        return code
    except SystemExit:  # --version, --help, a usage error: argparse's own exit
        raise
    except BrokenPipeError:
        quiet_broken_pipe()
        return exit_codes.BROKEN_PIPE
    except PlanError as e:
        for issue in e.issues:
            err(str(issue))
        return exit_codes.for_error(e)
    except SpecdeckError as e:
        err(f"specdeck: {e.message}")
        if e.hint:
            err(f"  hint: {e.hint}")
        return exit_codes.for_error(e)
    except (KeyboardInterrupt, _cancelled()):
        from core.faults import Interruption

        how = how or Interruption()  # Ctrl-C before the command started
        plan = getattr(args, "plan", None) or "<plan.yaml>"
        err(f"specdeck: {how.name}: detached runs keep going on their hosts (`specdeck attach "
            f"{plan}` follows them again); runs inside this specdeck were marked interrupted")
        return exit_codes.for_interruption(how)
    except _database_error() as e:
        err(f"specdeck: state database {getattr(args, 'state', None) or '(default)'}: {e}")
        err("  hint: free disk space or fix the file's permissions; pass another --state "
            "to start afresh")
        return exit_codes.for_error(e)
    except RecursionError as e:
        err("specdeck: the input is nested too deeply to process")
        return exit_codes.for_error(e)
    except Exception as e:  # noqa: BLE001 - no traceback ever reaches a user
        from core.faults import describe_fault

        err(f"specdeck: {describe_fault(e)}")
        return exit_codes.for_error(e)
