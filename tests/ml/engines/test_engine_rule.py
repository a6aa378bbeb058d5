"""specdeck's drafter under an engine's attention rule (issue 32 §2, "tau as that engine serves it").

``core.ml.engines.served`` rewrites a drafter's per-layer attention to the one an engine's table
(``core.ml.engines.rules``) reads from the same config.json. On a tiny drafter with a sliding layer
and no causal key, llama.cpp's rule (one causal flag, absent: non-causal) must change the mask
the drafter uses, hence its block outputs and its drafts; on an all-full-attention drafter
(causal by a top-level ``is_causal``, or non-causal by default) it must change nothing, bit
for bit. ``python -m core.ml.eval --engine-rule`` records the rule it ran under.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from core.ml.tasks import eval as eval_mod
from core.ml.models.drafter import load_drafter, save_drafter  # noqa: E402
from core.ml.engines.served import engine_rule_config, use_engine_rule  # noqa: E402
from core.ml.formats.runio import UsageError, run_main  # noqa: E402


def _block_out(drafter, target, seed=0):
    """The drafter's output for one block on random target features, and its draft tokens."""
    gen = torch.Generator().manual_seed(seed)
    cfg = drafter.config
    c, q = 12, cfg.block_size
    feats = torch.randn(1, c, cfg.feature_dim, generator=gen)
    ids = torch.tensor([[7] + [cfg.mask_token_id] * (q - 1)])
    emb = target.get_input_embeddings()(ids)
    positions = torch.arange(c + q).unsqueeze(0)
    with torch.no_grad():
        h = drafter(emb, feats, positions)
        drafts = target.get_output_embeddings()(h)[0, 1:].argmax(-1)
    return h, drafts


@pytest.fixture
def sliding_dir(tiny, qwen3_target, tmp_path):
    cfg = tiny.tiny_drafter_config(qwen3_target.config, block_size=8, num_layers=2, sliding_window=4)
    return save_drafter(tiny.build_tiny_drafter(cfg, seed=3), tmp_path / "sliding")


def test_llama_cpp_rule_changes_the_sliding_layers_mask_and_the_drafts(sliding_dir, qwen3_target):
    raw = json.loads((sliding_dir / "config.json").read_text())
    mine = load_drafter(sliding_dir)
    theirs = load_drafter(sliding_dir)
    assert [(r.causal, r.window) for r in mine.config.attention_rules()] == [(True, 4), (False, None)]
    rec = use_engine_rule(theirs, str(sliding_dir), "llama.cpp")
    assert rec["changed"] and rec["engine"] == "llama.cpp" and "0c1e570" in rec["revision"]
    # llama.cpp: no causal key -> every layer non-causal; the window kept (to_dict sets use_sliding_window)
    assert [(r.causal, r.window) for r in theirs.config.attention_rules()] == [(False, 4), (False, None)]
    assert [layer.self_attn.rule for layer in theirs.layers] == theirs.config.attention_rules()
    assert [x["causal"] for x in rec["attention"]["layers"]] == [False, False]
    h_mine, d_mine = _block_out(mine, qwen3_target)
    h_theirs, d_theirs = _block_out(theirs, qwen3_target)
    assert not torch.allclose(h_mine, h_theirs)
    assert not torch.equal(d_mine, d_theirs), "the rule changed the mask but no draft token"
    # vLLM and SGLang read this drafter as specdeck does: nothing changes
    for name in ("vllm", "sglang"):
        same = load_drafter(sliding_dir)
        assert not use_engine_rule(same, str(sliding_dir), name)["changed"]
        assert torch.equal(_block_out(same, qwen3_target)[0], h_mine)
    # the raw config alone decides: with dflash_config.causal: true llama.cpp runs every layer causal
    causal = engine_rule_config(mine.config, {**raw, "dflash_config": {**raw["dflash_config"], "causal": True}},
                                "llama.cpp")
    assert [(r.causal, r.window) for r in causal.attention_rules()] == [(True, 4), (True, None)]


@pytest.mark.parametrize("is_causal", [True, None])
def test_engine_rules_are_a_no_op_for_an_all_full_attention_drafter(tiny, qwen3_target, tmp_path, is_causal):
    cfg = tiny.tiny_drafter_config(qwen3_target.config, block_size=8, num_layers=2, is_causal=is_causal)
    path = save_drafter(tiny.build_tiny_drafter(cfg, seed=4), tmp_path / "full")
    ref = _block_out(load_drafter(path), qwen3_target)
    for name in ("llama.cpp", "vllm", "sglang"):
        d = load_drafter(path)
        rec = use_engine_rule(d, str(path), name)
        if name == "sglang" and is_causal:  # SGLang ignores is_causal: full layers stay non-causal
            assert rec["changed"]
            continue
        assert not rec["changed"], name
        out = _block_out(d, qwen3_target)
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_unknown_engine_is_refused_by_name(sliding_dir):
    with pytest.raises(UsageError, match="unknown engine 'trt'.*vllm, sglang, llama.cpp"):
        use_engine_rule(load_drafter(sliding_dir), str(sliding_dir), "trt")


def test_eval_records_the_engine_rule_it_ran_under(tiny, tmp_path, capsys):
    target_dir, drafter_dir = tiny.make_tiny_pair(tmp_path, "qwen3", seed=0, block_size=4, num_layers=2,
                                                  sliding_window=3)
    prompts = tiny.write_tiny_prompts(tmp_path / "p.jsonl", n_text=1)
    base = ["--target", str(target_dir), "--drafter", str(drafter_dir), "--prompts", str(prompts),
            "--max-new-tokens", "10"]
    assert run_main(eval_mod.main, [*base, "--out", str(tmp_path / "own/result.json")]) == 0
    assert run_main(eval_mod.main, [*base, "--engine-rule", "llama.cpp", "--out", str(tmp_path / "l/result.json")]) == 0
    err = capsys.readouterr().err
    own = json.loads((tmp_path / "own/result.json").read_text())
    eng = json.loads((tmp_path / "l/result.json").read_text())
    assert "engine_rule" not in own["drafter"]
    rule = eng["drafter"]["engine_rule"]
    assert rule["engine"] == "llama.cpp" and rule["changed"]
    assert [x["causal"] for x in eng["drafter"]["attention"]["layers"]] == [False, False]
    assert eng["provenance"]["drafter_attention"] == eng["drafter"]["attention"]
    assert [x["causal"] for x in own["drafter"]["attention"]["layers"]] == [True, False]
    assert "engine rule llama.cpp" in err and "non-causal, window 3" in err
    # the target's greedy tokens do not depend on the drafter's rule
    assert [p["tokens"] for p in own["per_prompt"]] == [p["tokens"] for p in eng["per_prompt"]]
    # the rule covers the end of generation: llama.cpp's server's, stated in the record and the definition
    assert rule["end_of_generation"] == eng["end_of_generation"] == "full-block"
    assert own["end_of_generation"] == "shrink" and "the last blocks shrink" in own["definition"]
    assert "llama.cpp's server runs the end of a generation" in eng["definition"]
    assert "the last rounds as its server runs them" in err


def test_an_engine_whose_end_was_not_read_keeps_the_references(tiny, qwen3_target, tmp_path):
    cfg = tiny.tiny_drafter_config(qwen3_target.config, block_size=8, num_layers=2)
    path = save_drafter(tiny.build_tiny_drafter(cfg, seed=4), tmp_path / "full")
    assert [use_engine_rule(load_drafter(path), str(path), name)["end_of_generation"]
            for name in ("vllm", "sglang", "llama.cpp")] == ["shrink", "shrink", "full-block"]
