"""Issue 47 §2, the quick tier's share (tests/ml/tasks/test_reproduce.py runs the evals for real):
``compare`` warns when a verdict pairs results measured against different targets, and ``diff``
names every difference in two runs' records, read from a real state database."""

from __future__ import annotations

import json

from core.state.records import EvalRow
from core.state.store import Store
from core.tau.table import build_comparison
from tests.conftest import run_cli

BASE = {"mode": "online", "block_size": 4, "tree_budget": None, "target": "fp", "prompts": "h",
        "dtype": "bfloat16"}
TARGET = {"revision": "0123", "dtype": "bfloat16", "quantization": None, "config_sha256": "c1"}


def _rows(label, role, settings, taus=(3, 2, 4, 3, 2, 3)):
    return [EvalRow(f"run-{label}", "eval", label, role, f"p{i}", t, [t], None, settings, None)
            for i, t in enumerate(taus)]


def test_compare_warns_when_a_verdict_pairs_another_revision_or_quantisation():
    requant = {**BASE, "target_id": {**TARGET, "quantization": "awq 4-bit", "config_sha256": "c2"}}
    c = build_comparison(_rows("base", "baseline", {**BASE, "target_id": TARGET})
                         + _rows("v5", "drafter", requant, (4, 3, 5, 4, 3, 4))
                         + _rows("v4", "drafter", {**BASE, "target_id": TARGET}, (3, 3, 4, 3, 2, 3)),
                         [("v5", "v4")])
    assert c.target_warnings == (
        "⚠ v5 vs base: measured against different targets (quantisation awq 4-bit≠none, config.json): "
        "a drafter paired with another revision or precision of its target (a requantised one) loses "
        "acceptance, so this verdict compares targets as much as drafters; measure both against one target",
        c.target_warnings[1])
    assert c.target_warnings[1].startswith("⚠ v5 vs v4: measured against different targets (quantisation")
    assert set(c.target_warnings) <= set(c.warnings)
    # v4 and the baseline share a target: nothing said of them; an older row (no record) is not
    # taken for another target
    assert not [w for w in c.target_warnings if "v4 vs base" in w]
    old = build_comparison(_rows("base", "baseline", BASE) + _rows("v4", "drafter", {**BASE, "target_id": TARGET}))
    assert old.target_warnings == ()


RECORD = {"specdeck": {"version": "0.1.0+code.3f9a2c1b7e", "code": "3f9a2c1b7e"},
          "git": {"dir": "/src", "commit": "abc", "dirty": False},
          "versions": {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.25.0", "cuda": None},
          "target": {"path": "/m/t", "config_sha256": "c1", "revision": None, "dtype": "float32",
                     "quantization": None, "ran_dtype": "float32"},
          "data": {"prompts": "/p.jsonl", "prompts_sha256": "d1", "prompt_count": 8},
          "config": {"max_new_tokens": 48, "out": "result-drafter.json"}}


def test_diff_names_every_difference_in_the_record(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(f"name: rec\nhosts:\n  ev: {{local: true, workdir: {tmp_path}}}\nitems:\n"
                    + "".join(f"  - id: {i}\n    content: {i}\n    action: {{kind: eval, host: ev, params: "
                              "{drafter: d, target: t}}\n" for i in ("eval-a", "eval-b", "eval-old")))
    other = {**RECORD, "git": {"dir": "/src", "commit": "abc", "dirty": True, "diff_sha256": "e" * 64,
                               "diff_bytes": 120, "diff_truncated": False, "diff": "/cap/eval-b/git.diff"},
             "target": {**RECORD["target"], "dtype": "bfloat16", "ran_dtype": "bfloat16", "config_sha256": "c2"},
             "config": {**RECORD["config"], "out": "elsewhere.json"}}
    s = Store(str(tmp_path / "s.db"))
    for item, rec in (("eval-a", RECORD), ("eval-b", other), ("eval-old", None)):
        s.claim_run(f"{item}-1", item, "eval", "ev", owner="t")
        s.end_run(f"{item}-1", "succeeded", exit_code=0, result={"tau": 2.0, **({"record": rec} if rec else {})})
        s.update_run(f"{item}-1", config={"python": "/venv/bin/python", "prompts": "/p.jsonl"})
    s.close()
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("diff", plan, "eval-a", "eval-b", "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {
        "record.git.dirty": {"eval-a#1": False, "eval-b#1": True},
        "record.git.diff_bytes": {"eval-a#1": None, "eval-b#1": 120},
        "record.git.diff_sha256": {"eval-a#1": None, "eval-b#1": "e" * 64},
        "record.git.diff_truncated": {"eval-a#1": None, "eval-b#1": False},
        "record.target.config_sha256": {"eval-a#1": "c1", "eval-b#1": "c2"},
        "record.target.dtype": {"eval-a#1": "float32", "eval-b#1": "bfloat16"},
        "record.target.ran_dtype": {"eval-a#1": "float32", "eval-b#1": "bfloat16"}}
    text = run_cli("diff", plan, "eval-a", "eval-b", env=env).stdout
    assert "eval-b#1: its checkout was dirty; the diff is kept on ev: /cap/eval-b/git.diff" in text
    assert "(also differ, as they do for any two runs: record.config.out, record.git.diff)" in text
    old = run_cli("diff", plan, "eval-old", "eval-a", env=env)
    assert old.returncode == 0 and "eval-old#1: no reproduction record" in old.stderr
