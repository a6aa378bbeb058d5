"""Reference trainer, unit level: config, loss, data paths, and the v4 options one by one.

The workspace (tiny Qwen3 target + tokenizer, a real ``core.ml.extract`` cache of the drafter's
taps 0, 2 plus the final layer 3, and a taps-only copy) is built once per session by
:func:`workspace` and shared with ``test_train_cli.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.ml.train import trainer as train_mod  # noqa: E402
from core.ml.train import config as tc  # noqa: E402
from core.ml.train import data as td  # noqa: E402
from core.ml.train import loss as tl  # noqa: E402
from core.ml.formats.runio import run_main  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
B, TAPS, FINAL, H = 8, [0, 2], 3, 64
PROMPT_SEEDS = range(200, 206)
GEN = 40

BASE_YAML = """\
target: target
out_dir: runs/default
drafter: {block_size: 8, num_layers: 2, target_layer_ids: [0, 2]}
data: {features: feats}
train: {max_steps: 200, batch_size: 1, anchors_per_sequence: 32, lr: 3.0e-3, warmup_steps: 10,
        log_every: 10, checkpoint_every: 100}
"""


def workspace(tmp_path_factory, tiny, target) -> Path:
    """Build (once per session) ``target/``, ``prompts.jsonl``, ``feats/`` (layers 0,2,3),
    ``feats_taps/`` (layers 0,2 only) and ``base.yaml`` under one directory."""
    root = tmp_path_factory.getbasetemp() / "train-ws"
    if (root / "ready").exists():
        return root
    from core.ml.tasks import extract
    from core.ml.formats import featstore

    root.mkdir(exist_ok=True)
    target.save_pretrained(root / "target")
    tiny.tiny_tokenizer().save_pretrained(root / "target")
    rows = [{"id": f"s{s}", "input_ids": tiny.fit_prompt(torch.Generator().manual_seed(s))} for s in PROMPT_SEEDS]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--target", str(root / "target"), "--prompts", str(root / "prompts.jsonl"), "--layers", "0,2,3",
            "--out", str(root / "feats"), "--max-new-tokens", str(GEN), "--ignore-eos"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert run_main(extract.main, argv) == 0
    finally:
        torch.set_num_threads(threads)
    manifest = featstore.load_manifest(root / "feats")
    taps = root / "feats_taps"
    taps.mkdir()
    new = {**manifest, "layer_ids": TAPS, "feature_dim": len(TAPS) * H, "entries": {}}
    for pid, e in manifest["entries"].items():
        seq = featstore.read_entry(root / "feats", pid, e)
        seq.features = seq.features[:, : len(TAPS) * H]
        new["entries"][pid] = {**e, "file": featstore.write_entry(taps, seq)}
    featstore.save_manifest(taps, new)
    (root / "base.yaml").write_text(BASE_YAML)
    (root / "ready").touch()
    return root


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tiny, qwen3_target) -> Path:
    return workspace(tmp_path_factory, tiny, qwen3_target)


@pytest.fixture()
def one_thread():
    """Tiny matrices: one thread is faster than two, and far faster on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def resolved(ws: Path, **over) -> tc.TrainConfig:
    cfg = tc.load_config(ws / "base.yaml", over)
    return tc.resolve(cfg, "base.yaml", tc.read_target_config(cfg.target), 3)


def cache(ws: Path, name: str = "feats") -> td.FeatureCache:
    from core.ml.tasks.extract import target_fingerprint

    return td.FeatureCache(ws / name, TAPS, FINAL, target_fingerprint(ws / "target"), 3072, H)


# ----------------------------------------------------------------------------- config


def test_unknown_key_names_it_and_suggests(tmp_path):
    (tmp_path / "train.yaml").write_text("target: t\ndata: {features: f}\nloss: {gama: 7}\n")
    with pytest.raises(tc.ConfigError) as exc:
        tc.load_config(tmp_path / "train.yaml")
    assert str(exc.value) == "train.yaml: unknown key 'gama' in section 'loss' (did you mean 'gamma'?)"
    (tmp_path / "train.yaml").write_text("target: t\ndata: {features: f}\nfc_layer: taps\n")
    with pytest.raises(tc.ConfigError, match=r"unknown key 'fc_layer' \(did you mean 'fc_layers'\?\)"):
        tc.load_config(tmp_path / "train.yaml")


@pytest.mark.parametrize("text, match", [
    ("noise: {target: everything}", r"'noise.target' must be one of fc_input, all_features"),
    ("train: {lr: fast}", r"'train.lr' must be a number"),
    ("train: {max_steps: 1.5}", r"'train.max_steps' must be an integer"),
    ("loss: {streak_weighting: 1}", r"'loss.streak_weighting' must be true or false"),
    ("loss: {soft_kl_weight: 1.5}", r"'loss.soft_kl_weight' must be in \[0, 1\]"),
    ("drafter: {target_layer_ids: [0, 0]}", r"'drafter.target_layer_ids' has duplicates"),
    ("data: {features: f, file: x.jsonl}", r"'data.features' and 'data.file': give exactly one"),
    ("data: {features: f}", r"duplicate key 'data'"),
])
def test_bad_values_name_the_key(tmp_path, text, match):
    (tmp_path / "c.yaml").write_text("target: t\n" + ("" if text.startswith("data: {features: f,") else
                                                     "data: {features: f}\n") + text + "\n")
    with pytest.raises(tc.ConfigError, match=match):
        tc.load_config(tmp_path / "c.yaml")


def test_paths_relative_to_file_and_yaml11_floats(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yaml").write_text("target: ../t\nout_dir: o\ndata: {features: f}\ntrain: {lr: 3e-3}\n")
    cfg = tc.load_config(tmp_path / "sub" / "c.yaml")
    assert cfg.target == str((tmp_path / "t").resolve()) and cfg.out_dir == str((tmp_path / "sub" / "o").resolve())
    assert cfg.train.lr == 0.003  # PyYAML reads 3e-3 as a string; accepted as a number


def test_gamma_by_block_size_unless_set(ws):
    assert [tc.default_gamma(b) for b in (16, 10, 8, 4)] == [7.0, 5.0, 4.0, 7.0]
    assert resolved(ws).loss.gamma == 4.0
    assert resolved(ws, drafter={"block_size": 16}).loss.gamma == 7.0
    assert resolved(ws, loss={"gamma": 10}).loss.gamma == 10.0


def test_resolve_fills_shape_and_refuses_final_tap(ws):
    cfg = resolved(ws)
    d = cfg.drafter
    assert (d.num_attention_heads, d.num_key_value_heads, d.head_dim, d.intermediate_size) == (4, 2, 16, 128)
    assert d.mask_token_id == 3 and cfg.data.min_loss_tokens == 2 * B
    with pytest.raises(tc.ConfigError, match=r"'drafter.target_layer_ids' contains the final layer 3"):
        resolved(ws, drafter={"target_layer_ids": [0, 3]})


def test_shipped_configs_list_every_knob_and_differ_in_v4_knobs():
    v5 = tc.load_config(REPO / "plans/train/v5.yaml")
    v4 = tc.load_config(REPO / "plans/train/v4-legacy.yaml")
    import yaml

    raw = tc.flatten(yaml.safe_load((REPO / "plans/train/v5.yaml").read_text()))
    assert set(raw) == set(tc.flatten(tc.TrainConfig().to_dict()))  # a complete, documented example
    assert set(tc.knob_diff(v5.to_dict(), v4.to_dict())) == set(tc.V4_KNOBS)
    assert v5.to_dict() == tc.load_config(REPO / "plans/train/v5.yaml", {}).to_dict()
    defaults = tc.flatten(tc.TrainConfig().to_dict())
    for key in ("fc_layers", "noise.target", "loss.soft_kl_weight", "loss.streak_weighting", "loss.gamma"):
        assert tc.flatten(v5.to_dict())[key] == defaults[key]  # v5 = the defaults for every v4 knob


def test_describe_documents_every_knob(capsys):
    assert run_main(train_mod.main, ["--describe"]) == 0
    text = capsys.readouterr().out
    for key in tc.flatten(tc.TrainConfig().to_dict()):
        assert f"{key} = " in text, key


# ----------------------------------------------------------------------------- loss


def test_decay_weights_and_hard_ce_by_hand():
    w = tl.decay_weights(4, 2.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-0.5), math.exp(-1.0)]))
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[1, 2, 3], [4, 0, 1]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    out = tl.dflash_loss(logits, labels, mask, gamma=2.0)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 5), labels.reshape(-1), reduction="none").view(2, 3)
    ww = w[None] * mask
    assert torch.allclose(out.loss, (ww * ce).sum() / ww.sum())
    assert torch.allclose(tl.dflash_loss(logits, labels, mask, 2.0, "mask").loss, (ww * ce).sum() / mask.sum())
    assert out.total.tolist() == [2, 2, 1]


def test_streak_weighting_is_prefix_probability():
    ce = torch.tensor([[0.5, 1.0, 2.0, 0.1]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    s = tl.streak_weights(ce, mask)
    q0, q2 = math.exp(-0.5), math.exp(-2.0)
    assert torch.allclose(s, torch.tensor([[1.0, q0, q0, q0 * q2]]))  # a masked slot neither breaks nor extends
    logits = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(1), requires_grad=True)
    labels = torch.randint(6, (3, 4), generator=torch.Generator().manual_seed(2))
    on = tl.dflash_loss(logits, labels, torch.ones(3, 4), 10.0, streak_weighting=True)
    off = tl.dflash_loss(logits, labels, torch.ones(3, 4), 10.0)
    assert not torch.allclose(on.loss, off.loss)


def test_soft_kl_mix_by_hand():
    g = torch.Generator().manual_seed(3)
    s, t = torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    T = 2.0
    p = torch.softmax(t / T, -1)
    kl = T * T * (p * (torch.log_softmax(t / T, -1) - torch.log_softmax(s / T, -1))).sum(-1)
    assert torch.allclose(tl.soft_kl(s, t, T), kl)
    assert torch.allclose(tl.soft_kl(t, t, T), torch.zeros(2, 3), atol=1e-6)
    labels, mask = t.argmax(-1), torch.ones(2, 3)
    ce = tl.dflash_loss(s, labels, mask, 10.0).loss
    mix = tl.dflash_loss(s, labels, mask, 10.0, teacher_logits=t, soft_kl_weight=0.7, temperature=T).loss
    w = tl.decay_weights(4, 10.0)[None]
    assert torch.allclose(mix, 0.3 * ce + 0.7 * (w * kl).sum() / (w.sum() * 2))


def test_eal_and_accuracy_by_hand():
    assert tl.expected_acceptance_length([0.5, 0.5]) == 0.75
    assert tl.expected_acceptance_length([1.0, 1.0, 0.0]) == 2.0
    assert tl.per_position_accuracy(torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.0])) == [0.5, 0.0]
    logits = torch.zeros(2, 3, 4)
    labels = torch.tensor([[1, 1, 2], [1, 3, 1]])
    logits[0, 0, 1] = logits[0, 1, 1] = logits[0, 2, 0] = logits[1, 0, 2] = 5  # block 0: streak 2, block 1: 0
    out = tl.dflash_loss(logits, labels, torch.ones(2, 3), 4.0)
    assert out.correct.tolist() == [1, 1, 0] and out.streak_sum == 2 and out.blocks == 2


def test_lr_schedule_warmup_then_cosine():
    f = [train_mod.lr_factor(s, 100, 10, 0.1) for s in range(100)]
    assert f[0] == 0.1 and f[9] == 1.0 and f[10] == 1.0
    assert all(a >= b for a, b in zip(f[10:], f[11:])) and abs(f[-1] - 0.1) < 1e-3


# ----------------------------------------------------------------------------- data paths and v4 options


def test_anchor_rule_and_determinism():
    m = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1], dtype=torch.bool)
    assert td.anchor_candidates(m).tolist() == [2, 3, 6]  # loss_mask[a] and loss_mask[a+1]
    a1 = td.sample_anchors(torch.ones(50, dtype=torch.bool), 8, torch.Generator().manual_seed(5))
    a2 = td.sample_anchors(torch.ones(50, dtype=torch.bool), 8, torch.Generator().manual_seed(5))
    assert torch.equal(a1, a2) and a1.numel() == 8 and torch.equal(a1, a1.sort().values)


def test_default_noise_leaves_target_logits_bit_identical(ws, qwen3_target):
    s = cache(ws).load(0)
    head = qwen3_target.get_output_embeddings()
    clean_fc, clean_final = td.model_inputs(s.taps, s.final, "taps", 0.0, "fc_input", None)
    fc, final = td.model_inputs(s.taps, s.final, "taps", 0.05, "fc_input", torch.Generator().manual_seed(0))
    assert not torch.equal(fc, clean_fc)  # fc's input is noised ...
    assert torch.equal(final, clean_final) and torch.equal(head(final), head(clean_final))  # ... the logits are not
    fc4, final4 = td.model_inputs(s.taps, s.final, "taps", 0.05, "all_features", torch.Generator().manual_seed(0))
    assert not torch.equal(fc4, clean_fc)
    assert not torch.equal(final4, clean_final) and not torch.equal(head(final4), head(clean_final))  # v4 bug


def test_fc_width_taps_vs_taps_and_final(ws):
    t_cfg = tc.read_target_config(ws / "target")
    for fc_layers, width, ids in (("taps", 2 * H, TAPS), ("taps_and_final", 3 * H, [*TAPS, FINAL])):
        cfg = resolved(ws, fc_layers=fc_layers)
        dcfg = tc.drafter_config_dict(cfg, t_cfg)
        assert train_mod.new_drafter(dcfg, 0.02, 0).fc.in_features == width
        assert dcfg["dflash_config"]["target_layer_ids"] == ids
        s = cache(ws).load(0)
        fc_in, _ = td.model_inputs(s.taps, s.final, fc_layers, 0.0, "fc_input", None)
        assert fc_in.shape == (len(s), width)
        if fc_layers == "taps_and_final":
            assert torch.equal(fc_in[:, 2 * H:], s.final)  # the shortcut: fc sees the label layer


def test_final_layer_gives_the_cached_greedy_labels(ws, qwen3_target):
    head = qwen3_target.get_output_embeddings()
    for i in range(3):
        s = cache(ws).load(i)
        assert torch.equal(head(s.final).argmax(-1), s.labels)
        assert torch.equal(s.labels[s.loss_mask][:-1], s.input_ids[s.loss_mask][1:])  # greedy continuation


def test_packed_training_forward_equals_inference_path(ws, tiny, qwen3_target, one_thread):
    """Two packed sequences, random anchors: every block equals the inference forward with
    context F[:a] of its own sequence (positions restart per sequence, no cross-sequence context)."""
    from core.ml.models.drafter import block_token_ids

    cfg = tiny.tiny_drafter_config(qwen3_target.config, block_size=B, target_layer_ids=TAPS)
    drafter = tiny.build_tiny_drafter(cfg, seed=4)
    src = cache(ws)
    samples = [src.load(0), src.load(1)]
    batch = td.pack(samples, 5, torch.Generator().manual_seed(1))
    embed = qwen3_target.get_input_embeddings()
    with torch.no_grad():
        emb = embed(block_token_ids(batch.input_ids[None], batch.anchors[None], B, 3))
        h = tl.TrainForward(drafter)(batch.taps[None], emb, batch.anchors[None], batch.positions[None],
                                     batch.doc[None])[0].view(-1, B, H)
        for j, a in enumerate(batch.anchors.tolist()):
            doc, pos = int(batch.doc[a]), int(batch.positions[a])
            s = samples[doc]
            block = torch.full((1, B), 3)
            block[0, 0] = s.input_ids[pos]
            ref = drafter(embed(block), s.taps[:pos][None], torch.arange(pos + B)[None])[0]
            assert torch.allclose(h[j], ref, atol=1e-4), (j, a)
    assert set(batch.doc[batch.anchors].tolist()) == {0, 1}


def test_dense_and_blockwise_attention_give_the_same_gradients(ws, tiny, qwen3_target, one_thread):
    cfg = resolved(ws)
    dcfg = tc.drafter_config_dict(cfg, tc.read_target_config(ws / "target"))
    grads = []
    for impl in ("dense", "blockwise"):
        drafter = train_mod.new_drafter(dcfg, 0.1, 0)
        batch = td.pack([cache(ws).load(0), cache(ws).load(1)], 6, torch.Generator().manual_seed(2))
        out = tl.batch_loss(tl.TrainForward(drafter, impl), qwen3_target.get_input_embeddings(),
                            qwen3_target.get_output_embeddings(), batch, cfg, torch.Generator().manual_seed(3), drafter.config)
        out.loss.backward()
        grads.append({k: p.grad.clone() for k, p in drafter.named_parameters()})
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-5, rtol=1e-4), k


@pytest.mark.parametrize("labels", ["target", "data"])
def test_label_sources_agree_on_greedy_data(ws, qwen3_target, labels, one_thread):
    """The cache holds the target's greedy continuation, so data tokens == target argmax labels,
    and a taps-only cache (cached labels) gives the same loss as the final-layer path."""
    losses = []
    for name in ("feats", "feats_taps"):
        cfg = resolved(ws, loss={"labels": labels}, noise={"std": 0.0})
        drafter = train_mod.new_drafter(tc.drafter_config_dict(cfg, tc.read_target_config(ws / "target")), 0.1, 0)
        batch = td.pack([cache(ws, name).load(2)], 8, torch.Generator().manual_seed(4))
        assert (batch.final is None) == (name == "feats_taps")
        out = tl.batch_loss(tl.TrainForward(drafter), qwen3_target.get_input_embeddings(),
                            qwen3_target.get_output_embeddings(), batch, cfg, None, drafter.config)
        losses.append(out.loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


def test_taps_only_cache_refuses_v4_options_naming_the_key(ws, capsys):
    argv = ["--config", str(ws / "base.yaml"), "--out", str(ws / "runs" / "refused"), "--set", "data.features=feats_taps"]
    assert run_main(train_mod.main, [*argv, "--set", "noise.target=all_features"]) == 2
    err = capsys.readouterr().err
    assert "'noise.target' needs the target's final layer 3" in err and "--layers 0,2,3" in err
    assert run_main(train_mod.main, [*argv, "--set", "fc_layers=taps_and_final"]) == 2
    assert "'fc_layers' needs the target's final layer 3" in capsys.readouterr().err


def test_jsonl_rows_and_on_the_fly_features_match_the_cache(ws, qwen3_target, tmp_path):
    from core.ml.formats.featstore import load_manifest, read_entry

    manifest = load_manifest(ws / "feats")
    pid, e = next(iter(manifest["entries"].items()))
    seq = read_entry(ws / "feats", pid, e)
    ids = seq.input_ids.tolist()
    rows = [{"id": "a", "input_ids": ids[: seq.prompt_len], "response_ids": ids[seq.prompt_len:]},
            {"input_ids": ids[:5], "loss_mask": [0, 0, 1, 1, 1]},
            {"text": "The quick brown fox"}, {"prompt": "What is 12 times 7?", "response": "Eighty-four."},
            {"id": "gen", "input_ids": ids[: seq.prompt_len]}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from core.ml.models.target import load_tokenizer

    src = td.JsonlSource(tmp_path / "d.jsonl", load_tokenizer(ws / "target"), 320, 3072, GEN)
    src.bind(qwen3_target, [])
    s = td.featurize(qwen3_target, src.load(0), TAPS, FINAL)
    assert torch.equal(s.input_ids, seq.input_ids) and torch.equal(s.loss_mask, torch.arange(len(ids)) >= seq.prompt_len)
    assert torch.allclose(s.taps, seq.features[:, : 2 * H], atol=1e-5)
    assert torch.allclose(s.final, seq.features[:, 2 * H:], atol=1e-5)
    assert src.load(1).loss_mask.tolist() == [False, False, True, True, True]
    assert src.load(2).loss_mask.all() and src.load(3).loss_mask.any() and not src.load(3).loss_mask.all()
    assert torch.equal(src.load(4).input_ids, seq.input_ids)  # prompt-only row: the target's greedy continuation
    (tmp_path / "bad.jsonl").write_text('{"input_ids": [1, 2]}\n{"prompt": "x", "input_ids": [1]}\n')
    from core.ml.formats.runio import UsageError

    with pytest.raises(UsageError, match=r"bad.jsonl:2: give exactly one of"):
        td.JsonlSource(tmp_path / "bad.jsonl", None, 320, 3072, 4)


def test_a_sequence_without_anchors_still_runs_the_forward(ws, qwen3_target):
    """No anchor candidate (e.g. a one-token response): zero loss, but forward and backward run
    (under DDP every rank must take part in the gradient all-reduce)."""
    cfg = resolved(ws)
    drafter = train_mod.new_drafter(tc.drafter_config_dict(cfg, tc.read_target_config(ws / "target")), 0.1, 0)
    s = cache(ws).load(0)
    s.loss_mask = torch.zeros_like(s.loss_mask)
    batch = td.pack([s], 8, torch.Generator().manual_seed(0))
    assert batch.anchors.numel() == 0
    out = tl.batch_loss(tl.TrainForward(drafter), qwen3_target.get_input_embeddings(),
                        qwen3_target.get_output_embeddings(), batch, cfg, torch.Generator().manual_seed(1),
                        drafter.config)
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.den == 0 and out.total.sum() == 0
    assert drafter.fc.weight.grad is not None and not drafter.fc.weight.grad.any()


def test_checkpoint_files_latest_pruning_and_resume_choice(tmp_path):
    from core.ml.train import runtime as rt
    from core.ml.formats.runio import UsageError

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    assert rt.resolve_resume(None, tmp_path) is None and rt.resolve_resume("auto", tmp_path) is None
    for step in (5, 10, 15):
        rt.save_checkpoint(tmp_path, step, model, opt, sched, {"seed": 0}, {}, {}, keep=2)
    assert [s for s, _ in rt.checkpoint_files(tmp_path)] == [10, 15]
    assert (tmp_path / "latest").read_text() == "step_15.pt\n"
    assert rt.resolve_resume("auto", tmp_path) == tmp_path / "step_15.pt"
    assert not list(tmp_path.glob(".*tmp"))  # atomic writes leave no temp files
    with pytest.raises(UsageError, match="already holds checkpoints"):
        rt.resolve_resume(None, tmp_path)
    with pytest.raises(UsageError, match="checkpoint not found"):
        rt.resolve_resume(str(tmp_path / "step_99.pt"), tmp_path)
    ckpt = torch.load(tmp_path / "step_15.pt", weights_only=True)
    assert ckpt["step"] == 15 and set(ckpt["model"]) == {"weight", "bias"}


def test_pruning_keeps_the_steps_other_items_name(tmp_path):
    """``train.keep_steps`` (specdeck lists the steps another item names): never pruned."""
    from core.ml.train import runtime as rt

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for step in (5, 10, 15, 20, 25):
        rt.save_checkpoint(tmp_path, step, model, opt, sched, {"seed": 0}, {}, {}, keep=2,
                           pins=[10])
    assert [s for s, _ in rt.checkpoint_files(tmp_path)] == [10, 20, 25]


def test_the_drafters_forward_knobs_shape_the_training_loss(ws, qwen3_target, one_thread):
    """input_embedding_scale and the logit knobs apply in training as in eval (docs/drafter.md §4):
    the same weights and batch give another loss with each knob set."""
    import dataclasses

    cfg = resolved(ws, noise={"std": 0.0})
    drafter = train_mod.new_drafter(tc.drafter_config_dict(cfg, tc.read_target_config(ws / "target")), 0.1, 0)
    batch = td.pack([cache(ws).load(0)], 8, torch.Generator().manual_seed(4))
    emb, head = qwen3_target.get_input_embeddings(), qwen3_target.get_output_embeddings()

    def loss(config):
        return tl.batch_loss(tl.TrainForward(drafter), emb, head, batch, cfg, None, config).loss.item()

    plain = loss(drafter.config)
    for knob, value in (("input_embedding_scale", 1.8), ("output_multiplier", 0.4), ("final_logit_softcapping", 2.0)):
        assert loss(dataclasses.replace(drafter.config, **{knob: value})) != pytest.approx(plain, rel=1e-4), knob


def test_no_sequence_long_enough_says_which_knob_to_turn(ws, capsys):
    """Answers shorter than data.min_loss_tokens (a target that stops early): exit 2, the longest
    answer's length against the knob, and what to change; no run directory is left behind."""
    out = ws / "runs" / "too-short"
    argv = ["--config", str(ws / "base.yaml"), "--out", str(out)]
    assert run_main(train_mod.main, [*argv, "--set", f"data.min_loss_tokens={GEN + 1}"]) == 2
    err = capsys.readouterr().err
    n = len(PROMPT_SEEDS)
    assert f"no training sequences left ({n} in the data, {n} too short" in err
    assert f"the longest has {GEN} supervised tokens and data.min_loss_tokens is {GEN + 1}" in err
    assert "Lower data.min_loss_tokens" in err and "max_new_tokens" in err
    assert run_main(train_mod.main, [*argv, "--set", f"data.val_count={n}"]) == 2
    err = capsys.readouterr().err
    assert (f"({n} in the data, 0 too short, {n} held out for validation): {n} long enough, all held out; "
            f"lower data.val_count ({n})") in err
    assert not (out / "checkpoints").exists()
