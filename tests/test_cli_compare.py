"""`specdeck compare` as a user runs it: intervals and verdicts in every format, `--pair`,
and bad input (an unknown drafter, a bad `--detect`) refused with exit 2."""

from __future__ import annotations

import csv
import io
import json

import pytest

from core.state.store import Store
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


def _result(accounting, rounds_by_prompt, with_tokens=True, max_new=9):
    """A result.json as core.ml.eval writes it (``accounting`` None: written before the rule)."""
    per = []
    for pid, rounds in rounds_by_prompt.items():
        row = {"id": pid, "tau": sum(rounds) / len(rounds), "rounds": rounds}
        if with_tokens:  # the output: the prefill's token + what the rounds committed, cut at max_new
            row["tokens"] = list(range(min(max_new, 1 + sum(rounds))))
        per.append(row)
    res = {"mode": "online", "block_size": 4, "target": {"fingerprint": "t"}, "prompts": {"sha256": "s"},
           "max_new_tokens": max_new, "dtype": "float32", "template": {"chat_template": True, "thinking": False},
           "per_prompt": per}
    if accounting:
        res["accounting"] = accounting
    else:
        res.pop("template")
    return res


def test_compare_recounts_or_flags_legacy_results_never_mixes_them(tmp_path):
    """A store holding rows of both accountings: a legacy result that still has its tokens is
    recounted as the reference counts; rows stored without them stay legacy and are flagged."""
    from core.actions.eval import eval_rows
    from core.state.records import EvalRow

    plan = tmp_path / "p.yaml"
    plan.write_text(f"name: acc\nhosts:\n  ev: {{local: true, workdir: {tmp_path}}}\nitems:\n  - id: e\n    content: e\n")
    state = tmp_path / "s.db"
    s = Store(str(state))
    s.add_eval_results(eval_rows("r1", "e", _result(None, {"a": [2, 3, 3, 1], "b": [4, 4, 2]}), "base",
                                 "baseline", None))
    s.add_eval_results(eval_rows("r4", "e", _result("dflash-0.1.0", {"a": [2, 3, 3], "b": [4, 4]}), "v6",
                                 "drafter", None))
    # legacy: a round after max_new_tokens (a) and an uncapped last round (b)
    s.add_eval_results(eval_rows("r2", "e", _result(None, {"a": [4, 4, 1], "b": [4, 4, 4]}), "v5", "drafter", None))
    old = eval_rows("r3", "e", _result(None, {"a": [3, 3, 3], "b": [4, 4, 4]}, with_tokens=False), "v4",
                    "drafter", None)
    s.add_eval_results([EvalRow(r.run_id, r.item_id, r.drafter, r.role, r.prompt_id, r.tau, r.rounds, None,
                                {k: v for k, v in r.settings.items() if k not in ("accounting", "template")}, None)
                        for r in old])  # as an older specdeck stored them: no accounting key at all
    s.close()
    res = run_cli("--state", state, "compare", plan, "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    by = {d["drafter"]: d for d in data["overall"]}
    assert by["v5"]["mismatch"] == [] and by["v5"]["rounds"] == 4  # recounted: [4, 4] and [4, 4]
    assert by["v5"]["macro"] == pytest.approx(4.0)
    assert by["base"]["rounds"] == 5  # recounted too: [2, 3, 3] and [4, 4]
    assert "accounting" in by["v4"]["mismatch"]  # flagged, never averaged with the recounted rows
    # a new result records its chat template; the legacy baseline's is unknown: flagged as well
    assert by["v6"]["mismatch"] == ["template"]
    text = run_cli("--state", state, "compare", plan).stdout
    assert "accounting" in text


def test_compare_at_a_step_keeps_the_baselines_and_refuses_a_step_nobody_evaluated(tmp_path):
    """``--step N``: the drafters evaluated at training step N with every baseline (no
    checkpoint, so bound to no step); a step nobody evaluated is refused (exit 2) naming the
    steps that were, never answered with the baselines alone. The console's t does the same
    on the same state (tests/ui/test_app.py::test_tau_over_training_and_tau_at_step)."""
    from tests.ui.conftest import CAMPAIGN, WATCH_STEPS, add_tau_watch, populate

    plan = tmp_path / "v5.yaml"
    plan.write_text(CAMPAIGN.format(root=tmp_path))
    state = tmp_path / "s.db"
    s = Store(str(state))
    populate(s)
    add_tau_watch(s)
    s.close()

    res = run_cli("--state", state, "compare", plan, "--step", "1000", "--json")
    assert res.returncode == 0, res.stderr
    names = {o["drafter"] for o in json.loads(res.stdout)["overall"]}
    assert "train-v5@1000" in names and "z-lab-b8" in names and "baseline" in names
    assert not {"v5", "train-v5@400"} & names

    res = run_cli("--state", state, "compare", plan, "--step", "123")
    assert res.returncode == 2 and res.stdout == "", res.stdout
    assert "no tau evaluated at step 123" in res.stderr
    assert f"evaluated steps: {', '.join(map(str, WATCH_STEPS))}" in res.stderr


def test_compare_advises_a_draft_length_under_a_given_cost(evals):
    """Issue 45 §3: with --cost, each drafter's expected speedup at each draft length and the one to
    serve, in the text and in --json; without it, one line saying how to ask; a bad cost exits 2."""
    plan, state = evals
    text = run_cli("--state", state, "compare", plan, "--cost", "1.0,0.05").stdout
    assert "v5: draft length (cost = 1 + 0.05*k plain steps" in text and "best k=" in text
    assert "num_speculative_tokens=" in text
    data = json.loads(run_cli("--state", state, "compare", plan, "--json", "--cost", "1,0.05").stdout)
    a = data["draft_length"]["v5"]
    assert a["cost"] == {"base": 1.0, "per_token": 0.05}
    assert [r["k"] for r in a["rows"]] == list(range(1, a["block_size"]))
    assert a["best"]["k"] == max(a["rows"], key=lambda r: (r["speedup"], -r["k"]))["k"]
    plain = run_cli("--state", state, "compare", plan).stdout
    assert "give --cost BASE,PER_TOKEN" in plain and "best k=" not in plain
    bad = run_cli("--state", state, "compare", plan, "--cost", "0,1")
    assert bad.returncode == 2 and "--cost 0,1" in bad.stderr and "cost.base" in bad.stderr


def test_compare_leads_with_the_plans_decision_and_shows_one_row_per_drafter(tmp_path):
    """A plan's ``decide:`` pair comes first (issue 48 §3), and a checkpoint measured by tau over
    training and by an eval item (the same weights sha256) is one row named with both labels."""
    from tests.unit.test_compare_decide import EVALS, WATCHED

    plan = tmp_path / "p.yaml"
    plan.write_text(f"""name: decide
hosts:
  ev: {{local: true, workdir: {tmp_path / 'ev'}}}
items:
  - id: eval-v5
    content: evaluate v5
    action: {{kind: eval, host: ev, params: {{drafter: drafters/v5, target: models/t}}}}
  - id: review
    content: decide
    needs: [eval-v5]
    decide: [[v5, v4]]
""")
    state = tmp_path / "s.db"
    s = Store(str(state))
    s.add_eval_results(WATCHED + EVALS)
    s.close()
    md = run_cli("--state", state, "compare", plan)
    assert md.returncode == 0, md.stderr
    lines = md.stdout.splitlines()
    assert lines[:2] == ["Decision (the plan's decide:):", lines[1]]
    assert lines[1].startswith("- v5 is better than v4 (+")
    summary = [ln for ln in lines if ln.startswith("| v5")]
    assert summary and summary[0].startswith("| v5 = train-v5@120 |")
    assert not any(ln.startswith("| train-v5@120 ") for ln in lines)
    data = json.loads(run_cli("--state", state, "compare", plan, "--json").stdout)
    assert [(p["a"], p["b"]) for p in data["pairs"]] == [("v5", "v4")]
    assert [o["drafter"] for o in data["overall"]] == ["train-v5@60", "v5", "baseline", "v4"]
    assert [d["aliases"] for d in data["drafters"] if d["label"] == "v5"] == [["train-v5@120"]]

    plan.write_text(plan.read_text().replace("decide: [[v5, v4]]", "decide: [v5, v4]"))
    bad = run_cli("--state", state, "compare", plan)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "p.yaml:11:" in bad.stderr and "decide must be a list of pairs" in bad.stderr, bad.stderr
