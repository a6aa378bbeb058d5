"""Issue 42 §7: every JSON file and output specdeck writes is strict JSON (no NaN or Infinity
token: a non-finite number is null, and the document's ``non_finite`` says where and what it
was), and the result.json files ``parity`` and ``compare`` read are checked once, so an edited
or foreign one (wrong types, missing keys, negative or absurd counts) is refused by name (the
file, the prompt, the field; exit 2), never a traceback or a figure."""

from __future__ import annotations

import ast
import json
import sqlite3
import subprocess
import sys

import pytest

from core.ml.formats import strictjson
from core.ml.formats.resultfile import problem
from core.state.records import EvalRow
from core.state.store import Store
from tests.cli.test_parity_cli import _seeded
from tests.conftest import ROOT
from tests.fault.conftest import cli, no_traceback


def strict_loads(text: str):
    """``json.loads`` that refuses NaN, Infinity and -Infinity (as jq and JSON.parse do)."""
    def refuse(token):
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_dumps_writes_null_and_says_where_and_leaves_finite_documents_as_they_were():
    doc = {"tau": float("nan"), "rows": [1.5, float("inf"), {"a/b~c": float("-inf")}], "ok": True, "n": 3}
    got = strict_loads(strictjson.dumps(doc))
    assert got == {"tau": None, "rows": [1.5, None, {"a/b~c": None}], "ok": True, "n": 3,
                   "non_finite": {"/tau": "NaN", "/rows/1": "Infinity", "/rows/2/a~1b~0c": "-Infinity"}}
    assert doc["tau"] != doc["tau"]  # the caller's object is left as it was
    plain = {"x": [1, 2.5, None, "s"], "y": {"z": False}}
    assert strictjson.dumps(plain, indent=2) == json.dumps(plain, indent=2)
    assert strict_loads(strictjson.dumps([float("nan")])) == [None]  # no object on top: null alone


def test_dumps_checks_what_default_converts():
    class Scalar:  # a numpy or torch scalar, as runio's default converts it
        def item(self):
            return float("inf")

    text = strictjson.dumps({"loss": Scalar()}, default=lambda o: o.item())
    assert strict_loads(text) == {"loss": None, "non_finite": {"/loss": "Infinity"}}


WRITERS_THAT_ARE_NOT_JSON = {
    # the file and how many json.dumps calls in it make no JSON document anyone reads as one
    "core/tau/table.py": 3,  # equality keys of settings, compared in memory
    "core/actions/eval.py": 1,  # the settings key: a hash input
    "core/ml/tasks/extract.py": 1,  # the target fingerprint: a hash input
    "core/ml/formats/drafter_config.py": 1,  # the drafter fingerprint: a hash input
    "core/plans/planfile.py": 1,  # a plan var's text as the shell sees it
    "core/plans/shellvars.py": 1,  # the same, for the run's environment
    "console/cli/results.py": 1,  # a config value shown in `diff`'s table
    "core/capsules/progress.py": 1,  # a value shown in a progress line or the log pane
    "core/plans/arms.py": 1,  # an arm's knob value shown beside its row (`noise.target=fc_input`)
}


def _refuses_nan(call: ast.Call) -> bool:
    """``json.dumps(..., allow_nan=False)``: strict too (it raises instead of writing NaN), the
    writer of a file an engine reads, where null would stand where a number belongs."""
    return any(k.arg == "allow_nan" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords)


def test_every_json_writer_goes_through_strictjson():
    """A new ``json.dump``/``json.dumps`` in core or console is strict or says why it is no
    JSON output (the list above)."""
    found = {}
    for path in sorted((ROOT / "core").rglob("*.py")) + sorted((ROOT / "console").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "core/ml/formats/strictjson.py":
            continue
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr in ("dump", "dumps")
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == "json"
                 and not _refuses_nan(n)]
        if calls:
            found[rel] = len(calls)
    assert found == WRITERS_THAT_ARE_NOT_JSON


def _compare_plan(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(f"name: cmp\nhosts:\n  ev: {{local: true, workdir: {tmp_path / 'ev'}}}\nitems:\n"
                    "  - id: eval\n    content: v5 vs its baseline\n"
                    "    action: {kind: eval, host: ev, params: {drafter: d, target: t}}\n")
    return plan


def test_compare_json_of_rows_whose_figures_overflow_is_strict(tmp_path):
    """Finite taus whose ratio overflows (1e150 over 5e-324: % of baseline infinite) and, as an
    older specdeck stored them, settings holding NaN: ``compare --json`` held Infinity and NaN."""
    plan, db = _compare_plan(tmp_path), tmp_path / "s.db"
    store = Store(db)
    store.add_eval_results([EvalRow("r", "eval", name, role, f"p{i}", tau, [1, 2], None, {"block_size": 8})
                            for i in range(8) for name, role, tau in
                            (("v5", "drafter", 1e150), ("base", "baseline", 5e-324))])
    store.close()
    con = sqlite3.connect(db)
    con.execute("UPDATE eval_results SET settings = ?", ['{"block_size": 8, "temperature": NaN}'])
    con.commit()
    con.close()
    res = cli("--state", db, "compare", plan, "--json")
    assert res.returncode == 0, res.stderr
    data = strict_loads(res.stdout)
    cell = data["cells"][0]
    assert cell["tau"] == 1e150 and cell["pct_of_baseline"] is None
    assert data["non_finite"]["/cells/0/pct_of_baseline"] == "Infinity"
    assert data["non_finite"]["/drafters/0/settings/temperature"] == "NaN"


def _result(**over):
    res = {"mode": "online", "block_size": 8, "max_new_tokens": 16, "target": {"fingerprint": "t"},
           "prompts": {"sha256": "p"}, "accounting": "dflash-0.1.0", "template": {"chat_template": True},
           "dtype": "float32", "stop_token_ids": [2], "drafter": {"attention": {"layers": []}},
           "per_prompt": [{"id": "a", "tokens": [5, 6, 7, 8, 9], "rounds": [2, 2], "tau": 2.0,
                           "stopped": False, "prompt_len": 9},
                          {"id": "b", "tokens": [4, 2], "rounds": [1], "tau": 1.0, "stopped": True,
                           "prompt_len": 7}]}
    res.update(over)
    return res


def _row(**over):
    row = {"id": "b", "tokens": [4, 2], "rounds": [1], "tau": 1.0, "stopped": True, "prompt_len": 7}
    row.update(over)
    return row


HOSTILE = [
    # (the result, what the refusal names)
    (_result(per_prompt=[_result()["per_prompt"][0], _row(rounds=[-1])]), ("prompt 'b'", "'rounds'", "-1")),
    (_result(per_prompt=[_row(rounds=[1, 10 ** 30])]), ("prompt 'b'", "'rounds'", "over 19 digits")),
    (_result(per_prompt=[_row(rounds=[9])]), ("'rounds'", "block size (8)")),
    (_result(per_prompt=[_row(tau="2.0")]), ("prompt 'b'", "'tau'", "'2.0'")),
    (_result(per_prompt=[_row(tau=-3.0)]), ("'tau'", "-3.0")),
    (_result(per_prompt=[_row(prompt_len=-7)]), ("'prompt_len'", ">= 0")),
    (_result(per_prompt=[_row(tokens=[4, "x"])]), ("'tokens'",)),
    (_result(per_prompt=[_row(rounds="12")]), ("'rounds'", "not a list")),
    (_result(per_prompt=[_row(id=None)]), ("per_prompt[0]", "'id'")),
    (_result(per_prompt=[7]), ("per_prompt[0]", "not an object")),
    (_result(per_prompt={"a": 1}), ("'per_prompt'", "not a list")),
    (_result(block_size=-8), ("'block_size'", ">= 1")),
    (_result(max_new_tokens="16"), ("'max_new_tokens'",)),
    (_result(top_k=10 ** 30), ("'top_k'",)),
    (_result(stop_token_ids=[-2]), ("'stop_token_ids'",)),
    (_result(ddtree={"budget": 8, "per_prompt": [_row(rounds=[-2])]}), ("ddtree:", "'rounds'")),
]


@pytest.mark.parametrize("res, words", HOSTILE, ids=[f"{i}" for i in range(len(HOSTILE))])
def test_a_hostile_result_is_named_by_prompt_and_field(res, words):
    why = problem(res)
    assert why is not None and all(w in why for w in words), why


def test_a_result_eval_writes_passes():
    assert problem(_result()) is None
    assert problem(_result(ddtree={"budget": 8, "per_prompt": [_row()]}, tau=1.5, tau_pooled=None)) is None
    assert problem(_result(per_prompt=[_row(rounds=None, tau=None, num_rounds=0, committed_tokens=0)])) is None


@pytest.mark.parametrize("res, words", [HOSTILE[0], HOSTILE[3], HOSTILE[9], HOSTILE[15]],
                         ids=["negative-round", "string-tau", "row-not-object", "ddtree-round"])
def test_parity_refuses_an_edited_result_naming_file_item_prompt_and_field(tmp_path, res, words):
    plan, state = _seeded(tmp_path, {"own": _result(), "again": _result(), "edited": res})
    ev = tmp_path / "ev"
    for args in (("parity", plan, "own", "edited"), ("parity", plan, "own", "edited", "--json")):
        got = cli("--state", state, *args)
        assert got.returncode == 2, got.stderr
        assert f"{ev / 'edited.json'}" in got.stderr and "item 'edited'" in got.stderr, got.stderr
        assert all(w in got.stderr for w in words), got.stderr
        assert got.stdout == ""  # no report on bad input
    assert cli("--state", state, "parity", plan, "own", "again").returncode == 0  # two good results pass


def _ml(module: str, *args):
    res = subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    no_traceback(res)
    return res


@pytest.mark.parametrize("module", ["core.ml.compare", "core.ml.parity"])
def test_ml_compare_and_parity_refuse_an_edited_result_and_write_strict_json(tmp_path, module):
    good, bad, out = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "out.json"
    good.write_text(json.dumps(_result()))
    bad.write_text(json.dumps(HOSTILE[0][0]))
    res = _ml(module, good, bad, "--out", out)
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert str(bad) in last and "prompt 'b'" in last and "'rounds'" in last, res.stderr
    assert not out.exists()
    # a baseline tau of 5e-324 (a number, within the bounds): ours over it is infinite, which the
    # metric lines and the file held as Infinity; now null, and said where
    tiny = _result(per_prompt=[_row(id="a", tau=5e-324), _row(tau=5e-324)])
    bad.write_text(json.dumps(tiny))
    res = _ml(module, good, bad, "--out", out)
    assert res.returncode == 0, res.stderr
    lines = [strict_loads(line) for line in res.stdout.splitlines()]
    written = strict_loads(out.read_text())
    if module == "core.ml.compare":
        assert written["per_prompt"][0]["ratio"] is None and written["non_finite"] == {
            "/per_prompt/0/ratio": "Infinity", "/per_prompt/1/ratio": "Infinity"}
        assert [ln.get("non_finite") for ln in lines if ln.get("id") in ("a", "b")] == [
            {"/ratio": "Infinity"}, {"/ratio": "Infinity"}]
    else:
        assert written["pairs"][0]["num_prompts"] == 2 and lines[0]["event"] == "metric"
