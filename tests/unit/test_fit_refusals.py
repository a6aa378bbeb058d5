"""Size mismatches refused before anything runs (issue 14 §6): ``specdeck validate`` where the
sizes are known (a local host), and the eval's preflight on the host otherwise.

Real files: a target directory with its config.json, an extract cache's manifest.json, drafter
config.json files, and the real CLI in a subprocess.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run_cli

TARGET = {"model_type": "qwen3", "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 320,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128}
TRAIN_YAML = {"target": "../target", "out_dir": "../runs/v5",
              "drafter": {"block_size": 8, "num_layers": 2, "target_layer_ids": [0, 2], "mask_token_id": 3},
              "data": {"features": "../feats"}, "train": {"max_steps": 10}}


def drafter_config(block_size: int) -> dict:
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block_size,
            "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 2]}, "hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "intermediate_size": 128, "vocab_size": 320}


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "target/config.json").write_text(json.dumps(TARGET))
    (tmp_path / "feats").mkdir()
    (tmp_path / "feats/manifest.json").write_text(json.dumps({"layer_ids": [0, 2], "hidden_size": 64,
                                                              "entries": {}}))
    (tmp_path / "train").mkdir()
    (tmp_path / "train/v5.yaml").write_text(yaml.safe_dump(TRAIN_YAML))
    for b in (8, 16):
        (tmp_path / f"d{b}").mkdir()
        (tmp_path / f"d{b}/config.json").write_text(json.dumps(drafter_config(b)))
    return tmp_path


def write_plan(ws, items) -> str:
    plan = {"name": "fit", "hosts": {"here": {"local": True, "workdir": str(ws)}}, "items": items}
    path = ws / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return str(path)


def train_item(overrides=None) -> dict:
    return {"id": "train", "content": "train", "action": {"kind": "train", "host": "here", "params": {
        "config": "train/v5.yaml", "overrides": overrides or {}}}}


def eval_item(drafter="d16", baseline="d8", **extra) -> dict:
    return {"id": "ev", "content": "eval", "needs": ["train"] if drafter.startswith("item:") else [],
            "action": {"kind": "eval", "host": "here", "params": {
                "drafter": drafter, "baseline": baseline, "target": "target", **extra}}}


def test_a_fitting_train_config_validates(ws):
    res = run_cli("validate", write_plan(ws, [train_item()]))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("overrides,expect", [
    ({"drafter.target_layer_ids": [0, 7]}, ["[7] outside the target's layers 0..3", "4 decoder layers"]),
    ({"drafter.target_layer_ids": [0, 1]}, ["holds layers [0, 2]", "need [1]", "extract --layers 0,1,3"]),
    ({"drafter.hidden_size": 128}, ["'drafter.hidden_size' is 128", "hidden_size 64", "set drafter.hidden_size to 64"]),
    ({"drafter.vocab_size": 151936}, ["'drafter.vocab_size' is 151936", "vocab_size 320"]),
    ({"fc_layers": "taps_and_final"}, ["needs the target's final layer 3", "extract --layers 0,2,3"]),
    ({"drafter.target_layer_ids": [0, 3]}, ["final layer 3, which is reserved for the target logits"]),
    ({"train.lr": -1}, ["'train.lr' must be > 0"]),
], ids=["tap-beyond-target", "tap-not-cached", "hidden", "vocab", "final-not-cached", "final-tapped", "bad-knob"])
def test_train_config_that_cannot_fit_is_refused_at_validate(ws, overrides, expect):
    res = run_cli("validate", write_plan(ws, [train_item(overrides)]))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "item 'train'" in res.stderr and "Traceback" not in res.stderr
    for part in expect:
        assert part in res.stderr, (part, res.stderr)


def test_feature_cache_of_another_hidden_size_is_refused_at_validate(ws):
    (ws / "feats/manifest.json").write_text(json.dumps({"layer_ids": [0, 2, 3], "hidden_size": 4096}))
    res = run_cli("validate", write_plan(ws, [train_item()]))
    assert res.returncode == 2 and "holds hidden size 4096 but the drafter/target has 64" in res.stderr


@pytest.mark.parametrize("extra,ok", [({}, False), ({"block_size": 8}, True),
                                      ({"allow_block_size_mismatch": True}, True)])
def test_eval_block_size_mismatch_needs_saying_so(ws, extra, ok):
    res = run_cli("validate", write_plan(ws, [train_item(), eval_item(**extra)]))
    if ok:
        assert res.returncode == 0, res.stderr
        return
    assert res.returncode == 2
    for part in ("drafter d16 was trained with block size 16", "baseline d8 with 8", "set block_size: 8",
                 "allow_block_size_mismatch: true"):
        assert part in res.stderr, (part, res.stderr)


def test_eval_of_a_train_item_knows_its_block_size_at_validate(ws):
    res = run_cli("validate", write_plan(ws, [train_item(), eval_item("item:train@latest", "d16")]))
    assert res.returncode == 2 and "block size 8 but baseline d16 with 16" in res.stderr
    res = run_cli("validate", write_plan(ws, [train_item(), eval_item("item:train@latest", "d8")]))
    assert res.returncode == 0, res.stderr


def test_an_eval_of_a_train_item_whose_own_params_are_invalid_reports_those(ws):
    """The eval's block-size check reads the train item; when that item's params did not
    parse, validate says what is wrong with them (exit 2), it does not crash."""
    bad = train_item()
    bad["action"]["params"]["watch_eval"] = {"on": "elsewhere", "target": "target"}
    res = run_cli("validate", write_plan(ws, [bad, eval_item("item:train@latest", "d16")]))
    assert res.returncode == 2, res.stderr
    assert "item 'train': field 'action.params.watch_eval.on'" in res.stderr
    assert "Error" not in res.stderr  # no exception's name: a sentence about the field


async def test_eval_preflight_on_the_host_refuses_what_validate_could_not_see(ws):
    """The baseline appears on the host only after the plan was validated: the item's preflight
    (check, on the host) refuses it and launches nothing."""
    from core.plans.planfile import load_plan
    from core.runs.runner import Runner
    from core.state.store import Store

    plan = load_plan(write_plan(ws, [train_item(), eval_item("d16", "later")]))  # validated: no baseline yet
    (ws / "later").mkdir()
    (ws / "later/config.json").write_text(json.dumps(drafter_config(8)))
    store = Store(ws / "s.db")
    runner = Runner(plan, store, poll=0.05)
    try:
        assert await runner.run_item(plan.item("ev")) == "failed"
    finally:
        await runner.close()
    assert store.latest_run("ev") is None  # nothing was launched
    last = store.status_history("ev")[-1]
    assert last.status == "failed" and "block size 16 but baseline later with 8" in last.reason
    assert "set block_size: 8" in last.reason


@pytest.mark.parametrize("extra,ok", [({}, False), ({"allow_block_size_mismatch": True}, True),
                                      ({"block_size": 8}, True)])
def test_watch_eval_baseline_of_another_block_size_needs_saying_so(ws, extra, ok):
    item = train_item()
    item["action"]["params"]["watch_eval"] = {"host": "here", "target": "target", "mode": "online",
                                              "baseline": "d16", **extra}
    res = run_cli("validate", write_plan(ws, [item]))
    assert (res.returncode == 0) == ok, res.stderr
    if not ok:
        assert res.returncode == 2 and "block size 8 but baseline d16 with 16" in res.stderr


@pytest.mark.parametrize("marker", ["architectures", "dflash_config"])
def test_a_dflash2_drafter_init_is_refused_at_validate(ws, marker):
    raw = drafter_config(8)
    if marker == "architectures":
        raw["architectures"] = ["DFlash2DraftModel"]
    else:
        raw["dflash_config"].update(conv_kernel_size=4, conv_group_size=16, selector_rank=8, selector_top_k=4)
    (ws / "d2").mkdir()
    (ws / "d2/config.json").write_text(json.dumps(raw))
    res = run_cli("validate", write_plan(ws, [train_item({"drafter.init": str(ws / "d2")})]))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "item 'train'" in res.stderr and "Traceback" not in res.stderr
    assert "'drafter.init'" in res.stderr and "is a DFlash-2 drafter" in res.stderr, res.stderr
    ok = run_cli("validate", write_plan(ws, [train_item({"drafter.init": str(ws / "d8")})]))
    assert ok.returncode == 0, ok.stderr
