"""``python -m core.ml.strip``: a thin entry; the task is :mod:`core.ml.tasks.strip`."""

from core.ml.tasks.strip import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
