"""The llama.cpp engine leg of ``python -m core.ml.eval --engine llama.cpp`` (issue 32 §3).

The same drafter and prompts as the in-process online eval, measured through a real
``llama-server`` (``scripts/build-llama-server`` builds it from the llama.cpp tree vendored in
the ``llama-cpp-python`` 0.3.36 sdist; ../shared/docs/engine-llama-cpp.md is the measured
recipe). What it does, and why each step is so:

* **GGUF.** ``--engine-target`` / ``--engine-drafter`` take a ``.gguf`` or a directory, which is
  converted with the converter of the same llama.cpp revision (:mod:`core.ml.gguf_convert`,
  kept next to the binary), at the eval's dtype: float32 parity needs float32 on both sides.
* **Server.** Loopback only, a free port of its own, ``-np 1`` (so ``/metrics`` deltas are one
  request's), ``LLAMA_TRACE=1`` (one ``accepted a/ b draft tokens`` log line per round), its
  log in the run's directory; it dies with the run: ended in a ``finally`` (errors and Ctrl-C
  too) and, on Linux, killed by the kernel if this process dies first (``PR_SET_PDEATHSIG``).
* **Requests.** Every prompt as token ids (the engine's tokenizer never runs), greedy, EOS
  stopping on (the engine's ``ignore_eos`` forbids EOS instead of generating past it), and
  exactly ``max_new_tokens`` tokens asked for (``n_predict``): the engine's own end of generation
  is measured (its draft cut to ``n_remaining - 1``, the last token decoded alone:
  :data:`core.ml.measure.tau.FULL_BLOCK`), which specdeck reproduces under ``--engine-rule llama.cpp``
  round for round at every ``max_new_tokens``.
* **Acceptance.** Per round from the trace lines of that request (tau_round = a + 1), per
  request from ``timings.draft_n`` / ``draft_n_accepted``, and ``/metrics`` deltas; any
  disagreement between the three is an error naming the prompt. The rounds are then counted
  the reference's way over the engine's own tokens (:func:`core.ml.measure.tau.committed`: at most
  ``max_new_tokens`` committed, none after a stop token), so result.json has the shape and
  accounting of :mod:`core.ml.eval`, the engine's raw figures kept beside them.
"""

from __future__ import annotations

import ctypes
import hashlib
import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.ml.formats import strictjson
from core.ml.measure import tau as taulib
from core.ml.formats.drafter_config import read_target_config
from core.ml.formats.runio import Progress, TaskError, UsageError, say

ENGINE = "llama.cpp"
CACHE_ENV, BIN_ENV = "SPECDECK_LLAMA_CACHE", "SPECDECK_LLAMA_SERVER"
BUILD_HINT = "build it with scripts/build-llama-server (about 7 min on 2 CPUs) or pass --engine-bin PATH"
TRACE = re.compile(r" I slot .*accepted\s+(\d+)/\s*(\d+) draft tokens( \(restore checkpoint\))?\s*$")
"""The per-round trace line (info level; the debug line that also says ``accepted a/b draft tokens``
goes on with ``, new n_tokens``, so it never matches)."""
DRAFT_LOAD = "loading draft model"
EOG = re.compile(r"EOG token\s+= (\d+) ")
METRICS = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
           "spec_decode_num_accepted_tokens_total")
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
START_TIMEOUT_S, REQUEST_TIMEOUT_S, LOG_TIMEOUT_S = 300.0, 600.0, 60.0
WAIT_PROGRESS_S, STOP_GRACE_S, KILL_WAIT_S = 10.0, 10.0, 5.0
"""How often a line says the eval still waits for the server to start; how long the server has
to end on SIGINT before its process group is killed; how long a stop waits for the killed to go."""
SHOWN_CHARS = 200
"""How much of an answer that is not llama-server's an error message quotes."""


def cache_root() -> Path:
    """Where scripts/build-llama-server keeps its builds, one directory per sdist sha256."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache/specdeck/llama.cpp")


def find_binary(explicit: str | None = None) -> Path | None:
    """``--engine-bin``, else ``$SPECDECK_LLAMA_SERVER``, else the newest cached build; None if none."""
    given = explicit or os.environ.get(BIN_ENV)
    if given:
        return Path(given)
    built = sorted(cache_root().glob("*/bin/llama-server"), key=lambda p: p.stat().st_mtime)
    return built[-1] if built else None


def converter_tree(binary: Path) -> Path | None:
    """The converter kept next to a cached build (``<sha>/convert``), else ``$SPECDECK_LLAMA_CPP``."""
    for tree in (binary.resolve().parent.parent / "convert", Path(os.environ.get("SPECDECK_LLAMA_CPP") or "/nonexistent")):
        if (tree / "convert_hf_to_gguf.py").is_file():
            return tree
    return None


def binary_info(binary: Path) -> dict[str, Any]:
    """Path, sha256 and ``--version`` of the server binary (result.json's ``engine``)."""
    h = hashlib.sha256()
    with open(binary, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    try:
        proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--engine-bin {binary}: does not run ({exc}); {BUILD_HINT}") from None
    line = next((s.strip() for s in (proc.stdout + proc.stderr).splitlines() if s.startswith("version")), None)
    if line is None:
        raise UsageError(f"--engine-bin {binary}: `--version` printed no version line; is it llama-server?")
    commit = re.search(r"commit ([0-9a-f]{6,})|\(([0-9a-f]{6,})\)", line)
    return {"name": ENGINE, "binary": str(binary.resolve()), "binary_sha256": h.hexdigest(), "version": line,
            "revision": next(g for g in commit.groups() if g) if commit else None}


# ----------------------------------------------------------------------------- GGUF


def gguf_of(given: str | None, source: str, role: str, outtype: str, workdir: Path, tree: Path | None,
            target_dir: str) -> tuple[Path, dict[str, Any]]:
    """The GGUF for ``role`` (target or drafter): ``given`` when it is a ``.gguf``, else the
    directory (``given`` or ``source``) converted into ``workdir``. Returns it and its record."""
    path = Path(given or source)
    if path.is_file() and path.suffix == ".gguf":
        return path, {"gguf": str(path.resolve()), "converted_from": None}
    if tree is None:
        raise UsageError(f"--engine-{role} {path}: converting a directory needs llama.cpp's converter, which is "
                         f"kept next to a binary built by scripts/build-llama-server (or set SPECDECK_LLAMA_CPP "
                         f"to a llama.cpp tree); or pass a .gguf")
    out = workdir / f"{role}.gguf"
    source_dir = path if role == "drafter" else with_mrope_sections(path, workdir / "target-staged")
    args = [str(source_dir), "--outtype", outtype, "--outfile", str(out)]
    if role == "drafter":
        args += ["--target-model-dir", str(Path(target_dir).resolve())]
    else:
        args += _target_flags(path)
    cmd = [sys.executable, "-m", "core.ml.gguf_convert", str(tree), "--", *args]
    say(f"converting the {role} {path} to GGUF ({outtype}) with {tree / 'convert_hf_to_gguf.py'}")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(Path(__file__).resolve().parents[2]))
    if proc.returncode != 0 or not out.is_file():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise UsageError(f"--engine-{role} {path}: llama.cpp's converter failed (exit {proc.returncode}):\n{tail}")
    notices = [s for s in proc.stderr.splitlines() if s.startswith("notice:")]
    for n in notices:
        say(n)
    return out, {"gguf": str(out.resolve()), "converted_from": str(path.resolve()), "outtype": outtype,
                 "notices": notices}


def mrope_sections(n_rot: int) -> list[int]:
    """M-RoPE sections for ``n_rot`` rotary dims: ``n_rot / 2`` pairs split over (t, h, w) as
    Qwen's default [11, 11, 10] splits 32."""
    n = n_rot // 2
    first = -(-n // 3)
    second = -(-(n - first) // 2)
    return [first, second, n - first - second]


def with_mrope_sections(path: Path, staged: Path) -> Path:
    """``path``, or a copy of it (weights linked) whose config states ``mrope_section``: llama.cpp
    gives a Qwen3.5 target without one the default [11, 11, 10] and aborts when the model has
    fewer rotary dims (``GGML_ASSERT(sect_dims <= ne0)``, tiny targets). For text positions the
    sections change nothing: t, h and w positions are all the token's index."""
    try:
        cfg = read_target_config(path, text=False)  # checked: sizes are integers in range
    except ValueError:  # InvalidFile: eval refused it already, naming the key
        return path
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    rope = text.get("rope_parameters")
    if not str(text.get("model_type", cfg.get("model_type", ""))).startswith("qwen3_5") or not isinstance(rope, dict) \
            or "mrope_section" in rope:
        return path
    head = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    n_rot = int(head * float(rope.get("partial_rotary_factor", 1.0)))
    rope["mrope_section"] = mrope_sections(n_rot)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for f in path.iterdir():
        if f.name != "config.json":
            (staged / f.name).symlink_to(f.resolve())
    (staged / "config.json").write_text(json.dumps(cfg, indent=2, allow_nan=False), encoding="utf-8")
    say(f"notice: {path}/config.json states no mrope_section; converting a copy with {rope['mrope_section']} "
        f"({n_rot} rotary dims; the same outputs for text positions)")
    return staged


def _target_flags(path: Path) -> list[str]:
    """Converter flags a target needs: a Qwen3.5 checkpoint without MTP layers needs ``--no-mtp``."""
    try:
        text = read_target_config(path)  # checked; text_config over the top level
    except ValueError:  # InvalidFile: eval refused it already, naming the key
        return []
    if str(text.get("model_type", "")).startswith("qwen3_5") and not text.get("mtp_num_hidden_layers"):
        return ["--no-mtp"]
    return []


# ----------------------------------------------------------------------------- server


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def group_members(pgid: int) -> list[int]:
    """Pids of the live processes (zombies left out) of process group ``pgid``, from /proc;
    where there is no /proc, ``[pgid]`` while the group has any member, else ``[]``."""
    proc = Path("/proc")
    if not (proc / "self/stat").exists():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    out = []
    for pid, stat in _proc_read("stat"):
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            out.append(pid)
    return out


def _proc_read(name: str) -> list[tuple[int, str]]:
    """``(pid, text)`` of /proc/PID/NAME for every process readable now (``exe``: the link's target)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out.append((int(d.name), os.readlink(d / name) if name == "exe" else (d / name).read_text()))
            except OSError:
                continue
    return out


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def shown(data: bytes | str, limit: int = SHOWN_CHARS) -> str:
    """What a server sent, as an error message quotes it: the start of it (``repr``: bytes that
    are not UTF-8 and control characters show as escapes), and how long it was when cut."""
    text = data.decode("utf-8", "backslashreplace") if isinstance(data, bytes) else data
    if len(text) <= limit:
        return repr(text)
    unit = "bytes" if isinstance(data, bytes) else "characters"
    return f"{text[:limit]!r}... ({len(data)} {unit} in all)"


class Garbage(ValueError):
    """An answer that is not what llama-server sends: ``what`` says how."""


def _number(value: Any, integer: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if integer:
        return isinstance(value, int) and value >= 0
    return math.isfinite(value)


TIMING_FIELDS = {"prompt_ms": False, "predicted_ms": False, "predicted_n": True, "draft_n": True,
                 "draft_n_accepted": True}
"""The ``timings`` fields the eval reads, and whether each is a count (else a finite number)."""


def read_completion(data: bytes) -> dict[str, Any]:
    """A ``/completion`` answer, checked: a JSON object whose ``tokens`` are token ids, whose
    ``timings`` hold numbers where the eval reads them and whose ``stop_type`` is text.

    Raises:
        Garbage: anything else (non-UTF-8 bytes, an HTML page, text where a number belongs),
            naming the field.
    """
    try:
        resp = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise Garbage("an answer that is not UTF-8 text") from None
    except ValueError:
        raise Garbage("an answer that is not JSON") from None
    if not isinstance(resp, dict):
        raise Garbage(f"JSON that is not an object (a {type(resp).__name__})")
    tokens = resp.get("tokens")
    if not isinstance(tokens, list) or not all(_number(t, True) for t in tokens):
        raise Garbage("no 'tokens' list of token ids" if tokens is None else
                      f"'tokens' that are not token ids ({shown(str(tokens), 80)})")
    timings = resp.get("timings", {})
    if not isinstance(timings, dict):
        raise Garbage(f"'timings' that is not an object ({shown(str(timings), 80)})")
    for key, integer in TIMING_FIELDS.items():
        if key in timings and not _number(timings[key], integer):
            kind = "a count" if integer else "a finite number"
            raise Garbage(f"'timings.{key}' that is not {kind} ({shown(str(timings[key]), 80)})")
    if not isinstance(resp.get("stop_type"), (str, type(None))):
        raise Garbage(f"'stop_type' that is not text ({shown(str(resp['stop_type']), 80)})")
    return resp


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_metrics(text: str) -> dict[str, float]:
    """The speculative-decoding counters (:data:`METRICS`) of a ``/metrics`` answer.

    Raises:
        Garbage: a counter whose value is not a finite number >= 0, or one missing (llama-server
            started with ``--metrics`` always exposes the three).
    """
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        key = name.removeprefix("llamacpp:")
        if key in METRICS:
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if not math.isfinite(number) or number < 0:
                raise Garbage(f"counter {name} = {shown(value, 80)}, not a number of tokens or drafts")
            out[key] = number
    missing = [k for k in METRICS if k not in out]
    if missing:
        raise Garbage(f"no {', '.join(missing)} counter{'s' if len(missing) > 1 else ''}")
    return out


@dataclass(frozen=True)
class Reply:
    """One request's answer: the engine's tokens and figures, and the trace rounds of it."""

    tokens: list[int]
    accepted: list[int]
    drafted: list[int]
    timings: dict[str, Any]
    metrics_delta: dict[str, float]
    stop_type: str | None


class LlamaServer:
    """A ``llama-server`` for one eval: started by ``with``, ended when the block exits.

    The binary may be a wrapper (a script that execs or spawns llama-server): it is started in a
    session of its own and ended with its whole process group, so nothing it started outlives
    the eval. ``start_timeout``: seconds to wait for ``/health`` (a line says so every
    ``progress_every`` seconds meanwhile); ``stop_grace``: seconds between SIGINT and SIGKILL.
    ``drafter`` None: the target alone, plain decoding (extract's continuations, the bench).
    """

    def __init__(self, binary: Path, target: Path, drafter: Path | None, n_max: int, threads: int, context: int,
                 workdir: Path, start_timeout: float = START_TIMEOUT_S, progress_every: float = WAIT_PROGRESS_S,
                 stop_grace: float = STOP_GRACE_S) -> None:
        self.binary, self.target, self.drafter = binary, target, drafter
        self.n_max, self.threads, self.context = n_max, threads, context
        self.start_timeout, self.progress_every, self.stop_grace = start_timeout, progress_every, stop_grace
        self.log_path = workdir / "llama-server.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy

    def command(self) -> list[str]:
        spec = [] if self.drafter is None else ["-md", str(self.drafter), "--spec-type", "draft-dflash",
                                                "--spec-draft-n-max", str(self.n_max)]
        return [str(self.binary), "-m", str(self.target), *spec, "-np", "1", "-c", str(self.context),
                "-t", str(self.threads), "--host", "127.0.0.1", "--port", str(self.port), "--no-warmup", "--metrics",
                "-lv", "4"]

    def __enter__(self) -> LlamaServer:
        try:
            for _ in range(3):  # another process may take the free port before the server binds it
                self.port = _free_port()
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                start = self.log_path.stat().st_size if self.log_path.exists() else 0
                with open(self.log_path, "ab") as log:
                    self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, env={**os.environ, "LLAMA_TRACE": "1"},
                                                 start_new_session=True, preexec_fn=_die_with_parent)
                if self._wait_healthy(start):
                    return self
                self.stop()  # what a wrapper started goes with it
        except BaseException:  # Ctrl-C or a timeout while starting: the server must not outlive it
            self.stop()
            raise
        raise TaskError(f"llama-server could not bind a loopback port in 3 tries; see {self.log_path}")

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """End the server and everything it started: SIGINT to its process group (llama-server's
        clean shutdown), SIGKILL to what is left of the group after ``stop_grace`` seconds; the
        process started is always reaped. A wrapper that ended before its children still has
        them ended."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the process started leads its own group
        if proc.poll() is None or group_members(pgid):
            _signal_group(pgid, signal.SIGINT)
            deadline = time.monotonic() + self.stop_grace
            while (proc.poll() is None or group_members(pgid)) and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is None or group_members(pgid):
                _signal_group(pgid, signal.SIGKILL)
                deadline = time.monotonic() + KILL_WAIT_S  # a SIGKILL is delivered, not awaited: see it done
                while (proc.poll() is None or group_members(pgid)) and time.monotonic() < deadline:
                    time.sleep(0.02)
        proc.wait()

    def _log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", errors="replace")

    def _log_tail(self, offset: int, lines: int = 15) -> str:
        return "\n".join(self._log_since(offset).splitlines()[-lines:]) or "(empty)"

    def _wait_healthy(self, offset: int) -> bool:
        """Poll ``/health`` until the model is loaded: True; False when the port was taken
        (the server ended, saying so); TaskError when it ended otherwise or never got ready.
        Every ``progress_every`` seconds a line says it is still waiting, and on what."""
        t0 = time.monotonic()
        deadline, said = t0 + self.start_timeout, 0
        where = f"127.0.0.1:{self.port}"
        state = "its port was never open"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = self._log_since(offset)
                if "couldn't bind HTTP server socket" in text:
                    return False
                raise TaskError(f"llama-server exited with status {self.proc.returncode} while starting "
                                f"({self.log_path}):\n{self._log_tail(offset)}")
            try:
                with self._http.open(f"http://{where}/health", timeout=5) as r:
                    if r.status == 200:
                        return True
            except urllib.error.HTTPError as exc:  # 503 while the model loads
                state = f"its port is open, GET /health answered {exc.code} (still loading the model?)"
            except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException):
                pass
            waited = time.monotonic() - t0
            if waited >= (said + 1) * self.progress_every:
                said = int(waited // self.progress_every)
                say(f"waiting for llama-server on {where} ({waited:.0f}s)")
            time.sleep(0.1)
        raise TaskError(f"llama-server did not get ready on {where} in {self.start_timeout:g} s: {state}; it was "
                        f"ended. Its log ({self.log_path}) ends:\n{self._log_tail(offset)}\nA large model takes "
                        "longer to load: raise --engine-start-timeout; else check that --engine-bin starts "
                        "llama-server with the arguments it is given")

    def _garbage(self, endpoint: str, what: str, data: bytes | str) -> TaskError:
        return TaskError(f"{ENGINE} (llama-server on 127.0.0.1:{self.port}) {endpoint}: {what}: {shown(data)}; "
                         f"is --engine-bin {self.binary} llama.cpp's llama-server (scripts/build-llama-server)? "
                         f"Its log: {self.log_path}")

    def _open(self, endpoint: str, req: urllib.request.Request | str) -> bytes:
        """The body of one request to the server; TaskError naming the endpoint when it answers an
        error status, cannot be reached (it ended? its log says why) or does not answer in time."""
        try:
            with self._http.open(req, timeout=REQUEST_TIMEOUT_S) as r:
                return r.read()
        except urllib.error.HTTPError as exc:
            raise self._garbage(endpoint, f"HTTP {exc.code}", exc.read()) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise TaskError(f"{ENGINE} (llama-server on 127.0.0.1:{self.port}) {endpoint}: no answer ({reason}); "
                            f"its log ({self.log_path}) ends:\n{self._log_tail(0)}") from None

    def metrics(self) -> dict[str, float]:
        """The cumulative speculative-decoding counters of ``/metrics``.

        Raises:
            TaskError: the answer is not UTF-8 text or not the counters (names the endpoint and
                shows what came back).
        """
        data = self._open("GET /metrics", f"http://127.0.0.1:{self.port}/metrics")
        try:
            return read_metrics(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise self._garbage("GET /metrics", "an answer that is not UTF-8 text", data) from None
        except Garbage as exc:
            raise self._garbage("GET /metrics", str(exc), data) from None

    def eog_ids(self) -> list[int]:
        """The token ids the engine ends generation at, as the target's vocabulary loader printed
        them (``-lv 4``; before the draft model's own vocabulary is loaded)."""
        text = self._log_since(0).split(DRAFT_LOAD, 1)[0]
        return sorted({int(m.group(1)) for m in EOG.finditer(text)})

    def completion(self, pid: str, ids: list[int], n_predict: int, cache_prompt: bool = False,
                   **extra: Any) -> dict[str, Any]:
        """One greedy ``/completion`` of token ids, checked (:func:`read_completion`); ``extra``
        goes into the request as is (the bench's ``ignore_eos``).

        Raises:
            TaskError: an error status, or an answer that is not llama-server's (names the
                prompt, the endpoint and what came back).
        """
        body = {"prompt": ids, "n_predict": n_predict, "temperature": 0, "top_k": 1, "samplers": ["top_k"],
                "cache_prompt": cache_prompt, "return_tokens": True, **extra}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=strictjson.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        endpoint = f"prompt {pid}: POST /completion"
        data = self._open(endpoint, req)
        try:
            return read_completion(data)
        except Garbage as exc:
            raise self._garbage(endpoint, str(exc), data) from None

    def complete(self, pid: str, ids: list[int], n_predict: int) -> Reply:
        """One greedy ``/completion`` of token ids, with its trace rounds and counter deltas.

        Raises:
            TaskError: an error status, or an answer that is not llama-server's (names the
                prompt, the endpoint and what came back).
        """
        before = self.metrics()
        offset = self.log_path.stat().st_size
        resp = self.completion(pid, ids, n_predict)
        delta = {k: v - before.get(k, 0.0) for k, v in self.metrics().items()}
        # The log is written by the server's own logging thread: wait until it holds every round.
        rounds = int(delta.get("spec_decode_num_drafts_total", 0))
        deadline = time.monotonic() + LOG_TIMEOUT_S
        while True:
            lines = _trace(self.log_path, offset)
            if len(lines) >= rounds or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return Reply(list(resp["tokens"]), [a for a, _ in lines], [b for _, b in lines], resp.get("timings", {}),
                     delta, resp.get("stop_type"))


def _trace(log: Path, offset: int) -> list[tuple[int, int]]:
    """``(accepted, drafted)`` per round from the complete trace lines after ``offset``. A
    checkpointed target (Qwen3.5) logs a partial acceptance as ``(restore checkpoint)`` and
    then replays the accepted part; the round is the first line, the replay's line is skipped."""
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", errors="replace")
    out, replay = [], False
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n") or not (m := TRACE.search(line)):
            continue
        if replay:
            replay = False
            continue
        out.append((int(m.group(1)), int(m.group(2))))
        replay = bool(m.group(3))
    return out


def check_reply(pid: str, r: Reply) -> None:
    """The trace, the response's timings and the ``/metrics`` deltas must tell one story.

    Raises:
        TaskError: they disagree (names the prompt and the figures).
    """
    figures = {
        "rounds": (len(r.accepted), r.metrics_delta.get("spec_decode_num_drafts_total")),
        "draft tokens": (sum(r.drafted), r.timings.get("draft_n"), r.metrics_delta.get("spec_decode_num_draft_tokens_total")),
        "accepted": (sum(r.accepted), r.timings.get("draft_n_accepted"),
                     r.metrics_delta.get("spec_decode_num_accepted_tokens_total")),
    }
    bad = {k: v for k, v in figures.items() if len({int(x) for x in v if x is not None}) != 1 or None in v[:1]}
    if bad:
        text = "; ".join(f"{k}: trace/timings/metrics = {'/'.join(str(x) for x in v)}" for k, v in bad.items())
        raise TaskError(f"prompt {pid}: llama-server's acceptance figures disagree ({text})")


def committed_rounds(tokens: list[int], engine_rounds: list[int], max_new: int,
                     stops: Sequence[int]) -> tuple[list[int], list[int], bool]:
    """The engine's answer counted as :func:`core.ml.decoding.generate.chain_generate` counts its own: the
    first token comes from the prefill, each round commits its ``a + 1`` tokens up to
    ``max_new_tokens`` and up to (and with) the first stop token (the engine stops accepting at an
    EOG token inside its draft; one that ends the draft is accepted and followed by a bonus the
    engine does not output). Returns ``(tokens,
    rounds, stopped)``; tokens past the engine's drafts (its last token, decoded alone when one
    is left) count a round of 1 each, as specdeck's target forward with no draft does."""
    if not tokens:
        return [], [], False
    stop = set(stops)
    out, rounds, start = tokens[:1], [], 1
    stopped = tokens[0] in stop
    queue = list(engine_rounds)
    while len(out) < max_new and not stopped and start < len(tokens):
        width = queue.pop(0) if queue else 1
        produced, stopped = taulib.committed(tokens[start:start + width], max_new - len(out), stop)
        out += tokens[start:start + produced]
        rounds.append(produced)
        start += width
    return out, rounds, stopped


# ----------------------------------------------------------------------------- the eval


def run_engine(args: Any, prompts: list[Any], tokenizer: Any, stops: list[int], block_size: int, dtype: str,
               workdir: Path, binary: Path) -> dict[str, Any]:
    """Every prompt through a llama-server of ``binary``; returns eval's figures and ``engine``."""
    from core.ml.measure.prompts import encode

    info = binary_info(binary)
    tree = converter_tree(binary)
    workdir.mkdir(parents=True, exist_ok=True)
    outtype = GGUF_TYPES[dtype]
    target_gguf, target_rec = gguf_of(args.engine_target, args.target, "target", outtype, workdir, tree, args.target)
    drafter_gguf, drafter_rec = gguf_of(args.engine_drafter, args.drafter, "drafter", outtype, workdir, tree,
                                        args.target)
    vocab = args.vocab_size
    rows = []
    progress = Progress("eval", len(prompts), "prompts", label=getattr(args, "label", None))
    server = LlamaServer(binary, target_gguf, drafter_gguf, block_size - 1, args.engine_threads,
                         args.engine_context, workdir, start_timeout=args.engine_start_timeout)
    say(f"starting llama-server ({info['version']}) on 127.0.0.1, log {server.log_path}")
    with server:
        eog, pid = server.eog_ids(), server.proc.pid
        for p in prompts:
            ids = encode(p, tokenizer, vocab, not args.no_chat_template, args.enable_thinking)
            need = len(ids) + args.max_new_tokens + block_size
            if need > args.engine_context:
                raise UsageError(f"prompt {p.id}: {len(ids)} prompt tokens + {args.max_new_tokens} + B={block_size} "
                                 f"do not fit --engine-context {args.engine_context}; raise it")
            t0 = time.perf_counter()
            reply = server.complete(p.id, ids, args.max_new_tokens)
            check_reply(p.id, reply)
            tokens, rounds, stopped = committed_rounds(reply.tokens, [a + 1 for a in reply.accepted],
                                                       args.max_new_tokens, stops)
            p.answer = tokens
            tm = reply.timings
            rows.append({"id": p.id, "sample": 0, "seed": None, "tau": taulib.mean_tau(rounds), "rounds": rounds,
                         "tokens": tokens, "prompt_len": len(ids), "stopped": stopped,
                         "prefill_s": (tm.get("prompt_ms") or 0.0) / 1e3, "decode_s": (tm.get("predicted_ms") or 0.0) / 1e3,
                         "wall_s": time.perf_counter() - t0,
                         "engine": {"rounds": [a + 1 for a in reply.accepted], "drafted": reply.drafted,
                                    "tokens": reply.tokens, "draft_n": tm.get("draft_n"),
                                    "draft_n_accepted": tm.get("draft_n_accepted"),
                                    "predicted_n": tm.get("predicted_n"), "stop_type": reply.stop_type,
                                    "metrics_delta": reply.metrics_delta, "n_predict": args.max_new_tokens}})
            progress.step(tokens=len(tokens), id=p.id, tau=rows[-1]["tau"])
    eos = {"specdeck": sorted(stops), "engine": eog, "equal": sorted(stops) == eog}
    if not eos["equal"]:
        say(f"warning: EOS sets differ: specdeck stops at {eos['specdeck']}, llama.cpp at {eog}; a generation "
            "that reaches an id in only one of them ends differently")
    engine = {**info, "target": target_rec, "drafter": drafter_rec, "eos": eos, "threads": args.engine_threads,
              "context": args.engine_context, "pid": pid, "spec_draft_n_max": block_size - 1, "log": str(server.log_path.resolve()),
              "command": server.command(), "converter": str(tree) if tree else None}
    return {"per_prompt": rows, "engine": engine}


def server_processes(binary: Path) -> list[int]:
    """Pids of running processes of ``binary`` (tests: no server outlives its eval)."""
    exe = str(binary.resolve())
    return [pid for pid, target in _proc_read("exe") if target == exe]

