"""``core.ml.parity``: one drafter measured several ways, each pair equal or not and why (issue 32 §3).

Pure Python on result.json dicts in the shape core.ml.eval writes; the real four-way
measurement (offline, online, under llama.cpp's rule, through llama-server) is in
tests/ml/test_engine_llama.py.
"""

from __future__ import annotations

import json

import pytest

from core.ml.parity import main, pair_report, parity
from core.ml.runio import UsageError, run_main


def _result(rows, *, causal=(True, False), engine=None, stops=(2,), dtype="float32", mode="online", prompt_len=9):
    layers = [{"causal": c, "window": 3 if i == 0 else None} for i, c in enumerate(causal)]
    res = {"mode": mode, "block_size": 8, "max_new_tokens": 16, "target": {"fingerprint": "t"},
           "prompts": {"sha256": "p"}, "accounting": "dflash-0.1.0", "template": {"chat_template": True},
           "dtype": dtype, "stop_token_ids": list(stops), "drafter": {"attention": {"layers": layers}},
           "per_prompt": [{"id": pid, "tokens": toks, "rounds": rounds, "tau": sum(rounds) / len(rounds),
                           "stopped": toks[-1] == 2, "prompt_len": prompt_len} for pid, toks, rounds in rows]}
    if engine:
        res["engine"] = {"name": "llama.cpp", "revision": "0c1e570", "eos": {"engine": list(stops)}}
    return res


ROWS = [("a", [5, 6, 7, 8, 9], [2, 2]), ("b", [4, 4, 2], [2])]


def test_equal_results_are_equal_with_no_cause():
    rep = pair_report(_result(ROWS), _result(ROWS, engine=True))
    assert rep["equal"] and rep["likely_causes"] == [] and rep["b"] == "llama.cpp@0c1e570"
    assert rep["prompts_rounds_equal"] == rep["num_prompts"] == 2


def test_a_different_rule_is_named_and_the_first_differing_round_given():
    other = [("a", [5, 6, 7, 8, 9], [1, 3]), ("b", [4, 4, 2], [2])]
    rep = pair_report(_result(ROWS), _result(other, causal=(False, False), engine=True))
    assert not rep["equal"] and rep["likely_causes"] == ["rule"]
    assert rep["per_prompt"][0]["first_round_differing"] == 0 and rep["per_prompt"][1]["rounds_equal"]


@pytest.mark.parametrize("kw, cause", [({"dtype": "bfloat16"}, "dtype"), ({"stops": (0, 2)}, "EOS set"),
                                       ({"prompt_len": 11}, "tokenizer")])
def test_each_setting_that_differs_is_the_likely_cause(kw, cause):
    other = [("a", [5, 6, 7, 8, 1], [2, 1]), ("b", [4, 4, 2], [2])]
    assert cause in pair_report(_result(ROWS), _result(other, **kw))["likely_causes"]


def test_only_the_eos_round_differing_is_named_and_else_unexplained():
    eos = [("a", [5, 6, 7, 8, 9], [2, 2]), ("b", [4, 4, 2], [1])]
    assert pair_report(_result(ROWS), _result(eos))["likely_causes"] == ["EOS round"]
    bug = [("a", [5, 6, 7, 8, 9], [1, 3]), ("b", [4, 4, 2], [2])]
    assert pair_report(_result(ROWS), _result(bug))["likely_causes"] == ["unexplained"]


def test_cli_reports_every_pair_and_refuses_one_result(tmp_path, capsys):
    paths = []
    for name, res in (("own", _result(ROWS)), ("eng", _result(ROWS, engine=True)), ("off", _result(ROWS, mode="offline"))):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(res))
    assert run_main(main, [*map(str, paths), "--out", str(tmp_path / "parity.json")]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(x["a"], x["b"]) for x in lines if x["event"] == "metric"] == [
        ("specdeck", "llama.cpp@0c1e570"), ("specdeck", "offline"), ("llama.cpp@0c1e570", "offline")]
    assert json.loads((tmp_path / "parity.json").read_text())["sides"] == ["specdeck", "llama.cpp@0c1e570", "offline"]
    assert run_main(main, [str(paths[0])]) == 2
    with pytest.raises(UsageError, match="at least two"):
        parity([])
