"""``python -m core.ml.notify``: a thin entry; the task is :mod:`core.ml.tasks.notify`."""

from core.ml.tasks.notify import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
