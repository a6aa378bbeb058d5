"""Drafter: config layouts, published configs, z-lab checkpoint loading, save/reload,
training-path == inference-path equivalence (docs/drafter.md, docs/training.md §2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from core.ml.models.drafter import (  # noqa: E402
    DFlashDrafter,
    anchor_block_mask,
    block_positions,
    expected_tensors,
    load_drafter,
    multi_anchor_forward,
    rope_inv_freq,
    save_drafter,
)
from core.ml.formats.drafter_config import DFlashConfig, build_target_layer_ids  # noqa: E402

PUBLISHED = Path("/work/shared/fixtures/published-configs")
PUBLISHED = PUBLISHED if PUBLISHED.is_dir() else Path(__file__).parents[4] / "shared/fixtures/published-configs"

# A tiny config in the exact z-lab layout (Qwen3-8B-b16 config.json with small sizes).
ZLAB_TINY = {
    "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 4, "bos_token_id": 0,
    "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 2]}, "dtype": "bfloat16",
    "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "intermediate_size": 96, "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 512,
    "max_window_layers": 2, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "num_target_layers": 4, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False, "use_cache": True,
    "use_sliding_window": False, "vocab_size": 320,
}


def zlab_tensor_names(L: int) -> list[str]:
    """The published tensor names, written out from docs/drafter.md §1 (not from our module)."""
    names = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    for i in range(L):
        p = f"layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"] + [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    return names


def zlab_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    H, I, d, nh, nkv, K = c["hidden_size"], c["intermediate_size"], c["head_dim"], c["num_attention_heads"], \
        c["num_key_value_heads"], len(c["dflash_config"]["target_layer_ids"])
    shapes = {"fc.weight": (H, K * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                   p + "self_attn.q_proj.weight": (nh * d, H), p + "self_attn.k_proj.weight": (nkv * d, H),
                   p + "self_attn.v_proj.weight": (nkv * d, H), p + "self_attn.o_proj.weight": (H, nh * d),
                   p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                   p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I)}
    return shapes


def write_fake_zlab(path: Path, cfg: dict = ZLAB_TINY, prefix: str = "", extra: dict | None = None, drop: str | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    tensors = {prefix + k: (torch.randn(s, generator=g) * 0.2).to(torch.bfloat16) for k, s in zlab_shapes(cfg).items() if k != drop}
    tensors |= extra or {}
    save_file(tensors, str(path / "model.safetensors"))
    return path


# ----------------------------------------------------------------------------- configs


def test_build_target_layer_ids_matches_published():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B / 4B
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]  # Qwen3.6-27B
    assert build_target_layer_ids(24, 5) == [1, 6, 11, 16, 21]  # Qwen2.5-0.5B recipe
    assert build_target_layer_ids(40, 1) == [20]


@pytest.mark.parametrize("name", sorted(p.name for p in PUBLISHED.glob("*.json")))
def test_every_published_config_loads_and_builds_on_meta(name):
    raw = json.loads((PUBLISHED / name).read_text())
    cfg = DFlashConfig.from_dict(raw)
    assert cfg.block_size == 16 and cfg.mask_token_id == raw["dflash_config"]["mask_token_id"]
    assert cfg.target_layer_ids == raw["dflash_config"]["target_layer_ids"]
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert sorted(got) == sorted(zlab_tensor_names(raw["num_hidden_layers"]))
    assert got == zlab_shapes(raw)
    assert len(got) == 11 * raw["num_hidden_layers"] + 3  # 58 for 5 layers
    again = DFlashConfig.from_dict(cfg.to_dict())  # our saved layout reads back identically
    assert again.to_dict() == cfg.to_dict()


def test_qwen36_27b_drafter_fields():
    cfg = DFlashConfig.from_file(PUBLISHED / "qwen3.6-27b-dflash.json")
    assert cfg.layer_types == ["sliding_attention"] * 4 + ["full_attention"] and cfg.sliding_window == 2048
    assert (cfg.mask_token_id, cfg.rope_theta, cfg.vocab_size, cfg.hidden_size) == (248070, 1e7, 248320, 5120)
    assert cfg.target_layer_ids == [1, 16, 31, 46, 61] and cfg.num_target_layers == 64
    params = sum(torch.Size(s).numel() for s in expected_tensors(cfg).values())
    assert 1.5e9 < params < 2.5e9


def test_block_size_inside_dflash_config_and_default_ids():
    raw = {k: v for k, v in ZLAB_TINY.items() if k != "block_size"}
    raw["dflash_config"] = {"mask_token_id": 7, "block_size": 8}  # Qwen3.5+ layout, no target_layer_ids
    raw["num_target_layers"] = 36
    raw["num_hidden_layers"], raw["layer_types"] = 5, ["full_attention"] * 5
    cfg = DFlashConfig.from_dict(raw)
    assert (cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids) == (8, 7, [1, 9, 17, 25, 33])
    with pytest.raises(ValueError, match="block_size"):
        DFlashConfig.from_dict({**raw, "dflash_config": {"mask_token_id": 7}})


def test_speculators_layout_subtracts_one_from_aux_ids():
    layer = {k: ZLAB_TINY[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                       "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "max_position_embeddings")}
    raw = {"speculators_model_type": "dflash", "transformer_layer_config": {**layer, "rope_theta": 1e6},
           "aux_hidden_state_layer_ids": [2, 10, 18, 26, 34], "mask_token_id": 151669, "block_size": 16}
    cfg = DFlashConfig.from_dict(raw)
    assert cfg.target_layer_ids == [1, 9, 17, 25, 33] and cfg.source_format == "speculators"
    assert cfg.to_dict()["dflash_config"]["target_layer_ids"] == [1, 9, 17, 25, 33]


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
])
def test_rope_scaling_matches_transformers(scaling):
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = DFlashConfig.from_dict({**ZLAB_TINY, "rope_scaling": scaling})
    ours, scale = rope_inv_freq(cfg)
    hf_cfg = Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=512,
                         rope_parameters={"rope_theta": 1e6, **scaling})
    ref, ref_scale = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf_cfg, "cpu")
    torch.testing.assert_close(ours, ref.float())
    assert scale == pytest.approx(ref_scale)


# ----------------------------------------------------------------------------- checkpoints


def test_fake_zlab_checkpoint_loads_strictly(tmp_path):
    d = write_fake_zlab(tmp_path / "zlab")
    model = load_drafter(d, dtype=torch.float32)
    assert model.block_size == 4 and model.mask_token_id == 3 and model.target_layer_ids == [0, 2]
    from safetensors.torch import load_file

    raw = load_file(str(d / "model.safetensors"))
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, raw[k].float())
    # optional "model." prefix (sglang tolerates it)
    assert load_drafter(write_fake_zlab(tmp_path / "pref", prefix="model."), dtype=torch.float32).block_size == 4


@pytest.mark.parametrize("break_it", ["missing", "unexpected", "shape"])
def test_strict_load_rejects_wrong_keys(tmp_path, break_it):
    if break_it == "missing":
        d = write_fake_zlab(tmp_path / "x", drop="layers.1.mlp.up_proj.weight")
    elif break_it == "unexpected":
        d = write_fake_zlab(tmp_path / "x", extra={"layers.0.self_attn.g_proj.weight": torch.zeros(2, 64)})
    else:
        d = write_fake_zlab(tmp_path / "x", extra={"fc.weight": torch.zeros(64, 64)})
    with pytest.raises(ValueError, match="does not match"):
        load_drafter(d)


def test_saved_drafter_reloads_to_identical_outputs(tmp_path, device, tiny):
    cfg = tiny.tiny_drafter_config(tiny.tiny_target_config(), block_size=4, sliding_window=6)
    model = tiny.build_tiny_drafter(cfg, seed=3).to(device)
    save_drafter(model, tmp_path / "d")
    saved = json.loads((tmp_path / "d/config.json").read_text())
    assert saved["architectures"] == ["DFlashDraftModel"] and saved["model_type"] == "qwen3"
    assert saved["dflash_config"] == {"mask_token_id": 3, "target_layer_ids": [0, 2]} and saved["block_size"] == 4
    again = load_drafter(tmp_path / "d", device=device)
    g = torch.Generator().manual_seed(0)
    emb, feats = torch.randn(1, 4, 64, generator=g).to(device), torch.randn(1, 11, 128, generator=g).to(device)
    pos = torch.arange(15, device=device)[None]
    assert torch.equal(model(emb, feats, pos), again(emb, feats, pos))


# ----------------------------------------------------------------------------- training == inference


# causality overrides (docs/drafter.md §5 precedence): none, all layers non-causal, all layers causal
OVERRIDES = {"rule": {}, "is_causal=false": {"is_causal": False}, "dflash.causal=true": {"dflash_extra": {"causal": True}}}


def _equivalence_case(tiny, device, sliding_window=None, override="rule", seed=0):
    tcfg = tiny.tiny_target_config()
    cfg = tiny.tiny_drafter_config(tcfg, block_size=4, sliding_window=sliding_window, **OVERRIDES[override])
    drafter = tiny.build_tiny_drafter(cfg, seed=seed).to(device)
    g = torch.Generator().manual_seed(seed)
    S, H = 24, cfg.hidden_size
    feats = torch.randn(1, S, cfg.feature_dim, generator=g).to(device)
    anchors = torch.tensor([[1, 5, 6, 13, 20]], device=device)
    block_emb = torch.randn(1, anchors.shape[1] * 4, H, generator=g).to(device)
    return drafter, feats, anchors, block_emb


def _inference_blocks(drafter, feats, anchors, block_emb):
    """Per anchor: drafter.forward with context F[:a] and the same block, no mask (docs/drafter.md §3)."""
    B, out = drafter.block_size, []
    for j, a in enumerate(anchors[0].tolist()):
        pos = torch.arange(a + B, device=feats.device)[None]
        out.append(drafter(block_emb[:, j * B:(j + 1) * B], feats[:, :a], pos))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("impl", ["dense", "blockwise"])
@pytest.mark.parametrize("sliding_window,override", [(None, "rule"), (5, "rule"), (3, "rule"), (5, "is_causal=false"),
                                                     (None, "dflash.causal=true"), (3, "dflash.causal=true")])
def test_multi_anchor_training_logits_equal_inference_logits(tiny, device, sliding_window, override, impl):
    drafter, feats, anchors, block_emb = _equivalence_case(tiny, device, sliding_window, override)
    head = torch.nn.Linear(64, 320, bias=False).to(device)
    torch.nn.init.normal_(head.weight, std=64**-0.5)  # logits of unit scale
    train = head(multi_anchor_forward(drafter, feats, block_emb, anchors, impl=impl))
    infer = head(_inference_blocks(drafter, feats, anchors, block_emb))
    torch.testing.assert_close(train, infer, atol=1e-5, rtol=1e-5)


def test_leaky_context_mask_fails_the_equivalence(tiny):
    """The `<=` context mask (SpecForge PR #473's bug) lets a block see its anchor's own features."""
    drafter, feats, anchors, block_emb = _equivalence_case(tiny, "cpu")
    S, B = feats.shape[1], drafter.block_size
    pos = torch.arange(S)[None]
    good = anchor_block_mask(anchors, pos, B)
    leaky = good.clone()
    a = anchors.repeat_interleave(B, dim=1)[0]
    leaky[0, 0, :, :S] = pos[0][None, :] <= a[:, None]
    ctx_kv = drafter.context_kv(drafter.project_context(feats), pos)
    bp = block_positions(anchors, B)
    infer = _inference_blocks(drafter, feats, anchors, block_emb)
    torch.testing.assert_close(drafter.forward_block(block_emb, bp, ctx_kv, good), infer, atol=1e-5, rtol=1e-5)
    assert (drafter.forward_block(block_emb, bp, ctx_kv, leaky) - infer).abs().max() > 1e-3


def test_packed_documents_see_only_their_own_context(tiny):
    drafter, feats, _, _ = _equivalence_case(tiny, "cpu")
    B, g = drafter.block_size, torch.Generator().manual_seed(1)
    doc = torch.tensor([[0] * 10 + [1] * 14])
    pos = torch.cat([torch.arange(10), torch.arange(14)])[None]
    anchors = torch.tensor([[4, 15]])  # doc 0 position 4, doc 1 position 5
    emb = torch.randn(1, 2 * B, 64, generator=g)
    first = drafter(emb[:, :B], feats[:, :4], torch.arange(4 + B)[None])
    second = drafter(emb[:, B:], feats[:, 10:15], torch.arange(5 + B)[None])
    for impl in ("dense", "blockwise"):
        train = multi_anchor_forward(drafter, feats, emb, anchors, ctx_positions=pos, doc_ids=doc, impl=impl)
        torch.testing.assert_close(train, torch.cat([first, second], 1), atol=1e-5, rtol=1e-5)


def test_noise_hook_applies_to_fc_input_only(tiny):
    from core.ml.models.drafter import uniform_feature_noise

    drafter, feats, anchors, block_emb = _equivalence_case(tiny, "cpu")
    seen = []
    out = multi_anchor_forward(drafter, feats, block_emb, anchors, noise_fn=lambda f: seen.append(f) or f + 0.05)
    assert len(seen) == 1 and seen[0].shape == feats.shape
    assert not torch.allclose(out, multi_anchor_forward(drafter, feats, block_emb, anchors))
    noisy = uniform_feature_noise(0.05)(feats)
    assert 0 < (noisy - feats).abs().max() <= 0.05


def test_bfloat16_drafter_runs(tiny, device):
    cfg = tiny.tiny_drafter_config(tiny.tiny_target_config(), block_size=4)
    model = tiny.build_tiny_drafter(cfg).to(device=device, dtype=torch.bfloat16)
    out = model(torch.randn(1, 4, 64, device=device), torch.randn(1, 6, 128, device=device), torch.arange(10, device=device)[None])
    assert out.dtype == torch.bfloat16 and out.device.type == device and torch.isfinite(out.float()).all()


@pytest.mark.parametrize("sliding_window,override", [(None, "rule"), (3, "rule"), (5, "is_causal=false")])
def test_blockwise_and_dense_training_gradients_agree(tiny, sliding_window, override):
    drafter, feats, anchors, block_emb = _equivalence_case(tiny, "cpu", sliding_window, override)
    grads = {}
    for impl in ("dense", "blockwise"):
        drafter.zero_grad()
        (multi_anchor_forward(drafter, feats, block_emb, anchors, impl=impl) ** 2).sum().backward()
        grads[impl] = {n: p.grad.clone() for n, p in drafter.named_parameters()}
    for name, g in grads["dense"].items():
        torch.testing.assert_close(grads["blockwise"][name], g, atol=1e-5 * g.abs().max().item(), rtol=1e-4)
