"""A plan's arms through the CLI, on a local host with shell items (real runs, real SQLite):
validate and status show the expanded items; an arm added to a campaign whose other arms are
done runs only its own items; a removed arm's results stay readable; an unknown param in one
arm is refused at validate (exit 2, naming the arm and the item) and nothing runs."""

from __future__ import annotations

import json

from core.state.store import Store
from tests.conftest import run_cli
from tests.unit.test_compare import row

ARMS = """\
  each:
    a: {}
    b: {work: {command: "echo b-changed >> log.txt"}}
"""


def _plan(tmp_path, arms: str = ARMS):
    plan = tmp_path / "arms.yaml"
    plan.write_text(f"""name: armsdemo
hosts:
  h: {{local: true, workdir: {tmp_path / 'wd'}}}
arms:
  against: base
{arms}items:
  - id: prep
    content: shared, runs once
    action: {{kind: shell, host: h, params: {{command: "echo prep >> log.txt"}}}}
  - id: work
    content: work for ${{arm}}
    arms: all
    needs: [prep]
    action: {{kind: shell, host: h, params: {{command: "echo work-${{arm}} >> log.txt"}}}}
  - id: after
    content: after ${{arm}}'s work
    arms: all
    needs: [work]
    action: {{kind: shell, host: h, params: {{command: "echo after-${{arm}} >> log.txt"}}}}
""")
    return plan


def _latest_runs(plan, env) -> dict:
    doc = json.loads(run_cli("status", plan, "--json", env=env).stdout)
    return {i["id"]: (i["status"], (i["run"] or {}).get("id")) for i in doc["items"]}


def test_adding_an_arm_runs_only_its_items_and_removing_one_keeps_its_results(tmp_path):
    plan = _plan(tmp_path)
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("validate", plan)
    assert res.returncode == 0, res.stderr
    assert "arms: 2 (a, b), each runs work, after; compared with base" in res.stdout
    assert "b: work[b], after[b] (command=echo b-changed >> log.txt)" in res.stdout
    res = run_cli("run", plan, "--all", env=env)
    assert res.returncode == 0, res.stderr
    log = tmp_path / "wd" / "log.txt"
    assert sorted(log.read_text().split()) == ["after-a", "after-b", "b-changed", "prep", "work-a"]
    before = _latest_runs(plan, env)
    assert set(before) == {"prep", "work[a]", "work[b]", "after[a]", "after[b]"}
    assert all(s == "done" for s, _ in before.values())

    plan = _plan(tmp_path, ARMS + "    c: {}\n")  # a third arm, the others done
    log.write_text("")
    res = run_cli("run", plan, "--all", env=env)
    assert res.returncode == 0, res.stderr
    assert log.read_text().split() == ["work-c", "after-c"]  # only its own items ran
    after = _latest_runs(plan, env)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing that ran touched
    assert after["work[c]"][0] == after["after[c]"][0] == "done"
    doc = json.loads(run_cli("status", plan, "--json", env=env).stdout)
    assert doc["arms"][2] == {"arm": "c", "knob": [], "items": ["work[c]", "after[c]"],
                              "done": 2, "state": "done"}
    assert [i.get("arm") for i in doc["items"]][:3] == [None, "a", "b"]
    text = run_cli("status", plan, env=env).stdout
    assert "work[c]" in text and "arm c: ● done, 2/2 done (changes nothing)" in text

    # an eval result of arm b, then b removed from the plan: its results stay readable
    s = Store(str(tmp_path / "s.db"))
    s.add_eval_results([row(lb, f"q{i}", [1 + i % 3, 2], [0.5], run=f"r-{lb}")
                        for lb in ("base", "b") for i in range(6)])
    s.close()
    plan = _plan(tmp_path, "  each:\n    a: {}\n    c: {}\n")
    assert "work[b]" not in run_cli("status", plan, env=env).stdout
    res = run_cli("compare", plan, "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert {o["drafter"] for o in json.loads(res.stdout)["overall"]} == {"base", "b"}
    assert run_cli("logs", plan, "work[a]", env=env).returncode == 0


def test_an_unknown_param_in_one_arm_is_refused_at_validate_and_nothing_runs(tmp_path):
    plan = _plan(tmp_path, ARMS.replace('{work: {command:', '{work: {comand:'))
    state = tmp_path / "s.db"
    for args in (("validate", plan), ("run", plan, "--all"), ("status", plan)):
        res = run_cli(*args, env={"SPECDECK_STATE": str(state)})
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert (f"{plan}:8:16: item 'work[b]': field 'action.params.comand': arm 'b', "
                "item 'work': unknown param 'comand'") in res.stderr
        assert "did you mean 'command'" in res.stderr
    assert not state.exists() and not (tmp_path / "wd").exists()  # nothing written, nothing ran


def test_compare_arms_needs_arms_and_a_reference(tmp_path):
    plan = _plan(tmp_path)
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    s = Store(str(tmp_path / "s.db"))
    s.add_eval_results([row("x", f"q{i}", [2, 2], [0.5]) for i in range(6)])
    s.close()
    res = run_cli("compare", plan, "--arms", env=env)
    assert res.returncode == 2 and "--arms base: no eval result labelled 'base'" in res.stderr
    bare = tmp_path / "bare.yaml"
    bare.write_text(plan.read_text().split("arms:\n", 1)[0] + "items:\n  - {id: m, content: x}\n")
    res = run_cli("compare", bare, "--arms", env=env)
    assert res.returncode == 2 and "declares no arms" in res.stderr, res.stderr
