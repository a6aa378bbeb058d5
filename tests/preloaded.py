"""``python -m MODULE ARGS`` as a child process forked from an interpreter that has already
imported torch and transformers: the same process boundary (its own exit status, stdout,
stderr, working directory and environment), without paying their import (1.5 to 3 s of CPU a
run on 2 CPUs) for every hostile file a fault set hands an entry point.

One server per test process, started on first use: ``python -c SERVER`` imports the heavy
packages and then, for each request (one JSON line on its stdin), forks; the child takes the
request's working directory, environment, stdin/stdout/stderr files and ``sys.argv`` and runs
the module as ``__main__`` (:func:`runpy.run_module`), exactly as ``python -m`` does, exits
with its status (an uncaught exception prints its traceback and exits 1, as Python does).
The server answers the child's pid at once and its exit status when it ends; a request that
runs past its timeout is killed (SIGKILL) and raises :class:`subprocess.TimeoutExpired`.

What differs from a fresh interpreter: modules imported before the fork stay imported, so
environment variables read at import time (``HF_HUB_OFFLINE``) are the server's, which starts
with the suite's. Tests about what a command imports, or how fast it starts, spawn the real
entry point instead (tests/test_import_hygiene.py, bench/cli_startup.py).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SERVER = r"""
import json, os, runpy, sys, traceback
sys.path[0] = ROOT
import torch, transformers  # noqa: F401  the import every child would pay
import transformers.models.qwen3.modeling_qwen3  # noqa: F401  (lazy modules: the tiny targets')
import core.ml.models.drafter  # noqa: F401

def child(req):
    for fd, path, mode in ((0, req["stdin"], os.O_RDONLY),
                           (1, req["stdout"], os.O_WRONLY),
                           (2, req["stderr"], os.O_WRONLY)):
        f = os.open(path, mode)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    # sys.path as ``python -m`` in that directory with that PYTHONPATH would start with
    # (the server's own checkout kept after them: what it imported came from there)
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:1] = [os.getcwd(), *extra, ROOT]
    module, *args = req["argv"]
    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(code & 0xFF)

out = os.fdopen(os.dup(1), "w", buffering=1)
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        out.close()
        child(req)
    out.write(json.dumps({"pid": pid}) + "\n")
    _, status = os.waitpid(pid, 0)
    out.write(json.dumps({"status": status}) + "\n")
"""


class _Server:
    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"ROOT = {str(ROOT)!r}\n{SERVER}"], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _answer(self, timeout: float | None) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the preloaded server died (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self, argv: list[str], env: dict, cwd: Path, timeout: float, input: str | None
            ) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="preloaded-") as tmp, self.lock:
            paths = {k: os.path.join(tmp, k) for k in ("stdin", "stdout", "stderr")}
            Path(paths["stdin"]).write_text(input or "")
            for k in ("stdout", "stderr"):
                Path(paths[k]).touch()
            self.proc.stdin.write(json.dumps({"argv": argv, "env": env, "cwd": str(cwd),
                                              **paths}) + "\n")
            self.proc.stdin.flush()
            pid = self._answer(60)["pid"]
            done = self._answer(timeout)
            if done is None:
                os.kill(pid, signal.SIGKILL)
                self._answer(60)
                raise subprocess.TimeoutExpired([sys.executable, "-m", *argv], timeout,
                                                Path(paths["stdout"]).read_text(),
                                                Path(paths["stderr"]).read_text())
            status = done["status"]
            code = os.waitstatus_to_exitcode(status)
            return subprocess.CompletedProcess(
                [sys.executable, "-m", *argv], code,
                Path(paths["stdout"]).read_text(errors="replace"),
                Path(paths["stderr"]).read_text(errors="replace"))

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_server: _Server | None = None


def run_module(*argv, env: dict | None = None, cwd: Path | str = ROOT, timeout: float = 120,
               input: str | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([python, "-m", *argv], capture_output=True, text=True, ...)``, forked
    from the preloaded server (started on first use, one per test process)."""
    global _server
    if _server is None or not _server.alive():
        _server = _Server()
        atexit.register(_server.close)
    return _server.run([str(a) for a in argv], dict(os.environ if env is None else env),
                       Path(cwd), timeout, input)
