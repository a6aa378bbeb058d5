"""The real campaign's trainer configs, fine-tuning layouts and mismatch refusals (issue 14 §2, §5, §6).

* ``plans/train/qwen3.6-27b-v5.yaml`` resolves (``--print-config``, no model loaded) to exactly
  the published Qwen3.6-27B drafter: the drafter it builds on ``meta`` has every tensor name
  and shape of the one built from the published config.json, and the same per-layer layout.
* v4-legacy differs from it only in the v4 knobs.
* Fine-tuning from a sliding-window ``drafter.init`` keeps that drafter's config.json layout.
* A config that cannot fit its target or feature cache is refused before any device is used
  (exit 2, both sides named, and the fix).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.ml.train import trainer as train_mod  # noqa: E402
from core.ml.train import config as tc  # noqa: E402
from core.ml.models.drafter import DFlashDrafter, save_drafter  # noqa: E402
from core.ml.formats.drafter_config import DFlashConfig  # noqa: E402
from core.ml.formats.runio import run_main  # noqa: E402
from tests.ml.models.test_ml_drafter import PUBLISHED  # noqa: E402
from tests.ml.train.test_train import REPO, workspace  # noqa: E402

V5_27B = REPO / "plans/train/qwen3.6-27b-v5.yaml"
V4_27B = REPO / "plans/train/qwen3.6-27b-v4-legacy.yaml"


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tiny, qwen3_target) -> Path:
    return workspace(tmp_path_factory, tiny, qwen3_target)


def print_config(config: Path, *sets: str) -> tuple[int, str, str]:
    """``python -m core.ml.train --config FILE --print-config`` as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "core.ml.train", "--config", str(config), "--print-config"]
    for s in sets:
        argv += ["--set", s]
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    return p.returncode, p.stdout, p.stderr


def qwen36_27b_target_config() -> dict:
    """The campaign target's config.json layout (composite qwen3_5, sizes in text_config)."""
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": {"model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64,
                            "vocab_size": 248320, "num_attention_heads": 24, "num_key_value_heads": 4,
                            "head_dim": 256, "intermediate_size": 17408, "rms_norm_eps": 1e-6,
                            "max_position_embeddings": 262144, "rope_parameters": {"rope_theta": 10000000}}}


def test_27b_v5_config_resolves_to_the_published_drafter_shape():
    rc, out, err = print_config(V5_27B)
    assert rc == 0, err
    assert len(out.strip().splitlines()) == 1  # ONE JSON object on stdout
    cfg = json.loads(out)
    d = cfg["drafter"]
    assert (d["block_size"], d["num_layers"], d["target_layer_ids"]) == (16, 5, [1, 16, 31, 46, 61])
    assert d["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"] and d["sliding_window"] == 2048
    assert (d["mask_token_id"], d["rope_theta"], d["vocab_size"], d["hidden_size"]) == (248070, 1e7, 248320, 5120)
    assert cfg["loss"]["gamma"] == 7.0 and cfg["train"]["lr"] == 6e-4
    assert cfg["train"]["anchors_per_sequence"] == 512 and cfg["train"]["warmup_ratio"] == 0.04
    assert (cfg["train"]["epochs"], cfg["train"]["grad_clip"], cfg["data"]["max_length"]) == (6.0, 1.0, 3072)

    mine = DFlashConfig.from_dict(tc.drafter_config_dict(tc.from_dict(cfg, "printed")))
    published = DFlashConfig.from_file(PUBLISHED / "qwen3.6-27b-dflash.json")
    with torch.device("meta"):
        a, b = DFlashDrafter(mine), DFlashDrafter(published)
    shapes = {k: tuple(v.shape) for k, v in a.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in b.state_dict().items()}
    assert len(shapes) == 58 and shapes["fc.weight"] == (5120, 5 * 5120)
    assert mine.attention_rules() == published.attention_rules()  # 4 x causal window 2048 + 1 full
    assert (mine.layer_types, mine.sliding_window, mine.rope_theta, mine.block_size) == (
        published.layer_types, published.sliding_window, published.rope_theta, published.block_size)

    # --set reaches the printed config; nested keys stay nested
    rc, out, _ = print_config(V5_27B, "train.lr=1e-4", "drafter.sliding_window=1024")
    assert rc == 0 and json.loads(out)["train"]["lr"] == 1e-4 and json.loads(out)["drafter"]["sliding_window"] == 1024


def test_27b_v4_legacy_differs_only_in_the_v4_knobs():
    v5, v4 = tc.load_config(V5_27B), tc.load_config(V4_27B)
    assert set(tc.knob_diff(v5.to_dict(), v4.to_dict())) == set(tc.V4_KNOBS) | {"out_dir"} - set(tc.RUN_KEYS)
    import yaml

    raw = tc.flatten(yaml.safe_load(V5_27B.read_text()))
    assert set(raw) == set(tc.flatten(tc.TrainConfig().to_dict()))  # every knob written out


def test_27b_config_against_a_27b_target_and_a_wrong_one(tmp_path):
    """With the target's config.json readable the sizes are checked against it."""
    target = tmp_path / "Qwen3.6-27B"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(qwen36_27b_target_config()))
    rc, out, err = print_config(V5_27B, f"target={target}")
    assert rc == 0, err
    assert json.loads(out)["drafter"]["num_target_layers"] == 64
    wrong = qwen36_27b_target_config()
    wrong["text_config"].update(hidden_size=4096, num_hidden_layers=36)  # a Qwen3-8B-sized target
    (target / "config.json").write_text(json.dumps(wrong))
    rc, out, err = print_config(V5_27B, f"target={target}")
    assert rc == 2 and out == ""
    msg = err.strip().splitlines()[-1]
    assert "drafter.num_target_layers' is 64" in msg and "36" in msg and "point 'target'" in msg
    assert "Traceback" not in err


def test_loader_reads_every_published_config():
    names = sorted(p.name for p in PUBLISHED.glob("*.json"))
    assert len(names) >= 8
    for name in names:
        raw = json.loads((PUBLISHED / name).read_text())
        cfg = DFlashConfig.from_dict(raw)
        again = cfg.to_dict()
        assert {k: again.get(k) for k in raw} == {k: v for k, v in raw.items()}, name  # nothing lost or changed


# ----------------------------------------------------------------------------- §2 fine-tune keeps the layout


def test_finetune_from_a_sliding_init_keeps_its_config_layout(ws, tiny, tmp_path, capsys):
    raw_init = DFlashConfig(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=96, vocab_size=320, block_size=8, mask_token_id=3, target_layer_ids=[0, 2],
        num_target_layers=4, rope_theta=1e6, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        sliding_window=6).to_dict()
    raw_init.update(max_window_layers=3, use_sliding_window=True, eos_token_id=2, initializer_range=0.02,
                    auto_map={"AutoModel": "dflash.DFlashDraftModel"})
    raw_init["dflash_config"]["causal"] = None  # odd but published-shaped keys survive too
    init_dir = tmp_path / "init"
    save_drafter(tiny.build_tiny_drafter(DFlashConfig.from_dict(raw_init), seed=5), init_dir)
    saved_init = json.loads((init_dir / "config.json").read_text())
    saved_init.update({k: raw_init[k] for k in ("max_window_layers", "eos_token_id", "initializer_range", "auto_map")})
    (init_dir / "config.json").write_text(json.dumps(saved_init))

    capsys.readouterr()
    rc = run_main(train_mod.main, ["--config", str(ws / "base.yaml"), "--out", str(tmp_path / "run"),
                                   "--max-steps", "5", "--set", f"drafter.init={init_dir}",
                                   "--set", "drafter.num_layers=3", "--set", "train.checkpoint_every=5"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    written = json.loads((tmp_path / "run/config.json").read_text())
    for key, value in saved_init.items():
        if key != "dtype":
            assert written.get(key) == value, key
    assert written["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention"]
    assert (written["sliding_window"], written["use_sliding_window"], written["max_window_layers"]) == (6, True, 3)
    ckpt = torch.load(tmp_path / "run/step_5.pt", weights_only=True)
    assert ckpt["drafter_config"]["layer_types"] == written["layer_types"]
    info = next(json.loads(x) for x in out.out.splitlines() if '"info"' in x)
    assert [x["causal"] for x in info["attention"]["layers"]] == [True, True, False]
    assert "drafter attention: layers 0-1 sliding_attention: causal, window 6 from each query" in out.err
    from core.ml.tasks import strip as strip_mod

    assert run_main(strip_mod.main, [str(tmp_path / "run/step_5.pt"), str(tmp_path / "stripped")]) == 0
    stripped = json.loads((tmp_path / "stripped/config.json").read_text())
    assert stripped["layer_types"] == written["layer_types"] and stripped["max_window_layers"] == 3


def test_trainer_drafter_block_may_name_layer_types(ws, tmp_path):
    cfg = tc.resolve(tc.load_config(ws / "base.yaml", {"drafter": {
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5}}), "base.yaml",
        tc.read_target_config(ws / "target"), 3)
    d = DFlashConfig.from_dict(tc.drafter_config_dict(cfg))
    assert d.layer_types == ["sliding_attention", "full_attention"] and d.sliding_window == 5
    assert [r.causal for r in d.attention_rules()] == [True, False]
    with pytest.raises(tc.ConfigError, match="drafter.sliding_window"):
        tc.load_config(ws / "base.yaml", {"drafter": {"layer_types": ["sliding_attention", "full_attention"]}})
    with pytest.raises(tc.ConfigError, match="2 entries for drafter.num_layers 3"):
        tc.load_config(ws / "base.yaml", {"drafter": {"num_layers": 3, "layer_types": ["full_attention"] * 2}})
    with pytest.raises(tc.ConfigError, match="one of full_attention, sliding_attention"):
        tc.load_config(ws / "base.yaml", {"drafter": {"layer_types": ["chunked_attention", "full_attention"]}})


# ----------------------------------------------------------------------------- §6 mismatches refused


@pytest.mark.parametrize("case,sets,expect", [
    ("tap missing from the cache", ["data.features=feats_taps", "drafter.target_layer_ids=[0,1]"],
     ["holds layers [0, 2]", "[0, 1] need [1]", "extract --layers 0,1,3"]),
    ("tap beyond the target", ["drafter.target_layer_ids=[0,7]"], ["[7] outside the target's layers 0..3"]),
    ("hidden size", ["drafter.hidden_size=128"], ["'drafter.hidden_size' is 128", "hidden_size 64"]),
    ("vocab", ["drafter.vocab_size=151936"], ["'drafter.vocab_size' is 151936", "vocab_size 320"]),
    ("final layer not in the cache", ["data.features=feats_taps", "fc_layers=taps_and_final"],
     ["final layer 3", "holds layers [0, 2]", "extract --layers 0,2,3"]),
])
def test_mismatches_are_refused_before_any_device(ws, tmp_path, capsys, monkeypatch, case, sets, expect):
    touched = []
    monkeypatch.setattr("core.ml.models.target.resolve_device", lambda *a, **k: touched.append(a) or torch.device("cpu"))
    argv = ["--config", str(ws / "base.yaml"), "--out", str(tmp_path / "o")]
    for s in sets:
        argv += ["--set", s]
    capsys.readouterr()
    assert run_main(train_mod.main, argv) == 2, case
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: ")
    for part in expect:
        assert part in err, (case, part, err)
    assert not touched and not (tmp_path / "o").exists()  # no device chosen, nothing written


def test_cache_of_another_hidden_size_is_refused(ws, tmp_path, capsys):
    import shutil

    feats = tmp_path / "feats"
    shutil.copytree(ws / "feats", feats)
    manifest = json.loads((feats / "manifest.json").read_text())
    manifest["hidden_size"] = 5120
    (feats / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert run_main(train_mod.main, ["--config", str(ws / "base.yaml"), "--out", str(tmp_path / "o"),
                                     "--set", f"data.features={feats}"]) == 2
    err = capsys.readouterr().err
    assert "holds hidden size 5120 but the drafter/target has 64" in err and "extract it again from" in err
