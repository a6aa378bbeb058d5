"""``python -m core.ml.compare``: a thin entry; the task is :mod:`core.ml.measure.compare`."""

from core.ml.measure.compare import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
