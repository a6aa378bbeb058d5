"""How each engine will read a drafter (issue 32 §2): the rule tables over every published config.

``core.ml.engines.rules`` restates what vLLM, SGLang and llama.cpp (0c1e570) read from a drafter's
config.json; ``core.ml.engines.lint`` compares each reading with specdeck's own (docs/drafter.md
§5). Every published config in the shared fixtures is read by all three; the all-full-attention
ones are served as specdeck measures them, and the campaign's baseline (4 sliding + 1 full, no
causal key) must show llama.cpp's non-causal sliding layers and what vLLM reads. Variants of the
baseline exercise each key an engine reads differently: the causal overrides, the window's
switch, a speculators-layout config, a missing mask token, a target that does not fit.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from core.ml.engines.lint import lint, render
from tests.conftest import run_cli

CONFIGS = Path("/work/shared/fixtures/published-configs")
CONFIGS = CONFIGS if CONFIGS.is_dir() else Path(__file__).resolve().parents[3] / "shared/fixtures/published-configs"
ALL = sorted(CONFIGS.glob("*.json"))
BASELINE = CONFIGS / "qwen3.6-27b-dflash.json"
pytestmark = pytest.mark.skipif(not ALL, reason=f"the published configs ({CONFIGS}) are not on this machine")


def _write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def _by_engine(result):
    return {r.engine: r for r in result.readings}


def _kinds(reading, kind):
    return [f for f in reading.findings if f.kind == kind]


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_every_published_config_is_read_by_every_engine(path):
    raw = json.loads(path.read_text())
    result = lint(path)
    assert result.specdeck is not None, result.specdeck_error
    spec = result.specdeck
    n = raw["num_hidden_layers"]
    engines = _by_engine(result)
    assert set(engines) == {"vllm", "sglang", "llama.cpp"}
    for r in engines.values():
        assert len(r.layers) == n and list(r.target_layer_ids) == spec.target_layer_ids, r.engine
        assert r.mask_token_id == raw["dflash_config"]["mask_token_id"] and not _kinds(r, "missing")
    assert engines["llama.cpp"].block_size == engines["sglang"].block_size == spec.block_size == 16
    assert f"--spec-draft-n-max {spec.block_size - 1}" in render(result)
    if "sliding_attention" not in raw["layer_types"]:
        # all full attention, no causal key: every engine serves what specdeck measures
        assert not result.differences(), result.differences()
        assert all(not x.causal and x.window is None for r in engines.values() for x in r.layers)


def test_baseline_names_the_llama_cpp_causality_difference_and_shows_what_vllm_reads():
    result = lint(BASELINE)
    engines = _by_engine(result)
    vllm, llama = engines["vllm"], engines["llama.cpp"]
    # vLLM: sliding layers causal with the window, the full layer non-causal; taps = hidden_states[id + 1]
    assert [(x.causal, x.window) for x in vllm.layers] == [(True, 2048)] * 4 + [(False, None)]
    assert vllm.causality_from == "layer_types" and list(vllm.target_layer_ids) == [1, 16, 31, 46, 61]
    assert "hidden_states [2, 17, 32, 47, 62]" in vllm.taps and vllm.mask_token_id == 248070
    assert not [f for f in vllm.findings if f.kind == "differs"]
    notes = " ".join(f.message for f in _kinds(vllm, "note"))
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in notes and "set it to 15" in notes
    # SGLang reads it as specdeck does
    assert [(x.causal, x.window) for x in engines["sglang"].layers] == [(True, 2048)] * 4 + [(False, None)]
    assert not [f for f in engines["sglang"].findings if f.kind == "differs"]
    # llama.cpp: one causal flag, absent -> every layer non-causal; the window is written (use_sliding_window)
    assert [(x.causal, x.window) for x in llama.layers] == [(False, 2048)] * 4 + [(False, None)]
    differs = _kinds(llama, "differs")
    assert len(differs) == 1 and differs[0].field == "attention"
    assert differs[0].message.startswith("layers 0-3 (sliding_attention): llama.cpp runs non-causal, window 2048")
    assert "specdeck measured causal, window 2048" in differs[0].message
    note = next(f.message for f in _kinds(llama, "note") if f.field == "causality")
    assert "dflash_config.is_causal is not read" in note and "only when use_sliding_window" in note
    assert "--engine-rule llama.cpp" in note
    assert result.differences() == [("llama.cpp", differs[0])]
    text = render(result)
    assert "DIFFERS attention: layers 0-3 (sliding_attention): llama.cpp runs non-causal" in text
    assert "reads: layers 0-3 sliding_attention: causal, window 2048; layer 4 full_attention: non-causal" in text


def test_causal_overrides_are_read_differently_by_each_engine(tmp_path):
    base = json.loads(BASELINE.read_text())
    # dflash_config.causal: true -> specdeck, vLLM and llama.cpp run every layer causal; SGLang ignores it
    cfg = copy.deepcopy(base)
    cfg["dflash_config"]["causal"] = True
    engines = _by_engine(lint(_write(tmp_path, cfg)))
    assert not _kinds(engines["vllm"], "differs") and not _kinds(engines["llama.cpp"], "differs")
    sg = engines["sglang"]
    assert [f.field for f in _kinds(sg, "ignored")] == ["dflash_config.causal"]
    assert "layer 4 (full_attention): sglang runs non-causal, full" in _kinds(sg, "differs")[0].message
    # dflash_config.is_causal: false -> specdeck runs all non-causal; vLLM ignores the key (sliding stay causal);
    # llama.cpp ignores it too but its default is non-causal, so it matches specdeck
    cfg = copy.deepcopy(base)
    cfg["dflash_config"]["is_causal"] = False
    engines = _by_engine(lint(_write(tmp_path, cfg)))
    vd = _kinds(engines["vllm"], "differs")
    assert len(vd) == 1 and vd[0].message.startswith("layers 0-3 (sliding_attention): vllm runs causal, window 2048")
    assert "dflash_config.is_causal" in [f.field for f in _kinds(engines["vllm"], "ignored")]
    assert not _kinds(engines["llama.cpp"], "differs")
    assert "dflash_config.is_causal" in [f.field for f in _kinds(engines["llama.cpp"], "ignored")]


def test_without_use_sliding_window_llama_cpp_drops_the_window(tmp_path):
    cfg = json.loads(BASELINE.read_text())
    cfg.pop("use_sliding_window")
    llama = _by_engine(lint(_write(tmp_path, cfg)))["llama.cpp"]
    assert [(x.causal, x.window) for x in llama.layers] == [(False, None)] * 5
    fields = [f.field for f in _kinds(llama, "differs")]
    assert fields == ["attention", "use_sliding_window"]
    assert "window none instead of 2048" in _kinds(llama, "differs")[0].message


def test_knobs_an_engine_ignores_are_named_with_their_effect(tmp_path):
    cfg = json.loads(BASELINE.read_text())
    cfg["dflash_config"].update(input_embedding_scale=2.0, output_multiplier=0.5)
    engines = _by_engine(lint(_write(tmp_path, cfg)))
    vllm = {f.field: f.message for f in _kinds(engines["vllm"], "ignored")}
    assert "drafts differ" in vllm["dflash_config.input_embedding_scale"]
    assert "greedy drafts are the same" in vllm["dflash_config.output_multiplier"]
    sg = {f.field for f in _kinds(engines["sglang"], "ignored")}
    assert sg == {"dflash_config.input_embedding_scale"}  # SGLang reads output_multiplier in dflash_config
    llama = {f.field: f.message for f in _kinds(engines["llama.cpp"], "ignored")}
    assert set(llama) == {"dflash_config.output_multiplier"} and "DFlash-2 graph" in llama["dflash_config.output_multiplier"]


def test_a_speculators_layout_is_read_by_vllm_only(tmp_path):
    base = json.loads(BASELINE.read_text())
    layer = {k: v for k, v in base.items() if k not in ("architectures", "block_size", "dflash_config",
                                                          "num_target_layers")}
    cfg = {"speculators_model_type": "dflash", "architectures": ["DFlashDraftModel"], "transformer_layer_config": layer,
           "block_size": 16, "mask_token_id": 248070, "draft_vocab_size": base["vocab_size"],
           "aux_hidden_state_layer_ids": [i + 1 for i in base["dflash_config"]["target_layer_ids"]],
           "sliding_window_non_causal": True}
    result = lint(_write(tmp_path, cfg))
    assert result.specdeck.source_format == "speculators"
    assert all(not r.causal for r in result.specdeck.attention_rules())  # specdeck honours sliding_window_non_causal
    engines = _by_engine(result)
    vllm = engines["vllm"]
    assert list(vllm.target_layer_ids) == [1, 16, 31, 46, 61]
    assert "sliding_window_non_causal" in [f.field for f in _kinds(vllm, "ignored")]
    assert _kinds(vllm, "differs")[0].message.startswith("layers 0-3 (sliding_attention): vllm runs causal")
    assert [f.field for f in _kinds(engines["sglang"], "refused")] == ["speculators_model_type"]
    assert [f.field for f in _kinds(engines["llama.cpp"], "refused")] == ["speculators_model_type"]


def test_a_missing_mask_token_is_named_and_specdeck_refusal_shown(tmp_path):
    cfg = json.loads(BASELINE.read_text())
    del cfg["dflash_config"]["mask_token_id"]
    result = lint(_write(tmp_path, cfg))
    assert result.specdeck is None and "mask_token_id" in result.specdeck_error
    for r in result.readings:
        if r.engine != "sglang":  # SGLang falls back to the tokenizer's <|MASK|> token
            assert "dflash_config.mask_token_id" in [f.field for f in _kinds(r, "missing")], r.engine
    assert "the tokenizer's '<|MASK|>' token" == _by_engine(result)["sglang"].mask_from
    assert "specdeck refuses this config" in render(result)


def test_target_checks(tmp_path):
    tdir = tmp_path / "target"
    tdir.mkdir()
    _write(tdir, {"architectures": ["Qwen3_5ForConditionalGeneration"],
                  "text_config": {"hidden_size": 5120, "num_hidden_layers": 62, "vocab_size": 248320}})
    found = {f.field: f for f in lint(BASELINE, tdir).target_findings}
    assert found["target_layer_ids"].kind == "note" and "last layer 61" in found["target_layer_ids"].message
    _write(tdir, {"hidden_size": 4096, "num_hidden_layers": 64, "vocab_size": 1000})
    found = {f.field: f.kind for f in lint(BASELINE, tdir).target_findings}
    assert found == {"hidden_size": "refused", "mask_token_id": "refused"}


def test_cli_engines_json_and_bad_input():
    res = run_cli("engines", BASELINE, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [e["engine"] for e in doc["engines"]] == ["vllm", "sglang", "llama.cpp"]
    llama = doc["engines"][2]
    assert [x["causal"] for x in llama["layers"]] == [False] * 5
    assert doc["specdeck"]["source"] == "layer_types"
    res = run_cli("engines", BASELINE, "--engine", "llamacpp")
    assert res.returncode == 0 and "llama.cpp (" in res.stdout and "vllm (" not in res.stdout
    res = run_cli("engines", BASELINE, "--engine", "trt")
    assert res.returncode == 2 and "unknown engine 'trt'" in res.stderr
    res = run_cli("engines", "/nonexistent/drafter")
    assert res.returncode == 2 and "no drafter config there" in res.stderr


def test_a_hostile_layer_count_is_refused_not_looped_over(tmp_path):
    """num_hidden_layers of 1e308 (what a broken or hostile config.json can say) exits 2 at once
    naming the field, where it once looped layer by layer without end."""
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text('{"num_hidden_layers": 1e308, "layer_types": null}')
    res = subprocess.run([sys.executable, "-m", "console.cli", "engines", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "num_hidden_layers: 1e+308 is not a layer count" in res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
