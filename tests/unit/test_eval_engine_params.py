"""The eval action's engine params (issue 32 §3): validated like the others, passed to core.ml.eval."""

from __future__ import annotations

import pytest

from core.actions.eval import EvalParams, eval_rows
from core.plans.params import parse_params
from tests.unit.evalcmd import eval_words


def _errors(**params) -> dict:
    with pytest.raises(ExceptionGroup) as info:
        parse_params(EvalParams, {"drafter": "d", "target": "t", **params})
    return {e.path: e.message for e in info.value.exceptions}


def test_engine_params_reach_the_command():
    words = eval_words(EvalParams(drafter="d", target="t", engine="llama.cpp", engine_bin="bin/llama-server",
                                  engine_target="t.gguf", engine_threads=4, engine_context=2048))
    assert words[words.index("--engine") + 1] == "llama.cpp"
    assert words[words.index("--engine-bin") + 1] == "/home/op/bin/llama-server"
    assert words[words.index("--engine-target") + 1] == "/home/op/t.gguf"
    assert words[words.index("--engine-threads") + 1] == "4"
    assert words[words.index("--engine-context") + 1] == "2048"
    assert "--engine-drafter" not in words
    assert not any(w.startswith("--engine") for w in eval_words(EvalParams(drafter="d", target="t")))


@pytest.mark.parametrize("params, field, words", [
    ({"engine": "vllm"}, ("engine",), "llama.cpp"),
    ({"engine": "llama.cpp", "mode": "offline", "cache": "c"}, ("mode",), "online"),
    ({"engine": "llama.cpp", "tree_budget": 4}, ("tree_budget",), "chain"),
    ({"engine": "llama.cpp", "temperature": 0.7}, ("temperature",), "greedy"),
    ({"engine": "llama.cpp", "engine_threads": 0}, ("engine_threads",), ">= 1"),
    ({"engine": "llama.cpp", "engine_context": 4}, ("engine_context",), ">= 16"),
    ({"engine_bin": "x"}, ("engine_bin",), "engine: llama.cpp"),
    ({"engine": "llama.cpp", "engine_rule": "llama.cpp"}, ("engine_rule",), "another eval item"),
    ({"engine_rule": "tgi"}, ("engine_rule",), "llama.cpp"),
])
def test_bad_engine_params_are_named(params, field, words):
    errs = _errors(**params)
    assert field in errs and words in errs[field], errs


def test_engine_rows_are_labelled_with_the_engine_so_never_merged_with_in_process_rows():
    res = {"mode": "online", "block_size": 8, "per_prompt": [{"id": "p", "tau": 2.0, "rounds": [2, 2]}]}
    own = eval_rows("r1", "e", res, "v5", "drafter", None)
    eng = eval_rows("r2", "e", {**res, "engine": {"name": "llama.cpp", "revision": "0c1e570"}}, "v5", "drafter", None)
    assert own[0].drafter == "v5" and eng[0].drafter == "v5 @llama.cpp"
    assert eng[0].settings["engine"] == "llama.cpp@0c1e570" and "engine" not in own[0].settings


def test_an_engine_rule_reaches_the_command_and_names_its_rows():
    words = eval_words(EvalParams(drafter="d", target="t", engine_rule="llama.cpp"))
    assert words[words.index("--engine-rule") + 1] == "llama.cpp" and "--engine" not in words
    res = {"mode": "online", "block_size": 8, "per_prompt": [{"id": "p", "tau": 2.0, "rounds": [2, 2]}],
           "drafter": {"engine_rule": {"engine": "llama.cpp", "revision": "0c1e570", "changed": True}}}
    row, = eval_rows("r3", "e", res, "v5", "drafter", None)
    assert row.drafter == "v5 under llama.cpp" and row.settings["engine_rule"] == "llama.cpp@0c1e570"
