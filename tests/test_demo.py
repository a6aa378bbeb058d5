"""`specdeck demo --headless --quick` (the CI variant of the demo) runs the whole campaign
locally and ends with a tau table; a second run reuses everything (checks mark items done)."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.ml, pytest.mark.slow]


def test_demo_headless_quick_then_reuse(tmp_path):
    ws = tmp_path / "demo"
    t0 = time.monotonic()
    res = run_cli("demo", "--dir", ws, "--headless", "--quick", timeout=1500)
    first = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-4000:]
    out = res.stdout
    assert "| drafter | prompts | macro tau |" in out  # the overall tau table
    for name in ("v4", "v5", "baseline"):
        assert f"| {name}" in out
    assert "ddtree-16" in out
    status = json.loads(run_cli("--state", ws / "state.db", "status", ws / "demo.yaml",
                                "--json").stdout)
    st = {i["id"]: i["status"] for i in status["items"]}
    assert st.pop("review") == "pending" and set(st.values()) == {"done"}, st
    t0 = time.monotonic()
    res = run_cli("demo", "--dir", ws, "--headless", "--quick", timeout=600)
    again = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-3000:]
    assert again < first / 3, (first, again)
