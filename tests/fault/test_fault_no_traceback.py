"""No traceback reaches a user: every command of the CLI, run as a subprocess against the
hostile inputs and faults of each class, exits with the contract's status and one message."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from tests.fault.conftest import local_plan, write_plan

ITEMS = """  - id: a
    content: a
    action: {kind: shell, host: here, params: {command: "echo a", cwd: "x/../../%s"}}
"""


def _setup(tmp_path, case):
    plan = local_plan(tmp_path, ITEMS % ("y" * 300))
    db = tmp_path / "s.db"
    if case == "garbage-db":
        db.write_bytes(b"garbage" * 50)
    elif case == "dir-db":
        db.mkdir()
    elif case == "plan-dir":
        plan = tmp_path / "adir.yaml"
        plan.mkdir()
    elif case == "plan-binary":
        plan = write_plan(tmp_path, "", "bin.yaml")
        plan.write_bytes(b"\xff\xfe\x00name: x\x00")
    elif case == "plan-bomb":
        plan = write_plan(tmp_path, "a: &a [1,1,1,1,1,1,1,1]\n" + "".join(
            f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
            for p, c in zip("abcdefgh", "bcdefghi")), "bomb.yaml")
    elif case == "plan-deep":
        plan = write_plan(tmp_path, "items: " + "[" * 5000 + "]" * 5000, "deep.yaml")
    return plan, db


CASES = ["ok", "garbage-db", "dir-db", "plan-dir", "plan-binary", "plan-bomb", "plan-deep"]
COMMANDS = [("validate",), ("status",), ("status", "--json"), ("run", "a"), ("run", "--all"),
            ("run", "nope"), ("attach",), ("logs", "a"), ("logs", "a", "-f"),
            ("stop", "a", "--yes"), ("mark", "a", "done"), ("export", "--todowrite")]


@pytest.mark.parametrize("case", CASES)
def test_no_traceback_from_any_command(tmp_path, case):
    plan, db = _setup(tmp_path, case)
    for cmd in COMMANDS:
        res = run_cli("--state", db, cmd[0], plan, *cmd[1:], timeout=60)
        assert "Traceback" not in res.stderr and "Traceback" not in res.stdout, (cmd, res.stderr)
        assert res.returncode in (0, 1, 2, 3), (cmd, res.returncode, res.stderr)
        if case != "ok" and not (case.endswith("-db") and cmd[0] == "validate"):
            assert res.returncode == 2, (case, cmd, res.stderr)
        if res.returncode:
            assert res.stderr.strip(), (cmd, "a failure says why")


@pytest.mark.parametrize("args", [
    ("import", "{tmp}/missing.json", "-o", "{tmp}/o.yaml"),
    ("import", "{tmp}", "-o", "{tmp}/o.yaml"),
    ("import", "{tmp}/deep.json", "-o", "{tmp}/o.yaml"),
    ("import", "{tmp}/ok.json", "-o", "{tmp}"),
    ("import", "{tmp}/ok.json", "-o", "/proc/nope/o.yaml"),
])
def test_no_traceback_from_import(tmp_path, args):
    (tmp_path / "deep.json").write_text("[" * 50000)
    (tmp_path / "ok.json").write_text('[{"content": "x"}]')
    res = run_cli(*[a.format(tmp=tmp_path) for a in args])
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 2, res.stderr
