"""Issue 43: old import paths are refused with their new name, and every ``python -m
core.ml.<task>`` that plans, docs and the hosts' commands name still resolves to a module."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from core import moved
from tests.conftest import ROOT


@pytest.mark.parametrize("old", sorted(moved.MOVED))
def test_an_old_path_is_refused_with_the_new_one(old):
    new = moved.MOVED[old]
    assert importlib.util.find_spec(new) is not None, f"{old} -> {new}, which does not exist"
    with pytest.raises(ModuleNotFoundError, match=re.escape(f"{old} moved to {new}")):
        importlib.import_module(old)


def test_from_import_of_an_old_name_names_the_new_one():
    with pytest.raises(ImportError, match=r"core\.store moved to core\.state\.store"):
        from core import store  # noqa: F401
    with pytest.raises(ImportError, match=r"core\.ml\.drafter moved to core\.ml\.models\.drafter"):
        from core.ml import drafter  # noqa: F401
    with pytest.raises(AttributeError):
        import core

        core.not_a_module_ever  # noqa: B018


def _named_tasks() -> set[str]:
    text = []
    for pattern in ("README.md", "docs/*.md", "plans/*.yaml", "core/**/*.py", "console/**/*.py"):
        text += [p.read_text() for p in ROOT.glob(pattern)]
    return set(re.findall(r"-m\s+core\.ml\.([a-z_]+)", "\n".join(text))) | set(
        re.findall(r'"-m",\s*"core\.ml\.([a-z_]+)"', "\n".join(text)))


def test_every_named_task_still_runs_where_it_stood():
    tasks = _named_tasks()
    assert {"eval", "extract", "strip", "train", "watcher", "export"} <= tasks, tasks
    for t in sorted(tasks):
        assert importlib.util.find_spec(f"core.ml.{t}") is not None, f"python -m core.ml.{t}"
        assert f"core.ml.{t}" not in moved.MOVED


def test_a_thin_entry_runs_its_task():
    out = subprocess.run([sys.executable, "-m", "core.ml.compare", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "baseline" in out.stdout.lower() or "result" in out.stdout.lower(), out.stdout
