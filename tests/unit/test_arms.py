"""A plan's arms (core.plans.arms): template items expanded once per arm with their own
predecessors, shared items once, positions kept, bad arms refused naming the arm and the item;
Holm's correction (core.tau.stats) and the arms' family (core.tau.arms) on known figures."""

from __future__ import annotations

import pytest

from core.errors import PlanError
from core.plans.planfile import parse_plan
from core.tau import arms as tau_arms
from core.tau import stats

PLAN = """\
name: abl
hosts:
  h: {local: true, workdir: /tmp/abl}
arms:
  against: base
  each:
    a: {work: {command: echo a-changed}}
    b:
    c: {work: {command: echo c-changed}, check: {creates: c.txt}}
items:
  - id: prep
    content: shared, runs once
    action: {kind: shell, host: h, params: {command: echo prep}}
  - id: work
    content: work for ${arm}
    arms: all
    needs: [prep]
    action: {kind: shell, host: h, params: {command: "echo work-${arm}", creates: "out/${arm}"}}
  - id: check
    content: check ${arm}
    arms: [a, c]
    needs: [work]
    action: {kind: shell, host: h, params: {command: "test -e out/${arm}"}}
  - id: review
    content: read them all
    needs: [check, work]
"""


def test_templates_expand_per_arm_with_their_own_predecessors():
    plan = parse_plan(PLAN, "abl.yaml")
    ids = [it.id for it in plan.items]
    assert ids == ["prep", "work[a]", "work[b]", "work[c]", "check[a]", "check[c]", "review"]
    work_a, check_c = plan.item("work[a]"), plan.item("check[c]")
    assert work_a.needs == ("prep",) and (work_a.template, work_a.arm) == ("work", "a")
    assert check_c.needs == ("work[c]",)  # its own arm's work, nobody else's
    assert plan.item("review").needs == ("check[a]", "check[c]", "work[a]", "work[b]",
                                         "work[c]")
    assert plan.item("prep").arm is None
    # ${arm} in strings, the arm's params merged over the template's
    assert plan.item("work[b]").action.params.command == "echo work-b"
    assert plan.item("work[b]").content == "work for b"
    assert plan.item("work[a]").action.params.command == "echo a-changed"
    assert plan.item("work[a]").action.params.creates == "out/a"
    assert plan.item("check[c]").action.params.creates == "c.txt"
    assert plan.item("work[c]").line == 14  # the template's line
    assert plan.arms.names == ("a", "b", "c") and plan.arms.against == "base"
    assert plan.arms.arm("a").knob == ("command=echo a-changed",)
    assert plan.arms.arm("b").knob == ()
    assert plan.arms.arm("c").knob == ("work: command=echo c-changed", "check: creates=c.txt")
    assert [it.id for it in plan.arm_items("c")] == ["work[c]", "check[c]"]


def _issues(text: str) -> list:
    with pytest.raises(PlanError) as e:
        parse_plan(text, "abl.yaml")
    return e.value.issues


def test_an_unknown_param_in_one_arm_names_the_arm_the_item_and_where_the_arm_wrote_it():
    issues = _issues(PLAN.replace("a: {work: {command: echo a-changed}}",
                                  "a: {work: {comand: echo a-changed}}"))
    assert len(issues) == 1, issues
    (i,) = issues
    assert (i.line, i.item, i.field) == (7, "work[a]", "action.params.comand")
    assert "arm 'a', item 'work': unknown param 'comand'" in i.message
    assert "did you mean 'command'" in i.message


def test_an_arm_changing_an_item_it_does_not_run_is_refused():
    issues = _issues(PLAN.replace("a: {work: {command: echo a-changed}}", "a: {nope: {command: x}}"))
    assert [(i.line, i.item) for i in issues] == [(7, None)], issues
    assert "arm 'a' changes item 'nope', which is no template" in issues[0].message
    issues = _issues(PLAN.replace("    b:\n", "    b: {check: {creates: x}}\n"))
    assert [(i.line, i.item) for i in issues] == [(8, "check[b]")], issues
    assert "arm 'b' changes item 'check', whose arms: leaves it out" in issues[0].message


def test_bad_arm_blocks_and_template_lists_are_refused_with_positions():
    issues = _issues(PLAN.replace("arms: [a, c]", "arms: [a, d]"))
    assert any("unknown arm 'd'" in i.message and i.item == "check" and i.line == 21
               for i in issues), issues
    issues = _issues(PLAN.replace("arms:\n  against: base\n  each:", "arms:\n  against: base\n  eech:"))
    assert [i.message.split(" (")[0] for i in issues] == ["arms: unknown key 'eech'",
                                                          "arms: a mapping {against: LABEL, each: {ARM: {TEMPLATE_ITEM: {PARAM: VALUE}}}} with at least one arm"], issues
    no_block = PLAN.split("arms:\n  against", 1)[0] + "items:" + PLAN.split("\nitems:", 1)[1]
    issues = _issues(no_block)
    assert any("declares no arms" in i.message and i.item == "work" for i in issues), issues
    issues = _issues(PLAN.replace("    b:\n", "    b[x]:\n"))
    assert any("arm name 'b[x]' must be a slug" in i.message for i in issues), issues


def test_a_plan_that_would_expand_to_too_many_items_is_refused_before_expanding():
    from core.plans import arms

    each = "".join(f"    x{i}: {{}}\n" for i in range(arms.MAX_EXPANDED // 2 + 1))
    issues = _issues(PLAN.replace("    a: {work: {command: echo a-changed}}\n    b:\n", each)
                     .replace("arms: [a, c]", "arms: all")
                     .replace("    c: {work: {command: echo c-changed}, check: {creates: c.txt}}\n", ""))
    assert [(i.line, i.message) for i in issues] == [
        (7, "10001 arms x 2 template items would make 20,002 items; a plan's arms make at most "
            "20,000")]


def test_an_id_with_brackets_is_only_made_by_expansion():
    issues = _issues(PLAN.replace("- id: prep", '- id: "prep[x]"').replace("needs: [prep]",
                                                                        'needs: ["prep[x]"]'))
    assert any(i.field == "id" and "must be a slug" in i.message for i in issues), issues


def test_holm_adjusted_p_values_and_levels_agree():
    ps = [0.01, 0.04, 0.03, None, 0.002]
    adj = stats.holm_adjusted(ps)
    # sorted: 0.002 (x4), 0.01 (x3), 0.03 (x2), 0.04 (x1), each raised to the running maximum
    assert adj == pytest.approx([0.03, 0.06, 0.06, None, 0.008], abs=1e-12) or adj[3] is None
    assert adj[3] is None
    levels = stats.holm_levels(ps)
    assert levels[4] == pytest.approx(0.05 / 4) and levels[0] == pytest.approx(0.05 / 3)
    assert levels[2] == pytest.approx(0.05 / 2) and levels[1] == pytest.approx(0.05 / 2)
    for p, a, lv in zip(ps, adj, levels):
        if p is not None:
            assert (a < 0.05) == (p < lv)  # rejected at its level exactly when Holm rejects


def test_the_arms_family_is_holm_corrected_and_each_interval_matches_its_verdict():
    prompts = [f"q{i}" for i in range(10)]
    base = {p: 2.0 + 0.1 * (i % 3) for i, p in enumerate(prompts)}
    taus = {"base": base,
            "big": {p: t + 1.0 + 0.05 * (i % 2) for i, (p, t) in enumerate(base.items())},
            "same": {p: t + (0.05 if i % 2 else -0.05) for i, (p, t) in enumerate(base.items())},
            "odd": {p: t + 0.2 for p, t in list(base.items())[:6]}}
    arms = [("big", "big", ("lr=1",)), ("same", "same", ()), ("odd", "odd", ("x=2",)),
            ("gone", "gone", ())]
    c = tau_arms.compare_arms(taus, arms, "base")
    assert c.missing == ("gone",) and c.family == 6
    first = {(p.a, p.b): p for p in c.pairs}
    assert list(first)[:3] == [("big", "base"), ("same", "base"), ("odd", "base")]
    assert first[("big", "base")].verdict == stats.BETTER
    assert first[("big", "base")].knob_a == ("lr=1",)
    assert first[("same", "base")].verdict == stats.NONE
    assert first[("odd", "base")].prompts == 6  # the prompts both have
    for p in c.pairs:
        assert p.p_holm >= p.p_value
        better_or_worse = p.verdict in (stats.BETTER, stats.WORSE)
        assert better_or_worse == (p.p_holm < stats.ALPHA)
        if p.ci:
            assert better_or_worse == (not p.ci[0] <= 0 <= p.ci[1])
    # a lone test calls "odd" better (6 prompts all +0.2: p = 2/64); one of six: no
    lone = stats.paired([taus["odd"][q] for q in prompts[:6]], [base[q] for q in prompts[:6]])
    assert lone.verdict == stats.BETTER and first[("odd", "base")].verdict == stats.NONE
    text = tau_arms.to_markdown(c)
    assert "| big | lr=1 |" in text and "not evaluated yet (left out of the family): gone" in text


def test_values_built_in_memory_are_expanded_on_a_copy():
    import copy

    import yaml

    from core.plans.planfile import plan_from_data

    data = yaml.safe_load(PLAN)
    before = copy.deepcopy(data)
    plan = plan_from_data(data, PLAN, "abl.yaml")
    assert [it.id for it in plan.items][:3] == ["prep", "work[a]", "work[b]"]
    assert data == before  # what the caller will write is what it built
