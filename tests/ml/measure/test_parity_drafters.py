"""Issue 48 §4: ``parity`` checks the drafter before the rounds, on results ``core.ml.eval``
really writes: the weights' sha256 each result records (one file or shards), the same drafter
measured twice equal, a drafter with one weight changed "different drafters" and exit 4.

Pure-Python cases (the fallback without a digest, labels) are tests/ml/measure/test_parity.py; the
plan form, tests/cli/test_parity_cli.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

torch = pytest.importorskip("torch")

from core.ml.tasks import eval as eval_mod
from core.ml.measure import parity as parity_mod
from core.ml.formats.runio import run_main  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_eval_records_the_sha256_of_one_weights_file_or_of_its_shards(tiny_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    single = tiny_dirs["drafter"] / "model.safetensors"
    data = single.read_bytes()
    rec = eval_mod.drafter_weights(tiny_dirs["drafter"])
    assert rec["weights"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert rec["fingerprint"] == rec["weights"]["sha256"][:16]  # what results have always called fingerprint
    assert (rec["weights"]["files"], rec["weights"]["bytes"]) == (["model.safetensors"], len(data))
    assert rec["weights"]["mtime_ns"] == single.stat().st_mtime_ns

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    state = load_file(str(single))
    keys = sorted(state)
    halves = {"model-00002-of-00002.safetensors": keys[len(keys) // 2:],
              "model-00001-of-00002.safetensors": keys[:len(keys) // 2]}
    for name, part in halves.items():
        save_file({k: state[k] for k in part}, str(sharded / name))
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: name for name, part in halves.items() for k in part}}))
    shards = [sharded / name for name in sorted(halves)]
    got = eval_mod.drafter_weights(sharded)
    assert got["weights"]["sha256"] == hashlib.sha256(b"".join(p.read_bytes() for p in shards)).hexdigest()
    assert got["weights"]["files"] == sorted(halves)
    assert got["weights"]["bytes"] == sum(p.stat().st_size for p in shards)
    (sharded / "model.safetensors.index.json").write_text("{not json")
    assert eval_mod.drafter_weights(sharded) == {"fingerprint": None, "weights": None}
    assert eval_mod.drafter_weights(tmp_path) == {"fingerprint": None, "weights": None}  # no weights at all


def test_parity_of_one_drafter_measured_twice_is_equal_and_of_two_drafters_exits_4(tiny_dirs, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    other = tmp_path / "drafter-other"
    shutil.copytree(tiny_dirs["drafter"], other)
    state = load_file(str(other / "model.safetensors"))
    name = sorted(state)[0]
    state[name] = state[name] + 0.5  # one tensor changed: another drafter, same config, same path shape
    save_file(state, str(other / "model.safetensors"))

    common = ["--target", str(tiny_dirs["target"]), "--prompts", str(tiny_dirs["prompts"]), "--limit", "2",
              "--max-new-tokens", "12", "--ignore-eos"]
    outs = {}
    for run, drafter in (("first", tiny_dirs["drafter"]), ("again", tiny_dirs["drafter"]), ("other", other)):
        outs[run] = str(tmp_path / run / "result.json")
        assert run_main(eval_mod.main, [*common, "--drafter", str(drafter), "--out", outs[run]]) == 0
    capsys.readouterr()

    assert run_main(parity_mod.main, [outs["first"], outs["again"]]) == 0
    out = capsys.readouterr()
    (same,) = [json.loads(x) for x in out.out.splitlines()]
    assert same["equal"] and same["same_drafter"] is True and same["drafter"]["by"] == "weights sha256"
    assert (same["a"], same["b"]) == (f"{outs['first']} (specdeck)", f"{outs['again']} (specdeck)")
    assert out.err == ""

    assert run_main(parity_mod.main, [outs["first"], outs["other"]]) == parity_mod.DIFFERENT_DRAFTERS == 4
    out = capsys.readouterr()
    (diff,) = [json.loads(x) for x in out.out.splitlines()]
    assert diff["same_drafter"] is False and not diff["equal"] and diff["likely_causes"][0] == "different drafters"
    assert "unexplained" not in diff["likely_causes"]
    assert "different drafters" in out.err and diff["drafter"]["a"][:16] in out.err
