"""specdeck's chain eval of a DFlash-2 drafter against z-lab's ``DFlash2DraftModel`` and
``dflash_generate`` (``dflash`` 0.1.0), round for round, raw (as tests/ml/measure/test_reference_parity.py
does for DFlash-1).

The DFlash-2 drafters are built in the test from the fitted DFlash-1 drafter of that module:
random convolutions (near the identity, so rounds still accept drafts) and random codebooks
(large enough that the selector overrules the argmax), and the identity (convolutions that pass
their input through, zero codebooks), which must draft exactly as the DFlash-1 drafter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ml.measure.test_reference_parity import (  # noqa: F401 (fixtures)
    TEXTS,
    _cpu_timer,
    assert_same,
    base,
    reference_eval,
    specdeck_eval,
)

from core.ml.demo import tiny
from core.ml.models.drafter import load_drafter, save_drafter  # noqa: E402

pytestmark = pytest.mark.reference


def dflash2_dir(base: Path, src: str, identity: bool) -> Path:
    out = base / f"{src}-dflash2{'-identity' if identity else ''}"
    if not out.exists():
        save_drafter(tiny.dflash2_from(load_drafter(base / src), seed=3, std=0.02, identity=identity), out)
    return out


CASES = {
    # name: (DFlash-1 source, max_new_tokens, --block-size)
    "full-48": ("full", 48, None),
    "full-9": ("full", 9, None),  # the last block shrinks to 1 + what is left
    "sliding-48": ("sliding", 48, None),
    "block-4": ("full", 30, 4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dflash2_chain_eval_equals_the_reference_round_for_round(base, case, tmp_path):
    src, max_new, block = CASES[case]
    drafter = dflash2_dir(base, src, identity=False)
    extra = ["--max-new-tokens", str(max_new)] + (["--block-size", str(block)] if block else [])
    ours = specdeck_eval(base / "target", drafter, base / "prompts.jsonl", tmp_path / "r.json", *extra)
    assert ours["drafter"]["family"] == "dflash2"
    ref = reference_eval(base / "target", drafter, TEXTS, max_new, block, draft_class="DFlash2DraftModel")
    assert_same(ours, ref, tiny.tiny_tokenizer())
    if case.endswith("-48"):
        assert max(max(r["rounds"]) for r in ours["per_prompt"]) >= 3  # rounds carry information
        one = reference_eval(base / "target", base / src, TEXTS, max_new, block)
        assert [r["rounds"] for r in ref] != [r["rounds"] for r in one], "DFlash-2 drafts as DFlash-1: vacuous"


def test_identity_dflash2_equals_the_dflash1_drafter_it_came_from(base, tmp_path):
    drafter = dflash2_dir(base, "full", identity=True)
    ours = specdeck_eval(base / "target", drafter, base / "prompts.jsonl", tmp_path / "r.json", "--max-new-tokens", "40")
    ref2 = reference_eval(base / "target", drafter, TEXTS, 40, None, draft_class="DFlash2DraftModel")
    ref1 = reference_eval(base / "target", base / "full", TEXTS, 40, None)
    assert_same(ours, ref2, tiny.tiny_tokenizer())
    assert ref2 == ref1
    assert max(max(r["rounds"]) for r in ref1) >= 3
