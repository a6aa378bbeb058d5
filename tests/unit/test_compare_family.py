"""The drafter family (result.json ``drafter.family``) travels into the eval rows' settings and
is named by ``compare``, without making a DFlash-2 drafter incomparable with a DFlash baseline."""

from __future__ import annotations

from core.actions.eval import eval_rows
from core.tau.table import COMPARED_SETTINGS, build_comparison, summary_markdown, to_dict


def result(family: str | None, taus: list[int]) -> dict:
    drafter = {"path": "/d", "family": family} if family else {"path": "/d"}
    return {"mode": "online", "block_size": 8, "accounting": "dflash-0.1.0", "drafter": drafter,
            "per_prompt": [{"id": f"p{i}", "tau": float(t), "rounds": [t], "tokens": [1] * t}
                           for i, t in enumerate(taus)]}


def test_compare_names_a_dflash2_drafter_and_still_compares_it():
    rows = eval_rows("r1", "ev", result("dflash2", [3, 4, 5, 4]), "d2", "drafter", None) + \
        eval_rows("r1", "ev", result(None, [2, 2, 3, 2]), "base", "baseline", None)
    assert "family" not in COMPARED_SETTINGS
    assert {r.settings["family"] for r in rows} == {"dflash2", "dflash"}  # an old result is a DFlash one
    c = build_comparison(rows)
    table = summary_markdown(c)
    assert "| d2 [DFlash-2] |" in table and "| base (baseline) |" in table
    d2 = next(d for d in to_dict(c)["drafters"] if d["name"] == "d2")
    assert d2["settings"]["family"] == "dflash2" and not d2["mismatch"]
