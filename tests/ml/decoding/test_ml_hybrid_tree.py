"""The hybrid target's tree-aware gated delta rule (core/ml/models/hybrid.py) in one batched form equals
the plain sequential recurrence run along every node's root path, on chains, bushy, deep and
DDTree-shaped trees: each node's output, and the state committing any node's path leaves."""

import pytest
import torch

from core.ml.decoding.ddtree import build_tree, topk_per_depth
from core.ml.models.hybrid import TreeStates, ancestor_matrix, linear_attention_modules, path_state, tree_delta_rule
from core.ml.models.target import TargetRunner, cache_kwarg, new_cache


def root_path(parents, node):
    """Node indices from the root to ``node``."""
    path = []
    while node != -1:
        path.append(node)
        node = parents[node]
    return path[::-1]


def sequential(q, k, v, g, beta, state, parents, node):
    """The decode path's recurrence, one token at a time along ``node``'s root path: its output
    [H, dv] and state [H, dk, dv]."""
    s = state.clone()
    for i in root_path(parents, node):
        s = s * g[i].exp()[:, None, None]
        delta = (v[i] - (s * k[i][..., None]).sum(-2)) * beta[i][:, None]
        s = s + k[i][..., None] * delta[:, None, :]
    return (s * q[node][..., None]).sum(-2), s


def chain(n):
    return [-1, *range(n - 1)]


def bushy(n):
    return [-1] + [0] * (n - 1)


def deep_narrow(n):
    """Two long branches from the root, and a fork half-way down the first."""
    parents, half = [-1], (n - 1) // 2
    for i in range(1, n):
        if i <= half:
            parents.append(i - 1)
        elif i == half + 1:
            parents.append(0)
        else:
            parents.append(i - 1 if i != half + 3 else half // 2)
    return parents


def ddtree(seed, budget=16, depth=15, vocab=40):
    logits = torch.randn(depth, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    return build_tree(1, topk_per_depth(logits, budget), budget).parents


def random_tree(seed, n):
    rng = torch.Generator().manual_seed(seed)
    return [-1] + [int(torch.randint(0, i, (1,), generator=rng)) for i in range(1, n)]


SHAPES = {
    "root_only": [-1],
    "chain16": chain(16),
    "bushy17": bushy(17),
    "deep_narrow33": deep_narrow(33),
    **{f"ddtree16_seed{s}": ddtree(s) for s in range(4)},
    **{f"random{n}_seed{s}": random_tree(s, n) for s, n in ((0, 9), (1, 24), (2, 40))},
}


def inputs(n, heads=3, dk=8, dv=6, seed=0, decay_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(n, heads, dk, generator=gen), dim=-1) / dk**0.5
    k = torch.nn.functional.normalize(torch.randn(n, heads, dk, generator=gen), dim=-1)
    v = torch.randn(n, heads, dv, generator=gen)
    g = -torch.rand(n, heads, generator=gen) * decay_scale
    beta = torch.rand(n, heads, generator=gen)
    state = torch.randn(heads, dk, dv, generator=gen)
    return q, k, v, g, beta, state


def test_ddtree_shapes_branch():
    """The DDTree fixtures are real trees: several leaves and more than one node per depth."""
    for s in range(4):
        parents = SHAPES[f"ddtree16_seed{s}"]
        assert len(parents) == 17 and len(set(parents[1:])) < 16


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("decay_scale", [0.05, 1.0, 8.0])
def test_tree_delta_rule_equals_the_sequential_recurrence_per_path(shape, decay_scale):
    parents = SHAPES[shape]
    n = len(parents)
    q, k, v, g, beta, state = inputs(n, seed=n, decay_scale=decay_scale)
    out, u, decay, cum = tree_delta_rule(q, k, v, g, beta, state, ancestor_matrix(parents))
    assert out.shape == v.shape
    for node in range(n):
        want_out, want_state = sequential(q, k, v, g, beta, state, parents, node)
        torch.testing.assert_close(out[node], want_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(path_state(state, k, u, decay, cum, node), want_state, atol=1e-5, rtol=1e-5)


def test_ancestor_matrix():
    anc = ancestor_matrix([-1, 0, 0, 1, 3])
    assert anc.tolist() == [[True, False, False, False, False],
                            [True, True, False, False, False],
                            [True, False, True, False, False],
                            [True, True, False, True, False],
                            [True, True, False, True, True]]


def decode_path(target, prompt, tokens):
    """Plain incremental decoding of ``prompt`` then ``tokens``: the logits after each token and
    the cache it leaves."""
    kw, cache = cache_kwarg(target), new_cache(target)
    target(torch.tensor([prompt]), **{kw: cache}, use_cache=True)
    logits = [target(torch.tensor([[t]]), **{kw: cache}, use_cache=True).logits[0, -1].float() for t in tokens]
    return logits, cache


@pytest.mark.parametrize("shape", ["chain16", "bushy17", "deep_narrow33", "ddtree16_seed0", "ddtree16_seed3"])
def test_verify_and_commit_equal_plain_decoding_on_the_tiny_hybrid(qwen35_target, make_prompt, shape):
    """Through the real target: every node's logits equal plain decoding of its root path, and
    committing the deepest leaf's path leaves every linear layer's conv window and recurrent
    state where plain decoding of that path leaves them."""
    parents = SHAPES[shape]
    n = len(parents)
    tokens = [int(t) for t in torch.randint(4, 300, (n,), generator=torch.Generator().manual_seed(n))]
    depths = [len(root_path(parents, i)) - 1 for i in range(n)]
    prompt = make_prompt(3, 10)
    runner = TargetRunner(qwen35_target, None)
    assert runner.strategy == "state"
    runner.prefill(prompt)
    logits, _ = runner.verify_tree(tokens, parents, depths)
    leaves = [i for i in range(n) if i not in parents]
    deepest = max(leaves, key=lambda i: depths[i])
    for leaf in leaves:  # every node lies on some leaf's path
        path = root_path(parents, leaf)
        want, cache = decode_path(qwen35_target, prompt, [tokens[i] for i in path])
        torch.testing.assert_close(logits[path], torch.stack(want), atol=2e-4, rtol=1e-4)
        if leaf == deepest:
            deepest_cache = cache
    runner.commit_tree(root_path(parents, deepest))
    for mod in linear_attention_modules(qwen35_target):
        got, want = runner.cache.layers[mod.layer_idx], deepest_cache.layers[mod.layer_idx]
        torch.testing.assert_close(got.recurrent_states[0], want.recurrent_states[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.conv_states[0], want.conv_states[0], atol=5e-5, rtol=1e-4)  # batched vs 1-token projections


def test_commit_refuses_a_path_that_is_not_a_root_path():
    states = TreeStates([], [-1, 0, 0], [0, 1, 1])
    with pytest.raises(ValueError, match="not a root path"):
        states.commit(None, [0, 1, 2])
    with pytest.raises(ValueError, match="does not start at the root"):
        states.commit(None, [1])
