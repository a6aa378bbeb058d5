"""`specdeck compare` as a user runs it: intervals and verdicts in every format, `--pair`,
and bad input (an unknown drafter, a bad `--detect`) refused with exit 2."""

from __future__ import annotations

import csv
import io
import json

import pytest

from core.store import Store
from tests.conftest import run_cli
from tests.unit.test_compare import _campaign


@pytest.fixture
def evals(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(f"""name: cmp
hosts:
  ev: {{local: true, workdir: {tmp_path / 'ev'}}}
items:
  - id: eval
    content: evaluate v4 and v5 against the baseline
    action: {{kind: eval, host: ev, params: {{drafter: drafters/v5, target: models/t}}}}
""")
    state = tmp_path / "s.db"
    s = Store(str(state))
    s.add_eval_results(_campaign())
    s.close()
    return plan, state


def test_compare_json_csv_markdown_and_pairs(evals):
    plan, state = evals
    res = run_cli("--state", state, "compare", plan, "--json", "--pair", "v5", "v4")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    v5 = [o for o in data["overall"] if o["drafter"] == "v5"][0]
    assert v5["verdict"] == "better" and v5["macro_ci95"][0] < v5["macro"] < v5["macro_ci95"][1]
    assert v5["rounds"] == 192 and v5["p_value"] < 0.05 and v5["test"].startswith("sign-flip")
    assert [(p["a"], p["b"], p["verdict"]) for p in data["pairs"]] == [
        ("v5", "v4", "better"), ("v5 ddtree-8", "v4 ddtree-8", "better")]
    # seeded: the same figures on a second run
    again = json.loads(run_cli("--state", state, "compare", plan, "--json", "--pair", "v5",
                               "v4").stdout)
    assert again == data

    md = run_cli("--state", state, "compare", plan, "--pivot", "--pair", "v5", "v4").stdout
    # the verdicts lead, then the summary, then the per-prompt pivot
    assert md.startswith("Verdicts:\n") and "\n| prompt | base | v4 | Δ |" in md
    assert md.index("| drafter | verdict |") < md.index("| prompt | base |")
    assert "- v5 is better than v4 (+" in md and "- v5 is better than base (+" in md
    table = list(csv.DictReader(io.StringIO(
        run_cli("--state", state, "compare", plan, "--csv").stdout)))
    macro = [r for r in table if r["scope"] == "macro" and r["drafter"] == "v5"][0]
    assert macro["verdict"] == "better" and float(macro["ci95_lo"]) < float(macro["tau"])


@pytest.mark.parametrize("args,words", [
    (["--pair", "v5", "v9"], "no drafter 'v9'"),
    (["--pair", "v5", "v5"], "two different drafters"),
    (["--detect", "-0.1"], "--detect -0.1"),
])
def test_compare_bad_input_exits_2(evals, args, words):
    plan, state = evals
    res = run_cli("--state", state, "compare", plan, *args)
    assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr
    assert res.stdout == ""
