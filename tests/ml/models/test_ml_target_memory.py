"""The target in its own dtype, memory-mapped, with a memory preflight (at a real size: a bf16
Qwen3 of about 430 MB built from config here; bench/memory.py measures the same way)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from bench import memory as bench  # noqa: E402
from core.ml.tasks import eval as eval_mod
from core.ml.formats import weights
from core.ml.formats.runio import run_main  # noqa: E402


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16-430mb")
    target = bench.build_target(root / "target", layers=12, hidden=1024, inter=3072, vocab=32000)
    drafter = bench.build_drafter(root / "drafter", target)
    prompts = bench.write_prompts(root / "prompts.jsonl", n=1, length=16)
    return root, target, drafter, prompts


def test_bf16_target_is_evaluated_in_bf16_within_1_25x_its_bytes(big):
    root, target, drafter, prompts = big
    size = weights.weight_bytes(target)
    assert size >= 400e6 and weights.checkpoint_dtype(target) == torch.bfloat16
    out = root / "on" / "result.json"
    argv = ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts), "--out", str(out),
            "--max-new-tokens", "8", "--ignore-eos"]
    peak = bench.run_child("eval", argv, target)  # a fresh process: baseline after imports, then the eval
    res = json.loads(out.read_text())
    assert res["dtype"] == "bfloat16" and res["memory"]["loads"] == "full target"
    assert res["memory"]["target_bytes"] == size
    ratio = (peak["peak_mb"] - peak["baseline_mb"]) * bench.MB / size
    assert ratio <= 1.25, f"peak RSS {ratio:.2f}x the weight bytes above the baseline"
    assert ratio >= 0.9  # the forward did touch every weight: the measure is not vacuous


def test_max_memory_below_the_need_refuses_before_loading(big, tmp_path, capsys, monkeypatch):
    _, target, drafter, prompts = big
    loaded = []
    monkeypatch.setattr("core.ml.models.target.load_target", lambda *a, **k: loaded.append(a))
    out = tmp_path / "r" / "result.json"
    base = ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts), "--out", str(out)]
    assert run_main(eval_mod.main, base + ["--max-memory", "300MB"]) == 2
    err = capsys.readouterr().err
    assert "needs 0.48 GB" in err and "0.30 GB --max-memory" in err and "refused before loading" in err
    assert "--mode offline" in err and "Traceback" not in err
    assert not loaded and not out.parent.exists()
    assert run_main(eval_mod.main, base + ["--max-memory", "lots"]) == 2
    assert "not a size" in capsys.readouterr().err


def test_offline_needs_only_the_embedding_and_head(big, tmp_path, capsys):
    """The preflight of offline mode counts the embedding + head (2 x 65 MB), not the 430 MB."""
    _, target, drafter, prompts = big
    args = eval_mod.build_parser().parse_args(["--target", str(target), "--drafter", str(drafter), "--prompts",
                                               str(prompts), "--out", str(tmp_path / "x.json"), "--mode", "offline",
                                               "--cache", str(tmp_path), "--max-memory", "200MB"])
    mem = eval_mod.memory_preflight(args, torch.bfloat16, torch.device("cpu"))
    assert mem["target_bytes"] == 2 * 32000 * 1024 * 2 and mem["loads"] == "embedding + lm_head"
    args.mode = "online"
    with pytest.raises(eval_mod.UsageError, match="refused before loading"):
        eval_mod.memory_preflight(args, torch.bfloat16, torch.device("cpu"))
