"""Plan loading: every class of invalid plan is refused with file:line:col, item and field."""

from __future__ import annotations

import re
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import PlanError
from core.plans.plan import params_summary
from core.plans.planfile import load_plan, parse_plan
from tests.conftest import DATA

PLANS = DATA / "plans"

# file, the text found at the reported line:col, item, field, message fragment
INVALID = [
    ("invalid_unknown_key.yaml", "colour:", "a", "colour", "unknown key 'colour'"),
    ("invalid_unknown_kind.yaml", "teleport", "a", "action.kind", "unknown action kind 'teleport'"),
    ("invalid_unknown_host.yaml", "there", "a", "action.host", "unknown host 'there'"),
    ("invalid_unknown_need.yaml", "ghost", "a", "needs", "needs unknown item 'ghost'"),
    ("invalid_cycle.yaml", "[a]", "b", "needs", "cyclic needs: a -> b -> a"),
    ("invalid_duplicate_id.yaml", "a", "a", "id", "duplicate id"),
    ("invalid_wrong_type.yaml", '"not-a-list"', "a", "action.params.args", "must be a list"),
    ("invalid_wrong_value.yaml", "urgent", "a", "priority", "priority must be one of"),
    ("invalid_undefined_var.yaml", '"echo ${unknown}"', "a", "action.params.command",
     "undefined variable ${unknown}"),
    ("invalid_param_unknown.yaml", "comand:", "a", "action.params.comand",
     "unknown field 'comand'"),
    ("invalid_secret.yaml", "HF_TOKEN", None, "hosts.gpu.env.HF_TOKEN", "looks like a secret"),
    ("invalid_yaml_syntax.yaml", "", None, None, "YAML syntax"),
]


@pytest.mark.parametrize("name,token,item,field,fragment", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_plan_names_position_item_and_field(name, token, item, field, fragment):
    with pytest.raises(PlanError) as ei:
        load_plan(PLANS / name)
    issues = ei.value.issues
    match = [i for i in issues if fragment in i.message]
    assert match, [str(i) for i in issues]
    issue = match[0]
    lines = (PLANS / name).read_text().splitlines() + [""]
    assert lines[issue.line - 1][issue.col - 1:].startswith(token), str(issue)
    if name == "invalid_duplicate_id.yaml":
        assert issue.line == 5  # the second 'a', not the first
    assert issue.item == item
    assert issue.field == field
    assert str(issue).startswith(f"{PLANS / name}:{issue.line}:{issue.col}: ")


@pytest.mark.parametrize("name", [c[0] for c in INVALID])
def test_cli_validate_exit_2_and_one_line_per_error(cli, name, tmp_path):
    src = PLANS / name
    before = sorted(p.name for p in tmp_path.iterdir())
    res = cli("validate", src, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert lines and all(re.match(rf"{re.escape(str(src))}:\d+:\d+: ", ln) for ln in lines), lines
    assert "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_valid_plan_summary(cli):
    res = cli("validate", PLANS / "valid_local.yaml")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("\n") == 1
    assert "3 items (1 manual)" in res.stdout


def test_vars_are_quoted_in_shell_fields_only():
    plan = load_plan(PLANS / "valid_local.yaml")
    cmd = plan.item("first").action.params.command
    # shell text references the value in the environment (core.plans.shellvars), never splices it
    assert cmd == 'echo "${SPECDECK_VAR_msg}"', cmd
    text = """
name: q
hosts: {h: {local: true, workdir: /tmp}}
vars: {p: "a b"}
items:
  - id: a
    content: "x"
    action: {kind: shell, host: h, params: {command: "true", cwd: "${p}/sub", args: ["${p}"]}}
"""
    it = parse_plan(text).item("a")
    assert it.action.params.cwd == "a b/sub"
    assert it.action.params.args == ("a b",)


def test_status_shows_shell_vars_as_the_plan_wrote_them():
    """status --json and the console show ``${name}``, not the environment plumbing."""
    text = """
name: q
hosts: {h: {local: true, workdir: /tmp}}
vars: {msg: hi, a.b-c: x, my_ab_x: y}
items:
  - id: a
    content: "x"
    action: {kind: shell, host: h, params: {command: "echo ${msg} \\"${a.b-c}\\" '${my_ab_x}' $$HOME"}}
"""
    it = parse_plan(text).item("a")
    assert "SPECDECK_VAR_" in it.action.params.command  # what runs
    assert params_summary(it)["command"] == "echo \"${msg}\" \"${a.b-c}\" '${my_ab_x}' $HOME"


def test_dollar_dollar_is_a_literal_dollar():
    text = """
name: q
hosts: {h: {local: true, workdir: /tmp}}
items:
  - {id: a, content: x, action: {kind: shell, host: h, params: {command: "echo $${HOME}"}}}
"""
    assert parse_plan(text).item("a").action.params.command == "echo ${HOME}"


def test_all_errors_reported_at_once():
    text = """
name: q
items:
  - {id: a, content: x, priority: nope}
  - {id: b, needs: [zz]}
"""
    with pytest.raises(PlanError) as ei:
        parse_plan(text, "f.yaml")
    msgs = [str(i) for i in ei.value.issues]
    assert any("priority" in m for m in msgs)
    assert any("content" in m for m in msgs)
    assert any("zz" in m for m in msgs)


def test_order_is_dependency_order():
    text = """
name: q
items:
  - {id: c, content: c, needs: [b]}
  - {id: a, content: a}
  - {id: b, content: b, needs: [a]}
"""
    plan = parse_plan(text)
    assert [i.id for i in plan.order()] == ["a", "b", "c"]
    assert plan.dependents("a") == ["b", "c"]


yaml_text = st.text(alphabet=st.sampled_from(list("abc:-[]{}\"'\n #&*!|>%@`\t,?0123456789")),
                    max_size=200)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(yaml_text)
def test_malformed_yaml_never_tracebacks(text):
    try:
        parse_plan(text, "fuzz.yaml")
    except PlanError as e:
        for issue in e.issues:
            assert str(issue).startswith("fuzz.yaml:")
            assert issue.line >= 1 and issue.col >= 1


item_st = st.fixed_dictionaries({}, optional={
    "id": st.one_of(st.text(max_size=5), st.integers(), st.none()),
    "content": st.one_of(st.text(max_size=5), st.lists(st.integers(), max_size=2)),
    "priority": st.sampled_from(["high", "x", 3, None]),
    "status": st.sampled_from(["done", "bogus", None]),
    "needs": st.one_of(st.lists(st.sampled_from(["a", "b", "zz"]), max_size=3), st.integers()),
    "action": st.one_of(st.none(), st.integers(), st.fixed_dictionaries(
        {"kind": st.sampled_from(["shell", "stop", "manual", "nope"])},
        optional={"host": st.sampled_from(["h", "x"]),
                  "params": st.one_of(st.integers(), st.dictionaries(
                      st.sampled_from(["command", "args", "item", "grace_s", "zz"]),
                      st.one_of(st.text(max_size=5), st.integers(), st.lists(st.text(max_size=3)))))})),
})


@settings(max_examples=200, deadline=None)
@given(st.lists(item_st, max_size=4))
def test_structurally_wrong_plans_never_traceback(items):
    import yaml

    text = yaml.safe_dump({"name": "fz", "hosts": {"h": {"local": True, "workdir": "/tmp"}},
                           "items": items})
    try:
        parse_plan(text, "fz.yaml")
    except PlanError as e:
        assert all(str(i).startswith("fz.yaml:") for i in e.issues)


def test_on_preempt_is_resume_or_fail_and_a_bad_value_names_its_line_and_field():
    plan = parse_plan("name: q\nitems:\n  - {id: a, content: x, on_preempt: resume}\n"
                      "  - {id: b, content: y}\n", "f.yaml")
    assert [it.on_preempt for it in plan.items] == ["resume", "fail"]
    with pytest.raises(PlanError) as ei:
        parse_plan("name: q\nitems:\n  - id: a\n    content: x\n    on_preempt: requeue\n",
                   "f.yaml")
    (issue,) = ei.value.issues
    assert (issue.item, issue.field) == ("a", "on_preempt")
    assert str(issue).startswith("f.yaml:5:") and \
        "on_preempt must be one of fail, resume, got 'requeue'" in issue.message
