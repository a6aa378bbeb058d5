"""``python -m core.ml.export``: a thin entry; the task is :mod:`core.ml.tasks.export`."""

from core.ml.tasks.export import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
