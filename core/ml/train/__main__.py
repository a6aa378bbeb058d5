"""``python -m core.ml.train``: see :mod:`core.ml.train.trainer`."""

from core.ml.formats.runio import run_main
from core.ml.train.trainer import main

raise SystemExit(run_main(main))
