"""Offline tau from cached features (docs/evaluation.md §4): batched == one-anchor-at-a-time, and
trajectory-offline tau == online tau on the target's own greedy output."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from core.ml.measure import tau as T
from core.ml.tasks.extract import labels_and_features  # noqa: E402
from core.ml.formats.featstore import CachedSequence  # noqa: E402
from core.ml.decoding.generate import DFlashProposer, chain_generate, ddtree_generate, greedy_generate  # noqa: E402
from core.ml.decoding.offline import draft_blocks, draft_blocks_loop, sequence_streaks, streaks_from_drafts  # noqa: E402
from core.ml.models.target import TargetRunner  # noqa: E402

N, B = 40, 8


def cached(target, drafter, prompt, n_new):
    """What core.ml.extract stores for one prompt."""
    gen = greedy_generate(target, prompt, n_new)
    ids = torch.tensor([prompt + gen.tokens])
    feats, labels = labels_and_features(target, ids, drafter.target_layer_ids)
    return CachedSequence("x", ids[0], feats, labels, len(prompt))


def test_labels_are_the_greedy_continuation(qwen3_target, fitted_drafter, make_prompt):
    prompt = make_prompt(100)
    seq = cached(qwen3_target, fitted_drafter, prompt, 20)
    P = len(prompt)
    assert seq.labels[P - 1:-1].tolist() == seq.input_ids[P:].tolist()  # labels[t] = greedy token t + 1
    full = qwen3_target(seq.input_ids[None]).logits[0].argmax(-1)
    assert torch.equal(seq.labels, full)


@pytest.mark.parametrize("sliding", [None, 6])
def test_batched_streaks_equal_one_anchor_loop(tiny, device, qwen3_target, fitted_drafter, make_prompt, sliding):
    target = qwen3_target.to(device)
    if sliding:
        drafter = tiny.build_tiny_drafter(tiny.tiny_drafter_config(target.config, sliding_window=sliding), seed=4)
    else:
        drafter = fitted_drafter
    drafter = drafter.to(device)
    try:
        seq = cached(target, drafter, make_prompt(100), 30)
        anchors = list(range(seq.prompt_len, seq.input_ids.shape[0]))
        emb, head = target.get_input_embeddings(), target.get_output_embeddings()
        batched, _, _ = draft_blocks(drafter, emb, head, seq, anchors, B, max_rows=5 * B)  # several passes
        loop = draft_blocks_loop(drafter, emb, head, seq, anchors, B)
        assert torch.equal(batched, loop)
        assert streaks_from_drafts(seq, anchors, batched) == streaks_from_drafts(seq, anchors, loop)
    finally:
        qwen3_target.to("cpu")
        fitted_drafter.to("cpu")


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_trajectory_offline_tau_equals_online_tau(arch, qwen3_target, qwen35_target, fitted_drafter, fitted_drafter35, make_prompt):
    target, drafter = (qwen3_target, fitted_drafter) if arch == "qwen3" else (qwen35_target, fitted_drafter35)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    runner = TargetRunner(target, drafter.target_layer_ids)
    checked = 0
    for seed in (100, 7):  # a memorised prompt (tau > 1) and an unseen one
        prompt = make_prompt(seed)
        online = chain_generate(DFlashProposer(drafter, target), runner, prompt, N, B, 3)
        tree = ddtree_generate(DFlashProposer(drafter, target), runner, prompt, N, B, 3, 12)
        seq = cached(target, drafter, prompt, N + B - 1)  # labels must cover the last round's block
        st = sequence_streaks(drafter, emb, head, seq, B, tree_budget=12)
        _, rounds = st.trajectory(N)
        assert rounds == online.rounds
        assert st.trajectory(N, tree=True)[1] == tree.rounds
        assert T.mean_tau(rounds) == pytest.approx(online.tau)
        checked += max(online.rounds) > 1
    assert checked >= 1  # acceptance happened, so the equality is not trivially 1 == 1


def test_offline_trajectory_under_llama_cpps_end_equals_online_and_drafts_no_short_block(
        qwen3_target, fitted_drafter, make_prompt):
    """--engine-rule llama.cpp offline: every anchor keeps its full block's streak (no block is
    drafted again shorter), counted as the online chain under the same end counts its rounds."""
    target, drafter = qwen3_target, fitted_drafter
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    runner = TargetRunner(target, drafter.target_layer_ids)
    prompt = make_prompt(100)
    seq = cached(target, drafter, prompt, N + B - 1)
    st = sequence_streaks(drafter, emb, head, seq, B)
    shorter = []
    st.short = lambda a, width, _short=st.short: (shorter.append(width), _short(a, width))[1]
    for n in (3, 9, 17, N):
        online = chain_generate(DFlashProposer(drafter, target), runner, prompt, n, B, 3, last_blocks=T.FULL_BLOCK)
        assert st.trajectory(n, last_blocks=T.FULL_BLOCK)[1] == online.rounds
        assert not shorter
    st.trajectory(9)  # the reference's end drafts the last blocks again, shorter
    assert shorter and max(shorter) < B


def test_all_anchor_rounds_use_full_blocks_only(qwen3_target, fitted_drafter, make_prompt):
    seq = cached(qwen3_target, fitted_drafter, make_prompt(101), 24)
    emb, head = qwen3_target.get_input_embeddings(), qwen3_target.get_output_embeddings()
    st = sequence_streaks(fitted_drafter, emb, head, seq, B)
    S, P = seq.input_ids.shape[0], seq.prompt_len
    assert st.anchors == list(range(P, S))
    assert st.full == [a + B - 1 <= S for a in st.anchors]
    rounds = st.all_anchor_rounds()
    assert len(rounds) == S - P - (B - 2)
    assert rounds == [s + 1 for s, f in zip(st.streaks, st.full) if f]
    assert max(st.streaks) > 0
