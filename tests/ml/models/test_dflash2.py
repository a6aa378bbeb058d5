"""DFlash-2 drafters (docs/drafter.md §7) without the reference package: published tensor names
on save and load, the selector's path as the draft (online and offline), the identity
DFlash-2 drafter drafting as its DFlash-1 drafter, DDTree refused, the family in result.json.

The reference tier (tests/ml/measure/test_reference_dflash2.py) compares the same with z-lab's
``DFlash2DraftModel`` round for round.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402

from core.ml.models.drafter import draft_path, draft_logits, load_drafter, save_drafter  # noqa: E402
from core.ml.decoding.generate import DFlashProposer, chain_generate, ddtree_generate  # noqa: E402
from core.ml.decoding.offline import draft_blocks, draft_blocks_loop, sequence_streaks  # noqa: E402
from core.ml.models.target import TargetRunner  # noqa: E402
from tests.ml.decoding.test_ml_offline import cached  # noqa: E402

N, B = 40, 8
FIT = (100, 101)  # the fitted drafter's memorised prompts: rounds accept drafts


@pytest.fixture(scope="module")
def d2(tiny, fitted_drafter):
    """The fitted drafter with random convolutions (near the identity) and codebooks."""
    return tiny.dflash2_from(fitted_drafter, seed=3, std=0.15)


@pytest.fixture(scope="module")
def d2_identity(tiny, fitted_drafter):
    return tiny.dflash2_from(fitted_drafter, identity=True)


def test_saved_under_the_published_names_and_loaded_with_or_without_weight(d2, tmp_path):
    out = save_drafter(d2, tmp_path / "d2")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert {k: cfg["dflash_config"][k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                 "selector_top_k")} == {"conv_kernel_size": 3, "conv_group_size": 16,
                                                                        "selector_rank": 8, "selector_top_k": 4}
    state = load_file(str(out / "model.safetensors"))
    assert state["layers.1.attention_conv.base_kernel"].shape == (2, 3, 64)
    assert state["layers.0.mlp_conv.kernel_projection.weight"].shape == (2 * 3 * 64 // 16, 64)
    assert state["candidate_selector.predecessor_codebook"].shape == (320, 8)
    assert state["candidate_selector.hidden_projection.weight"].shape == (8, 64)
    assert not any(k.endswith("codebook.weight") for k in state)
    loaded = load_drafter(out)
    assert loaded.family == "dflash2"
    want = d2.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in loaded.state_dict().items())
    renamed = {(k + ".weight" if k.endswith("_codebook") else k): v for k, v in state.items()}
    save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
    again = load_drafter(out).state_dict()
    assert all(torch.equal(v, want[k]) for k, v in again.items())


def test_the_draft_is_the_selectors_path_not_the_argmax(qwen3_target, d2, make_prompt):
    runner = TargetRunner(qwen3_target, d2.target_layer_ids)
    prop = DFlashProposer(d2, qwen3_target)
    differ = 0
    for seed in (*FIT, 7):
        prompt = make_prompt(seed)
        logits, feats = runner.prefill(prompt)
        block = [int(logits.argmax())] + [d2.mask_token_id] * (B - 1)
        prop.reset()
        scores = prop.propose(block, len(prompt), feats)
        prop.reset()
        drafted = prop.draft(block, len(prompt), feats)
        assert len(drafted) == B - 1
        top = set(torch.topk(scores, 4, dim=-1).indices.flatten().tolist())
        assert set(drafted) <= top  # always among the top-k
        differ += drafted != scores.argmax(-1).tolist()
    runner.close()
    assert differ, "the selector never changed a path: the case is vacuous"


def test_identity_dflash2_drafts_as_its_dflash1(qwen3_target, fitted_drafter, d2_identity, make_prompt):
    runner = TargetRunner(qwen3_target, fitted_drafter.target_layer_ids)
    for seed in FIT:
        prompt = make_prompt(seed)
        one = chain_generate(DFlashProposer(fitted_drafter, qwen3_target), runner, prompt, N, B, 3)
        two = chain_generate(DFlashProposer(d2_identity, qwen3_target), runner, prompt, N, B, 3)
        assert (two.rounds, two.tokens) == (one.rounds, one.tokens)
        assert max(one.rounds) > 1
    runner.close()


def test_offline_dflash2_is_the_selectors_path_per_anchor_and_equals_online(qwen3_target, d2, make_prompt):
    target = qwen3_target
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    runner = TargetRunner(target, d2.target_layer_ids)
    accepted = 0
    for seed in (*FIT, 7):
        prompt = make_prompt(seed)
        online = chain_generate(DFlashProposer(d2, target), runner, prompt, N, B, 3)
        seq = cached(target, d2, prompt, N + B - 1)
        anchors = list(range(seq.prompt_len, seq.input_ids.shape[0]))
        batched, _, _ = draft_blocks(d2, emb, head, seq, anchors, B, max_rows=5 * B)
        assert torch.equal(batched, draft_blocks_loop(d2, emb, head, seq, anchors, B))
        st = sequence_streaks(d2, emb, head, seq, B)
        assert st.trajectory(N)[1] == online.rounds
        accepted += max(online.rounds) > 1
    runner.close()
    assert accepted


def test_selector_with_zero_codebooks_is_the_argmax(d2_identity, qwen3_target):
    h = torch.randn(2, B - 1, 64)
    logits = draft_logits(d2_identity.config, qwen3_target.get_output_embeddings(), h)
    assert torch.equal(draft_path(d2_identity, h, logits, torch.tensor([5, 6])), logits.argmax(-1))


def test_ddtree_is_refused_for_a_dflash2_drafter(qwen3_target, d2, make_prompt):
    runner = TargetRunner(qwen3_target, d2.target_layer_ids)
    with pytest.raises(ValueError, match="DDTree is not defined for a DFlash-2 drafter"):
        ddtree_generate(DFlashProposer(d2, qwen3_target), runner, make_prompt(7), N, B, 3, 6)
    runner.close()
    seq = cached(qwen3_target, d2, make_prompt(7), 10)
    with pytest.raises(ValueError, match="DDTree is not defined"):
        sequence_streaks(d2, qwen3_target.get_input_embeddings(), qwen3_target.get_output_embeddings(), seq, B, 6)


def test_eval_names_the_family_and_refuses_a_tree(tiny_dirs, d2, tmp_path):
    from core.ml.tasks.eval import main
    from core.ml.formats.runio import UsageError

    drafter = save_drafter(d2, tmp_path / "d2")
    args = ["--target", str(tiny_dirs["target"]), "--drafter", str(drafter), "--prompts", str(tiny_dirs["prompts"]),
            "--dtype", "float32", "--max-new-tokens", "4"]
    assert main([*args, "--out", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["drafter"]["family"] == "dflash2"
    with pytest.raises(UsageError, match="--tree-budget 6: DDTree is not defined for a DFlash-2 drafter"):
        main([*args, "--out", str(tmp_path / "t.json"), "--tree-budget", "6"])
    assert not (tmp_path / "t.json").exists()
    assert main(["--target", str(tiny_dirs["target"]), "--drafter", str(tiny_dirs["drafter"]), "--prompts",
                 str(tiny_dirs["prompts"]), "--dtype", "float32", "--max-new-tokens", "4",
                 "--out", str(tmp_path / "one.json")]) == 0
    assert json.loads((tmp_path / "one.json").read_text())["drafter"]["family"] == "dflash"
