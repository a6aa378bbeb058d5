"""``python -m core.ml.gguf_convert TREE [--pre-fallback NAME] -- CONVERTER ARGS``: llama.cpp's converter.

Runs ``convert_hf_to_gguf.py`` of the llama.cpp tree ``TREE`` (the one :mod:`core.ml.engines.llama`
serves with: ``scripts/build-llama-server`` keeps it next to the binary) in this interpreter,
with one change: a byte-level BPE tokenizer whose pre-tokenizer the converter does not know
(its hash table lists published tokenizers only; specdeck's tiny tokenizers are in none) is
labelled ``--pre-fallback`` (default ``qwen2``) instead of refused. That is harmless for the
engine leg, which sends every prompt as token ids, so llama.cpp's tokenizer never runs; the
label only has to name a pre-tokenizer llama.cpp has. A printed ``notice`` says when it was used.

Kept in its own process (not imported by the driver) because the converter's modules
(``conversion``, ``gguf``) come from ``TREE`` and must not shadow anything else.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args or args.index("--") < 1:
        sys.stderr.write("usage: python -m core.ml.gguf_convert TREE [--pre-fallback NAME] -- CONVERTER ARGS\n")
        return 2
    split = args.index("--")
    head, rest = args[:split], args[split + 1:]
    tree, fallback = Path(head[0]), "qwen2"
    if head[1:2] == ["--pre-fallback"] and len(head) > 2:
        fallback = head[2]
    script = tree / "convert_hf_to_gguf.py"
    if not script.is_file():
        sys.stderr.write(f"error: {script}: not found (a llama.cpp tree holds convert_hf_to_gguf.py)\n")
        return 2
    sys.path[:0] = [str(tree), str(tree / "gguf-py")]
    import conversion.base as base  # the tree's own module, importable only now

    known = base.TextModel.get_vocab_base_pre

    def vocab_pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            sys.stderr.write(f"notice: the converter does not know this tokenizer's pre-tokenizer; labelled "
                             f"{fallback!r} (prompts reach the engine as token ids, its tokenizer never runs)\n")
            return fallback

    base.TextModel.get_vocab_base_pre = vocab_pre
    sys.argv = [str(script), *rest]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
