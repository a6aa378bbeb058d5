"""``python -m core.ml.tiny``: a thin entry; the task is :mod:`core.ml.demo.tiny`."""

from core.ml.demo.tiny import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
