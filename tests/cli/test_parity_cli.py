"""``specdeck parity PLAN ITEM ITEM...``: the items' latest results read from their host, every
pair equal or not and why (issue 32 §3); bad input exits 2 with nothing written. The results
are eval's result.json shape; the four-way measurement through a real llama-server is
tests/ml/engines/test_engine_llama.py."""

from __future__ import annotations

import json

from core.state.store import Store
from tests.conftest import run_cli


def _result(rounds_a, causal, engine=None, rule=None, sha=None):
    layers = [{"causal": causal, "window": 3}, {"causal": True, "window": None}]
    res = {"mode": "online", "block_size": 8, "max_new_tokens": 16, "target": {"fingerprint": "t"},
           "prompts": {"sha256": "p"}, "accounting": "dflash-0.1.0", "template": {"chat_template": True},
           "dtype": "float32", "stop_token_ids": [2], "drafter": {"attention": {"layers": layers}},
           "per_prompt": [{"id": "a", "tokens": [5, 6, 7, 8, 9], "rounds": rounds_a, "tau": sum(rounds_a) / 2,
                           "stopped": False, "prompt_len": 9}]}
    if sha:  # what core.ml.eval records of the drafter's weights
        res["drafter"].update(path=f"/drafters/{sha[0]}", fingerprint=sha[:16],
                              weights={"sha256": sha, "files": ["model.safetensors"], "bytes": 64, "mtime_ns": 1})
    if rule:
        res["drafter"]["engine_rule"] = {"engine": rule, "revision": "0c1e570", "changed": True}
    if engine:
        res["engine"] = {"name": "llama.cpp", "revision": "0c1e570", "eos": {"engine": [2]}}
    return res


def _seeded(tmp_path, results: dict):
    ev = tmp_path / "ev"
    ev.mkdir()
    items = "".join(f"""  - id: {i}
    content: the drafter measured one way
    action: {{kind: eval, host: ev, params: {{drafter: d, target: t}}}}
""" for i in [*results, "never-run"])
    plan = tmp_path / "p.yaml"
    plan.write_text(f"name: par\nhosts:\n  ev: {{local: true, workdir: {ev}}}\nitems:\n{items}")
    state = tmp_path / "s.db"
    s = Store(str(state))
    for n, (item, res) in enumerate(results.items()):
        path = ev / f"{item}.json"
        if res is not None:
            path.write_text(json.dumps(res) if isinstance(res, dict) else res)
        s.claim_run(f"r{n}", item, "eval", "ev", owner="test")
        s.end_run(f"r{n}", "succeeded", exit_code=0, result={"result": str(path)})
    s.close()
    return plan, state


def test_parity_of_three_items_names_the_rule_as_the_cause(tmp_path):
    plan, state = _seeded(tmp_path, {"own": _result([2, 2], True), "rule": _result([1, 3], False, rule="llama.cpp"),
                                     "engine": _result([1, 3], False, engine=True)})
    res = run_cli("--state", state, "parity", plan, "own", "rule", "engine", "--json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert [i["item"] for i in rep["items"]] == ["own", "rule", "engine"]
    own, rule, engine = rep["sides"]
    assert (own, engine) == ("specdeck", "llama.cpp@0c1e570") and rule.startswith("specdeck under llama.cpp")
    # each side labelled by its item and its harness: a pair names items, not just harnesses
    assert rep["labels"] == [f"own ({own})", f"rule ({rule})", f"engine ({engine})"]
    own, rule, engine = rep["labels"]
    pairs = {(p["a"], p["b"]): p for p in rep["pairs"]}
    assert [pairs[(own, rule)]["likely_causes"], pairs[(own, engine)]["likely_causes"]] == [["rule"], ["rule"]]
    assert pairs[(rule, engine)]["equal"] and not pairs[(own, engine)]["equal"]  # the rule and the engine agree
    table = run_cli("--state", state, "parity", plan, "own", "rule", "engine").stdout
    assert "engine (llama.cpp@0c1e570)" in table and "rule" in table and "yes" in table


def test_bad_input_exits_2_naming_the_item(tmp_path):
    plan, state = _seeded(tmp_path, {"own": _result([2, 2], True), "broken": "{not json",
                                     "gone": None})
    before = state.read_bytes()
    for args, words in [(["own"], "at least two"), (["own", "nope"], "nope"),
                        (["own", "never-run"], "'never-run' has no succeeded eval run"),
                        (["own", "broken"], "not a result.json"), (["own", "gone"], "missing")]:
        res = run_cli("--state", state, "parity", plan, *args)
        assert res.returncode == 2 and words in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr and res.stdout == ""
    assert state.read_bytes() == before  # a look writes nothing


V4, V5 = "4" * 64, "5" * 64


def test_two_drafters_are_different_drafters_exit_4_with_distinct_labels(tmp_path):
    """Issue 48 §4: eval-v4 and eval-v5 evaluate two drafters through the same harness."""
    plan, state = _seeded(tmp_path, {"eval-v4": _result([1, 3], True, sha=V4),
                                     "eval-v5": _result([2, 2], True, sha=V5)})
    res = run_cli("--state", state, "parity", plan, "eval-v4", "eval-v5")
    assert res.returncode == 4, res.stderr
    assert "eval-v4 (specdeck)" in res.stdout and "eval-v5 (specdeck)" in res.stdout
    assert "different drafters" in res.stdout and "unexplained" not in res.stdout
    assert "different drafters" in res.stderr and V4[:16] in res.stderr and V5[:16] in res.stderr
    assert "hint:" in res.stderr and "Traceback" not in res.stderr
    rep = json.loads(run_cli("--state", state, "parity", plan, "eval-v4", "eval-v5", "--json").stdout)
    (pair,) = rep["pairs"]
    assert (pair["a"], pair["b"]) == ("eval-v4 (specdeck)", "eval-v5 (specdeck)")
    assert [i["label"] for i in rep["items"]] == [pair["a"], pair["b"]] and rep["sides"] == ["specdeck", "specdeck"]
    assert pair["same_drafter"] is False and pair["likely_causes"] == ["different drafters"]
    assert rep["different_drafters"] == [[pair["a"], pair["b"]]]


def test_one_drafter_measured_twice_is_equal_exit_0(tmp_path):
    plan, state = _seeded(tmp_path, {"first": _result([2, 2], True, sha=V5), "again": _result([2, 2], True, sha=V5)})
    res = run_cli("--state", state, "parity", plan, "first", "again", "--json")
    assert res.returncode == 0, res.stderr
    (pair,) = json.loads(res.stdout)["pairs"]
    assert (pair["a"], pair["b"]) == ("first (specdeck)", "again (specdeck)")
    assert pair["equal"] and pair["same_drafter"] is True and pair["likely_causes"] == []
    assert pair["drafter"]["by"] == "weights sha256" and res.stderr == ""


def test_an_item_named_twice_exits_2(tmp_path):
    plan, state = _seeded(tmp_path, {"first": _result([2, 2], True, sha=V5)})
    res = run_cli("--state", state, "parity", plan, "first", "first")
    assert res.returncode == 2 and "'first' is named twice" in res.stderr and res.stdout == ""
