"""specdeck's online chain eval against z-lab's reference implementation, round for round.

The reference is the package z-lab publishes (``dflash`` 0.1.0: ``dflash.model.dflash_generate``,
``DFlashDraftModel.from_pretrained``, and ``dflash.benchmark``'s prompt wrapping and stop ids),
installed test-only with ``--no-deps`` by ``scripts/bootstrap --test``. Each case writes a real target
directory (tiny Qwen3 built in code, with its tokenizer) and a drafter directory in the z-lab
layout, runs ``python -m core.ml.eval`` (in process) on them, loads the same directories with the
reference's own loaders and compares, raw and with no normalisation:

* the prompt ids (specdeck's :func:`core.ml.measure.prompts.encode` against the reference benchmark's
  ``apply_chat_template`` + ``tokenizer.encode(..., add_special_tokens=False)``);
* the output token ids;
* the per-round list (result.json ``rounds`` against ``acceptance_lengths``).

The cases cover full attention, a sliding window smaller than prompt + output, a stop token hit
inside a round, a stop token as the very first token, block sizes smaller and larger than the
trained one, max_new_tokens at, below and between block multiples, and each forward knob of
``dflash_config`` at a non-default value. A knob case also checks that the knob changes the
reference's rounds, so an ignored knob cannot pass.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

dflash_model = pytest.importorskip("dflash.model", reason="the reference tier needs dflash==0.1.0 "
                                   "(scripts/bootstrap --test installs it with --no-deps)")
dflash_benchmark = pytest.importorskip("dflash.benchmark")

import torch  # noqa: E402

from core.ml.demo import tiny
from core.ml.models.drafter import load_drafter, save_drafter  # noqa: E402
from core.ml.measure.prompts import Prompt, encode  # noqa: E402

pytestmark = pytest.mark.reference

B = 8
TEXTS = [tiny.CORPUS[1], tiny.CORPUS[4], "for i in range(10):"]


@pytest.fixture(autouse=True)
def _cpu_timer(monkeypatch):
    """The reference times with ``torch.cuda.synchronize``; on CPU a plain clock stands in."""
    monkeypatch.setattr(dflash_model, "_cuda_time", time.perf_counter)


@pytest.fixture(scope="module")
def base(tmp_path_factory, qwen3_target):
    """A target directory (with tokenizer) and a drafter fitted to it on the chat-wrapped texts,
    so rounds accept several drafts; the sliding variant (window 6) is fitted the same way."""
    root = tmp_path_factory.mktemp("refparity")
    qwen3_target.save_pretrained(root / "target")
    tok = tiny.tiny_tokenizer()
    tok.save_pretrained(root / "target")
    prompts = [encode(Prompt(f"p{i}", text=t), tok, tiny.TARGET_VOCAB) for i, t in enumerate(TEXTS)]
    for name, window in (("full", None), ("sliding", 6)):
        cfg = tiny.tiny_drafter_config(qwen3_target.config, block_size=B, sliding_window=window)
        d = tiny.build_tiny_drafter(cfg, seed=1, std=0.05)
        d = tiny.fit_tiny_drafter(d, qwen3_target, steps=80, num_seqs=len(prompts), gen_tokens=48, seed=0,
                                  prompts=prompts)
        save_drafter(d, root / name)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n"
                                                for i, t in enumerate(TEXTS)))
    return root


def variant(base: Path, name: str, src: str = "full", **dflash_config) -> Path:
    """A copy of drafter ``src`` whose config.json's dflash_config gets ``dflash_config``."""
    out = base / name
    if not out.exists():
        shutil.copytree(base / src, out)
        cfg = json.loads((out / "config.json").read_text())
        cfg["dflash_config"].update(dflash_config)
        (out / "config.json").write_text(json.dumps(cfg))
    return out


def with_stop(base: Path, name: str, stop: int) -> Path:
    """A copy of the target directory whose generation_config.json says ``eos_token_id: stop``."""
    out = base / name
    if not out.exists():
        shutil.copytree(base / "target", out)
        gen = json.loads((out / "generation_config.json").read_text())
        gen["eos_token_id"] = stop
        (out / "generation_config.json").write_text(json.dumps(gen))
    return out


def specdeck_eval(target: Path, drafter: Path, prompts: Path, out: Path, *args: str) -> dict:
    from core.ml.tasks.eval import main

    assert main(["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
                 "--out", str(out), "--dtype", "float32", *args]) == 0
    return json.loads(out.read_text())


def reference_eval(target_dir: Path, drafter_dir: Path, texts, max_new: int, block_size: int | None,
                   draft_class: str = "DFlashDraftModel"):
    """The reference, as its benchmark drives it: its loaders (``draft_class`` of ``dflash.model``),
    wrapping, stop ids, generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), attn_implementation="sdpa",
                                                  dtype=torch.float32).eval()
    draft = getattr(dflash_model, draft_class).from_pretrained(str(drafter_dir), attn_implementation="sdpa",
                                                               dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    out = []
    for text in texts:
        wrapped = dflash_benchmark.apply_chat_template(tok, [{"role": "user", "content": text}], None)
        ids = tok.encode(wrapped, return_tensors="pt", add_special_tokens=False)
        stats = dflash_model.dflash_generate(draft, target, ids, max_new, dflash_benchmark.stop_token_ids(target, tok),
                                             block_size=block_size, return_stats=True)
        out.append({"prompt_ids": ids[0].tolist(), "tokens": stats.output_ids[0, ids.shape[1]:].tolist(),
                    "rounds": list(stats.acceptance_lengths)})
    return out


def assert_same(ours: dict, ref: list[dict], tok) -> None:
    rows = ours["per_prompt"]
    assert len(rows) == len(ref) == len(TEXTS)
    for i, (row, want) in enumerate(zip(rows, ref)):
        ids = encode(Prompt(row["id"], text=TEXTS[i]), tok, tiny.TARGET_VOCAB)
        assert ids == want["prompt_ids"], f"prompt {i}: prompt ids differ"
        assert row["prompt_len"] == len(want["prompt_ids"])
        assert row["tokens"] == want["tokens"], f"prompt {i}: output tokens differ"
        assert row["rounds"] == want["rounds"], f"prompt {i}: rounds {row['rounds']} != reference {want['rounds']}"


CASES = {
    # name: (drafter variant, max_new_tokens, --block-size, stop)
    "full-48": ("full", 48, None, None),
    "full-17": ("full", 17, None, None),  # 16 tokens after the prefill's: two full blocks exactly
    "full-9": ("full", 9, None, None),  # the last block shrinks to 1 + what is left
    "full-2": ("full", 2, None, None),
    "full-1": ("full", 1, None, None),  # no round at all
    "sliding-48": ("sliding", 48, None, None),
    "block-4": ("full", 30, 4, None),
    "block-12": ("full", 30, 12, None),  # larger than the trained 8: allowed, as by the reference
    "stop-mid-round": ("full", 48, None, "mid"),
    "stop-first": ("full", 48, None, "first"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_chain_eval_equals_the_reference_round_for_round(base, case, tmp_path):
    src, max_new, block, stop = CASES[case]
    drafter, target = base / src, base / "target"
    tok = tiny.tiny_tokenizer()
    extra = ["--max-new-tokens", str(max_new)] + (["--block-size", str(block)] if block else [])
    if stop is not None:
        plain = specdeck_eval(target, drafter, base / "prompts.jsonl", tmp_path / "plain.json", *extra)
        row = max(plain["per_prompt"], key=lambda r: max(r["rounds"] or [0]))
        if stop == "first":
            stop_id = row["tokens"][0]
        else:  # a token strictly inside the longest round of that prompt
            i = row["rounds"].index(max(row["rounds"]))
            assert row["rounds"][i] >= 3
            stop_id = row["tokens"][1 + sum(row["rounds"][:i]) + 1]
        target = with_stop(base, f"target-stop-{stop_id}", stop_id)
    ours = specdeck_eval(target, drafter, base / "prompts.jsonl", tmp_path / "result.json", *extra)
    assert ours["accounting"] == "dflash-0.1.0"
    ref = reference_eval(target, drafter, TEXTS, max_new, block)
    assert_same(ours, ref, tok)
    if stop is not None:
        assert ours["stop_token_ids"] == [stop_id]
        hit = [r for r in ours["per_prompt"] if r["stopped"]]
        assert hit and all(r["tokens"][-1] == stop_id for r in hit)
    if block == 12:
        assert "block_size_note" in ours
    if case == "full-48":
        assert max(max(r["rounds"]) for r in ours["per_prompt"]) >= 4  # rounds carry information


KNOBS = {
    "input_embedding_scale": 1.7,
    "output_multiplier": 0.35,
    "final_logit_softcapping": 1.5,
}


def first_block_logits(target_dir: Path, drafter_dir: Path, prompt_ids: list[int]):
    """The draft logits of a prompt's first block, by the reference's own pieces (its target
    features, its ``_raw_input_embeddings`` with the scale, its forward and ``compute_logits``)
    and by specdeck's proposer: [B-1, V] each, float32."""
    from transformers import AutoModelForCausalLM

    from core.ml.decoding.generate import DFlashProposer
    from core.ml.models.target import TargetRunner

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    draft = dflash_model.DFlashDraftModel.from_pretrained(str(drafter_dir), dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
        first = int(out.logits[0, -1].argmax())
        block = torch.tensor([[first] + [draft.mask_token_id] * (B - 1)])
        scale = float(dflash_model._draft_value(draft.config, "input_embedding_scale", 1.0))
        hidden = draft(target_hidden=dflash_model.extract_context_feature(out.hidden_states, draft.target_layer_ids),
                       noise_embedding=dflash_model._raw_input_embeddings(target, block, scale),
                       position_ids=torch.arange(len(prompt_ids) + B)[None])[:, 1 - B:]
        ref = draft.compute_logits(hidden, dflash_model._output_head(target))[0].float()
        mine = load_drafter(drafter_dir)
        runner = TargetRunner(target, mine.target_layer_ids)
        _, feats = runner.prefill(prompt_ids)
        ours = DFlashProposer(mine, target).propose(block[0].tolist(), len(prompt_ids), feats)
        runner.close()
    return ours, ref


@pytest.mark.parametrize("knob", list(KNOBS))
def test_each_drafter_knob_is_honoured_as_the_reference_does(base, knob, tmp_path):
    """Rounds and tokens equal the reference's with the knob set, and the draft logits equal its
    ``compute_logits`` raw. The logit knobs are monotone, so greedy rounds cannot see them (the
    reference's neither): the logits and DDTree's scores (which add log-probabilities across
    depths) are where an ignored knob shows, and this test looks there."""
    drafter = variant(base, f"knob-{knob}", **{knob: KNOBS[knob]})
    assert getattr(load_drafter(drafter).config, knob) == KNOBS[knob]
    ours = specdeck_eval(base / "target", drafter, base / "prompts.jsonl", tmp_path / "r.json",
                         "--max-new-tokens", "40", "--tree-budget", "6")
    ref = reference_eval(base / "target", drafter, TEXTS, 40, None)
    assert_same(ours, ref, tiny.tiny_tokenizer())
    ids = encode(Prompt("p0", text=TEXTS[0]), tiny.tiny_tokenizer(), tiny.TARGET_VOCAB)
    mine, theirs = first_block_logits(base / "target", drafter, ids)
    assert torch.allclose(mine, theirs, atol=1e-4, rtol=1e-4)
    plain, _ = first_block_logits(base / "target", base / "full", ids)
    assert not torch.allclose(mine, plain, atol=1e-2), f"{knob} changes nothing: the case is vacuous"
    if knob == "input_embedding_scale":  # it moves the drafts, so the rounds show it too
        plain_rounds = reference_eval(base / "target", base / "full", TEXTS, 40, None)
        assert [r["rounds"] for r in ref] != [r["rounds"] for r in plain_rounds]
    else:  # DDTree's cross-depth scores see a monotone change of the logits
        base_tree = specdeck_eval(base / "target", base / "full", base / "prompts.jsonl", tmp_path / "p.json",
                                  "--max-new-tokens", "40", "--tree-budget", "6")
        assert [r["rounds"] for r in ours["ddtree"]["per_prompt"]] != \
            [r["rounds"] for r in base_tree["ddtree"]["per_prompt"]], f"DDTree does not see {knob}"
