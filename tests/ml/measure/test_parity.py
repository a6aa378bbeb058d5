"""``core.ml.parity``: one drafter measured several ways, each pair equal or not and why (issue 32 §3).

Pure Python on result.json dicts in the shape core.ml.eval writes; the real four-way
measurement (offline, online, under llama.cpp's rule, through llama-server) is in
tests/ml/engines/test_engine_llama.py.
"""

from __future__ import annotations

import json

import pytest

from core.ml.measure.parity import main, pair_report, parity
from core.ml.formats.runio import UsageError, run_main


def _result(rows, *, causal=(True, False), engine=None, stops=(2,), dtype="float32", mode="online", prompt_len=9,
            drafter=None):
    layers = [{"causal": c, "window": 3 if i == 0 else None} for i, c in enumerate(causal)]
    res = {"mode": mode, "block_size": 8, "max_new_tokens": 16, "target": {"fingerprint": "t"},
           "prompts": {"sha256": "p"}, "accounting": "dflash-0.1.0", "template": {"chat_template": True},
           "dtype": dtype, "stop_token_ids": list(stops), "drafter": {"attention": {"layers": layers}},
           "per_prompt": [{"id": pid, "tokens": toks, "rounds": rounds, "tau": sum(rounds) / len(rounds),
                           "stopped": toks[-1] == 2, "prompt_len": prompt_len} for pid, toks, rounds in rows]}
    if engine:
        res["engine"] = {"name": "llama.cpp", "revision": "0c1e570", "eos": {"engine": list(stops)}}
    res["drafter"].update(drafter or {})
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


def test_a_last_round_drafted_otherwise_at_the_end_is_named_end_of_generation():
    # max_new_tokens 16, B 8: the reference shrinks the last block, llama.cpp's server cuts the draft
    own = [("a", list(range(16)), [4, 4, 4, 3])]
    eng = [("a", list(range(16)), [4, 4, 4, 1, 1, 1])]  # 4 tokens left at round 3: where the two draft otherwise
    rep = pair_report(_result(own), _result(eng, engine=True))
    assert not rep["equal"] and rep["likely_causes"] == ["end of generation"]
    assert rep["per_prompt"][0]["cause"] == "end of generation" and rep["per_prompt"][0]["first_round_differing"] == 3
    # under llama.cpp's rule specdeck runs the end as the engine does: equal, no cause
    ruled = _result(eng, drafter={"engine_rule": {"engine": "llama.cpp", "changed": False,
                                                  "end_of_generation": "full-block"}})
    ruled["end_of_generation"] = "full-block"
    assert pair_report(ruled, _result(eng, engine=True))["equal"]
    assert pair_report(ruled, _result(own))["likely_causes"] == ["end of generation"]
    assert pair_report(ruled, _result(own))["a"] == "specdeck under llama.cpp's rule"  # named though its attention is specdeck's
    # the same difference earlier, with a full block left on both sides, is no end-of-generation matter
    early = [("a", list(range(16)), [1, 1, 4, 4, 4, 1])]
    assert pair_report(_result(own), _result(early, engine=True))["likely_causes"] == ["unexplained"]
    # nor between two sides that ran the same end
    assert pair_report(_result(own), _result(eng))["likely_causes"] == ["unexplained"]


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


SHA_V4, SHA_V5 = "4" * 64, "5" * 64


def _weights(sha, path="/d/v5", size=100, mtime=7):
    return {"path": path, "fingerprint": sha[:16], "weights": {"sha256": sha, "files": ["model.safetensors"],
                                                                "bytes": size, "mtime_ns": mtime}}


def test_two_drafters_are_different_drafters_never_equal_nor_unexplained():
    bug = [("a", [5, 6, 7, 8, 9], [1, 3]), ("b", [4, 4, 2], [2])]
    rep = pair_report(_result(ROWS, drafter=_weights(SHA_V4, "/d/v4")), _result(bug, drafter=_weights(SHA_V5)))
    assert rep["likely_causes"] == ["different drafters"] and not rep["equal"] and rep["same_drafter"] is False
    assert rep["drafter"]["by"] == "weights sha256" and (rep["drafter"]["a"], rep["drafter"]["b"]) == (SHA_V4, SHA_V5)
    # the same rounds from two drafters are still no parity: the weights differ
    same_rounds = pair_report(_result(ROWS, drafter=_weights(SHA_V4)), _result(ROWS, drafter=_weights(SHA_V5)))
    assert not same_rounds["equal"] and same_rounds["likely_causes"] == ["different drafters"]
    assert same_rounds["prompts_rounds_equal"] == same_rounds["num_prompts"] == 2


def test_one_drafter_measured_twice_is_equal_and_an_old_16_digit_fingerprint_is_its_digest():
    rep = pair_report(_result(ROWS, drafter=_weights(SHA_V5, mtime=1)),
                      _result(ROWS, drafter=_weights(SHA_V5, mtime=2)))
    assert rep["equal"] and rep["same_drafter"] is True and rep["likely_causes"] == []
    assert rep["drafter"]["note"] is None
    old = _result(ROWS, drafter={"path": "/d/v5", "fingerprint": SHA_V5[:16]})  # before weights.sha256 was recorded
    assert pair_report(old, _result(ROWS, drafter=_weights(SHA_V5)))["same_drafter"] is True
    assert pair_report(old, _result(ROWS, drafter=_weights(SHA_V4)))["same_drafter"] is False


def test_without_a_digest_the_recorded_path_size_and_mtime_decide_and_the_report_says_so():
    no_digest = {"path": "/d/v5", "fingerprint": None}
    rep = pair_report(_result(ROWS, drafter=no_digest), _result(ROWS, drafter=_weights(SHA_V5)))
    assert rep["equal"] and rep["same_drafter"] is True and rep["drafter"]["by"] == "path"
    assert rep["drafter"]["note"].startswith("specdeck records no weights digest")
    other = pair_report(_result(ROWS, drafter=no_digest), _result(ROWS, drafter={"path": "/d/v4"}))
    assert other["same_drafter"] is False and other["likely_causes"] == ["different drafters"]
    assert "specdeck and specdeck record no weights digest" in other["drafter"]["note"]
    both = {"path": "/d/v5", "weights": {"bytes": 100, "mtime_ns": 7}}
    rewritten = pair_report(_result(ROWS, drafter=both), _result(ROWS, drafter={**both, "weights": {"bytes": 100,
                                                                                                   "mtime_ns": 8}}))
    assert rewritten["same_drafter"] is False and rewritten["drafter"]["by"] == "path, size, mtime"
    unknown = pair_report(_result(ROWS), _result(ROWS, engine=True))  # nothing recorded: not checked, said so
    assert unknown["same_drafter"] is None and unknown["equal"] and "not checked" in unknown["drafter"]["note"]


def test_labels_never_collide_and_a_result_given_twice_is_refused():
    one, two = _result(ROWS, drafter=_weights(SHA_V5)), _result(ROWS, drafter=_weights(SHA_V5))
    rep = parity([one, two, _result(ROWS, engine=True, drafter=_weights(SHA_V5))])
    assert rep["sides"] == ["specdeck", "specdeck", "llama.cpp@0c1e570"]
    assert rep["labels"] == ["#1 (specdeck)", "#2 (specdeck)", "llama.cpp@0c1e570"]
    assert [(p["a"], p["b"]) for p in rep["pairs"]] == [("#1 (specdeck)", "#2 (specdeck)"),
                                                        ("#1 (specdeck)", "llama.cpp@0c1e570"),
                                                        ("#2 (specdeck)", "llama.cpp@0c1e570")]
    assert all(p["equal"] for p in rep["pairs"]) and rep["different_drafters"] == []
    with pytest.raises(UsageError, match="given twice"):
        parity([one, two], ["eval-v5 (specdeck)", "eval-v5 (specdeck)"])


def test_cli_exits_4_for_different_drafters_with_the_report_written(tmp_path, capsys):
    paths = {}
    for name, sha in (("v4", SHA_V4), ("v5", SHA_V5), ("v5-again", SHA_V5)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(_result(ROWS, drafter=_weights(sha))))
    v4, v5, again = (str(paths[k]) for k in ("v4", "v5", "v5-again"))
    from console.cli import exit_codes

    assert run_main(main, [v4, v5, "--out", str(tmp_path / "parity.json")]) == 4 == exit_codes.DIFFERENT_DRAFTERS
    out = capsys.readouterr()
    (metric,) = [json.loads(x) for x in out.out.splitlines() if json.loads(x)["event"] == "metric"]
    assert (metric["a"], metric["b"]) == (f"{v4} (specdeck)", f"{v5} (specdeck)")
    assert metric["likely_causes"] == ["different drafters"] and "unexplained" not in out.out
    assert "different drafters" in out.err and SHA_V4[:16] in out.err and SHA_V5[:16] in out.err
    assert json.loads((tmp_path / "parity.json").read_text())["different_drafters"] == [[metric["a"], metric["b"]]]
    assert run_main(main, [v5, again]) == 0  # one drafter measured twice
    assert '"equal": true' in capsys.readouterr().out
    assert run_main(main, [v5, v5]) == 2 and "given twice" in capsys.readouterr().err
