"""``python -m core.ml.engine_clients``: tau as a running vLLM or SGLang server serves it -> result.json.

    python -m core.ml.engine_clients --engine vllm|sglang --url URL --prompts FILE.jsonl --out result.json
        [--target DIR] [--model NAME] [--max-new-tokens N] [--limit N] [--ignore-eos]
        [--block-size B] [--send ids|text] [--no-chat-template] [--enable-thinking]
        [--api-key-env VAR] [--timeout S] [--settle-timeout S]

For a server the operator already runs with a DFlash drafter (docs/serving.md §4, §5): every
prompt is sent greedy (temperature 0), one request at a time, to the server's generation
endpoint, and its acceptance is read from what the engine itself counts. No GPU and no engine
package is needed here: the client speaks HTTP with the standard library only.

* Prompts go as **token ids** (``--send ids``, the default): ``input_ids`` lines as written, text
  lines encoded with the target's tokenizer and chat template exactly as core.ml.eval encodes
  them (:func:`core.ml.measure.prompts.encode`; ``--target`` gives the tokenizer), so both sides start
  from the same ids. ``--send text`` sends the text :func:`core.ml.measure.prompts.render` makes (the
  same template, not tokenized) for a server whose API takes no ids; the engine then tokenizes
  it. result.json says which (``engine.prompt_encoding``).
* **vLLM** (``/v1/completions`` with ``prompt`` a list of ids and ``return_token_ids``):
  acceptance from its Prometheus spec-decode counters at ``/metrics``, read before and after each
  request, with no other request running or waiting (the ``vllm:num_requests_running`` and
  ``vllm:num_requests_waiting`` gauges; a busy server is refused, since its counters would mix
  other requests in) and no other one finishing meanwhile (``vllm:request_success``). Names as ``vllm/v1/spec_decode/metrics.py`` (``SpecDecodingProm``) in
  vllm-project/vllm @ee4ceaae5953 registers them: ``vllm:spec_decode_num_drafts``,
  ``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens`` (Prometheus
  counters, exposed with a ``_total`` suffix) and ``vllm:spec_decode_num_accepted_tokens_per_pos``
  (label ``position``, 0 .. num_speculative_tokens - 1: drafts whose accepted run reaches that
  position). vLLM records them after it hands the response over, so the client reads again until
  they account for every committed token and stop moving (``--settle-timeout``).
* **SGLang** (its native ``/generate`` with ``input_ids``): acceptance per request from the
  response's ``meta_info``, as ``_calculate_spec_decoding_metrics`` in
  ``python/sglang/srt/managers/tokenizer_manager.py`` of sgl-project/sglang @001067fffe33 writes
  it: ``spec_verify_ct`` (verification rounds), ``completion_tokens``, ``spec_num_correct_drafts``
  (accepted draft tokens; older releases: ``spec_accepted_drafts``), ``spec_accept_length``
  (= completion_tokens / spec_verify_ct, its own figure) and ``spec_correct_drafts_histogram``
  (older: ``spec_accept_histogram``; entry k = rounds that accepted k draft tokens). SGLang adds
  them only when a request had a verification round.

Accounting (docs/evaluation.md §1): a prompt's ``tau`` is its committed tokens over its rounds,
the committed tokens being ``completion_tokens - 1`` (the prefill's token belongs to no round, as
in specdeck) and the rounds the engine's draft count (vLLM ``num_drafts`` delta, SGLang
``spec_verify_ct``). The engine's own figure, ``1 + accepted / drafts`` (not capped where a stop
or max_new_tokens cuts the last round), is kept beside it (``engine.tau``). Neither engine
reports rounds one by one, so a row has **no per-round sequence** (``rounds`` is null); the
per-position counts and the histogram are the engine's (uncapped) counts. A request whose counters
did not move while it committed more than its prefill token is refused, never counted as tau 1:
speculative decoding did not run.

An API key comes only from the environment variable ``--api-key-env`` names (default
``SPECDECK_ENGINE_API_KEY``), never from argv, and is written nowhere. A URL with credentials,
a query or a fragment is refused. stdout: JSON lines as every core.ml task (progress per prompt,
a metric line, ``{"event": "result", "path": ...}``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.ml.formats import bounds, strictjson
from core.ml.measure import harness
from core.ml.measure import tau as taulib
from core.ml.formats.drafter_config import read_target_config
from core.ml.formats.runio import Progress, TaskError, UsageError, check_flags, emit, provenance, run_main, say, write_result
from core.text import read_json_file

KIND = "specdeck-engine-eval-v1"
ENGINES = ("vllm", "sglang")
DEFAULT_KEY_ENV = "SPECDECK_ENGINE_API_KEY"
SOURCES = {
    "vllm": "vllm-project/vllm @ee4ceaae5953 vllm/v1/spec_decode/metrics.py (SpecDecodingProm): /metrics counters",
    "sglang": "sgl-project/sglang @001067fffe33 python/sglang/srt/managers/tokenizer_manager.py "
              "(_calculate_spec_decoding_metrics): /generate meta_info",
}
NO_ROUNDS = ("none: the engine reports counts per request (drafts, accepted tokens, per position), not "
             "round by round, so per_prompt rows have rounds null; tau per prompt is committed tokens / rounds")
DEFINITION = (
    "tau per prompt = committed tokens / verification rounds, from the engine's own counts: committed = "
    "completion_tokens - 1 (the prefill's token belongs to no round), rounds = the engine's drafts (vLLM: "
    "the vllm:spec_decode_num_drafts delta around the request, one request in flight; SGLang: meta_info "
    "spec_verify_ct). 'tau' is the mean over prompts, 'tau_pooled' total committed / total rounds. "
    "'engine.tau' is the engine's figure 1 + accepted / drafts (uncapped at a stop or max_new_tokens). "
    "'per_position_acceptance'[k-1] = drafts whose accepted run reaches draft position k / drafts, and "
    "'histogram'[t] = rounds with accepted + 1 == t, both from the engine's counts (uncapped). No per-round "
    "sequence (rounds null). Greedy (temperature 0)."
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# ----------------------------------------------------------------------------- HTTP


def server_url(text: str) -> str:
    """The server's base URL as given, checked: http(s), a host, and nothing secret in it.

    Raises:
        UsageError: another scheme, no host, credentials (``user:pass@``), a query or a fragment.
    """
    u = urllib.parse.urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(f"--url {_public(text)}: give the server's base URL, e.g. http://127.0.0.1:8000")
    if u.username is not None or u.password is not None:
        raise UsageError("--url: the URL carries credentials, which would stay in argv, shell history and "
                         f"result.json; give the base URL and put the API key in ${DEFAULT_KEY_ENV} "
                         "(or the variable --api-key-env names)")
    if u.query or u.fragment:
        raise UsageError(f"--url {_public(text)}: no query or fragment (a token there would be recorded); "
                         "give the base URL and the API key through --api-key-env")
    return urllib.parse.urlunsplit((u.scheme, u.netloc, u.path.rstrip("/"), "", ""))


def _public(text: str) -> str:
    """A URL with any credentials, query and fragment dropped: what an error message may show."""
    u = urllib.parse.urlsplit(text)
    host = u.hostname or ""
    netloc = f"{host}:{u.port}" if u.port else host
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path, "", ""))


class Http:
    """Blocking JSON/text calls to one server; every failure a :class:`TaskError` naming the URL
    and what to do next, with the API key never in it."""

    def __init__(self, base: str, api_key: str | None, timeout: float, engine: str) -> None:
        self.base, self.timeout, self.engine = base, timeout, engine
        self._key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def get_text(self, path: str) -> str:
        return self._call(urllib.request.Request(self.base + path, headers=self.headers))

    def get_json(self, path: str) -> Any:
        return self._decode(path, self.get_text(path))

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(self.base + path, data=strictjson.dumps(body).encode(), method="POST",
                                     headers={**self.headers, "Content-Type": "application/json"})
        return self._decode(path, self._call(req))

    def _call(self, req: urllib.request.Request) -> str:
        url = req.full_url
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            body = self._redact(exc.read().decode("utf-8", "replace"))[:300]
            if exc.code in (401, 403):
                raise TaskError(f"{url}: HTTP {exc.code}, the server refused the request's API key; set the "
                                f"variable --api-key-env names (default ${DEFAULT_KEY_ENV}) to the key the "
                                "server was started with") from None
            raise HTTPFailure(url, exc.code, body) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise TaskError(f"{url}: the {self.engine} server did not answer within --timeout "
                                f"{self.timeout:g} s; raise --timeout or check the server's log") from None
            raise TaskError(f"{url}: cannot reach the {self.engine} server ({self._redact(str(reason))}); "
                            f"start it (docs/serving.md §4) or check --url, then run this again") from None

    def _decode(self, path: str, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            raise TaskError(f"{self.base}{path}: the answer is not JSON ({text[:120]!r}); is --url a "
                            f"{self.engine} server?") from None

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "[api key]") if self._key else text


class HTTPFailure(TaskError):
    """An HTTP error status from the server (``code``), with the start of its body."""

    def __init__(self, url: str, code: int, body: str) -> None:
        self.code = code
        super().__init__(f"{url}: HTTP {code}: {body}")


def server_version(http: Http, engine: str) -> dict[str, Any]:
    """The server's version and the endpoint that said it: ``/version`` (vLLM; SGLang has it in
    recent releases), else SGLang's ``/get_server_info`` / ``/server_info`` ``version``."""
    paths = ["/version"] + (["/get_server_info", "/server_info"] if engine == "sglang" else [])
    for path in paths:
        try:
            data = http.get_json(path)
        except HTTPFailure:
            continue
        if isinstance(data, dict) and data.get("version"):
            return {"version": str(data["version"]), "version_endpoint": path}
    raise TaskError(f"{http.base}: none of {', '.join(paths)} gave a version: is --url a {engine} server?")


def served_model(http: Http, given: str | None) -> str:
    """The model name requests carry: ``--model``, else the only (or first) of ``/v1/models``."""
    if given:
        return given
    data = http.get_json("/v1/models")
    ids = [m.get("id") for m in (data.get("data") or []) if isinstance(m, dict)] if isinstance(data, dict) else []
    if not ids or not ids[0]:
        raise TaskError(f"{http.base}/v1/models lists no model; give --model NAME (the served model name)")
    if len(ids) > 1:
        say(f"notice: {http.base} serves {ids}; using {ids[0]!r} (--model to choose)")
    return str(ids[0])


# ----------------------------------------------------------------------------- counts


@dataclass(frozen=True)
class Counts:
    """A request's acceptance as an engine counts it: ``drafts`` rounds, ``draft_tokens``
    proposed, ``accepted`` accepted draft tokens, ``per_pos[k]`` drafts whose accepted run
    reaches draft position k+1 (empty when the engine gives none)."""

    drafts: int
    draft_tokens: int | None
    accepted: int | None
    per_pos: tuple[int, ...] = ()

    def minus(self, before: "Counts") -> "Counts":
        if len(before.per_pos) not in (0, len(self.per_pos)):
            raise TaskError("the per-position counters changed length between two reads: the server restarted?")
        per_pos = tuple(a - b for a, b in zip(self.per_pos, before.per_pos or (0,) * len(self.per_pos)))
        out = Counts(self.drafts - before.drafts, _sub(self.draft_tokens, before.draft_tokens),
                     _sub(self.accepted, before.accepted), per_pos)
        if out.drafts < 0 or (out.accepted or 0) < 0 or any(c < 0 for c in per_pos):
            raise TaskError("the spec-decode counters went down between two reads: the server restarted during "
                            "the run; run the client again against a server that stays up")
        return out

    def histogram(self, block_size: int) -> list[int] | None:
        """Rounds per acceptance length 1..B, from the per-position counts (None without them)."""
        if not self.per_pos:
            return None
        reach = [self.drafts, *self.per_pos, 0]
        return [reach[t - 1] - reach[t] for t in range(1, block_size + 1)] if len(reach) == block_size + 1 else None


def _sub(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of a Prometheus text exposition: ``name -> [(labels, value)]`` (comments skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)", line)
        if not m:
            continue
        labels = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append((labels, value))
    return out


VLLM_PREFIX = "vllm:spec_decode_num_"


def _of_model(rows: list[tuple[dict[str, str], float]], model: str) -> list[tuple[dict[str, str], float]]:
    """The samples labelled with ``model``; all of them when none is (a server serves one model,
    and its ``model_name`` label may be another of its names than the one requests carry)."""
    return [(lb, v) for lb, v in rows if lb.get("model_name", model) == model] or rows


def vllm_counts(samples: dict[str, list[tuple[dict[str, str], float]]], model: str) -> Counts | None:
    """The spec-decode counters of ``model`` summed over engines (None: the server has none)."""

    def total(name: str, by: str | None = None) -> Any:
        rows = samples.get(VLLM_PREFIX + name + "_total", samples.get(VLLM_PREFIX + name))
        if rows is None:
            return None
        rows = _of_model(rows, model)
        if by is None:
            return int(sum(v for _, v in rows))
        acc: dict[int, float] = {}
        for lb, v in rows:
            acc[int(lb.get(by, 0))] = acc.get(int(lb.get(by, 0)), 0) + v
        return tuple(int(acc[k]) for k in sorted(acc))

    drafts = total("drafts")
    if drafts is None:
        return None
    return Counts(drafts, total("draft_tokens"), total("accepted_tokens"),
                  total("accepted_tokens_per_pos", "position") or ())


def vllm_in_flight(samples: dict[str, list[tuple[dict[str, str], float]]]) -> int:
    """Requests running or waiting (the scheduler's gauges, over every model and engine)."""
    return int(sum(v for name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
                   for _, v in samples.get(name, [])))


def vllm_finished(samples: dict[str, list[tuple[dict[str, str], float]]], model: str) -> int | None:
    """Requests ``model`` finished so far (``vllm:request_success``, every finish reason; None
    when the server does not expose it): a delta other than 1 around a request means another
    request shared the counters with it."""
    rows = samples.get("vllm:request_success_total", samples.get("vllm:request_success"))
    if rows is None:
        return None
    return int(sum(v for _, v in _of_model(rows, model)))


@dataclass(frozen=True)
class Scrape:
    """One read of vLLM's ``/metrics``: the spec-decode counts, requests in flight, requests finished."""

    counts: Counts | None
    busy: int
    finished: int | None


@dataclass(frozen=True)
class Reply:
    """One request's answer: the tokens it committed (``completion_tokens``, the prefill's one
    included), the output ids when the engine returns them, why it stopped, and its counts."""

    completion_tokens: int
    tokens: list[int] | None
    finish_reason: str | None
    counts: Counts | None
    engine_accept_length: float | None = None
    histogram: list[int] | None = None


class VllmClient:
    """Requests to vLLM's OpenAI completions endpoint, counts from ``/metrics`` deltas."""

    engine = "vllm"

    def __init__(self, http: Http, model: str, settle_timeout: float) -> None:
        self.http, self.model, self.settle_timeout = http, model, settle_timeout

    def read(self) -> Scrape:
        samples = parse_prometheus(self.http.get_text("/metrics"))
        return Scrape(vllm_counts(samples, self.model), vllm_in_flight(samples), vllm_finished(samples, self.model))

    def block_size(self) -> int | None:
        counts = self.read().counts
        if counts is None:
            raise TaskError(f"{self.http.base}/metrics has no {VLLM_PREFIX}drafts counter: the server runs without "
                            "speculative decoding; start it with --speculative-config '{\"method\": \"dflash\", "
                            "\"model\": DRAFTER, \"num_speculative_tokens\": B-1}' (docs/serving.md §4)")
        return len(counts.per_pos) + 1 if counts.per_pos else None

    def generate(self, prompt: list[int] | str, max_new_tokens: int, stop_ids: list[int], ignore_eos: bool) -> Reply:
        before = self._poll(lambda r: r.busy == 0)
        if before.busy:
            raise TaskError(f"{self.http.base}: {before.busy} other request(s) running or waiting; the counter "
                            "deltas would count them too: run the client when nothing else uses the server")
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": max_new_tokens,
                                "temperature": 0.0, "ignore_eos": ignore_eos, "return_token_ids": True}
        if stop_ids:
            body["stop_token_ids"] = stop_ids
        data = self.http.post_json("/v1/completions", body)
        try:
            choice, usage = data["choices"][0], data["usage"]
            completion = int(usage["completion_tokens"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise TaskError(f"{self.http.base}/v1/completions: no choices[0] / usage.completion_tokens in "
                            f"the answer ({str(data)[:160]})") from None
        counts, finished = self._settled(before, completion)
        if finished is not None and finished > 1:
            raise TaskError(f"{self.http.base}: {finished} requests finished while this one ran (vllm:request_success): "
                            "another client used the server and its rounds are in these counters; run the client "
                            "when nothing else uses the server")
        tokens = choice.get("token_ids")
        return Reply(completion, [int(t) for t in tokens] if isinstance(tokens, list) else None,
                     choice.get("finish_reason"), counts)

    def _poll(self, done: Callable[[Scrape], bool]) -> Scrape:
        """Read ``/metrics`` until ``done`` holds or ``--settle-timeout`` passes; the last read."""
        deadline, wait = time.monotonic() + self.settle_timeout, 0.02
        while True:
            scrape = self.read()
            if done(scrape) or time.monotonic() > deadline:
                return scrape
            time.sleep(wait)  # polling a server's counters: there is nothing to wait on but the next read
            wait = min(wait * 2, 0.5)

    def _settled(self, before: Scrape, completion: int) -> tuple[Counts, int | None]:
        """The counter deltas once they account for the request (its committed tokens, its end)
        and hold still over two reads (vLLM records them after it answers), or what they were
        at the deadline; and how many requests finished meanwhile (None: not exposed)."""
        last: list[Any] = [None]

        def settled(now: Scrape) -> bool:
            if now.counts is None or before.counts is None:
                raise TaskError(f"{self.http.base}/metrics lost its {VLLM_PREFIX}drafts counter mid-run: the "
                                "server restarted? run again")
            delta = (now.counts.minus(before.counts), _sub(now.finished, before.finished))
            accounted = ((delta[0].accepted is None or delta[0].drafts + delta[0].accepted >= completion - 1)
                         and (delta[1] is None or delta[1] >= 1))
            still, last[0] = delta == last[0], delta
            return accounted and still

        self._poll(settled)
        return last[0]


class SglangClient:
    """Requests to SGLang's native ``/generate``, counts from each response's ``meta_info``."""

    engine = "sglang"

    def __init__(self, http: Http, model: str) -> None:
        self.http, self.model = http, model

    def block_size(self) -> int | None:
        for path in ("/get_server_info", "/server_info"):
            try:
                info = self.http.get_json(path)
            except HTTPFailure:
                continue
            n = info.get("speculative_num_draft_tokens") if isinstance(info, dict) else None
            if isinstance(n, int) and n > 0:
                return n
        return None

    def generate(self, prompt: list[int] | str, max_new_tokens: int, stop_ids: list[int], ignore_eos: bool) -> Reply:
        params: dict[str, Any] = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos}
        if stop_ids:
            params["stop_token_ids"] = stop_ids
        key = "input_ids" if isinstance(prompt, list) else "text"
        data = self.http.post_json("/generate", {key: prompt, "sampling_params": params})
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        meta = data.get("meta_info") if isinstance(data, dict) else None
        if not isinstance(meta, dict) or "completion_tokens" not in meta:
            raise TaskError(f"{self.http.base}/generate: no meta_info.completion_tokens in the answer "
                            f"({str(data)[:160]})")
        completion = int(meta["completion_tokens"])
        verify = meta.get("spec_verify_ct")
        accepted = next((meta[k] for k in ("spec_num_correct_drafts", "spec_accepted_drafts") if k in meta), None)
        proposed = next((meta[k] for k in ("spec_num_proposed_drafts", "spec_proposed_drafts") if k in meta), None)
        hist = next((meta[k] for k in ("spec_correct_drafts_histogram", "spec_accept_histogram") if k in meta), None)
        counts = None if verify is None else Counts(int(verify), None if proposed is None else int(proposed),
                                                    None if accepted is None else int(accepted))
        ids, finish = data.get("output_ids"), meta.get("finish_reason")
        return Reply(completion, [int(t) for t in ids] if isinstance(ids, list) else None,
                     finish.get("type") if isinstance(finish, dict) else finish, counts,
                     meta.get("spec_accept_length"), [int(h) for h in hist] if isinstance(hist, list) else None)


# ----------------------------------------------------------------------------- rows


def prompt_row(pid: str, reply: Reply, block_size: int, prompt_len: int | None, decode_s: float,
               base: str) -> dict[str, Any]:
    """One prompt's row in core.ml.eval's per_prompt shape (``rounds`` null: see :data:`NO_ROUNDS`).

    Raises:
        TaskError: the request committed more than its prefill token and the engine counted no
            round for it (speculative decoding did not run: refused, never tau 1), or counts that
            cannot be one request's (more tokens than B per round).
    """
    committed = max(reply.completion_tokens - 1, 0)
    c = reply.counts
    drafts = c.drafts if c is not None else 0
    if committed and not drafts:
        raise TaskError(f"prompt {pid!r}: {reply.completion_tokens} tokens generated but {base} counted no "
                        "speculative round for it (its counters did not move): the server decoded without its "
                        "drafter; check that it was started with the drafter (docs/serving.md §4) and that "
                        "nothing else reset its metrics, then run again")
    if drafts and not drafts <= committed <= drafts * block_size:
        raise TaskError(f"prompt {pid!r}: {committed} committed tokens over {drafts} rounds is not 1..{block_size} "
                        f"tokens a round (block size {block_size}): another request was counted with this one, the "
                        "engine counted rounds that committed nothing, or --block-size is wrong")
    hist = reply.histogram if reply.histogram is not None else (c.histogram(block_size) if c else None)
    if hist is not None and len(hist) < block_size:
        hist = hist + [0] * (block_size - len(hist))
    per_pos = list(c.per_pos) if c and c.per_pos else _reach(hist, block_size)
    engine_tau = 1 + c.accepted / drafts if c and drafts and c.accepted is not None else None
    return {"id": pid, "sample": 0, "seed": None, "tau": committed / drafts if drafts else None, "rounds": None,
            "num_rounds": drafts, "committed_tokens": committed, "tokens": reply.tokens, "prompt_len": prompt_len,
            "stopped": reply.finish_reason == "stop", "finish_reason": reply.finish_reason, "decode_s": decode_s,
            "per_position_counts": per_pos,
            "histogram": {str(t): hist[t - 1] for t in range(1, block_size + 1)} if hist else None,
            "engine": {"drafts": drafts, "draft_tokens": c.draft_tokens if c else None,
                       "accepted": c.accepted if c else None, "tau": engine_tau,
                       "accept_length": reply.engine_accept_length,
                       "completion_tokens": reply.completion_tokens}}


def _reach(hist: list[int] | None, block_size: int) -> list[int] | None:
    """Per-position counts from a histogram over accepted draft tokens 0..B-1 (entry k = rounds
    with k accepted): position k is reached by the rounds with k or more."""
    if not hist:
        return None
    return [sum(hist[k:block_size]) for k in range(1, block_size)]


def summarize(rows: list[dict[str, Any]], block_size: int) -> dict[str, Any]:
    """The top-level figures of core.ml.eval's result from rows without rounds."""
    taus = [r["tau"] for r in rows if r["tau"] is not None]
    rounds = sum(r["num_rounds"] for r in rows)
    committed = sum(r["committed_tokens"] for r in rows)
    have_pos = all(r["per_position_counts"] is not None for r in rows if r["num_rounds"])
    counts = [sum((r["per_position_counts"] or [0] * (block_size - 1))[k] for r in rows if r["num_rounds"])
              for k in range(block_size - 1)] if have_pos else None
    hists = [r["histogram"] for r in rows if r["num_rounds"]]
    accepted = [r["engine"]["accepted"] for r in rows if r["num_rounds"]]
    return {
        "tau": sum(taus) / len(taus) if taus else None,
        "tau_pooled": committed / rounds if rounds else None,
        "per_position_acceptance": [c / rounds for c in counts] if counts and rounds else None,
        "per_position_counts": counts,
        "histogram": ({str(t): sum(h[str(t)] for h in hists) for t in range(1, block_size + 1)}
                      if hists and all(hists) else None),
        "num_rounds": rounds, "num_prompts": len(rows), "committed_tokens": committed,
        "engine_tau_pooled": 1 + sum(accepted) / rounds if rounds and None not in accepted else None,
    }


# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.engine_clients", allow_abbrev=False,
                                description="measure tau as a running vLLM or SGLang server serves a drafter")
    p.add_argument("--engine", required=True, choices=ENGINES)
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000 (no credentials)")
    p.add_argument("--prompts", required=True, help="JSONL prompts as core.ml.eval reads them (or zlab:NAME)")
    p.add_argument("--out", required=True, help="result.json path (provenance.json is written beside it)")
    p.add_argument("--target", help="the target's directory: its tokenizer encodes text prompts as core.ml.eval "
                   "does, its config identifies the target in result.json (needed for text prompts)")
    p.add_argument("--model", help="the served model name (default: the first of /v1/models)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--limit", type=int, help="only the first N prompts")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS")
    p.add_argument("--block-size", type=int, help="B (default: what the server reports; checked against it)")
    p.add_argument("--send", choices=("ids", "text"), default="ids", help="prompts as token ids (default) or as "
                   "the chat-templated text, for an API that takes no ids")
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--enable-thinking", action="store_true")
    p.add_argument("--api-key-env", default=DEFAULT_KEY_ENV, metavar="VAR",
                   help=f"the environment variable holding the server's API key (default {DEFAULT_KEY_ENV}; "
                   "never give the key itself on the command line)")
    p.add_argument("--api-key", help=argparse.SUPPRESS)  # refused: a key in argv is kept in shell history and ps
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one HTTP request may take")
    p.add_argument("--settle-timeout", type=float, default=10.0,
                   help="vLLM: seconds to wait for /metrics to account for a finished request")
    return p


def validate(args: argparse.Namespace) -> None:
    """Input checks before any request (UsageError: exit 2, naming the flag, nothing written)."""
    args.url = server_url(args.url)
    if args.api_key is not None:
        raise UsageError(f"--api-key: a key on the command line stays in shell history and ps; export it as "
                         f"${DEFAULT_KEY_ENV} (or the variable --api-key-env names) instead")
    if not _ENV_NAME.fullmatch(args.api_key_env):
        raise UsageError("--api-key-env takes the NAME of an environment variable holding the key (letters, "
                         "digits, _), not the key itself")
    if args.target is not None and not (Path(args.target) / "config.json").is_file():
        raise UsageError(f"--target {args.target}: no config.json there")
    if args.target is not None:
        read_target_config(args.target)  # InvalidFile: a value of the wrong type or range, by key
    if not args.prompts.startswith("zlab:") and not Path(args.prompts).is_file():
        raise UsageError(f"--prompts {args.prompts}: file not found")
    check_flags(args, max_new_tokens=bounds.count, limit=bounds.count, block_size=lambda v: bounds.count(v, 2))
    for flag, value in (("--timeout", args.timeout), ("--settle-timeout", args.settle_timeout)):
        if not (math.isfinite(value) and value > 0) or bounds.seconds(value):
            raise UsageError(f"{flag} {value}: must be a positive number of seconds, at most {bounds.SECONDS_MAX:g}")


def target_block(target: str | None) -> dict[str, Any] | None:
    """result.json's ``target``: core.ml.eval's fields that a client can know without torch."""
    if target is None:
        return None
    from core.ml.tasks.extract import target_fingerprint

    cfg = read_target_config(target, text=False)
    text = read_target_config(target)
    return {"path": str(Path(target).resolve()), "model_type": cfg.get("model_type"),
            "fingerprint": target_fingerprint(target), "num_layers": text.get("num_hidden_layers")}


def target_stop_ids(target: str | None) -> list[int]:
    """The EOS ids core.ml.eval stops at (:func:`core.ml.models.target.stop_token_ids`, read from the
    files without torch): generation_config.json's ``eos_token_id``, else config.json's."""
    if target is None:
        return []
    for name in ("generation_config.json", "config.json"):
        path = Path(target) / name
        if path.is_file():
            doc = read_json_file(path, "target config")
            eos = doc.get("eos_token_id") if isinstance(doc, dict) else None
            if isinstance(eos, int) and not isinstance(eos, bool):
                return [eos]
            if isinstance(eos, list) and eos and all(isinstance(e, int) and not isinstance(e, bool) for e in eos):
                return list(eos)
    return []


def encoder(args: argparse.Namespace, prompts: list[Any]) -> tuple[Callable[[Any], list[int] | str], Any]:
    """How each prompt becomes what is sent, and the tokenizer (None without text prompts)."""
    from core.ml.measure import prompts as promptlib

    texts = [p.id for p in prompts if p.input_ids is None]
    if texts and args.target is None:
        raise UsageError(f"--target: prompts {texts[:3]} are text; the target's tokenizer and chat template "
                         "encode them as core.ml.eval does (or give input_ids prompts)")
    tokenizer = None
    if args.target is not None:
        from core.ml.models.target import load_tokenizer

        tokenizer = load_tokenizer(args.target)
    vocab = 1 << 62
    if args.target is not None:
        vocab = read_target_config(args.target).get("vocab_size") or vocab
    chat = not args.no_chat_template

    def encode(p: Any) -> list[int] | str:
        if args.send == "text" and p.input_ids is None:
            return promptlib.render(p, tokenizer, chat, args.enable_thinking)[0]
        return promptlib.encode(p, tokenizer, vocab, chat, args.enable_thinking)

    return encode, tokenizer


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    validate(args)
    from core.ml.measure.prompts import describe, read_prompts, single_turn

    prompts = read_prompts(args.prompts, args.limit)
    single_turn(prompts, "engine_clients")
    encode, tokenizer = encoder(args, prompts)
    http = Http(args.url, os.environ.get(args.api_key_env) or None, args.timeout, args.engine)
    version = server_version(http, args.engine)
    model = served_model(http, args.model)
    client = (VllmClient(http, model, args.settle_timeout) if args.engine == "vllm" else SglangClient(http, model))
    reported = client.block_size()
    if args.block_size and reported and args.block_size != reported:
        raise UsageError(f"--block-size {args.block_size}: the server drafts with block size {reported} "
                         f"({'num_speculative_tokens + 1' if args.engine == 'vllm' else 'speculative_num_draft_tokens'})")
    block_size = args.block_size or reported
    if not block_size:
        raise UsageError(f"--block-size: {args.url} does not say its block size; give it (num_speculative_tokens + 1)")
    stops = [] if args.ignore_eos else target_stop_ids(args.target)
    rows, progress = [], Progress("engine_eval", len(prompts), "prompts")
    for p in prompts:
        sent = encode(p)
        t0 = time.perf_counter()
        reply = client.generate(sent, args.max_new_tokens, stops, args.ignore_eos)
        rows.append(prompt_row(p.id, reply, block_size, len(sent) if isinstance(sent, list) else None,
                               time.perf_counter() - t0, args.url))
        progress.step(tokens=reply.completion_tokens, id=p.id, tau=rows[-1]["tau"])
    figures = summarize(rows, block_size)
    if not figures["num_rounds"]:
        raise TaskError(f"{args.url}: no speculative round in {len(rows)} prompts (every answer was one token): "
                        "raise --max-new-tokens")
    from core.ml.tasks.eval import template_settings

    engine = {"name": args.engine, **version, "url": args.url, "model": model, "source": SOURCES[args.engine],
              "prompt_encoding": "token_ids" if args.send == "ids" or all(p.input_ids for p in prompts) else "text",
              "rounds": NO_ROUNDS, "engine_tau_pooled": figures.pop("engine_tau_pooled")}
    result = {
        "kind": KIND, "definition": DEFINITION, "mode": "online", "method": "chain",
        "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "samples": 1,
        "accounting": taulib.ACCOUNTING, "block_size": block_size,
        "stop_token_ids": stops, "ignore_eos": args.ignore_eos,
        "template": template_settings(args, tokenizer) if tokenizer is not None else None,
        "max_new_tokens": args.max_new_tokens, "target": target_block(args.target),
        "engine": engine, "prompts": describe(args.prompts, prompts),
        **figures, "per_prompt": rows,
    }
    result["harness"] = harness.of_result(result)
    emit("metric", task="engine_eval", engine=args.engine, tau=result["tau"], tau_pooled=result["tau_pooled"],
         engine_tau_pooled=engine["engine_tau_pooled"], num_rounds=result["num_rounds"])
    prov = provenance(["python -m core.ml.engine_clients", *argv], task="engine_eval", extra={"engine": engine})
    out = write_result(args.out, result, prov)
    emit("result", task="engine_eval", path=str(out.resolve()))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
