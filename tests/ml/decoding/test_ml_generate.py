"""Online chain and DDTree decoding are lossless: token-for-token equal to plain greedy decoding
of the target, for attention-only (Qwen3) and hybrid recurrent (Qwen3.5) targets (docs/evaluation.md §2)."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from core.ml.measure import tau as T
from core.ml.decoding.ddtree import build_tree, topk_per_depth  # noqa: E402
from core.ml.decoding.generate import DFlashProposer, chain_generate, ddtree_generate, greedy_generate  # noqa: E402
from core.ml.models.target import TargetRunner, tree_attention_mask  # noqa: E402
from tests.ml.models.test_attention_rule import Recording  # noqa: E402

MASK, N = 3, 40


@pytest.fixture(scope="module")
def cases(qwen3_target, qwen35_target, fitted_drafter, fitted_drafter35, make_prompt):
    """(name, target, drafter, prompt, greedy reference) for both architectures."""
    out = {}
    for name, target, drafter in (("qwen3", qwen3_target, fitted_drafter), ("qwen3_5", qwen35_target, fitted_drafter35)):
        prompt = make_prompt(100)  # one of the fitted drafters' FIT_SEEDS
        out[name] = (target, drafter, prompt, greedy_generate(target, prompt, N + 16))
    return out


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("block_size", [8, 4, 1])
def test_chain_with_drafter_is_lossless(cases, arch, block_size):
    target, drafter, prompt, ref = cases[arch]
    runner = TargetRunner(target, drafter.target_layer_ids)
    assert runner.strategy == ("crop" if arch == "qwen3" else "state")
    res = chain_generate(DFlashProposer(drafter, target) if block_size > 1 else None, runner, prompt, N, block_size, MASK)
    assert res.tokens == ref.tokens[:N]
    assert sum(res.rounds) == len(res.tokens) - 1 and all(1 <= r <= block_size for r in res.rounds)
    if block_size == 8:
        assert max(res.rounds) > 1  # the fitted drafter gets tokens accepted: rollbacks are exercised


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("p_correct", [1.0, 0.7])
def test_chain_with_oracle_is_lossless(cases, oracle, arch, p_correct):
    target, drafter, prompt, ref = cases[arch]
    seq = prompt + ref.tokens
    runner = TargetRunner(target, drafter.target_layer_ids)
    res = chain_generate(oracle(seq, 320, p_correct), runner, prompt, N, 8, MASK)
    assert res.tokens == ref.tokens[:N]
    if p_correct == 1.0:
        assert res.rounds[:-1] == [8] * (len(res.rounds) - 1)  # a perfect drafter: tau = B
    else:
        assert len(set(res.rounds)) > 2


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("budget", [0, 3, 16])
def test_ddtree_is_lossless(cases, oracle, arch, budget):
    target, drafter, prompt, ref = cases[arch]
    runner = TargetRunner(target, drafter.target_layer_ids)
    res = ddtree_generate(DFlashProposer(drafter, target), runner, prompt, N, 8, MASK, budget)
    assert res.tokens == ref.tokens[:N]
    if budget == 0:
        assert res.rounds == [1] * (N - 1)  # a root-only tree: one token per step (the first is the prefill's)
    noisy = ddtree_generate(oracle(prompt + ref.tokens, 320, 0.6), runner, prompt, N, 8, MASK, budget)
    assert noisy.tokens == ref.tokens[:N]
    if budget >= 14:  # rank-2 alternatives fit in the tree: it recovers from decoys
        chain = chain_generate(oracle(prompt + ref.tokens, 320, 0.6), runner, prompt, N, 8, MASK)
        assert noisy.tau > chain.tau


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_recompute_fallback_is_lossless(cases, oracle, mode):
    target, drafter, prompt, ref = cases["qwen3_5"]
    runner = TargetRunner(target, drafter.target_layer_ids)
    runner.reset = lambda _orig=runner.reset: (_orig(), setattr(runner, "strategy", "recompute"))[0]
    prop = oracle(prompt + ref.tokens, 320, 0.7)
    if mode == "chain":
        res = chain_generate(prop, runner, prompt, 24, 8, MASK)
    else:
        res = ddtree_generate(prop, runner, prompt, 24, 8, MASK, 10)
    assert runner.strategy == "recompute" and res.tokens == ref.tokens[:24]


def test_stop_token_ends_generation_like_greedy(cases):
    target, drafter, prompt, ref = cases["qwen3"]
    stop = ref.tokens[10]
    want = greedy_generate(target, prompt, N, [stop])
    assert want.stopped and want.tokens[-1] == stop
    runner = TargetRunner(target, drafter.target_layer_ids)
    assert chain_generate(DFlashProposer(drafter, target), runner, prompt, N, 8, MASK, [stop]).tokens == want.tokens
    assert ddtree_generate(DFlashProposer(drafter, target), runner, prompt, N, 8, MASK, 8, [stop]).tokens == want.tokens


def test_chain_lossless_on_device(device, tiny, make_prompt):
    target = tiny.build_tiny_target("qwen3", seed=0).to(device)
    drafter = tiny.build_tiny_drafter(tiny.tiny_drafter_config(target.config), seed=1).to(device)
    prompt = make_prompt(7)
    ref = greedy_generate(target, prompt, 24)
    res = chain_generate(DFlashProposer(drafter, target), TargetRunner(target, [0, 2]), prompt, 24, 8, MASK)
    assert res.tokens == ref.tokens


# ----------------------------------------------------------------------------- tree structure


def _topk(depths: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return topk_per_depth(torch.randn(depths, 50, generator=g) * 2, k)


def _path_score(tree, topk, node):
    score = 0.0
    while node > 0:
        d = tree.depths[node]
        score += dict((t, lp) for lp, t in topk[d - 1])[tree.tokens[node]]
        node = tree.parents[node]
    return score


@settings(max_examples=60, deadline=None)
@given(depths=st.integers(1, 6), budget=st.integers(0, 40), seed=st.integers(0, 10_000))
def test_tree_invariants(depths, budget, seed):
    topk = _topk(depths, max(budget, 1), seed)
    tree = build_tree(7, topk, budget)
    n = len(tree)
    assert n - 1 == min(budget, sum(len(topk[0]) ** d for d in range(1, depths + 1)))
    assert tree.parents[0] == -1 and tree.depths[0] == 0
    for i in range(1, n):
        p = tree.parents[i]
        assert 0 <= p < i  # parent index < child: prefix-closed, topologically ordered
        assert tree.depths[i] == tree.depths[p] + 1 <= depths
        assert tree.children[p][tree.tokens[i]] == i
    for i in range(n):  # siblings appear in the drafter's top-k order
        ranks = [[t for _, t in topk[tree.depths[i]]].index(tree.tokens[c]) for c in tree.children[i].values()] \
            if tree.depths[i] < depths else []
        assert ranks == sorted(ranks) == list(range(len(ranks)))


@pytest.mark.parametrize("seed", range(5))
def test_tree_holds_the_best_scoring_paths(seed):
    depths, k, budget = 3, 4, 12
    topk = _topk(depths, k, seed)
    tree = build_tree(0, topk, budget)
    chosen = sorted((_path_score(tree, topk, i) for i in range(1, len(tree))), reverse=True)
    everything = []
    for d in range(1, depths + 1):
        for ranks in itertools.product(range(k), repeat=d):
            everything.append(sum(topk[j][r][0] for j, r in enumerate(ranks)))
    # prefix-closed optimum: the best `budget` node scores (each node = its path's score)
    assert chosen == pytest.approx(sorted(everything, reverse=True)[:budget])


def test_follow_and_deepest_match():
    topk = [[(-0.1, 5), (-2.0, 6)], [(-0.2, 7), (-1.0, 8)], [(-0.3, 9)]]
    tree = build_tree(1, topk, 6)
    post = {i: 0 for i in range(len(tree))}
    post[0] = 6  # target wants token 6 after the root: rank-2 sibling
    n6 = tree.children[0].get(6)
    assert n6 is not None
    post[n6] = 4  # then something the tree does not have -> bonus
    assert tree.follow([post[i] for i in range(len(tree))]) == ([0, n6], 4)
    assert tree.deepest_match([5, 7, 9]) == 3 and tree.deepest_match([5, 1]) == 1 and tree.deepest_match([2]) == 0


def test_tree_attention_mask_is_ancestor_only():
    parents = [-1, 0, 0, 1, 3]
    m = tree_attention_mask(parents, 2, torch.float32, torch.device("cpu"))[0, 0]
    visible = (m == 0).int().tolist()
    assert [row[:2] for row in visible] == [[1, 1]] * 5  # every node sees the whole past
    assert [row[2:] for row in visible] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_chain_is_one_target_forward_per_round(cases, oracle, arch):
    """Rollback never re-runs tokens: prefill + one verify forward per round, B tokens each."""
    target, drafter, prompt, ref = cases[arch]
    runner = TargetRunner(target, drafter.target_layer_ids)
    for prop in (DFlashProposer(drafter, target), oracle(prompt + ref.tokens, 320, 0.7)):
        res = chain_generate(prop, runner, prompt, N, 8, MASK)
        assert res.tokens == ref.tokens[:N]
        assert any(r < 8 for r in res.rounds[:-1])  # rejections happened: a rollback was needed
        assert res.target_forwards == len(res.rounds) + 1
        starts = [len(prompt) + sum(res.rounds[:i]) for i in range(len(res.rounds))]
        widths = [min(8, len(prompt) + N - s) for s in starts]  # the last blocks shrink to what is left
        assert res.target_tokens == len(prompt) + sum(widths) and widths[0] == 8
        assert res.drafter_forwards == len(res.rounds)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_llama_cpp_end_drafts_full_blocks_and_verifies_at_most_the_tokens_left(cases, oracle, arch):
    """--engine-rule llama.cpp's end (core.ml.measure.tau.FULL_BLOCK): the drafter always sees a full block,
    the target verifies min(B, left) tokens (the draft cut to left - 1), and with one token left the
    drafter does not run; lossless at every max_new_tokens, and with drafts that do not depend on
    the block's length (the oracle) the rounds are the reference's."""
    target, drafter, prompt, ref = cases[arch]
    runner = TargetRunner(target, drafter.target_layer_ids)
    seen = {"cut": 0, "alone": 0}
    for n in (1, 2, 3, 4, 6, 9, 12, 17):  # every max_new_tokens 1..40 against llama-server: test_engine_llama.py
        for p_correct in (1.0, 0.7):
            prop = Recording(oracle(prompt + ref.tokens, 320, p_correct))
            res = chain_generate(prop, runner, prompt, n, 8, MASK, last_blocks=T.FULL_BLOCK)
            assert res.tokens == ref.tokens[:n]
            assert sum(res.rounds) == len(res.tokens) - 1 and all(1 <= r <= 8 for r in res.rounds)
            lefts = [n - 1 - sum(res.rounds[:i]) for i in range(len(res.rounds))]
            assert prop.blocks == [8] * sum(left > 1 for left in lefts)
            assert res.drafter_forwards == len(prop.blocks)
            assert res.target_forwards == len(res.rounds) + 1
            assert res.target_tokens == len(prompt) + sum(min(8, left) for left in lefts)
            if p_correct == 1.0:
                assert res.rounds == chain_generate(oracle(prompt + ref.tokens, 320, 1.0), runner, prompt, n, 8,
                                                    MASK).rounds
            seen["cut"] += any(1 < left < 8 for left in lefts)
            seen["alone"] += lefts[-1:] == [1]
    assert seen["cut"] >= 6 and seen["alone"] >= 3, seen  # the draft cut and the lone last token both ran


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("budget", [5, 16])
def test_ddtree_feeds_each_node_once(cases, oracle, arch, budget):
    """A tree of budget + 1 nodes costs one forward of budget + 1 tokens, hybrid targets too
    (the path-batch verification fed about 2.6x that, plus a re-run of the accepted path)."""
    target, drafter, prompt, ref = cases[arch]
    runner = TargetRunner(target, drafter.target_layer_ids)
    res = ddtree_generate(oracle(prompt + ref.tokens, 320, 0.6), runner, prompt, N, 8, MASK, budget)
    assert res.tokens == ref.tokens[:N]
    rounds = len(res.rounds)
    assert res.extra["mean_tree_nodes"] == budget  # full trees: vocab 320 >> budget
    assert res.target_forwards == rounds + 1
    assert res.target_tokens - len(prompt) == (budget + 1) * rounds


def test_hybrid_tree_states_match_plain_decoding_per_node(qwen35_target, make_prompt):
    """Every node of a branching tree gets the logits plain greedy decoding gives its path, and
    committing a non-first branch leaves the cache where decoding that path would."""
    from core.ml.models.target import new_cache, cache_kwarg

    target = qwen35_target
    prompt = make_prompt(7, 12)
    # root 0; branches 0->1->3->5, 0->2->4, 1->6 (node 6 a sibling of 3)
    tokens, parents = [11, 40, 41, 42, 43, 44, 45], [-1, 0, 0, 1, 2, 3, 1]
    depths = [0, 1, 1, 2, 2, 3, 2]
    runner = TargetRunner(target, None)
    runner.prefill(prompt)
    logits, _ = runner.verify_tree(tokens, parents, depths)

    def path_logits(node):
        path = []
        while node != -1:
            path.append(tokens[node])
            node = parents[node]
        full = prompt + path[::-1]
        return target(torch.tensor([full])).logits[0, -1].float()

    for i in range(len(tokens)):
        torch.testing.assert_close(logits[i], path_logits(i), atol=2e-4, rtol=1e-4)
    runner.commit_tree([0, 2, 4])
    nxt, _ = runner.verify_chain([50, 51])
    kw = cache_kwarg(target)
    cache = new_cache(target)
    target(torch.tensor([prompt]), **{kw: cache}, use_cache=True)
    want = [target(torch.tensor([[t]]), **{kw: cache}, use_cache=True).logits[0, -1].float()
            for t in (11, 41, 43, 50, 51)]
    torch.testing.assert_close(nxt, torch.stack(want[-2:]), atol=2e-4, rtol=1e-4)
