"""Class 7 (issue 28): plans are read within their bounds. A plan path or a todo list that is
a device, a FIFO or a multi-gigabyte file is refused by type and size before it is read
(exit 2, naming the path, nothing written); plan vars are checked as host env values are,
and a var reaches only the runs whose commands use it; a 100,000-item import takes seconds."""

from __future__ import annotations

import json
import os
import time

import pytest
import yaml

from core.state.store import Store
from tests.fault.conftest import cli, digest, local_plan, rows

ITEM = """  - id: a
    content: say hi
    action: {kind: shell, host: here, params: {command: "echo hi"}}
"""


def _hostile(kind, tmp_path):
    if kind == "fifo":
        p = tmp_path / "plan.fifo"
        os.mkfifo(p)  # nobody writes: reading it would wait forever
        return p, "FIFO"
    if kind == "device":
        return "/dev/zero", "device"  # reading it would never end
    if kind == "huge":
        p = tmp_path / "huge.yaml"
        with open(p, "wb") as f:
            f.truncate(3 << 30)  # 3 GiB, sparse: reading it would take the memory
        return p, "bytes"
    if kind == "directory":
        p = tmp_path / "adir.yaml"
        p.mkdir()
        return p, "directory"
    raise AssertionError(kind)


KINDS = ["fifo", "device", "huge", "directory"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", [("validate",), ("status",), ("run", "--all")])
def test_fault_plan_path_refused_by_type_and_size(tmp_path, kind, command):
    path, word = _hostile(kind, tmp_path)
    db = tmp_path / "state.db"
    Store(db).close()  # an existing state file (status reads only one that exists)
    before = digest(db)
    t0 = time.monotonic()
    res = cli("--state", db, command[0], path, *command[1:], timeout=60)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert str(path) in res.stderr and word in res.stderr, res.stderr
    assert time.monotonic() - t0 < 30  # refused, not read
    assert digest(db) == before  # nothing written


@pytest.mark.parametrize("kind", KINDS)
def test_fault_todo_list_refused_by_type_and_size(tmp_path, kind):
    path, word = _hostile(kind, tmp_path)
    out = tmp_path / "out.yaml"
    res = cli("import", path, "-o", out, timeout=60)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert str(path) in res.stderr and word in res.stderr, res.stderr
    assert not out.exists()


@pytest.mark.parametrize("value, words", [
    ('"a\\0b"', ("var 'v'", "NUL")),
    (json.dumps("x" * 70000), ("var 'v'", "64 KiB")),
])
def test_fault_plan_var_checked_like_an_env_value(tmp_path, value, words):
    plan = local_plan(tmp_path, ITEM, vars_="{v: " + value + "}")
    db = tmp_path / "state.db"
    for args in (("validate", plan), ("--state", db, "run", plan, "a")):
        res = cli(*args)
        assert res.returncode == 2, res.stderr
        assert f"{plan}:" in res.stderr and all(w in res.stderr for w in words), res.stderr
    assert not db.exists()


def test_fault_a_var_reaches_only_the_runs_that_use_it(tmp_path):
    """40 vars of 60 KiB (2.4 MB together, past the kernel's exec limit): exported to every
    run, no command could exec; each run gets only what its command uses."""
    big = {f"v{i}": chr(ord("a") + i % 26) * 60000 for i in range(40)}
    items = """  - id: plain
    content: uses no var
    action: {kind: shell, host: here, params: {command: "/bin/echo plain ok"}}
  - id: one
    content: uses one var
    action: {kind: shell, host: here, params: {command: "/bin/echo ${v3} | /usr/bin/wc -c"}}
"""
    plan = local_plan(tmp_path, items, vars_=json.dumps(big))
    db = tmp_path / "state.db"
    res = cli("--state", db, "run", plan, "--all", "-q")
    assert res.returncode == 0, res.stderr
    assert cli("--state", db, "logs", plan, "plain").stdout == "plain ok\n"
    assert cli("--state", db, "logs", plan, "one").stdout.strip() == "60001"
    states = dict(rows(db, "SELECT item_id, state FROM runs"))
    assert states == {"plain": "succeeded", "one": "succeeded"}
    scripts = {p.parent.name.split("-")[0]: p.read_text()
               for p in (tmp_path / "wd").rglob(".specdeck/runs/*/cmd.sh")}
    assert "SPECDECK_VAR_" not in scripts["plain"]
    assert "SPECDECK_VAR_v3=" in scripts["one"] and "SPECDECK_VAR_v4=" not in scripts["one"]


def test_fault_import_of_100000_todos_takes_seconds(tmp_path):
    todos = [{"content": "same task", "status": "pending", "priority": "medium"}
             for _ in range(50000)]
    todos += [{"content": f"task {i}", "id": f"t{i}", **({"needs": [f"t{i - 1}"]} if i else {})}
              for i in range(50000)]
    src = tmp_path / "t.json"
    src.write_text(json.dumps(todos))
    out = tmp_path / "big.yaml"
    t0 = time.monotonic()
    res = cli("import", src, "-o", out, timeout=300)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    print(f"import of 100,000 todos: {took:.1f} s")
    # minutes when the de-duplication was quadratic; seconds now (a loaded 2-CPU CI box)
    assert took < 90, took
    items = yaml.load(out.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))[
        "items"]
    assert len(items) == 100000 and len({it["id"] for it in items}) == 100000
    assert items[1]["id"] == "same-task-2" and items[49999]["id"] == "same-task-50000"
    assert items[50001]["needs"] == ["t0"]
