"""core.ml.engine_clients when the server is not what a measurement needs: down, decoding
without its drafter (counters that do not move), busy with other requests, restarted mid-run.
Each is refused with the URL and what to do next, exit 1, and no result.json: never a tau of 1."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from core.ml.tasks import engine_clients as ec
from core.ml.formats.runio import run_main
from tests.conftest import ROOT
from tests.fault.conftest import no_traceback
from tests.unit.engine_servers import Engine, Served
from tests.unit.test_engine_clients import SCRIPTS, write_prompts


def argv(url: str, kind: str, tmp) -> list[str]:
    return ["--engine", kind, "--url", url, "--prompts", str(write_prompts(tmp)), "--out", str(tmp / "o" / "r.json")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_fault_server_down_names_the_url_and_what_to_do(tmp_path, kind):
    url = f"http://127.0.0.1:{free_port()}"
    res = subprocess.run([sys.executable, "-m", "core.ml.engine_clients", *argv(url, kind, tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    no_traceback(res)
    assert res.returncode == 1
    assert f"{url}/version: cannot reach the {kind} server" in res.stderr
    assert "start it (docs/serving.md §4) or check --url" in res.stderr
    assert not (tmp_path / "o").exists()


def refused(engine: Engine, tmp, capsys, *extra: str) -> tuple[str, Served]:
    """Run the client against ``engine``: it must fail (exit 1) writing nothing; its stderr."""
    s = Served(engine)
    try:
        code = run_main(ec.main, [*argv(s.url, engine.kind, tmp), *extra])
    finally:
        s.close()
    assert code == 1 and not (tmp / "o").exists()
    return capsys.readouterr().err, s


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_fault_counters_that_did_not_move_are_refused_not_tau_1(tmp_path, capsys, kind):
    err, _ = refused(Engine(kind, 4, SCRIPTS, counters_move=False), tmp_path, capsys, "--settle-timeout", "0.5")
    assert "prompt 'a': 11 tokens generated but" in err and "counted no speculative round" in err
    assert "started with the drafter" in err


def test_fault_a_busy_vllm_server_is_refused(tmp_path, capsys):
    err, s = refused(Engine("vllm", 4, SCRIPTS, busy=2), tmp_path, capsys, "--settle-timeout", "0.5")
    assert "2 other request(s) running or waiting" in err and s.url in err
    assert s.engine.received == []  # refused before anything was sent


def test_fault_another_request_finishing_meanwhile_is_refused(tmp_path, capsys):
    """A client the gauges missed (it came and went between two reads) still shows in
    vllm:request_success: its rounds would be in the deltas."""

    class Shared(Engine):
        def record(self, sc):
            super().record(sc)
            self.finished += 1

    err, _ = refused(Shared("vllm", 4, SCRIPTS), tmp_path, capsys)
    assert "2 requests finished while this one ran" in err and "another client" in err


def test_fault_counters_that_go_down_mean_a_restart(tmp_path, capsys):
    class Restarting(Engine):
        def record(self, sc):
            super().record(sc)
            self.drafts -= 100  # the counters start over below where they were read

    err, _ = refused(Restarting("vllm", 4, SCRIPTS), tmp_path, capsys)
    assert "the server restarted during the run" in err


def test_fault_a_vllm_server_without_speculative_decoding_is_refused(tmp_path, capsys):
    class Plain(Engine):
        def metrics(self):
            return "\n".join(x for x in super().metrics().splitlines() if "spec_decode" not in x) + "\n"

    err, s = refused(Plain("vllm", 4, SCRIPTS), tmp_path, capsys)
    assert "runs without speculative decoding" in err and "--speculative-config" in err
    assert s.engine.received == []
