"""``python -m core.ml.codemodel``: a thin entry; the task is :mod:`core.ml.demo.codemodel`."""

from core.ml.demo.codemodel import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
