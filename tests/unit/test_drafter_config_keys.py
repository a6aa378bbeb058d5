"""Every key of a drafter's config.json is used, known to be inert, or refused by name
(docs/drafter.md §4); saving keeps the knobs and the architectures the source had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.ml.formats.drafter_config import INERT_KEYS, KNOBS, DFlashConfig

FIXTURES = Path("/work/shared/fixtures/published-configs")
FIXTURES = FIXTURES if FIXTURES.is_dir() else Path(__file__).resolve().parents[3] / "shared/fixtures/published-configs"
CAMPAIGN = FIXTURES / "qwen3.6-27b-dflash.json"


def campaign() -> dict:
    if not CAMPAIGN.is_file():
        pytest.skip(f"{CAMPAIGN} not here (shared/ lies beside the checkout)")
    return json.loads(CAMPAIGN.read_text())


def test_every_published_config_loads_with_no_key_refused():
    for path in sorted(FIXTURES.glob("*.json")):
        cfg = DFlashConfig.from_file(path)
        assert cfg.input_embedding_scale == 1.0 and cfg.output_multiplier == 1.0
        assert cfg.final_logit_softcapping is None


@pytest.mark.parametrize("where", ["dflash_config", "top"])
def test_knobs_are_read_where_the_reference_reads_them_and_kept_there(where):
    raw = campaign()
    knobs = {"input_embedding_scale": 2.5, "output_multiplier": 0.5, "final_logit_softcapping": 30.0}
    (raw["dflash_config"] if where == "dflash_config" else raw).update(knobs)
    cfg = DFlashConfig.from_dict(raw)
    assert {k: getattr(cfg, k) for k in KNOBS} == knobs
    out = cfg.to_dict()
    home = out["dflash_config"] if where == "dflash_config" else out
    assert {k: home[k] for k in KNOBS} == knobs
    assert {k: getattr(DFlashConfig.from_dict(out), k) for k in KNOBS} == knobs


def test_dflash_config_wins_over_the_top_level_as_in_the_reference():
    raw = campaign()
    raw["output_multiplier"], raw["dflash_config"]["output_multiplier"] = 3.0, 0.25
    assert DFlashConfig.from_dict(raw).output_multiplier == 0.25


def test_a_knob_set_in_code_is_saved_in_dflash_config():
    cfg = DFlashConfig.from_dict(campaign())
    cfg.final_logit_softcapping = 12.0
    assert cfg.to_dict()["dflash_config"]["final_logit_softcapping"] == 12.0


@pytest.mark.parametrize("key,where", [("attn_logit_softcapping", "top"), ("residual_multiplier", "top"),
                                       ("embedding_multiplier", "dflash_config")])
def test_an_unknown_key_is_refused_by_name(key, where):
    raw = campaign()
    (raw["dflash_config"] if where == "dflash_config" else raw)[key] = 2.0
    with pytest.raises(ValueError) as e:
        DFlashConfig.from_dict(raw)
    name = key if where == "top" else f"dflash_config.{key}"
    assert name in str(e.value) and "INERT_KEYS" in str(e.value)


def test_inert_keys_pass():
    raw = campaign()
    for key in ("bos_token_id", "initializer_range", "use_cache", "_name_or_path"):
        assert key in INERT_KEYS
        raw[key] = raw.get(key, 1)
    DFlashConfig.from_dict(raw)


DFLASH2 = {"conv_kernel_size": 4, "conv_group_size": 16, "selector_rank": 64, "selector_top_k": 8}


@pytest.mark.parametrize("where", ["dflash_config", "top"])
def test_a_dflash2_config_is_read_where_the_reference_reads_it_and_kept(where):
    raw = campaign()
    raw["architectures"] = ["DFlash2DraftModel"]
    (raw["dflash_config"] if where == "dflash_config" else raw).update(DFLASH2)
    cfg = DFlashConfig.from_dict(raw)
    assert cfg.family == "dflash2" and DFlashConfig.from_dict(campaign()).family == "dflash"
    assert {k: getattr(cfg, k) for k in DFLASH2} == DFLASH2
    out = cfg.to_dict()
    assert out["architectures"] == ["DFlash2DraftModel"]
    home = out["dflash_config"] if where == "dflash_config" else out
    assert {k: home[k] for k in DFLASH2} == DFLASH2
    again = DFlashConfig.from_dict(out)
    assert again.family == "dflash2" and again.to_dict() == out


def test_a_dflash2_config_without_architectures_saves_as_dflash2():
    raw = campaign()
    raw.pop("architectures", None)
    raw["dflash_config"].update(DFLASH2)
    assert DFlashConfig.from_dict(raw).to_dict()["architectures"] == ["DFlash2DraftModel"]


@pytest.mark.parametrize("change,expect", [
    ({"architectures": ["DFlash2DraftModel"]}, "missing ['conv_kernel_size'"),
    ({"selector_rank": 64}, "DFlash-2 drafter"),
    ({**DFLASH2, "conv_group_size": 7}, "conv_group_size 7 must divide hidden_size"),
    ({**DFLASH2, "selector_top_k": 10**7}, "selector_top_k 10000000 exceeds vocab_size"),
    ({**DFLASH2, "conv_kernel_size": 0}, "dflash_config.conv_kernel_size: 0 is out of range"),
    ({**DFLASH2, "selector_rank": 8.5}, "dflash_config.selector_rank: 8.5 is not an integer"),
], ids=["arch-only", "partial", "group", "top-k", "kernel", "rank-float"])
def test_an_inconsistent_dflash2_config_is_refused_naming_the_key(change, expect):
    raw = campaign()
    if "architectures" in change:
        raw["architectures"] = change["architectures"]
    raw["dflash_config"].update({k: v for k, v in change.items() if k != "architectures"})
    with pytest.raises(ValueError, match=expect.replace("[", r"\[").replace("(", r"\(")):
        DFlashConfig.from_dict(raw)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "2", True])
def test_a_knob_must_be_a_finite_number(value):
    raw = campaign()
    raw["dflash_config"]["input_embedding_scale"] = value
    with pytest.raises(ValueError, match="input_embedding_scale"):
        DFlashConfig.from_dict(raw)


def test_saving_keeps_the_sources_architectures():
    raw = campaign()
    raw["architectures"] = ["MyDFlashDraftModel"]
    assert DFlashConfig.from_dict(raw).to_dict()["architectures"] == ["MyDFlashDraftModel"]
    assert DFlashConfig.from_dict(campaign()).to_dict()["architectures"] == ["DFlashDraftModel"]
