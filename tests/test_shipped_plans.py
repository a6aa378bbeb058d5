"""Every plan shipped under plans/ validates, and plans/README.md documents every kind."""

from __future__ import annotations

import pytest

from core.actions import registry
from tests.conftest import ROOT, run_cli

PLANS = sorted((ROOT / "plans").glob("*.yaml"))


@pytest.mark.parametrize("plan", PLANS, ids=[p.name for p in PLANS])
def test_shipped_plan_validates(plan):
    res = run_cli("validate", plan)
    assert res.returncode == 0, res.stderr


def test_every_kind_is_documented():
    doc = (ROOT / "plans" / "README.md").read_text()
    for kind in registry.kinds():
        assert f"### {kind}" in doc, f"plans/README.md lacks a section for {kind}"


def test_every_kind_appears_in_a_shipped_plan():
    from core.plans.planfile import load_plan

    used = {it.action.kind for p in PLANS for it in load_plan(p).items if it.action}
    assert set(registry.kinds()) - {"manual"} <= used, set(registry.kinds()) - used
