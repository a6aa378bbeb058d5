"""Class 3: untrusted structure is bounded. Plans (alias bombs, recursive aliases, depth,
bad ids and env names, every error once in one pass), log lines (deeply nested or huge JSON
metric lines stored as text), todo JSON on import. Hypothesis fuzzes all three: never a
traceback; exit 2 (or the item failed) with a message."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.errors import InvalidInput, PlanError
from core.capsules.jobs import parse_artefact
from core.capsules.metrics_sources import parse_metrics
from core.plans.planfile import parse_plan
from core.plans.todos import todos_to_plan_yaml
from core.capsules.progress import describe, record_text
from tests.fault.conftest import cli, digest, local_plan, rows, write_plan

HEAD = "name: f\nhosts:\n  here: {local: true, workdir: /tmp/none}\n"


def _laughs(levels: int = 20) -> str:
    lines = ["vars: {}", "junk:", "  l0: &l0 [lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 8) + "]")
    return HEAD + "\n".join(lines) + "\nitems: []\n"


@pytest.mark.parametrize("text, words", [
    (_laughs(), ("alias",)),
    (HEAD + "items: &x\n  - *x\n", ("recursive alias",)),
    (HEAD + "items: " + "[" * 200 + "]" * 200 + "\n", ("nested",)),
    (HEAD + "items:\n" + "".join("  " * i + "- \n" for i in range(1, 120)), ("nested",)),
    (HEAD + "vars: {" + "a: {" * 80 + "}" * 81 + "\nitems: []\n", ("nested",)),
    (HEAD + "items:\n  - {id: " + "x" * 5000 + ", content: long}\n", ("64 at most",)),
    (HEAD.replace("/tmp/none}", "/tmp/none, env: {'A B': 1, '1X': 2, 'ok_': 3}}")
     + "items: []\n", ("'A B'", "'1X'")),
])
def test_hostile_plan_is_refused_quickly(tmp_path, text, words):
    p = write_plan(tmp_path, text)
    t0 = time.monotonic()
    res = cli("validate", p, timeout=60)
    assert time.monotonic() - t0 < 20
    assert res.returncode == 2, res.stderr
    assert all(w in res.stderr for w in words), res.stderr
    assert all(ln.startswith(f"{p}:") for ln in res.stderr.strip().splitlines())
    assert sorted(x.name for x in tmp_path.iterdir()) == ["p.yaml"]


def test_every_error_reported_once_in_one_pass_with_a_cycle(tmp_path):
    p = write_plan(tmp_path, HEAD + """items:
  - {id: a, content: A, needs: [b]}
  - {id: b, content: B, needs: [c], priority: urgent}
  - {id: c, content: C, needs: [a, nowhere]}
  - {id: a, content: again}
  - {id: "bad id!", content: x}
""")
    res = cli("validate", p)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == len(set(lines)) == 5, lines
    for w in ("cyclic needs: a -> b -> c -> a", "urgent", "'nowhere'", "duplicate id",
              "'bad id!'"):
        assert sum(w in ln for ln in lines) == 1, (w, lines)


def test_nested_and_huge_metric_lines_are_stored_as_text(tmp_path):
    deep = '{"step": 1, "x": ' + "[" * 5000 + "]" * 5000 + "}"
    wide = '{"step": 2, "loss": "not a number", "tau": "x", "v": [' + ",".join(["1"] * 20000) + "]}"
    (tmp_path / "lines.txt").write_text("\n".join([deep, wide, '{"step": 3, "loss": 0.5}',
                                                   '{"event": "metric", "tau": "bad"}',
                                                   "{" * 100000, "last line"]) + "\n")
    plan = local_plan(tmp_path, f"""  - id: m
    content: prints hostile JSON lines
    action: {{kind: shell, host: here, params: {{command: "cat {tmp_path / 'lines.txt'}"}}}}
""")
    db = tmp_path / "s.db"
    res = cli("--state", db, "run", plan, "m")
    assert res.returncode == 0, res.stderr
    logs = cli("--state", db, "logs", plan, "m")
    assert logs.returncode == 0
    assert logs.stdout == (tmp_path / "lines.txt").read_text()  # complete, byte for byte
    assert rows(db, "SELECT step, name, value FROM metrics WHERE name = 'loss'") == [
        (3, "loss", 0.5)]
    for cmd in (("status",), ("status", "--json"), ("attach", "m"), ("stop", "m", "--yes")):
        r = cli("--state", db, cmd[0], plan, *cmd[1:])
        assert r.returncode == 0, (cmd, r.stderr)


@pytest.mark.parametrize("content, words", [
    ("[" * 100000, ("nested",)),
    ('{"content": "x"}', ("JSON list",)),
    ('[{"content": ["x"]}]', ("content",)),
    ('[{"content": "x", "status": {"a": 1}}]', ("status",)),
    ('[{"content": "x", "priority": 3}]', ("priority",)),
    ('[{"content": "x", "id": [1]}]', ("'id'",)),
    ('[{"content": "' + "y" * 10000 + '"}]', ("characters",)),
    ("[1, 2", ("invalid JSON",)),
])
def test_import_refuses_hostile_todo_json(tmp_path, content, words):
    src = tmp_path / "t.json"
    src.write_text(content)
    res = cli("import", src, "-o", tmp_path / "out.yaml")
    assert res.returncode == 2, res.stderr
    assert all(w in res.stderr for w in words), res.stderr
    assert not (tmp_path / "out.yaml").exists()


def test_import_encoding_and_paths(tmp_path):
    src = tmp_path / "t.json"
    src.write_bytes(b'[{"content": "caf\xe9"}]')
    res = cli("import", src, "-o", tmp_path / "o.yaml")
    assert res.returncode == 2 and "UTF-8" in res.stderr
    src.write_text('[{"content": "ok"}]')
    (tmp_path / "adir").mkdir()
    res = cli("import", src, "-o", tmp_path / "adir")
    assert res.returncode == 2 and "directory" in res.stderr
    assert list((tmp_path / "adir").iterdir()) == []
    res = cli("import", tmp_path / "adir", "-o", tmp_path / "o.yaml")
    assert res.returncode == 2 and "directory" in res.stderr
    (tmp_path / "keep.yaml").write_text("mine")
    before = digest(tmp_path / "keep.yaml")
    res = cli("import", src, "-o", tmp_path / "keep.yaml")
    assert res.returncode == 2 and digest(tmp_path / "keep.yaml") == before


# -- fuzzing --------------------------------------------------------------------------------
_scalar = st.one_of(st.text(max_size=8), st.integers(), st.booleans(), st.none())
_names = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def yaml_with_aliases(draw):
    """Plan-ish YAML built from fragments with anchors, aliases and nesting."""
    anchors: list[str] = []

    def node(depth: int) -> str:
        kind = draw(st.sampled_from(["scalar", "list", "map", "alias", "anchor"]
                                    if depth < 40 else ["scalar", "alias"]))
        if kind == "alias" and anchors:
            return "*" + draw(st.sampled_from(anchors))
        if kind == "anchor":
            name = draw(_names)
            inner = node(depth + 1)
            anchors.append(name)
            return f"&{name} [{inner}]"
        if kind == "list":
            n = draw(st.integers(0, 4))
            return "[" + ", ".join(node(depth + 1) for _ in range(n)) + "]"
        if kind == "map":
            keys = draw(st.lists(st.sampled_from(["id", "content", "needs", "action", "x",
                                                  "kind", "params"]), max_size=4, unique=True))
            return "{" + ", ".join(f"{k}: {node(depth + 1)}" for k in keys) + "}"
        return json.dumps(draw(_scalar))

    depth = draw(st.integers(0, 60))
    items = node(0)
    nested = "[" * depth + "1" + "]" * depth
    return (f"name: fz\nhosts: {{h: {{local: true, workdir: /tmp/none}}}}\n"
            f"vars: {{v: {nested}}}\nitems: {items}\n")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(yaml_with_aliases())
def test_fuzz_plan_yaml_never_escapes_as_a_crash(text):
    try:
        parse_plan(text, "fz.yaml")
    except PlanError as e:
        assert e.issues and all(str(i).startswith("fz.yaml:") for i in e.issues)


_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                               st.text(max_size=6)),
                     lambda c: st.one_of(st.lists(c, max_size=4),
                                         st.dictionaries(st.text(max_size=5), c, max_size=4)),
                     max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(_json, st.integers(0, 3000), st.sampled_from(["step", "loss", "tau", "event", "path"]))
def test_fuzz_metric_lines_never_raise(obj, depth, key):
    doc = {"step": 1, key: obj} if not isinstance(obj, dict) else {**obj, "step": 1}
    line = json.dumps(doc)
    for text in (line, "[" * depth + line + "]" * depth,
                 '{"step": 1, "x": ' + "[" * depth + "]" * depth + "}",
                 '{"event": "checkpoint", "path": ' + "[" * depth + "]" * depth + "}"):
        parse_metrics(text.encode())
        parse_artefact(text.encode())
        describe(text)
        record_text(text)  # the log pane's text of the same line


@settings(max_examples=300, deadline=None)
@given(_json)
def test_fuzz_todo_json_is_refused_or_valid(todos):
    try:
        text = todos_to_plan_yaml(todos, "fz", "t.json")
    except InvalidInput as e:
        assert e.message.startswith("t.json")
        return
    plan = parse_plan(text, "out.yaml")  # what import would write validates
    assert len(plan.items) == len(todos)
