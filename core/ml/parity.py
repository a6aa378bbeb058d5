"""``python -m core.ml.parity``: a thin entry; the task is :mod:`core.ml.measure.parity`."""

from core.ml.measure.parity import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
