"""Dependencies point one way, checked in fresh interpreters (as Harlequin does).

* importing ``core`` (and the CLI) loads neither textual nor torch;
* importing ``console`` does not load torch or transformers;
* only ``core/state/store.py`` imports sqlite_utils, only ``core/hosts/ssh.py`` asyncssh, only
  ``core/ml`` torch/transformers, and nothing under ``core`` imports ``console``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def loaded_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return {m.split(".")[0] for m in out.split()}


@pytest.mark.parametrize("stmt", ["import core", "import core.session", "import core.runs.runner",
                                  "import core.actions", "import core.state.store",
                                  "import console.cli", "import console.cli.ui"])
def test_core_loads_no_textual_no_torch(stmt):
    mods = loaded_after(stmt)
    assert "textual" not in mods
    assert "torch" not in mods and "transformers" not in mods
    assert "console" not in mods or stmt.startswith("import console.cli")


def test_console_does_not_load_torch():
    mods = loaded_after("import console.app")
    assert "torch" not in mods and "transformers" not in mods


OWNERS = {"sqlite_utils": {"core/state/store.py"}, "asyncssh": {"core/hosts/ssh.py"}}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_static_import_owners():
    for path in sorted((ROOT / "core").rglob("*.py")) + sorted((ROOT / "console").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        mods = _imports(path)
        for mod, owners in OWNERS.items():
            if mod in mods:
                assert rel in owners, f"{rel} imports {mod}; only {owners} may"
        if mods & {"torch", "transformers", "safetensors"}:
            assert rel.startswith("core/ml/"), f"{rel} imports torch/transformers"
        if rel.startswith("core/"):
            assert "textual" not in mods and "console" not in mods, rel


def modules_after_cli(*argv: str, cwd: Path = ROOT) -> tuple[int, set[str]]:
    """The CLI's exit status on ``argv`` and every module it had loaded when it ended."""
    code = ("import sys\nfrom console.cli import main\ntry:\n    rc = main(sys.argv[1:])\n"
            "except SystemExit as e:\n    rc = e.code or 0\n"
            "sys.stderr.write('\\n'.join(sorted(sys.modules)) + '\\n')\nsys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, capture_output=True,
                          text=True)
    return done.returncode, set(done.stderr.split())


HEAVY = {"asyncio", "sqlite3", "sqlite_utils", "yaml", "rich", "numpy", "asyncssh",
         "argcomplete", "zipfile", "core.plans.planfile", "core.runs.runner", "core.state.store", "core.capsules.jobs",
         "core.actions.registry", "core.runs.events", "core.tau.stats", "core.tau.table"}


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["status", "--help"]])
def test_version_and_help_load_no_command_code(argv):
    """Start-up (issue 34): what no command ran is not imported; these print from the parser
    alone."""
    rc, mods = modules_after_cli(*argv)
    assert rc == 0
    assert not HEAVY & mods, sorted(HEAVY & mods)


def test_validate_loads_no_console_ssh_ml_nor_store(tmp_path):
    """``validate`` reads the plan and every kind's checks (a train item reads its trainer
    config): neither textual, asyncssh nor torch, and no state store (nor sqlite_utils)."""
    from core.demo import write_workspace

    plan = write_workspace(tmp_path / "demo", quick=True)
    rc, mods = modules_after_cli("validate", str(plan))
    assert rc == 0
    assert "core.actions.train" in mods  # the kinds' checks ran
    assert not {"textual", "asyncssh", "torch", "transformers", "core.state.store", "sqlite_utils",
                "pandas", "numpy", "regex"} & mods, sorted(mods)


def test_piped_status_loads_no_rich_table_nor_compare(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("name: p\nitems:\n  - id: a\n    content: A manual step\n")
    rc, mods = modules_after_cli("status", str(plan), "--state", str(tmp_path / "s.db"))
    assert rc == 2  # a --state that does not exist: refused before the store opens
    assert not {"core.state.store", "sqlite_utils", "rich"} & mods
    rc, _ = modules_after_cli("--state", str(tmp_path / "s.db"), "mark", str(plan), "a", "done")
    assert rc == 0
    rc, mods = modules_after_cli("status", str(plan), "--state", str(tmp_path / "s.db"))
    assert rc == 0
    assert "core.state.store" in mods  # the command ran
    assert not {"rich.table", "rich.console", "core.tau.table", "core.tau.stats", "argcomplete",
                "asyncssh", "textual", "torch", "pandas", "numpy"} & mods, mods
