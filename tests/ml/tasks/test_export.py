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
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from core.ml.tasks import export as export_mod
from core.ml.models.drafter import load_drafter  # noqa: E402
from core.ml.formats.runio import run_main  # noqa: E402


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
    assert stat.S_IMODE((tmp_path / "deep").stat().st_mode) == 0o755  # a folder it created: reachable
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


def test_the_export_carries_each_engines_draft_length(pair, tmp_path, capsys):
    """Issue 45 §3: the draft length to serve goes into the export's engine settings (B-1 unless
    the operator names the advised one); one outside 1..B-1 exits 2 with nothing written."""
    assert _export(pair, tmp_path / "whole", "--dtype", "fp32") == 0
    whole = json.loads((tmp_path / "whole" / "provenance.json").read_text())["engine_settings"]
    assert whole == {"draft_length": 7, "advised": False, "vllm": {"num_speculative_tokens": 7},
                     "sglang": {"--speculative-num-draft-tokens": 8}, "llama.cpp": {"--spec-draft-n-max": 7}}
    assert _export(pair, tmp_path / "k3", "--dtype", "fp32", "--draft-length", "3") == 0
    k3 = json.loads((tmp_path / "k3" / "provenance.json").read_text())["engine_settings"]
    assert k3["draft_length"] == 3 and k3["advised"] and k3["vllm"] == {"num_speculative_tokens": 3}
    for bad in ("0", "8"):
        assert _export(pair, tmp_path / f"bad{bad}", "--draft-length", bad) == 2
        assert "--draft-length" in capsys.readouterr().err and not (tmp_path / f"bad{bad}").exists()


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
    """The converter itself needs a real target tokenizer (tests/ml/tasks/test_export.py below); here a
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


# ----------------------------------------------------------------------------- into real folders (issue 42 §1)


def _weights_dtype(folder):
    return {str(t.dtype).removeprefix("torch.") for t in load_file(folder / "model.safetensors").values()}


def _consistent(folder):
    """The dtype config.json declares, checked against every tensor's (an engine reads the
    weights as the config says)."""
    declared = json.loads((folder / "config.json").read_text())["dtype"]
    assert _weights_dtype(folder) == {declared}, (declared, _weights_dtype(folder))
    return declared


def _ours(folder):
    """Staging or backup folders an export left behind (in ``folder`` or beside it)."""
    return sorted(p.name for p in [*folder.iterdir(), *folder.parent.iterdir()]
                  if p.name.startswith((".specdeck-", f".{folder.name}.")))


def _lmodes(paths):
    """Each path's own mode (lstat) and, for a link, its target's."""
    return {str(p): (oct(os.lstat(p).st_mode), oct(os.stat(p).st_mode)) for p in paths}


@pytest.fixture
def immutable():
    """``chattr +i`` on a real file (a file that cannot be renamed or removed: what a replacement
    meets half-way); taken off again at the end. Skipped where chattr cannot set it."""
    made = []

    def make(path):
        res = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"chattr +i needs root and a filesystem with the immutable flag ({res.stderr.strip()})")
        made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_export_into_a_shared_folder_sets_modes_only_on_its_own_files(pair, tmp_path, umask_077):
    """The operator's folder, files, subfolder and links keep their modes (lstat and target),
    a first export and a replacement alike; a link to a 0600 key outside is never followed."""
    out = tmp_path / "serving"
    out.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    key = outside / "id_ed25519"
    key.write_text("private")
    (outside / "private").mkdir()
    (out / "sub").mkdir()
    for path, mode in [(out, 0o750), (key, 0o600), (outside / "private", 0o700), (out / "sub", 0o711)]:
        path.chmod(mode)
    for name, mode in [("notes.txt", 0o600), ("run.sh", 0o754), ("sub/inner.bin", 0o640)]:
        (out / name).write_text(name)
        (out / name).chmod(mode)
    (out / "key-link").symlink_to(key)
    (out / "dir-link").symlink_to(outside / "private")
    theirs = [out, key, outside / "private", *(out / n for n in ("sub", "notes.txt", "run.sh", "sub/inner.bin",
                                                                "key-link", "dir-link"))]
    before = _lmodes(theirs)
    for dtype in ("fp32", "bf16"):
        assert _export(pair, out, "--dtype", dtype) == 0
        assert _lmodes(theirs) == before, dtype
        assert key.read_text() == "private" and (out / "sub" / "inner.bin").read_text() == "sub/inner.bin"
        ours = {n: stat.S_IMODE(os.lstat(out / n).st_mode) for n in ("config.json", "model.safetensors",
                                                                     "provenance.json")}
        assert ours == dict.fromkeys(ours, 0o644)
        assert _ours(out) == []
    assert _consistent(out) == "bfloat16"


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm (a tmpfs) for a second filesystem")
def test_export_through_a_symlink_to_another_filesystem_lands_whole(pair, tmp_path, capsys):
    """``--out`` a link to a folder on tmpfs, and a new folder under such a link: staged there,
    so no rename crosses devices; the link stays a link, and the resolution is said."""
    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same device as the test's tmp_path here: no second filesystem")
    shm = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="specdeck-test-"))
    try:
        link = tmp_path / "serve"
        link.symlink_to(shm)
        for dtype, out in [("fp32", link), ("bf16", link), ("bf16", link / "v5")]:
            assert _export(pair, out, "--dtype", dtype) == 0, capsys.readouterr().err
            err = capsys.readouterr().err
            assert f"resolves to {shm}" in err and "the link is left as it is" in err
            real = shm / out.relative_to(link)
            assert {"config.json", "model.safetensors", "provenance.json"} <= {p.name for p in real.iterdir()}
            assert _consistent(real) == {"fp32": "float32", "bf16": "bfloat16"}[dtype]
            assert _ours(real) == []
        assert link.is_symlink() and os.readlink(link) == str(shm)
        assert stat.S_IMODE((shm / "v5").stat().st_mode) == 0o755
    finally:
        shutil.rmtree(shm)


def test_a_replacement_that_fails_half_way_leaves_the_earlier_export_whole(pair, tmp_path, capsys, immutable):
    """In a shared folder, the earlier export's weights cannot be moved (immutable): its
    config.json, moved aside first, comes back; the folder holds the fp32 export whole, and the
    error (exit 1) says so. Once the cause is gone, the export goes through."""
    out = tmp_path / "serving"
    out.mkdir()
    (out / "README").write_text("the operator's")
    assert _export(pair, out, "--dtype", "fp32") == 0
    immutable(out / "model.safetensors")
    capsys.readouterr()
    assert _export(pair, out) == 1
    err = capsys.readouterr().err
    assert f"could not move the earlier export's files aside in {out} (model.safetensors: Operation not permitted)" in err
    assert (f"{out} holds the earlier export, unchanged (config.json (float32), model.safetensors, "
            "provenance.json); the new one was not installed") in err
    assert _consistent(out) == "float32"
    assert sorted(p.name for p in out.iterdir()) == ["README", "config.json", "model.safetensors", "provenance.json"]
    subprocess.run(["chattr", "-i", str(out / "model.safetensors")], check=True)
    assert _export(pair, out) == 0 and _consistent(out) == "bfloat16" and _ours(out) == []


def test_a_failure_moving_the_new_files_in_puts_the_earlier_ones_back(pair, tmp_path, capsys, monkeypatch):
    """The last step (the new config.json in) fails after the new weights went in: they go back
    out, the earlier export comes back, config.json's dtype matches the weights'. (No real
    filesystem cause fails a rename into a folder the export has just written in: os.rename is
    made to fail there.)"""
    from core.ml.formats import export_swap

    out = tmp_path / "serving"
    out.mkdir()
    (out / "README").write_text("the operator's")
    assert _export(pair, out, "--dtype", "fp32") == 0
    real_rename = os.rename

    def rename(src, dst):
        if Path(src).parent.name.startswith(".specdeck-export.") and Path(dst).name == "config.json":
            raise OSError(28, "No space left on device", str(dst))
        return real_rename(src, dst)

    monkeypatch.setattr(export_swap.os, "rename", rename)
    capsys.readouterr()
    assert _export(pair, out) == 1
    err = capsys.readouterr().err
    assert "could not move the new export's files in" in err and "holds the earlier export, unchanged" in err
    assert _consistent(out) == "float32" and _ours(out) == []


@pytest.mark.parametrize("exchange", ["renameat2", "two renames"])
def test_an_export_of_its_own_folder_is_swapped_whole(pair, tmp_path, monkeypatch, exchange):
    """A folder holding an earlier export alone is replaced as a folder (its permission bits
    kept), with RENAME_EXCHANGE or, without it, renamed aside and the new one renamed in."""
    from core.ml.formats import export_swap

    if exchange == "two renames":
        monkeypatch.setattr(export_swap, "exchange", lambda a, b: False)
    out = tmp_path / "v5"
    assert _export(pair, out, "--dtype", "fp32") == 0
    out.chmod(0o750)
    assert _export(pair, out) == 0
    assert _consistent(out) == "bfloat16" and stat.S_IMODE(out.stat().st_mode) == 0o750 and _ours(out) == []


def test_a_folder_swap_that_fails_puts_the_earlier_export_back(pair, tmp_path, capsys, monkeypatch):
    """Without RENAME_EXCHANGE, the new folder's rename in fails after the old one went aside:
    the old one comes back under its name, whole."""
    from core.ml.formats import export_swap

    out = tmp_path / "v5"
    assert _export(pair, out, "--dtype", "fp32") == 0
    real_rename = os.rename

    def rename(src, dst):
        if Path(src).name.startswith(".v5.export.") and Path(dst) == out:
            raise OSError(5, "Input/output error", str(src))
        return real_rename(src, dst)

    monkeypatch.setattr(export_swap, "exchange", lambda a, b: False)
    monkeypatch.setattr(export_swap.os, "rename", rename)
    capsys.readouterr()
    assert _export(pair, out) == 1
    err = capsys.readouterr().err
    assert f"could not put the new export in place as {out} (Input/output error)" in err
    assert "holds the earlier export, unchanged (config.json (float32)" in err
    assert _consistent(out) == "float32" and _ours(out) == []


def test_an_earlier_export_that_cannot_be_removed_is_said_and_the_new_one_is_in(pair, tmp_path, capsys, immutable):
    out = tmp_path / "v5"
    assert _export(pair, out, "--dtype", "fp32") == 0
    immutable(out / "model.safetensors")
    assert _export(pair, out) == 0
    assert _consistent(out) == "bfloat16"
    [left] = _ours(out)
    assert f"warning: the earlier export was left in {tmp_path / left}" in capsys.readouterr().err
    subprocess.run(["chattr", "-i", str(tmp_path / left / "model.safetensors")], check=True)
    assert json.loads((tmp_path / left / "config.json").read_text())["dtype"] == "float32"


@pytest.mark.parametrize("case", ["weights-is-a-folder", "dangling-link", "folder-cannot-be-written"])
def test_a_destination_the_export_cannot_use_is_refused_before_writing(pair, tmp_path, capsys, case, immutable):
    out = tmp_path / "serving"
    if case == "folder-cannot-be-written":
        out.mkdir()
        (out / "README").write_text("the operator's")
        immutable(out)
        assert _export(pair, out) == 2
        assert f"--out {out}: cannot write in {out} (Operation not permitted)" in capsys.readouterr().err
        assert [p.name for p in out.iterdir()] == ["README"]
        return
    if case == "weights-is-a-folder":
        out.mkdir()
        (out / "config.json").write_text('{"dtype": "float32"}')
        (out / "model.safetensors").mkdir()
        (out / "model.safetensors" / "shard").write_text("x")
        before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    else:
        out.symlink_to(tmp_path / "gone")
    assert _export(pair, out) == 2
    err = capsys.readouterr().err
    if case == "weights-is-a-folder":
        assert f"--out {out}: model.safetensors there is a directory, not a file of an earlier export" in err
        assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
        assert (out / "config.json").read_text() == '{"dtype": "float32"}'
    else:
        assert f"--out {out}: {out} is a symbolic link to {tmp_path / 'gone'}, which does not exist" in err
        assert _export(pair, out / "v5") == 2  # a link to nothing on the way: not made into a folder either
        assert f"--out {out / 'v5'}: {out} is a symbolic link to" in capsys.readouterr().err
        assert not (tmp_path / "gone").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
