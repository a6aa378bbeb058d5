"""An eval item measures its drafter and then its baseline in one capsule: each progress and
metric line says which drafter it measures (``v5 ddtree-8: tau ...`` / ``baseline ddtree-8:
tau ...``), so the baseline's figure never reads as the drafter's (issue 48 §1)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

pytest.importorskip("torch")

from core.capsules.progress import describe  # noqa: E402
from tests.conftest import run_cli  # noqa: E402


def test_each_eval_line_names_the_drafter_it_measures(tiny_dirs, tmp_path):
    shutil.copy(tiny_dirs["prompts"], tmp_path / "prompts.jsonl")
    plan = tmp_path / "p.yaml"
    plan.write_text(json.dumps({"name": "labels", "hosts": {"here": {
        "local": True, "workdir": str(tmp_path / "w"), "python": sys.executable}},
        "items": [{"id": "eval-v5", "content": "v5 vs the baseline", "action": {
            "kind": "eval", "host": "here", "params": {
                "drafter": str(tiny_dirs["drafter"]), "target": str(tiny_dirs["target"]),
                "prompts": "prompts.jsonl", "limit": 2, "max_new_tokens": 8, "tree_budget": 8,
                "label": "v5", "baseline": str(tiny_dirs["drafter"]),
                "baseline_label": "baseline"}}}]}))
    state = tmp_path / "s.db"
    res = run_cli("run", plan, "eval-v5", "--state", state, "-q", timeout=600)
    assert res.returncode == 0, res.stderr
    log = run_cli("logs", plan, "eval-v5", "--state", state).stdout.splitlines()
    said = [describe(x) for x in log if x.startswith('{"event": "metric"')]
    assert [s.split(":")[0] for s in said] == ["v5 chain", "v5 ddtree-8", "baseline chain",
                                               "baseline ddtree-8"], said
    progress = [describe(x) for x in log if x.startswith('{"event": "progress"')]
    assert progress[0].startswith("eval v5: 1/2 prompts")
    assert progress[-1].startswith("eval baseline: 2/2 prompts"), progress
