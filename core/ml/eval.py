"""``python -m core.ml.eval``: a thin entry; the task is :mod:`core.ml.tasks.eval`."""

from core.ml.tasks.eval import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
