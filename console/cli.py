"""The ``specdeck`` entry point: the headless CLI plus the commands that open the console."""

from __future__ import annotations

import sys

from core import cli


def _open_ui(plan, *, state=None, autorun: bool = False) -> int:
    from console.app import run_console  # Textual loads only when the console opens

    return run_console(plan, state=state, autorun=autorun)


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, ui_opener=_open_ui)


if __name__ == "__main__":
    sys.exit(main())
