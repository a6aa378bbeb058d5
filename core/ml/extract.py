"""``python -m core.ml.extract``: a thin entry; the task is :mod:`core.ml.tasks.extract`."""

from core.ml.tasks.extract import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
