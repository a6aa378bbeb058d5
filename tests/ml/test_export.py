"""``python -m core.ml.export``: the layouts engines load (issue 32 §1, docs/serving.md §1).

A tiny drafter with a sliding layer is exported under a umask of 077: every file must still be
0644 and every directory 0755, the weights bf16 by default (fp32 on request, bit-equal then),
and the export must read back into the same drafter. The speculators layout is checked with
the ``speculators`` 0.9.0 package itself (the ``speculators`` tier): its config validation and
``DFlashDraftModel.from_pretrained`` load our export, and its own ``DFlashConverter`` run on our
z-lab export gives the same config fields and the same tensors. The warnings an export prints
(llama.cpp's non-causal sliding layers) are kept in its provenance. ``--format gguf`` without
a llama.cpp tree is refused, naming what it needs, with nothing written.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from core.ml import export as export_mod  # noqa: E402
from core.ml.drafter import load_drafter  # noqa: E402
from core.ml.runio import run_main  # noqa: E402


@pytest.fixture(scope="module")
def pair(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    return tiny.make_tiny_pair(root, "qwen3", seed=0, block_size=8, num_layers=2, sliding_window=4)


@pytest.fixture
def umask_077():
    old = os.umask(0o077)
    yield
    os.umask(old)


def _export(pair, out, *extra):
    target, drafter = pair
    return run_main(export_mod.main, [str(drafter), "--out", str(out), *extra])


def _modes(root):
    return {p.relative_to(root).as_posix() or ".": stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def test_zlab_export_is_bf16_world_readable_and_reads_back(pair, tmp_path, umask_077, capsys):
    out = tmp_path / "deep" / "zlab"
    assert _export(pair, out) == 0
    err = capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "provenance.json"]
    modes = _modes(out)
    assert modes.pop(".") == 0o755 and set(modes.values()) == {0o644}, modes
    src = load_file(pair[1] / "model.safetensors")
    got = load_file(out / "model.safetensors")
    assert set(got) == set(src) and {t.dtype for t in got.values()} == {torch.bfloat16}
    assert all(torch.equal(got[k], src[k].to(torch.bfloat16)) for k in src)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and cfg["architectures"] == ["DFlashDraftModel"]
    back = load_drafter(out)
    assert back.config.attention_rules() == load_drafter(pair[1]).config.attention_rules()
    # the llama.cpp mismatch is said, and kept
    assert "warning: llama.cpp: differs attention: layer 0 (sliding_attention): llama.cpp runs non-causal" in err
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["format"] == "zlab" and [w["engine"] for w in prov["engine_warnings"]] == ["llama.cpp"]


def test_fp32_export_is_bit_equal(pair, tmp_path):
    assert _export(pair, tmp_path / "f32", "--dtype", "fp32") == 0
    src, got = load_file(pair[1] / "model.safetensors"), load_file(tmp_path / "f32" / "model.safetensors")
    assert all(got[k].dtype == torch.float32 and torch.equal(got[k], src[k]) for k in src)


@pytest.mark.parametrize("case", ["gguf-no-tree", "speculators-no-target", "no-config", "out-is-src"])
def test_bad_input_exits_2_with_nothing_written(pair, tmp_path, capsys, case, monkeypatch):
    for var in ("SPECDECK_LLAMA_CPP", "SPECDECK_LLAMA_SERVER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECDECK_LLAMA_CACHE", str(tmp_path / "no-builds"))  # no cached converter either
    target, drafter = pair
    out = tmp_path / "never"
    argv = {"gguf-no-tree": [str(drafter), "--out", str(out), "--format", "gguf", "--target", str(target)],
            "speculators-no-target": [str(drafter), "--out", str(out), "--format", "speculators"],
            "no-config": [str(tmp_path), "--out", str(out)],
            "out-is-src": [str(drafter), "--out", str(drafter)]}[case]
    assert run_main(export_mod.main, argv) == 2
    err = capsys.readouterr().err
    assert not out.exists()
    expect = {"gguf-no-tree": "run scripts/build-llama-server", "speculators-no-target": "needs --target",
              "no-config": "no config.json there", "out-is-src": "is the drafter directory itself"}[case]
    assert expect in err


# ----------------------------------------------------------------------------- speculators 0.9.0


@pytest.fixture(scope="module")
def speculators():
    pytest.importorskip("speculators", reason="the speculators tier needs speculators==0.9.0 (scripts/bootstrap --test)")
    from speculators.convert.dflash import DFlashConverter
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

    return DFlashConverter, DFlashDraftModel, DFlashSpeculatorConfig


@pytest.mark.speculators
def test_speculators_export_passes_the_package_validation_and_matches_its_converter(pair, tmp_path, speculators,
                                                                                    umask_077):
    DFlashConverter, DFlashDraftModel, DFlashSpeculatorConfig = speculators
    target, _ = pair
    ours = tmp_path / "spec"
    assert _export(pair, ours, "--format", "speculators", "--target", str(target)) == 0
    modes = _modes(ours)
    assert modes.pop(".") == 0o755 and set(modes.values()) == {0o644}, modes
    cfg = json.loads((ours / "config.json").read_text())
    DFlashSpeculatorConfig.model_validate(cfg)  # the package's own config validation
    model = DFlashDraftModel.from_pretrained(str(ours))  # and its loader (strict on the body)
    body = load_file(ours / "model.safetensors")
    state = model.state_dict()
    assert all(torch.equal(state[k].to(body[k].dtype), body[k]) for k in body)

    # the package's converter on our z-lab export gives the same config and the same tensors
    zlab = tmp_path / "zlab"
    assert _export(pair, zlab) == 0
    conv = tmp_path / "conv"
    DFlashConverter().convert(str(zlab), str(conv), base_model=str(target))
    theirs = json.loads((conv / "config.json").read_text())
    for key in ("speculators_model_type", "architectures", "aux_hidden_state_layer_ids", "block_size",
                "mask_token_id", "draft_vocab_size", "sliding_window_non_causal", "sample_from_anchor"):
        assert cfg[key] == theirs[key], key
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3]  # target_layer_ids [0, 2] + 1
    assert cfg["speculators_config"]["proposal_methods"] == theirs["speculators_config"]["proposal_methods"]
    assert cfg["speculators_config"]["verifier"] == theirs["speculators_config"]["verifier"]
    for key in ("layer_types", "sliding_window", "hidden_size", "num_hidden_layers", "head_dim", "vocab_size"):
        assert cfg["transformer_layer_config"][key] == theirs["transformer_layer_config"][key], key
    conv_body = load_file(conv / "model.safetensors")
    assert set(conv_body) == set(body) and all(torch.equal(conv_body[k], body[k]) for k in body)

    # specdeck reads its own speculators export back as the same drafter; vLLM's reading of it
    # (update_dflash) is specdeck's reading of the source
    src, back = load_drafter(pair[1]), load_drafter(ours)
    assert back.config.source_format == "speculators"
    assert back.config.attention_rules() == src.config.attention_rules()
    assert back.config.target_layer_ids == src.config.target_layer_ids
    prov = json.loads((ours / "provenance.json").read_text())
    assert not [w for w in prov["engine_warnings"] if w["engine"] == "vllm"]
    assert {w["engine"] for w in prov["engine_warnings"] if w["kind"] == "refused"} == {"sglang", "llama.cpp"}
    # the serving host's name for the verifier, not the path on this machine
    assert _export(pair, tmp_path / "named", "--format", "speculators", "--target", str(target),
                   "--verifier", "org/tiny") == 0
    named = json.loads((tmp_path / "named" / "config.json").read_text())["speculators_config"]["verifier"]
    assert named == {"name_or_path": "org/tiny", "architectures": ["Qwen3ForCausalLM"]}


# ----------------------------------------------------------------------------- gguf


STUB = '''import json, sys
from pathlib import Path
args = sys.argv[1:]
src = Path(args[0])
out = Path(args[args.index("--outfile") + 1])
Path(sys.argv[0]).with_name("called.json").write_text(json.dumps({
    "args": args, "files": sorted(p.name for p in src.iterdir()), "config": json.loads((src / "config.json").read_text())}))
out.write_bytes(b"GGUF")
'''


def test_gguf_runs_the_trees_converter_on_a_zlab_export_with_the_target(pair, tmp_path, umask_077, capsys):
    """The converter itself needs a real target tokenizer (tests/ml/test_export.py below); here a
    stand-in records how it is called: on a z-lab export, with --target-model-dir and the dtype."""
    target, _ = pair
    tree = tmp_path / "llama.cpp"
    (tree / "gguf-py").mkdir(parents=True)
    (tree / "convert_hf_to_gguf.py").write_text(STUB)
    out = tmp_path / "gguf"
    assert _export(pair, out, "--format", "gguf", "--target", str(target), "--llama-cpp", str(tree),
                   "--dtype", "fp32") == 0
    called = json.loads((tree / "called.json").read_text())
    args = called["args"]
    assert args[args.index("--target-model-dir") + 1] == str(target.resolve())
    assert args[args.index("--outtype") + 1] == "f32"
    assert called["files"] == ["config.json", "model.safetensors"]
    assert called["config"]["use_sliding_window"] is True  # so the converter writes the window
    assert sorted(p.name for p in out.iterdir()) == ["drafter.gguf", "provenance.json"]
    assert set(_modes(out).values()) <= {0o644, 0o755}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".gguf.export.")]
    assert "warning: llama.cpp: differs attention" in capsys.readouterr().err


CONVERTER = os.environ.get("SPECDECK_LLAMA_CPP") or export_mod.cached_converter()
"""llama.cpp's converter, looked up once here: the tests run with a temporary HOME, where no build is cached."""


@pytest.mark.skipif(not CONVERTER,
                    reason="needs llama.cpp's converter: scripts/build-llama-server keeps it (CI has it), or $SPECDECK_LLAMA_CPP")
def test_real_converter_refusal_is_passed_on_with_nothing_written(pair, tmp_path, capsys):
    """specdeck's tiny byte-level tokenizer is not one llama.cpp's converter knows: its own
    message comes back (exit 2) and no GGUF is left behind."""
    target, _ = pair
    out = tmp_path / "gguf"
    assert _export(pair, out, "--format", "gguf", "--target", str(target), "--llama-cpp", str(CONVERTER)) == 2
    assert "convert_hf_to_gguf.py failed" in capsys.readouterr().err
    assert not out.exists()
