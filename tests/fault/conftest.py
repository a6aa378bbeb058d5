"""Helpers for the fault-injection suites: real CLI subprocesses, real SQLite state files."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli


def no_traceback(res) -> None:
    """A user never sees a traceback."""
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout, res.stderr


def cli(*args, **kw):
    res = run_cli(*args, **kw)
    no_traceback(res)
    return res


def write_plan(tmp: Path, body: str, name: str = "p.yaml") -> Path:
    p = tmp / name
    p.write_text(body)
    return p


def local_plan(tmp: Path, items: str, *, name: str = "f", extra_hosts: str = "",
               vars_: str = "{}") -> Path:
    wd = tmp / "wd"
    return write_plan(tmp, f"name: {name}\nhosts:\n  here: {{local: true, workdir: {wd}}}\n"
                      f"{extra_hosts}vars: {vars_}\nitems:\n{items}")


def relay_plan(tmp: Path, size_mb: int, *, bwlimit: str = "2M", item: str = "copy") -> Path:
    """A plan relaying ``a:f.bin`` (``size_mb`` MiB of random bytes) to ``b:f.bin``
    between two local hosts, paced at ``bwlimit``: an in-process run lasting a while."""
    src = tmp / "a"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(1 << 20) * size_mb)
    return local_plan(tmp, f"""  - id: {item}
    content: a paced relay
    action: {{kind: relay, params: {{src: "a:f.bin", dst: "b:f.bin", bwlimit: {bwlimit}}}}}
""", extra_hosts=f"  a: {{local: true, workdir: {src}}}\n  b: {{local: true, workdir: "
                  f"{tmp / 'b'}}}\n")


def rows(db: Path, sql: str, args=()) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def popen_cli(*args, env=None):
    e = {**os.environ, **(env or {})}
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", "console.cli", *map(str, args)], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(pred, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    st = Path(f"/proc/{pid}/stat")
    return st.exists() and st.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def kill_later():
    """Pids to SIGKILL at teardown (processes a test deliberately leaves behind)."""
    pids: list[int] = []
    yield pids
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def maybe_rows(db: Path, sql: str, args=()) -> list[tuple]:
    """``rows`` while another process may still be creating the database."""
    if not db.exists():
        return []
    try:
        return rows(db, sql, args)
    except sqlite3.OperationalError:
        return []


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str):
    """A real small filesystem: a tmpfs of ``size`` (``64m``, ``2m``) mounted at ``mnt`` (made
    here) while inside, lazily unmounted after. Skips the test where mounting is not
    permitted (not root, no CAP_SYS_ADMIN), saying so."""
    mnt.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}",
                          f"specdeck-test-{uuid.uuid4().hex[:6]}", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
