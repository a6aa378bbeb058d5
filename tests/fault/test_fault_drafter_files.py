"""Configs and weights others wrote (issue 42 §2): every reader of a drafter's config.json, a
target's config.json or a safetensors file refuses a bad one by file and key, exit 2, no
traceback, nothing written.

Each hostile input is built for real from a valid tiny drafter (``core.ml.tiny``): a config.json
with a value of the wrong type, NaN, Infinity, a number no float holds, an absurd size, a
negative one, a document nested 100,000 levels deep, a missing key; a target config.json with
the same; a model.safetensors cut short with truncate, emptied, given a header length of 2**40,
replaced by random bytes; a training checkpoint cut short, empty, random, or safetensors. Every
entry point runs as a process of its own (forked from a preloaded interpreter: tests/preloaded.py),
as an operator or a host runs it: ``python -m console.cli
engines`` / ``export``, ``python -m core.ml.eval``, ``core.ml.strip``, ``core.ml.extract`` and
``core.ml.watcher``.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import struct
from pathlib import Path

import pytest

from core.errors import InvalidFile
from core.ml.formats.drafter_config import DFlashConfig, check_fields, read_target_config
from core.ml.formats.safetensors_header import read_header
from core.text import read_json_file
from tests.conftest import ROOT
from tests.fault.conftest import no_traceback
from tests.preloaded import run_module

torch = pytest.importorskip("torch")


def run(*argv, timeout=120):
    """``python -m ARGV`` from this checkout, as a host or an operator runs it: a process of its
    own, forked from one that imported torch already (tests/preloaded.py), so that each of
    the hundred hostile files does not pay torch's import again."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    res = run_module(*argv, timeout=timeout, env=env, cwd=ROOT)
    no_traceback(res)
    return res


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A valid tiny target and drafter, a prompts file and a training checkpoint of the drafter."""
    from core.ml.demo import tiny
    from core.ml.models.drafter import load_drafter

    root = tmp_path_factory.mktemp("pair")
    target, drafter = tiny.make_tiny_pair(root, "qwen3", seed=0, block_size=8, num_layers=2, sliding_window=4)
    prompts = tiny.write_tiny_prompts(root / "prompts.jsonl", n_text=1)
    d = load_drafter(drafter)
    ckpt = root / "ckpt" / "step_5.pt"
    ckpt.parent.mkdir()
    torch.save({"model": d.state_dict(), "step": 5}, ckpt)
    return {"target": target, "drafter": drafter, "prompts": prompts, "ckpt": ckpt}


def config_of(pair) -> dict:
    return json.loads((pair["drafter"] / "config.json").read_text())


def _set(path: str, value):
    def change(cfg):
        *parents, key = path.split(".")
        for p in parents:
            cfg = cfg[p]
        cfg[key] = value
    return change


def _move_block_into_dflash(value):
    def change(cfg):
        del cfg["block_size"]
        cfg["dflash_config"]["block_size"] = value
    return change


DEEP = "[" * 100_000 + "]" * 100_000
CASES = {  # name: (change to the config dict, or the whole text; what stderr must name)
    "wrong-type-list": (_set("hidden_size", [64]), "hidden_size: [64] is not an integer"),
    "wrong-type-string": (_set("num_hidden_layers", "2"), "num_hidden_layers: '2' is not a layer count"),
    "wrong-type-dict-in-list": (_set("dflash_config.target_layer_ids", [0, {"a": 1}]),
                                "dflash_config.target_layer_ids[1]: {'a': 1} is not a layer id"),
    "wrong-type-number": (_set("layer_types", 2), "layer_types: 2 is not a list of strings"),
    "nan": (_set("rope_theta", float("nan")), "rope_theta: NaN is not a finite number"),
    "infinity": (_move_block_into_dflash(float("inf")), "dflash_config.block_size: Infinity is not a finite number"),
    "float-overflow": ("1e400", "rms_norm_eps: 1e400 is not a finite number"),
    "absurd-size": (_set("block_size", 10**30), "block_size: 1e+30 is out of range (2..4096)"),
    "negative": (_set("hidden_size", -64), "hidden_size: -64 is out of range"),
    "deep-nesting": (DEEP, "nested more than 32 levels deep"),
    "missing-key": (lambda cfg: cfg.pop("hidden_size"), "config has no hidden_size"),
}


def hostile_drafter(pair, tmp_path, case: str) -> Path:
    """A copy of the valid drafter whose config.json is the hostile one of ``case``."""
    change, _ = CASES[case]
    d = tmp_path / "drafter"
    shutil.copytree(pair["drafter"], d)
    if change == DEEP:
        text = DEEP
    elif isinstance(change, str):  # a literal no float holds: written as text
        text = json.dumps(config_of(pair)).replace('"rms_norm_eps": 1e-06', f'"rms_norm_eps": {change}')
        assert change in text
    else:
        cfg = config_of(pair)
        change(cfg)
        text = json.dumps(cfg)  # Python writes NaN / Infinity tokens: what a hostile file holds
    (d / "config.json").write_text(text)
    return d


ENTRIES = ("engines", "export", "eval", "strip", "extract", "watcher")


def run_entry(entry: str, pair, drafter: Path, out: Path, target: Path | None = None):
    """Run ``entry`` on ``drafter`` (and the target), writing (if it ever did) under ``out``."""
    t = target or pair["target"]
    if entry == "engines":
        return run("console.cli", "engines", drafter, "--target", t)
    if entry == "export":
        return run("console.cli", "export", drafter, "--out", out, "--target", t)
    if entry == "eval":
        return run("core.ml.eval", "--target", t, "--drafter", drafter, "--prompts", pair["prompts"],
                   "--out", out / "result.json", "--max-new-tokens", 4)
    if entry == "strip":
        return run("core.ml.strip", pair["ckpt"], out, "--config", drafter)
    if entry == "extract":
        return run("core.ml.extract", "--target", t, "--prompts", pair["prompts"], "--layers", drafter,
                   "--out", out)
    assert entry == "watcher"
    return run("core.ml.watcher", "--ckpt-dir", pair["ckpt"].parent, "--target", t, "--mode", "online",
               "--prompts", pair["prompts"], "--drafter-config", drafter / "config.json", "--out", out)


def assert_nothing_written(entry: str, out: Path) -> None:
    """Nothing written: no output dir at all; the watcher only its status.json, which says why."""
    if entry != "watcher":
        assert not out.exists(), sorted(p.name for p in out.rglob("*"))
        return
    assert sorted(p.name for p in out.iterdir()) == ["status.json"]
    assert json.loads((out / "status.json").read_text())["state"] == "failed"


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_drafter_config_is_refused_by_file_and_key(pair, tmp_path, case, entry):
    drafter = hostile_drafter(pair, tmp_path, case)
    out = tmp_path / "out"
    res = run_entry(entry, pair, drafter, out)
    _, words = CASES[case]
    if entry == "engines" and case == "missing-key":
        # a config specdeck cannot read, but whose values are all sound: the engines' readings
        # are still shown (what each engine would make of it), with specdeck's refusal first
        assert res.returncode == 0, res.stderr
        assert f"specdeck refuses this config: {words}" in res.stdout, res.stdout
        return
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert words in res.stderr, res.stderr
    assert str(drafter / "config.json") in res.stderr, res.stderr  # the file, by its path
    assert_nothing_written(entry, out)
    if entry == "engines":
        assert res.stdout == ""


TARGET_CASES = {
    "wrong-type": (_set("num_hidden_layers", "4"), "num_hidden_layers: '4' is not a layer count"),
    "nan": (_set("vocab_size", float("nan")), "vocab_size: NaN is not a finite number"),
    "text-config-list": (_set("text_config", {"hidden_size": [64]}), "text_config.hidden_size: [64] is not an integer"),
    "absurd-size": (_set("vocab_size", 10**30), "vocab_size: 1e+30 is out of range"),
    "deep-nesting": (DEEP, "nested more than 32 levels deep"),
}


@pytest.mark.parametrize("entry", ("engines", "export", "eval", "extract", "watcher"))
@pytest.mark.parametrize("case", list(TARGET_CASES))
def test_a_hostile_target_config_is_refused_by_file_and_key(pair, tmp_path, case, entry):
    change, words = TARGET_CASES[case]
    target = tmp_path / "target"
    shutil.copytree(pair["target"], target)
    if change == DEEP:
        (target / "config.json").write_text(DEEP)
    else:
        cfg = json.loads((target / "config.json").read_text())
        change(cfg)
        (target / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    res = run_entry(entry, pair, pair["drafter"], out, target)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert words in res.stderr and str(target / "config.json") in res.stderr, res.stderr
    assert_nothing_written(entry, out)


@pytest.mark.parametrize("entry", ("export", "eval", "extract"))
def test_taps_past_the_targets_last_layer_are_refused(pair, tmp_path, entry):
    """The drafter taps target layer 7 of a 4-layer target: refused before a byte is written
    (``engines`` reports it as a refusal of every engine instead, exit 0)."""
    drafter = tmp_path / "drafter"
    shutil.copytree(pair["drafter"], drafter)
    cfg = config_of(pair)
    cfg["dflash_config"]["target_layer_ids"] = [0, 7]
    del cfg["num_target_layers"]
    (drafter / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    res = run_entry(entry, pair, drafter, out)
    assert res.returncode == 2, res.stderr
    assert "[7]" in res.stderr if entry == "extract" else "taps [0, 7] but the target has 4 layers (0..3)" in res.stderr
    assert_nothing_written(entry, out)
    res = run_entry("engines", pair, drafter, out)
    assert res.returncode == 0 and "target refused: taps [0, 7] but the target has 4 layers" in res.stdout


def cut_short(path: Path) -> None:
    """A copy cut short: the first half of the file."""
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def emptied(path: Path) -> None:
    path.write_bytes(b"")


def lying_length(path: Path) -> None:
    """The header length says 2**40 bytes; the rest of the file is as it was."""
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 2**40) + data[8:])


def random_bytes(path: Path) -> None:
    data = bytearray(random.Random(42).randbytes(4096))
    data[8] = ord("x")  # whatever the draw, not the '{' a JSON header starts with
    path.write_bytes(bytes(data))


WEIGHTS = {
    "cut-short": (cut_short, "truncated (header says 331864 bytes, file has 165932)"),
    "empty": (emptied, "empty (0 bytes): not a safetensors file"),
    "header-2**40": (lying_length, f"truncated (header says {8 + 2**40} bytes, file has 331864)"),
    "random-bytes": (random_bytes, "not a safetensors file"),
}


@pytest.mark.parametrize("entry", ("engines", "export", "eval"))
@pytest.mark.parametrize("case", list(WEIGHTS))
def test_drafter_weights_cut_short_empty_or_lying_are_refused(pair, tmp_path, case, entry):
    spoil, words = WEIGHTS[case]
    drafter = tmp_path / "drafter"
    shutil.copytree(pair["drafter"], drafter)
    assert (drafter / "model.safetensors").stat().st_size == 331864  # the size the messages quote
    spoil(drafter / "model.safetensors")
    out = tmp_path / "out"
    res = run_entry(entry, pair, drafter, out)
    assert res.returncode == 2, res.stderr
    assert f"{drafter / 'model.safetensors'}: {words}" in res.stderr, res.stderr
    assert_nothing_written(entry, out)


def test_target_weights_cut_short_are_refused_by_eval(pair, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(pair["target"], target)
    cut_short(target / "model.safetensors")
    out = tmp_path / "out"
    res = run_entry("eval", pair, pair["drafter"], out, target)
    assert res.returncode == 2 and f"{target / 'model.safetensors'}: truncated (header says" in res.stderr
    assert_nothing_written("eval", out)


CHECKPOINTS = {
    "cut-short": (cut_short, "truncated or damaged: a zip-format torch checkpoint"),
    "empty": (emptied, "empty (0 bytes): not a torch checkpoint"),
    "random-bytes": (random_bytes, "not a zip-format torch checkpoint"),
    "safetensors": (lambda p: shutil.copyfile(p.parent / "drafter" / "model.safetensors", p),
                    "a safetensors file, not a training checkpoint"),
}


@pytest.mark.parametrize("case", list(CHECKPOINTS))
def test_strip_refuses_a_checkpoint_that_is_not_whole(pair, tmp_path, case):
    spoil, words = CHECKPOINTS[case]
    ckpt = tmp_path / "step_5.pt"
    shutil.copyfile(pair["ckpt"], ckpt)
    (tmp_path / "drafter").symlink_to(pair["drafter"])
    spoil(ckpt)
    out = tmp_path / "out"
    res = run("core.ml.strip", ckpt, out, "--config", pair["drafter"])
    assert res.returncode == 2 and f"{ckpt}: {words}" in res.stderr, res.stderr
    assert not out.exists()


@pytest.mark.parametrize("value, words", [
    (float("nan"), "'drafter_config' entry): rope_theta: nan is not a finite number"),
    (10**30, "'drafter_config' entry): rope_theta: 1e+30 does not fit a 64-bit integer"),
    ([1e6], "'drafter_config' entry): rope_theta: [1000000.0] is not a number"),
])
def test_strip_refuses_a_hostile_config_inside_the_checkpoint(pair, tmp_path, value, words):
    """The drafter config a trainer pickled into its checkpoint is checked as a file is, named
    by the checkpoint and its entry."""
    from core.ml.models.drafter import load_drafter

    d = load_drafter(pair["drafter"])
    cfg = d.config.to_dict()
    cfg["rope_theta"] = value
    ckpt = tmp_path / "step_7.pt"
    torch.save({"model": d.state_dict(), "drafter_config": cfg, "step": 7}, ckpt)
    out = tmp_path / "out"
    res = run("core.ml.strip", ckpt, out)
    assert res.returncode == 2 and f"{ckpt} (its {words}" in res.stderr, res.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- in process


def test_what_a_save_writes_holds_no_nan_nor_an_out_of_range_number(pair, tmp_path):
    """A config changed in code after it was read (a knob set to NaN, a block size past any
    engine's) is refused by save_drafter before a byte is written; a sound one is written as
    strict JSON (no NaN token), which the strict reader takes back."""
    from core.ml.models.drafter import load_drafter, save_drafter

    d = load_drafter(pair["drafter"])
    for name, value, words in (("output_multiplier", float("nan"), "nan is not a finite number"),
                               ("block_size", 2**40, "out of range (2..4096)")):
        good = getattr(d.config, name)
        setattr(d.config, name, value)
        with pytest.raises(InvalidFile, match=re.escape(words)):
            save_drafter(d, tmp_path / name)
        assert not (tmp_path / name).exists()
        setattr(d.config, name, good)
    save_drafter(d, tmp_path / "ok")
    text = (tmp_path / "ok" / "config.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert DFlashConfig.from_file(tmp_path / "ok").to_dict() == d.config.to_dict()


def test_the_strict_reader_names_the_key_of_a_non_finite_number(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"a": {"b": [1, 2, -Infinity]}}')
    with pytest.raises(InvalidFile) as e:
        read_json_file(path, "drafter config")
    assert e.value.field == "a.b[2]" and str(e.value).startswith(f"{path}: a.b[2]: -Infinity is not a finite")
    path.write_text('{"a": 1e999}')
    with pytest.raises(InvalidFile, match=r": a: 1e999 is not a finite number"):
        read_json_file(path, "drafter config")
    path.write_text('{"a": ' + "[" * 40 + "]" * 40 + "}")
    with pytest.raises(InvalidFile, match="nested more than 32 levels deep"):
        read_json_file(path, "drafter config")
    path.write_text('{"a": [1, 2')
    with pytest.raises(InvalidFile, match="invalid JSON at line 1 column 12"):
        read_json_file(path, "drafter config")


def test_check_fields_walks_a_dict_from_anywhere_without_recursing(tmp_path):
    """A dict that never was JSON (a checkpoint's pickled config) nested far deeper than the
    interpreter's recursion limit is refused, not met with a RecursionError."""
    deep: list = []
    for _ in range(200_000):
        deep = [deep]
    with pytest.raises(InvalidFile, match=r"ckpt.pt: extra(\[0\])+: nested more than 32 levels deep"):
        check_fields({"extra": deep}, "ckpt.pt")
    with pytest.raises(InvalidFile, match=r"ckpt.pt: x\[1\]: inf is not a finite number"):
        check_fields({"x": [1.0, math.inf]}, "ckpt.pt")


def test_a_composite_targets_text_config_is_checked_and_merged(pair, tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["X"], "text_config": {
        "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 320}}))
    assert read_target_config(target)["num_hidden_layers"] == 4
    assert read_target_config(target, text=False)["text_config"]["hidden_size"] == 64


def test_read_header_refuses_a_tiling_that_does_not_add_up(pair, tmp_path):
    """Offsets that overlap, or a shape whose bytes the offsets do not span, are refused by
    tensor name: ``safetensors`` would refuse them inside a load."""
    src = pair["drafter"] / "model.safetensors"
    header = read_header(src)
    name, meta = next(iter(sorted(header.tensors.items(), key=lambda kv: kv[1]["data_offsets"])))
    for bad, words in (({**meta, "shape": [m + 1 for m in meta["shape"]]}, f"tensor {name!r}: F32"),
                       ({**meta, "data_offsets": [8, meta["data_offsets"][1] + 8]}, "starts at 8")):
        doc = {**header.tensors, name: bad, "__metadata__": header.metadata}
        blob = json.dumps(doc).encode()
        blob += b" " * (-len(blob) % 8)
        spoiled = tmp_path / "x.safetensors"
        spoiled.write_bytes(struct.pack("<Q", len(blob)) + blob + src.read_bytes()[header.data_start:])
        with pytest.raises(InvalidFile, match=words):
            read_header(spoiled)


# ----------------------------------------------------------------------------- the console's readers


def test_the_actions_read_headers_and_target_configs_on_a_host_as_the_tasks_do(pair, tmp_path):
    """extract_weights' done-check reads the weights header on the host: a copy cut short,
    empty, lying or random is "not done" (None), never a crash; extract_hidden's disk estimate
    reads the target's config.json on the host: a bad value is the item's failure, by key;
    a train item's validate-time look at a local config.json nested 100,000 deep is "unknown"."""
    import asyncio

    from core.actions.extract_hidden import target_hidden_size
    from core.actions.extract_weights import safetensors_header
    from core.actions.fit import read_local_json
    from core.errors import ActionFailed
    from core.hosts.local import LocalHost

    host = LocalHost("box", workdir=str(tmp_path))
    weights = tmp_path / "model.safetensors"
    target = tmp_path / "config.json"

    async def go():
        await host.connect()
        shutil.copyfile(pair["drafter"] / "model.safetensors", weights)
        whole = await safetensors_header(host, str(weights))
        spoiled = []
        for spoil, _ in WEIGHTS.values():
            shutil.copyfile(pair["drafter"] / "model.safetensors", weights)
            spoil(weights)
            spoiled.append(await safetensors_header(host, str(weights)))
        shutil.copyfile(pair["target"] / "config.json", target)
        hidden = await target_hidden_size(host, str(target))
        target.write_text(json.dumps({"text_config": {"hidden_size": [64]}}))
        with pytest.raises(ActionFailed) as e:
            await target_hidden_size(host, str(target))
        return whole, spoiled, hidden, e.value

    whole, spoiled, hidden, failed = asyncio.run(go())
    assert whole is not None and whole["fc.weight"] == [64, 128]
    assert spoiled == [None] * len(WEIGHTS)
    assert hidden == 64
    assert f"box:{target}: text_config.hidden_size: [64] is not an integer" in failed.message
    target.write_text(DEEP)
    assert read_local_json(target) is None
