"""Target features: hidden_states[id + 1] (docs/drafter.md §2), for Qwen3 and hybrid Qwen3.5."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from core.ml.models.features import FeatureTap, context_features, decoder_parts, target_features  # noqa: E402


def test_plus_one_offset_hook_equals_hidden_states(any_target):
    ids = torch.randint(4, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    n = any_target.config.num_hidden_layers
    out = any_target(ids, output_hidden_states=True)
    hs = out.hidden_states
    assert len(hs) == n + 1
    # output of decoder layer l == hidden_states[l + 1], for every l
    layers, _ = decoder_parts(any_target)
    captured = {}
    handles = [layers[l].register_forward_hook(lambda m, i, o, l=l: captured.__setitem__(l, o)) for l in range(n)]
    any_target(ids)
    for h in handles:
        h.remove()
    for l in range(n - 1):
        assert torch.equal(captured[l], hs[l + 1])
        assert not torch.allclose(captured[l], hs[l])  # the off-by-one is not a no-op
    # FeatureTap (what the hosts use) == context_features (hidden_states[id + 1]) for every id
    for ids_ in ([0, 2], [1], list(range(n))):
        with FeatureTap(any_target, ids_) as tap:
            any_target(ids)
            torch.testing.assert_close(tap.pop(), context_features(hs, ids_), rtol=0, atol=0)
    wrong = torch.cat([hs[i] for i in [0, 2]], -1)
    assert not torch.allclose(context_features(hs, [0, 2]), wrong)


def test_target_features_shape_and_order(qwen3_target):
    ids = torch.randint(4, 300, (1, 9), generator=torch.Generator().manual_seed(1))
    out, feats = target_features(qwen3_target, ids, [2, 0])
    hs = qwen3_target(ids, output_hidden_states=True).hidden_states
    assert feats.shape == (1, 9, 2 * 64)
    torch.testing.assert_close(feats[..., :64], hs[3])  # order follows target_layer_ids
    torch.testing.assert_close(feats[..., 64:], hs[1])
    assert out.logits.shape == (1, 9, 320)


def test_unrecognised_layout_falls_back_to_hidden_states(qwen3_target):
    class Wrapper(torch.nn.Module):  # no .model.layers, no get_decoder
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, **kw):
            return self.inner(input_ids, **kw)

    w = Wrapper(qwen3_target)
    ids = torch.randint(4, 300, (1, 7), generator=torch.Generator().manual_seed(2))
    with FeatureTap(w, [1]) as tap:
        assert tap.needs_hidden_states
    _, feats = target_features(w, ids, [1])
    torch.testing.assert_close(feats, qwen3_target(ids, output_hidden_states=True).hidden_states[2])


def test_bad_layer_id_is_rejected(qwen3_target):
    with pytest.raises(ValueError, match="outside"):
        FeatureTap(qwen3_target, [4])
    with pytest.raises(ValueError, match="outside"):
        context_features([torch.zeros(1)] * 5, [4])
