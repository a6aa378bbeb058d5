"""Stand-ins for a vLLM and an SGLang server (no GPU here): real HTTP servers in a thread that
speak the endpoints core.ml.engine_clients reads, in the formats the engines document.

vLLM: ``/version``, ``/v1/models``, ``/v1/completions`` (ids in, ``token_ids`` and ``usage`` out)
and ``/metrics`` in the Prometheus text exposition ``prometheus_client`` writes for vLLM's
``SpecDecodingProm`` counters (``_total`` and ``_created`` samples, labels ``engine``,
``model_name``, ``position``), growing with each request. As vLLM does, the counters of a request
are recorded after its answer is sent: here they show from the second ``/metrics`` read after
it (``lag_reads``), so the client must read until they account for the request.
SGLang: ``/get_server_info`` (``version``, ``speculative_num_draft_tokens``; ``/version`` 404s as in
releases before it) and ``/generate`` with ``meta_info`` as ``_calculate_spec_decoding_metrics``
fills it.

A request's behaviour is a :class:`Script`: the accepted draft tokens of each round and how many
tokens it commits (fewer than the rounds make when a stop or max_new_tokens cuts the last one).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Script:
    """One request: ``accepted[i]`` draft tokens accepted in round i; ``cut`` tokens dropped from
    the last round (a stop inside it); ``finish`` the finish reason."""

    accepted: tuple[int, ...]
    cut: int = 0
    finish: str = "length"

    @property
    def completion_tokens(self) -> int:
        """The prefill's token plus what every round commits."""
        return 1 + sum(a + 1 for a in self.accepted) - self.cut


@dataclass
class Engine:
    """State shared by the handler threads: scripts by prompt, counters, what was received."""

    kind: str
    block_size: int
    scripts: dict[tuple, Script]
    model: str = "tiny"
    api_key: str | None = None
    lag_reads: int = 1
    counters_move: bool = True
    old_names: bool = False
    """SGLang: the meta_info names of releases before spec_num_correct_drafts (spec_accepted_drafts,
    spec_accept_histogram)."""
    busy: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    finished: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)
    pending: list[tuple[int, Script]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.per_pos = [0] * (self.block_size - 1)

    def script_for(self, prompt: Any) -> Script:
        return self.scripts[tuple(prompt) if isinstance(prompt, list) else prompt]

    def record(self, s: Script) -> None:
        self.finished += 1
        if not self.counters_move:
            return
        self.drafts += len(s.accepted)
        self.draft_tokens += len(s.accepted) * (self.block_size - 1)
        self.accepted += sum(s.accepted)
        for a in s.accepted:
            for k in range(a):
                self.per_pos[k] += 1

    def metrics(self) -> str:
        with self.lock:
            due = [p for p in self.pending if p[0] <= 0]
            self.pending = [(n - 1, s) for n, s in self.pending if n > 0]
            for _, s in due:
                self.record(s)
            lab = f'engine="0",model_name="{self.model}"'
            lines = []
            for name, value in (("drafts", self.drafts), ("draft_tokens", self.draft_tokens),
                                ("accepted_tokens", self.accepted)):
                full = f"vllm:spec_decode_num_{name}"
                lines += [f"# HELP {full}_total Number of {name}.", f"# TYPE {full}_total counter",
                          f"{full}_total{{{lab}}} {float(value)}", f"{full}_created{{{lab}}} 1.7e+09"]
            lines += ["# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{k}"}} {float(v)}'
                      for k, v in enumerate(self.per_pos)]
            lines += ["# TYPE vllm:request_success_total counter",
                      f'vllm:request_success_total{{{lab},finished_reason="length"}} {float(self.finished)}',
                      f'vllm:request_success_total{{{lab},finished_reason="stop"}} 0.0']
            lines += [f"vllm:num_requests_running{{{lab}}} {float(self.busy)}",
                      f"vllm:num_requests_waiting{{{lab}}} 0.0"]
            return "\n".join(lines) + "\n"


def tokens_of(s: Script) -> list[int]:
    return [100 + i for i in range(s.completion_tokens)]


class Handler(BaseHTTPRequestHandler):
    engine: Engine

    def log_message(self, *args: Any) -> None:  # keep the test output clean
        pass

    def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        e = self.engine
        e.headers.append(dict(self.headers))
        if e.api_key and self.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {e.api_key}":
            self._send(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        e = self.engine
        if not self._authorized():
            return
        if self.path == "/metrics" and e.kind == "vllm":
            self._send(200, e.metrics(), "text/plain; version=0.0.4")
        elif self.path == "/version" and e.kind == "vllm":
            self._send(200, {"version": "0.11.0"})
        elif self.path == "/get_server_info" and e.kind == "sglang":
            self._send(200, {"version": "0.5.4", "model_path": "/models/t", "speculative_algorithm": "DFLASH",
                             "speculative_num_draft_tokens": e.block_size})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": e.model, "object": "model"}]})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        e = self.engine
        if not self._authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        e.received.append({"path": self.path, **body})
        if self.path == "/v1/completions" and e.kind == "vllm":
            s = e.script_for(body["prompt"])
            with e.lock:
                e.pending.append((e.lag_reads, s))
            n = s.completion_tokens
            self._send(200, {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                             "choices": [{"index": 0, "text": "x" * n, "token_ids": tokens_of(s),
                                          "finish_reason": s.finish}],
                             "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                                       "total_tokens": len(body["prompt"]) + n}})
        elif self.path == "/generate" and e.kind == "sglang":
            s = e.script_for(body.get("input_ids", body.get("text")))
            n, rounds = s.completion_tokens, len(s.accepted)
            meta: dict[str, Any] = {"id": "r1", "finish_reason": {"type": s.finish}, "prompt_tokens": 5,
                                    "completion_tokens": n, "cached_tokens": 0, "e2e_latency": 0.01}
            if rounds and e.counters_move:
                hist = [0] * e.block_size
                for a in s.accepted:
                    hist[a] += 1
                meta.update(spec_accept_rate=sum(s.accepted) / (rounds * (e.block_size - 1)),
                            spec_accept_length=n / rounds, spec_verify_ct=rounds, spec_accepted_drafts=sum(s.accepted),
                            spec_proposed_drafts=rounds * (e.block_size - 1))
                if e.old_names:
                    meta["spec_accept_histogram"] = hist
                else:
                    meta.update(spec_num_correct_drafts=sum(s.accepted), spec_correct_drafts_histogram=hist,
                                spec_num_proposed_drafts=rounds * (e.block_size - 1))
            self._send(200, {"text": "x" * n, "output_ids": tokens_of(s), "meta_info": meta})
        else:
            self._send(404, {"detail": "Not Found"})


class Served:
    """A started server: ``url``, ``engine`` state; ``close()`` stops it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        handler = type("BoundHandler", (Handler,), {"engine": engine})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
