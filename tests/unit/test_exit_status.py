"""A remote command's own exit status never becomes specdeck's (the CLI contract: 1 an action
failed, 2 invalid input, 3 a host unreachable or a command on it ended by a signal), and
``console/cli/exit_codes.py`` is the only place that maps an error to a status."""

import ast
import sqlite3

import pytest

from console.cli import exit_codes
from console.cli import entry as cli_main
from core.errors import (ActionFailed, HostKeyRejected, HostUnreachable, InvalidInput,
                         PlanError, RemoteCommandFailed, SpecdeckError, StateDiskFull)
from core.faults import Interruption
from tests.conftest import ROOT


def _main_raising(monkeypatch, err) -> int:
    """``specdeck kinds`` through the real ``main``, its command raising ``err``."""
    def fails(args):
        raise err

    parser = cli_main.build_parser()
    for sub in parser._subparsers._group_actions[0].choices.values():
        if sub.prog.endswith(" kinds"):
            sub.set_defaults(fn=fails)
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
    return cli_main.main(["kinds"])


@pytest.mark.parametrize("remote, sig, status", [(127, None, 1), (0, None, 1), (3, None, 1),
                                                 (2, None, 1), (None, "KILL", 3),
                                                 (None, "TERM", 3)])
def test_remote_failure_never_exits_the_remote_status(monkeypatch, capsys, remote, sig, status):
    err = RemoteCommandFailed("ct129", "python -m core.ml.eval", remote, "boom\n", signal=sig)
    assert err.remote_status == remote
    assert _main_raising(monkeypatch, err) == status
    out = capsys.readouterr().err
    assert "ct129" in out and ("signal KILL" if sig == "KILL" else
                               "signal TERM" if sig else f"exit status {remote}") in out


@pytest.mark.parametrize("err, status", [
    (InvalidInput("bad flag"), 2), (PlanError([]), 2), (HostUnreachable("gpu", "refused"), 3),
    (HostKeyRejected("gpu", "changed key"), 3), (ActionFailed("no"), 1),
    (SpecdeckError("other"), 1), (sqlite3.DatabaseError("malformed"), 2),
    (RecursionError(), 2), (ValueError("surprise"), 1), (OSError(5, "I/O error"), 1),
    (StateDiskFull("/st/s.db", "the tmpfs filesystem mounted at /st", "database or disk is full",
                   full=True, mount="/st"), 1)])
def test_every_error_kind_has_its_status(monkeypatch, capsys, err, status):
    assert exit_codes.for_error(err) == status
    assert _main_raising(monkeypatch, err) == status
    assert "Traceback" not in capsys.readouterr().err


def test_interruptions_exit_as_shells_report_signals():
    import signal

    assert exit_codes.for_interruption(Interruption()) == 130
    assert exit_codes.for_interruption(Interruption("terminated", signal.SIGTERM)) == 143


@pytest.mark.parametrize("summary, named, status", [
    ({"unreachable": ["a"], "failed": ["b"], "waiting": [], "unadopted": []}, True, 3),
    ({"unreachable": [], "failed": ["b"], "waiting": [], "unadopted": []}, False, 1),
    ({"unreachable": [], "failed": [], "waiting": ["c"], "unadopted": []}, True, 1),
    ({"unreachable": [], "failed": [], "waiting": ["c"], "unadopted": []}, False, 0),
    ({"unreachable": [], "failed": [], "waiting": ["c"], "unadopted": ["c"]}, True, 0),
    ({"unreachable": [], "failed": [], "waiting": [], "unrecorded": ["d"]}, False, 1),
    ({"unreachable": ["a"], "failed": [], "waiting": [], "unrecorded": ["d"]}, False, 3)])
def test_run_summary_status(summary, named, status):
    from core.state.records import RunSummary

    summary = RunSummary(**{k: tuple(v) for k, v in summary.items()})
    assert exit_codes.for_run(summary, named=named) == status


def test_no_other_module_maps_errors_to_statuses():
    """No ``exit_status`` attribute on errors, no status literal returned from an except
    clause anywhere but exit_codes."""
    for path in sorted((ROOT / "core").rglob("*.py")) + sorted((ROOT / "console").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "console/cli/exit_codes.py" or rel.startswith("core/ml/"):
            continue  # core/ml/ tasks are separate programs with their own statuses
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign):
                        names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
                        assert "exit_status" not in names, f"{rel}: {node.name}.exit_status"
            if isinstance(node, ast.ExceptHandler):
                for sub in ast.walk(node):
                    if (isinstance(sub, ast.Return) and isinstance(sub.value, ast.Constant)
                            and isinstance(sub.value.value, int)
                            and not isinstance(sub.value.value, bool) and rel.startswith("console/cli/")):
                        raise AssertionError(f"{rel}:{sub.lineno}: an exit status literal "
                                             "in an except clause; use exit_codes")


def test_a_full_state_disk_is_told_with_where_and_what_to_do(monkeypatch, capsys):
    """StateDiskFull reaching ``main`` (a command other than run: mark, status): exit 1, its
    message (the file, its filesystem) and hint (where to free space) on stderr, nothing
    on stdout, no exception name."""
    err = StateDiskFull("/st/s.db", "the tmpfs filesystem mounted at /st (0 B free of 2.1 MB)",
                        "database or disk is full", full=True, mount="/st")
    assert _main_raising(monkeypatch, err) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert ("specdeck: the state disk is full: state database /st/s.db, on the tmpfs filesystem "
            "mounted at /st (0 B free of 2.1 MB)") in out.err
    assert "hint: free space on /st" in out.err
    assert "StateDiskFull" not in out.err and "Traceback" not in out.err
