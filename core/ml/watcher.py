"""``python -m core.ml.watcher``: a thin entry; the task is :mod:`core.ml.tasks.watcher`."""

from core.ml.tasks.watcher import main
from core.ml.formats.runio import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main))
