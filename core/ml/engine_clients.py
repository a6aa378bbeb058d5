"""``python -m core.ml.engine_clients``: a thin entry; the task is :mod:`core.ml.tasks.engine_clients`."""

from core.ml.tasks.engine_clients import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
