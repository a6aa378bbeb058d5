"""``specdeck``: the headless CLI. Its commands, output and exit statuses are a contract.

Exit statuses (:mod:`console.cli.exit_codes`, the one place that decides them): 0 success;
1 an action failed; 2 invalid input (nothing was written; an unusable state database too);
3 a host could not be reached, or a command specdeck ran on it was ended by a signal;
130 / 143 interrupted by Ctrl-C / SIGTERM (detached runs keep going, runs inside specdeck
are marked interrupted). Diagnostics and progress go to stderr; stdout carries only what a script asked
for (``status --json``, ``export``, ``logs``).

The commands, by theme: :mod:`~console.cli.plans` (validate, status, mark, export, import,
kinds), :mod:`~console.cli.runs` (run, attach, logs, stop, adopt),
:mod:`~console.cli.results` (compare, diff, metrics), :mod:`~console.cli.report` (report), :mod:`~console.cli.ui` (ui, serve, demo:
the Textual console, loaded only then; serve's browser side in :mod:`console.web`); :mod:`~console.cli.conventions` (global options anywhere,
``--version``, help examples, completion); :mod:`~console.cli.entry` (the parser and
``main``). Importing this package loads no Textual. ``python -m console.cli`` (or ``python -m
console``) is the same as the installed ``specdeck``.
"""

from console.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
