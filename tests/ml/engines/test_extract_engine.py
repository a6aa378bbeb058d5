"""``python -m core.ml.extract --engine llama.cpp`` (issue 49 §3): llama-server produces the greedy
continuations, torch takes the hidden states, and nothing changes but who decoded.

A real ``llama-server`` (scripts/build-llama-server) serves a tiny Qwen3 target (float32, logits
far from ties) converted by the engine's own converter. On 4 prompts:

* the engine's continuations are torch's greedy: the cache holds the same tokens, features and
  labels as a torch-only extract, every prompt says ``tokens_from: llama.cpp``, the first
  ``--engine-check`` prompts were also decoded token by token by torch, nothing mismatched, and
  no llama-server outlives the extract;
* served another target's GGUF (``--engine-target``), every continuation is caught and named
  (the checked prompt by torch's own greedy, the rest by the teacher-forced argmax), and each
  prompt's tokens come from torch: the cache equals the torch-only one all the same;
* a missing binary exits 2 before anything is written.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from core.ml.engines.llama import find_binary, server_processes  # noqa: E402
from core.ml.formats import featstore  # noqa: E402
from core.ml.formats.runio import run_main  # noqa: E402
from core.ml.tasks import extract as extract_mod  # noqa: E402

BINARY = find_binary()
needs_server = [pytest.mark.engine, pytest.mark.skipif(
    BINARY is None or not BINARY.is_file(),
    reason="no llama-server built: scripts/bootstrap --test builds it with scripts/build-llama-server "
           "(~7 min, into ~/.cache/specdeck/llama.cpp); CI has it")]
SHARP = {"initializer_range": 0.2, "eos_token_id": [0, 2]}
"""Logits far from ties and llama.cpp's EOS set (tests/ml/engines/test_engine_llama.py's reasons)."""
MAX_NEW = 24


def _extract(target, prompts, out, *extra) -> dict:
    argv = ["--target", str(target), "--prompts", str(prompts), "--layers", "0,2", "--out", str(out),
            "--max-new-tokens", str(MAX_NEW), "--dtype", "float32", *extra]
    assert run_main(extract_mod.main, argv) == 0
    return json.loads((out / featstore.MANIFEST).read_text())


def _cache(out, manifest) -> dict:
    """Each prompt's stored sequence (ids, features, labels)."""
    return {pid: featstore.read_entry(out, pid, e) for pid, e in manifest["entries"].items()}


def _same_cache(out_a, man_a, out_b, man_b) -> None:
    a, b = _cache(out_a, man_a), _cache(out_b, man_b)
    assert sorted(a) == sorted(b)
    for pid in a:
        assert a[pid].input_ids.tolist() == b[pid].input_ids.tolist(), pid
        assert a[pid].labels.tolist() == b[pid].labels.tolist(), pid
        assert a[pid].prompt_len == b[pid].prompt_len
        assert a[pid].features.equal(b[pid].features), pid  # the same torch forward over the same tokens
        assert man_a["entries"][pid]["stopped"] == man_b["entries"][pid]["stopped"], pid


@pytest.fixture(scope="module")
def tiny_target(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("extract-engine")
    model = tiny.build_tiny_target("qwen3", 0, **SHARP)
    target = tiny.save_tiny_target(root / "target", model=model)
    other = tiny.save_tiny_target(root / "other", seed=1, model=tiny.build_tiny_target("qwen3", 1, **SHARP))
    prompts = tiny.write_tiny_prompts(root / "prompts.jsonl", n_text=3)
    own = _extract(target, prompts, root / "torch")
    return root, target, other, prompts, own


class TestEngineContinuations:
    pytestmark = needs_server

    def test_engine_continuations_are_torchs_greedy_and_the_cache_equals_a_torch_extract(self, tiny_target):
        root, target, _other, prompts, own = tiny_target
        before = set(server_processes(BINARY))
        man = _extract(target, prompts, root / "engine", "--engine", "llama.cpp", "--engine-bin", str(BINARY),
                       "--engine-check", "2")
        assert set(server_processes(BINARY)) - before == set()
        _same_cache(root / "engine", man, root / "torch", own)
        ids = list(man["entries"])
        assert len(ids) == 4
        assert {pid: e["tokens_from"] for pid, e in man["entries"].items()} == dict.fromkeys(ids, "llama.cpp")
        assert all(own["entries"][pid]["tokens_from"] == "torch" for pid in ids)
        assert man["engine"]["checked"] == ids[:2]
        assert man["engine"]["mismatches"] == []
        assert man["engine"]["eog"] == [0, 2]
        assert man["engine"]["target"]["outtype"] == "f32"
        assert all(e["engine_s"] > 0 for e in man["entries"].values())
        assert any(e["num_generated"] == MAX_NEW for e in man["entries"].values())  # not all ended at once

    def test_another_targets_gguf_is_caught_on_every_prompt_named_and_torch_decodes(self, tiny_target):
        root, target, other, prompts, own = tiny_target
        wrong = root / "wrong"
        _extract(other, prompts, wrong, "--engine", "llama.cpp", "--engine-bin", str(BINARY), "--limit", "1")
        gguf = next((wrong / "engine").glob("target-*-f32.gguf"))
        man = _extract(target, prompts, root / "caught", "--engine", "llama.cpp", "--engine-bin", str(BINARY),
                       "--engine-check", "1", "--engine-target", str(gguf))
        _same_cache(root / "caught", man, root / "torch", own)
        ids = list(man["entries"])
        assert {pid: e["tokens_from"] for pid, e in man["entries"].items()} == dict.fromkeys(ids, "torch")
        bad = man["engine"]["mismatches"]
        assert [m["id"] for m in bad] == ids
        kinds = ("torch's token-by-token greedy differs", "the teacher-forced forward's argmax differs",
                 "the engine ended after")
        assert all(m["why"].startswith(kinds) for m in bad), bad
        assert not bad[0]["why"].startswith(kinds[1])  # the checked prompt: torch's own greedy decided first
        assert [m["torch_greedy_equal"] for m in bad] == [False] * len(ids)  # torch's greedy then confirmed it
        for m in bad:
            if m["position"] is not None:  # the first new token where the two differ, both named
                seq = featstore.read_entry(root / "caught", m["id"], man["entries"][m["id"]])
                assert seq.generated[m["position"]] == m["torch"] != m["engine"]
        assert man["engine"]["target"]["converted_from"] is None


@pytest.mark.usefixtures("tiny")
def test_a_missing_binary_exits_2_naming_it_and_writes_nothing(tiny, tmp_path, capsys):
    target = tiny.save_tiny_target(tmp_path / "target")
    prompts = tiny.write_tiny_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "out"
    argv = ["--target", str(target), "--prompts", str(prompts), "--layers", "0,2", "--out", str(out),
            "--engine", "llama.cpp", "--engine-bin", str(tmp_path / "no-such-llama-server")]
    assert run_main(extract_mod.main, argv) == 2
    err = capsys.readouterr().err
    assert "no-such-llama-server" in err and "scripts/build-llama-server" in err
    assert not out.exists()


def test_first_difference_names_the_first_index_or_the_shorter_length():
    from core.ml.engines.greedy import first_difference

    assert first_difference([5, 6, 7], [5, 6, 7]) is None
    assert first_difference([5, 6, 7], [5, 9, 7]) == 1
    assert first_difference([5, 6], [5, 6, 7]) == 2  # the engine stopped early
    assert first_difference([], []) is None


def test_labels_disagree_reads_the_argmax_one_position_before_each_token():
    from core.ml.engines.greedy import labels_disagree

    # prompt of 3 ids; labels[i] is the argmax after position i, so tokens[k] is labels[3 - 1 + k]
    labels = [11, 12, 40, 41, 42, 99]
    assert labels_disagree([40, 41, 42], labels, 3) is None
    assert labels_disagree([40, 7, 42], labels, 3) == (1, 41)
