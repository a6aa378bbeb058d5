"""The llama.cpp engine leg against servers that are not what it needs (issue 42 §7, engine side).

No real llama-server here: each "binary" is a script the test writes, started by
:class:`core.ml.engines.llama.LlamaServer` exactly as llama-server is (real processes, a real
HTTP server on a loopback port):

* a server answering garbage (bytes that are not UTF-8, an HTML page, text where its JSON has a
  number, counters that are not numbers or not there) is an error naming the engine, the
  endpoint and what came back, cut short; through ``eval`` that is exit 1, no traceback, nothing
  written;
* a server started through a wrapper script whose child outlives the wrapper is ended with its
  whole process group: on a normal stop, on an error inside the eval, on Ctrl-C; no process of
  it is left;
* a binary that never opens its port says so every second while it is waited for, then fails
  with the timeout and what to do, and is ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core.ml.engines.llama import LlamaServer
from core.ml.formats.runio import TaskError
from tests.conftest import ROOT
from tests.fault.conftest import no_traceback, pid_alive, wait_for

COUNTERS = ("llamacpp:spec_decode_num_drafts_total 0\nllamacpp:spec_decode_num_draft_tokens_total 0\n"
            "llamacpp:spec_decode_num_accepted_tokens_total 0\n")
HTML = "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>" + "<p>proxy</p>" * 60 + "</body></html>"

FAKE = r'''
import http.server, json, os, signal, sys, time

args = sys.argv[1:]
if "--version" in args:
    print("version: 1 (0c1e570)", file=sys.stderr)
    sys.exit(0)
if os.environ.get("FAKE_SIGINT") == "default":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
with open(os.environ["FAKE_PIDS"], "a") as f:
    f.write(f"{os.getpid()}\n")
mode = os.environ["FAKE_MODE"]
ANSWERS = json.loads(os.environ["FAKE_ANSWERS"])
completion = ANSWERS.get(mode + ":completion", ANSWERS["ok:completion"])
metrics = ANSWERS.get(mode + ":metrics", ANSWERS["ok:metrics"])


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def answer(self, body):
        data = body.encode("latin-1")  # the answers travel as latin-1 text: any bytes
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer('{"status": "ok"}' if self.path == "/health" else metrics)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if mode == "slow":
            open(os.environ["FAKE_PIDS"] + ".asked", "w").close()
            time.sleep(120)
        self.answer(completion)


port = int(args[args.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''

ANSWERS = {
    "ok:completion": json.dumps({"tokens": [5, 6], "timings": {"predicted_n": 2}, "stop_type": "limit"}),
    "ok:metrics": COUNTERS,
    "non-utf8:completion": "\xff\xfe{\"tokens\": [5]}\x80",
    "html:completion": HTML,
    "text-number:completion": json.dumps({"tokens": [5, 6], "timings": {"predicted_n": 2, "draft_n": "seven"}}),
    "text-tokens:completion": json.dumps({"tokens": "5 6", "timings": {}}),
    "metrics-text:metrics": COUNTERS.replace("drafts_total 0", "drafts_total twelve"),
    "metrics-html:metrics": HTML,
}


@pytest.fixture
def fake(tmp_path, monkeypatch, kill_later):
    """The fake server script, its pid file (every process of it appends its pid), and a helper
    that starts a LlamaServer on a given binary; every pid written is SIGKILLed at teardown."""
    script = tmp_path / "fake_llama_server.py"
    script.write_text(FAKE)
    pids = tmp_path / "pids"
    pids.write_text("")
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    monkeypatch.setenv("FAKE_ANSWERS", json.dumps(ANSWERS))
    monkeypatch.setenv("FAKE_MODE", "ok")
    (tmp_path / "t.gguf").write_bytes(b"GGUF")
    (tmp_path / "d.gguf").write_bytes(b"GGUF")

    def binary(body: str, name: str) -> Path:
        path = tmp_path / name
        path.write_text(body)
        path.chmod(0o755)
        return path

    def server(bin_path: Path, **kw) -> LlamaServer:
        return LlamaServer(bin_path, tmp_path / "t.gguf", tmp_path / "d.gguf", 7, 1, 256, tmp_path / "run", **kw)

    def started() -> list[int]:
        out = [int(x) for x in pids.read_text().split()]
        kill_later.extend(out)
        return out

    direct = binary(f"#!{sys.executable}\n{FAKE}", "llama-server")
    wrapper = binary(f'#!/bin/sh\necho $$ >> "$FAKE_PIDS"\n"{sys.executable}" "{script}" "$@" &\nwait\n', "wrapper.sh")
    return {"direct": direct, "wrapper": wrapper, "binary": binary, "server": server, "started": started,
            "root": tmp_path}


@pytest.mark.parametrize("mode, endpoint, shows", [
    ("non-utf8", "POST /completion", ["an answer that is not UTF-8 text", r"'\\xff\\xfe{"]),
    ("html", "POST /completion", ["an answer that is not JSON", "'<!DOCTYPE html><html><head><title>502 Bad Gateway",
                                  f"... ({len(HTML)} bytes in all)"]),
    ("text-number", "POST /completion", ["'timings.draft_n' that is not a count ('seven')"]),
    ("text-tokens", "POST /completion", ["'tokens' that are not token ids ('5 6')"]),
    ("metrics-text", "GET /metrics", ["counter llamacpp:spec_decode_num_drafts_total = 'twelve'"]),
    ("metrics-html", "GET /metrics", ["no spec_decode_num_drafts_total, spec_decode_num_draft_tokens_total, "
                                      "spec_decode_num_accepted_tokens_total counters", "'<!DOCTYPE html>"]),
])
def test_fault_garbage_answer_names_the_engine_the_endpoint_and_what_came_back(fake, monkeypatch, mode, endpoint,
                                                                                shows):
    monkeypatch.setenv("FAKE_MODE", mode)
    server = fake["server"](fake["direct"])
    with pytest.raises(TaskError) as err, server:
        server.complete("p0", [1, 2, 3], 4)
    text = str(err.value)
    assert text.startswith(f"llama.cpp (llama-server on 127.0.0.1:{server.port}) ")
    assert endpoint in text and all(s in text for s in shows), text
    assert len(text) < 900  # what came back is cut short, never the whole page
    assert "is --engine-bin" in text and str(server.log_path) in text
    assert not any(pid_alive(p) for p in fake["started"]())


def test_fault_a_good_fake_answer_passes_so_the_garbage_cases_test_the_checks(fake):
    server = fake["server"](fake["direct"])
    with server:
        reply = server.complete("p0", [1, 2, 3], 4)
    assert reply.tokens == [5, 6] and reply.stop_type == "limit"
    assert reply.metrics_delta == dict.fromkeys(("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                                                 "spec_decode_num_accepted_tokens_total"), 0.0)


@pytest.mark.parametrize("how", ["stop", "error"])
def test_fault_a_wrapped_server_is_ended_with_its_process_group(fake, how):
    """The wrapper's child ignores SIGINT (sh starts it in the background) and outlives the wrapper:
    only the process group's SIGKILL after the grace ends it."""
    server = fake["server"](fake["wrapper"], stop_grace=1.0)
    if how == "stop":
        with server:
            wrapper_and_child = fake["started"]()
            assert len(wrapper_and_child) == 2 and all(pid_alive(p) for p in wrapper_and_child)
    else:
        with pytest.raises(RuntimeError, match="the eval failed"), server:
            wrapper_and_child = fake["started"]()
            raise RuntimeError("the eval failed")
    assert server.proc is None
    assert not any(pid_alive(p) for p in wrapper_and_child), "a process of the wrapped server outlived it"


def test_fault_a_binary_that_never_opens_its_port_says_so_while_waiting_and_times_out(fake, capsys):
    sleeper = fake["binary"]('#!/bin/sh\necho $$ >> "$FAKE_PIDS"\nexec sleep 600\n', "sleeper")
    server = fake["server"](sleeper, start_timeout=2.5, progress_every=1.0, stop_grace=1.0)
    with pytest.raises(TaskError) as err, server:
        pass
    where = f"127.0.0.1:{server.port}"
    err_lines = capsys.readouterr().err.splitlines()
    assert f"waiting for llama-server on {where} (1s)" in err_lines
    assert f"waiting for llama-server on {where} (2s)" in err_lines
    text = str(err.value)
    assert f"llama-server did not get ready on {where} in 2.5 s: its port was never open" in text
    assert "raise --engine-start-timeout" in text and str(server.log_path) in text
    assert not any(pid_alive(p) for p in fake["started"]())


def _eval(fake, binary: Path, *extra: str) -> subprocess.Popen:
    """``python -m core.ml.eval --engine llama.cpp`` on a tiny target and drafter (never loaded:
    the engine is given .gguf files), through ``binary``."""
    from core.ml.demo import tiny

    root = fake["root"]
    target = tiny.save_tiny_target(root / "target", "qwen3")
    drafter = tiny.save_tiny_drafter(root / "drafter", tiny.tiny_target_config("qwen3"), block_size=8)
    prompts = tiny.write_tiny_prompts(root / "p.jsonl", n_text=1)
    return subprocess.Popen([sys.executable, "-m", "core.ml.eval", "--target", str(target), "--drafter", str(drafter),
                             "--prompts", str(prompts), "--out", str(root / "out/result.json"), "--engine", "llama.cpp",
                             "--engine-bin", str(binary), "--engine-target", str(root / "t.gguf"),
                             "--engine-drafter", str(root / "d.gguf"), "--dtype", "float32", *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.ml
def test_fault_eval_on_a_server_answering_html_exits_1_naming_it_and_writes_nothing(fake, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("FAKE_MODE", "html")
    proc = _eval(fake, fake["direct"])
    out, err = proc.communicate(timeout=300)
    no_traceback(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert proc.returncode == 1, err
    assert "POST /completion: an answer that is not JSON: '<!DOCTYPE html>" in err
    assert not (fake["root"] / "out/result.json").exists()
    assert not any(pid_alive(p) for p in fake["started"]())


@pytest.mark.ml
def test_fault_ctrl_c_during_eval_ends_a_wrapped_server_and_its_child(fake, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("FAKE_MODE", "slow")  # the request is pending when Ctrl-C comes
    monkeypatch.setenv("FAKE_SIGINT", "default")  # the child ends on the group's SIGINT, not on the wrapper's death
    proc = _eval(fake, fake["wrapper"])
    try:
        wait_for(lambda: Path(os.environ["FAKE_PIDS"] + ".asked").exists() or proc.poll() is not None, 300,
                 "the eval to send its first request")
        assert proc.poll() is None, proc.communicate()[1]
        served = fake["started"]()
        assert len([p for p in served if pid_alive(p)]) == 2  # the wrapper and its child
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert not any(pid_alive(p) for p in fake["started"]()), "a process of the wrapped server outlived the eval"
    assert not (fake["root"] / "out/result.json").exists()
