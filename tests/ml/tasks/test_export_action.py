"""The ``export`` action (issue 32 §1): a plan item runs ``core.ml.export`` on a (local) host,
records the export and its engine warnings, and a second run finds it done. A format that
needs the target's directory without one is refused by ``validate``, naming the field."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from tests.conftest import run_cli

pytest.importorskip("torch")

PLAN = """name: export-test
hosts:
  here: {{local: true, workdir: {work}, python: {python}}}
items:
  - id: serve-v5
    content: Export the drafter for llama.cpp's converter and vLLM
    action:
      kind: export
      host: here
      params: {{drafter: {drafter}, out: serve/v5, {extra}}}
"""


def _plan(tmp_path, drafter, extra="format: zlab"):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.format(work=tmp_path / "work", python=sys.executable, drafter=drafter, extra=extra))
    return path


def test_export_item_runs_records_warnings_and_is_done_the_second_time(tiny, tmp_path):
    _, drafter = tiny.make_tiny_pair(tmp_path / "m", "qwen3", seed=0, block_size=4, num_layers=2, sliding_window=3)
    plan = _plan(tmp_path, drafter)
    env = {"SPECDECK_STATE": str(tmp_path / "state.db")}
    res = run_cli("run", plan, "serve-v5", env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "work" / "serve" / "v5"
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {
        "config.json": 0o644, "model.safetensors": 0o644, "provenance.json": 0o644}
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["dtype"] == "bfloat16" and [w["engine"] for w in prov["engine_warnings"]] == ["llama.cpp"]
    status = json.loads(run_cli("status", plan, "--json", env=env).stdout)
    assert status["items"][0]["status"] == "done"
    again = run_cli("run", plan, "serve-v5", env={**env, "SPECDECK_STATE": str(tmp_path / "fresh.db")}, timeout=300)
    assert again.returncode == 0 and "holds the zlab export" in again.stderr + again.stdout


def test_a_format_that_needs_the_target_is_refused_by_validate(tmp_path):
    plan = _plan(tmp_path, tmp_path / "d", extra="format: speculators")
    res = run_cli("validate", plan)
    assert res.returncode == 2 and "target" in res.stderr and "needs target" in res.stderr
