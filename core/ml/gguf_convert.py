"""``python -m core.ml.gguf_convert``: a thin entry; the task is :mod:`core.ml.engines.gguf_convert`."""

from core.ml.engines.gguf_convert import main

if __name__ == "__main__":
    raise SystemExit(main())
