"""Faults around the llama.cpp engine leg: no ``llama-server`` outlives its eval.

The eval (``python -m core.ml.eval --engine llama.cpp``) is interrupted with SIGINT while its
server is serving prompts, and killed with SIGKILL (no ``finally`` runs then: the kernel ends the
server, ``PR_SET_PDEATHSIG``). Either way no process of the binary is left. Real llama-server,
skipped only where scripts/bootstrap --test has not built it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from core.ml.engines.llama import find_binary, server_processes  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.fault.conftest import wait_for  # noqa: E402

BINARY = find_binary()
pytestmark = [pytest.mark.engine, pytest.mark.ml, pytest.mark.slow, pytest.mark.skipif(
    BINARY is None or not BINARY.is_file(),
    reason="no llama-server built: scripts/bootstrap --test builds it with scripts/build-llama-server; CI has it")]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from core.ml.demo import tiny

    root = tmp_path_factory.mktemp("engine-fault")
    target, drafter = tiny.make_tiny_pair(root, "qwen3", seed=0, block_size=8)
    rows = tiny.tiny_prompt_rows(3) * 100  # long enough that the signal lands mid-run
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({**r, "id": f"p{i}"}) + "\n" for i, r in enumerate(rows)))
    return target, drafter, prompts


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)])
def test_fault_no_llama_server_outlives_an_interrupted_or_killed_eval(pair, tmp_path, sig, code):
    target, drafter, prompts = pair
    before = set(server_processes(BINARY))
    proc = subprocess.Popen([sys.executable, "-m", "core.ml.eval", "--target", str(target), "--drafter", str(drafter),
                             "--prompts", str(prompts), "--out", str(tmp_path / "run/result.json"),
                             "--max-new-tokens", "64", "--dtype", "float32", "--engine", "llama.cpp",
                             "--engine-bin", str(BINARY)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        line = wait_for(lambda: proc.stdout.readline(), 300, "the first progress line")
        assert json.loads(line)["event"] == "progress", line
        assert set(server_processes(BINARY)) - before, "no server was running while prompts were served"
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: not (set(server_processes(BINARY)) - before), 30, "the server to be gone")
    assert not (tmp_path / "run/result.json").exists()
