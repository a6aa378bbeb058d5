"""Sampled chain eval (T 0.7) against z-lab's ``dflash_generate`` with the same seeds (``dflash`` 0.1.0).

tau at a temperature > 0 is a random variable per prompt, so the comparison is statistical:
specdeck runs each prompt with 200 seeds (``--samples 200``; each row records its seed), the
reference runs the same prompt once per recorded seed (``torch.manual_seed(seed)``, then
``dflash_generate(..., temperature=0.7)``), and per prompt the two mean taus must agree within
their 95 % intervals. Both draw from a generator seeded alike, in the same order (the prefill's
token, a block's drafts, its acceptance uniforms, the correction or bonus), so most seeds give
the very same rounds; that share is reported and must be large, which a semantic difference
(another acceptance rule, another q, a residual drawn from p) would destroy.

Cases: the fitted DFlash-1 drafter, and the DFlash-2 drafter with random convolutions and
codebooks (its q is the candidate selector's distribution, as the reference's).
"""

from __future__ import annotations

import math
from statistics import fmean, stdev

import pytest

from tests.ml.measure.test_reference_dflash2 import dflash2_dir
from tests.ml.measure.test_reference_parity import (  # noqa: F401 (fixtures)
    TEXTS,
    _cpu_timer,
    base,
    dflash_benchmark,
    dflash_model,
    specdeck_eval,
)

import torch  # noqa: E402

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("one_thread")]

T, SEEDS, MAX_NEW, PROMPTS = 0.7, 200, 10, 2


def interval(taus: list[float]) -> tuple[float, float]:
    m, half = fmean(taus), 1.96 * stdev(taus) / math.sqrt(len(taus))
    return m - half, m + half


def reference_rounds(target_dir, drafter_dir, draft_class: str, rows: list[dict]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), attn_implementation="sdpa",
                                                  dtype=torch.float32).eval()
    draft = getattr(dflash_model, draft_class).from_pretrained(str(drafter_dir), attn_implementation="sdpa",
                                                               dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    stops = dflash_benchmark.stop_token_ids(target, tok)
    out = []
    for r in rows:
        text = TEXTS[int(r["id"].removeprefix("p"))]
        wrapped = dflash_benchmark.apply_chat_template(tok, [{"role": "user", "content": text}], None)
        ids = tok.encode(wrapped, return_tensors="pt", add_special_tokens=False)
        torch.manual_seed(r["seed"])
        stats = dflash_model.dflash_generate(draft, target, ids, MAX_NEW, stops, temperature=T, return_stats=True)
        out.append(list(stats.acceptance_lengths))
    return out


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_sampled_tau_per_prompt_agrees_with_the_reference_over_200_seeds(base, family, tmp_path):
    drafter = base / "full"
    if family == "dflash2":
        drafter = dflash2_dir(base, "full", identity=False)
    cls = "DFlashDraftModel" if family == "dflash" else "DFlash2DraftModel"
    ours = specdeck_eval(base / "target", drafter, base / "prompts.jsonl", tmp_path / "r.json",
                         "--max-new-tokens", str(MAX_NEW), "--limit", str(PROMPTS), "--temperature", str(T),
                         "--samples", str(SEEDS), "--seed", "5")
    assert (ours["temperature"], ours["samples"], ours["seed"]) == (T, SEEDS, 5)
    rows = ours["per_prompt"]
    assert len(rows) == PROMPTS * SEEDS and len({r["seed"] for r in rows}) == len(rows)
    theirs = reference_rounds(base / "target", drafter, cls, rows)
    same = sum(r["rounds"] == t for r, t in zip(rows, theirs)) / len(rows)
    print(f"{family}: {same:.0%} of the seeds give the reference's rounds exactly")
    for pid in {r["id"] for r in rows}:
        mine = [r["tau"] for r in rows if r["id"] == pid]
        ref = [sum(t) / len(t) for r, t in zip(rows, theirs) if r["id"] == pid]
        a, b = interval(mine), interval(ref)
        print(f"{family} {pid}: specdeck {fmean(mine):.3f} [{a[0]:.3f}, {a[1]:.3f}], "
              f"reference {fmean(ref):.3f} [{b[0]:.3f}, {b[1]:.3f}]")
        assert a[0] <= b[1] and b[0] <= a[1], f"{pid}: specdeck {a} and the reference {b} disagree"
        assert len(set(mine)) > 2 and max(mine) > 1  # sampled, and drafts are accepted
    assert same > 0.5
