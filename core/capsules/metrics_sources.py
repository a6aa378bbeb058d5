"""Where a run's training curves come from, besides JSON lines: the ``metrics`` param.

A train or shell item may declare::

    params:
      command: python my_trainer.py
      metrics:
        regex:                       # any number; each needs a (?P<step>...) group
          - 'step (?P<step>\\d+) loss (?P<loss>[\\d.]+)'
          - 'eval @ (?P<step>\\d+): acc=(?P<eval_acc>[\\d.]+)'
        hf_dicts: true               # HF Trainer lines: {'loss': 2.3, 'epoch': 0.1}
        tensorboard: runs/exp1       # event files under this dir (host workdir relative)

Log-line sources (JSON with ``step``, or a progress record counted in steps, at its
``done``: :func:`record_step`; the regexes, HF dict lines) are parsed as the log
follower stores each line, so they are stored exactly once because the log is. An HF dict
line without ``global_step`` (or ``step``) is numbered by its ordinal among such lines in the
run's log; that count is re-derived from the stored log whenever a follower starts, so a
restart numbers the next line as the dead follower would have. A tqdm bar's carriage-return
refreshes are parsed segment by segment (a dict after a ``\\r`` still counts).

TensorBoard event files (TFRecord framing around ``Event`` protobufs, decoded by
``protobuf`` with the needed part of TensorBoard's schema declared here: no torch,
TensorFlow or tensorboard needed on the console machine) are read from the host incrementally: each file's byte offset is kept in
the store and advanced in the same transaction as the metrics parsed from it, so a kill -9
at any point neither loses nor repeats a point. Files already in the directory when the run
is launched belong to earlier runs and are skipped. The tag is the metric name, unless
``names`` maps it (a SpecForge or speculators train item maps their tags: core.actions.trainers).

What runs write is untrusted: parsing never raises on a number (a 400-digit step, NaN,
``1e400``): numbers are handed on as found and the store keeps only those it can hold
(:mod:`core.state.points`), saying once per run and source what it dropped. A metrics regex runs
with a time bound per line (:data:`REGEX_TIMEOUT_S`); event-file framing faults are told
once per file with what was kept (:class:`TensorBoardSource`).
"""

from __future__ import annotations

import ast
import math
import re
import shlex
import struct
import time
from dataclasses import dataclass, field

from core.text import MAX_JSON_DEPTH, json_line

TB_GLOB = "events.out.tfevents*"
TB_READ = 16 << 20
"""Largest piece of one event file read per poll."""
CRC_MAX = 256 << 10
"""Records up to this size have their data checksum verified. Scalar events are ~100
bytes; bigger records are images, histograms or graphs, whose checksum would cost ~0.4 s/MB
in pure Python: for those the header checksum (framing) and the protobuf decode guard the
read."""


@dataclass(frozen=True)
class MetricsParams:
    regex: list[str] | str = field(default_factory=tuple, metadata={
        "doc": "regexes with named groups, (?P<step>...) among them; each other group is a metric"})
    hf_dicts: bool = field(default=False, metadata={
        "doc": "HF Trainer dict lines ({'loss': 2.3, 'epoch': 0.1}); step: global_step or line count"})
    tensorboard: str | None = field(default=None, metadata={
        "doc": "dir of TensorBoard event files (host workdir relative); read incrementally"})
    names: dict[str, str] = field(default_factory=dict, metadata={
        "doc": "TensorBoard tag -> metric name (train/loss: loss); other tags keep their name"})

    @property
    def regexes(self) -> tuple[str, ...]:
        return (self.regex,) if isinstance(self.regex, str) else tuple(self.regex)

    def validate(self):
        out = []
        for i, rx in enumerate(self.regexes):
            where = ("regex",) if isinstance(self.regex, str) else ("regex", i)
            out += [(where, m) for m in regex_problems(rx)]
        if self.tensorboard is not None and not self.tensorboard.strip():
            out.append((("tensorboard",), "an empty path; name the event files' dir"))
        return out


def regex_problems(rx: str) -> list[str]:
    try:
        groups = re.compile(rx).groupindex
        compile_regex(rx)  # the matcher used (the same syntax; checked all the same)
    except Exception as e:  # noqa: BLE001 - re.error, regex.error, RecursionError...
        return [f"not a regex: {e}"]
    if "step" not in groups:
        return ["needs a named group (?P<step>...)"]
    if len(groups) < 2:
        return ["needs a named group per metric besides (?P<step>...)"]
    return []


def regex_warnings(rx: str) -> list[str]:
    """Shapes of ``rx`` that can backtrack catastrophically: a repeat inside a repeat, as in
    ``(a+)+$`` or ``(\\d*)*``. Matching is bounded in time per line anyway
    (:data:`REGEX_TIMEOUT_S`); a line it gives up on gives no points."""
    try:
        tree = _sre_parse(rx)
    except Exception:  # noqa: BLE001 - regex_problems reports a bad regex
        return []
    found: list[str] = []
    _nested_repeats(tree, False, found)
    return [f"nested quantifiers ({', '.join(found)}) can backtrack catastrophically on a long "
            f"line; a line on which the regex runs over {REGEX_TIMEOUT_S * 1000:.0f} ms gives "
            "no points (make the inner part match one way only, e.g. (a+)+ -> a+)"] if found else []


def params_regex_warnings(params) -> list[str]:
    """``regex: warning`` lines for the metrics regexes an action's params declare
    (``metrics: {regex: ...}``, a train item's ``metrics_regex``): what ``validate`` says."""
    spec = getattr(params, "metrics", None)
    regexes = list(spec.regexes) if isinstance(spec, MetricsParams) else []
    legacy = getattr(params, "metrics_regex", None)
    regexes += [legacy] if isinstance(legacy, str) and legacy else []
    return [f"metrics regex {rx!r}: {w}" for rx in regexes for w in regex_warnings(rx)]


def _sre_parse(rx: str):
    import re._parser as sre_parse  # the stdlib's own parser (3.11+)

    return sre_parse.parse(rx)


_REPEATS = {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}


def _nested_repeats(tree, inside: bool, found: list[str]) -> None:
    for op, av in tree:
        name = str(op)
        if name in _REPEATS:
            lo, hi, sub = av
            many = hi is None or hi > 1 or str(hi) == "MAXREPEAT"
            if inside and many and name != "POSSESSIVE_REPEAT":
                found.append("a repeated group holds a repeat")
                return
            _nested_repeats(sub, inside or (many and name != "POSSESSIVE_REPEAT"), found)
        elif name == "SUBPATTERN":
            _nested_repeats(av[-1], inside, found)
        elif name == "BRANCH":
            for alt in av[1]:
                _nested_repeats(alt, inside, found)
        elif name in ("ASSERT", "ASSERT_NOT"):
            _nested_repeats(av[1], inside, found)
        if found:
            return


REGEX_TIMEOUT_S = 0.05
"""Longest a metrics regex may run on one line; over it, the line gives no points."""
REGEX_PREFIX = 64 << 10
"""Characters of a line a metrics regex sees (a longer line is matched on its start)."""
REGEX_STRIKES = 3
"""Timeouts after which a regex is no longer applied to the run's later lines."""


def compile_regex(rx: str):
    """``rx`` compiled by the matcher that takes a timeout (``regex``, a backtracking matcher
    with a time bound, which ``re`` has not), else by ``re``; imported here, by the commands
    that compile a metrics regex, not by every command that reads a plan."""
    try:
        import regex
    except ImportError:  # pragma: no cover - a dependency; without it: re on a shorter prefix
        return re.compile(rx)
    return regex.compile(rx)


# -- lines -------------------------------------------------------------------------------
def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _step(v):
    """A JSON/HF step: an int as is (the store drops one out of range, saying so), an
    integral float as an int, a non-finite float as is (dropped the same way); None for
    anything else (not a step: a fractional float, text)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            return v
        return int(v) if v.is_integer() else None
    return None


class _Names(ast.NodeTransformer):
    """``nan`` and ``inf`` as Python prints them in a dict (``{'loss': nan}``)."""

    def visit_Name(self, node):
        if node.id in ("nan", "inf"):
            return ast.copy_location(ast.Constant(float(node.id)), node)
        return node


def _literal(text: str):
    tree = ast.parse(text, mode="eval")
    return ast.literal_eval(_Names().visit(tree).body)


def hf_dict(segment: bytes) -> dict | None:
    """A Trainer-style ``{'loss': 2.3, ...}`` (Python or JSON) with a numeric value, else None."""
    s = segment.strip()
    if not (s.startswith(b"{") and s.endswith(b"}")) or len(s) > 65536:
        return None
    text = s.decode("utf-8", "replace")
    obj = json_line(text)  # bounded depth: never a RecursionError
    if obj is None:
        if text.count("{") + text.count("[") > MAX_JSON_DEPTH:
            return None  # too deep for a metrics dict (and for ast's recursive parser)
        try:
            obj = _literal(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    if not isinstance(obj, dict) or not any(_is_number(v) for v in obj.values()):
        return None
    return obj


class LineMetrics:
    """Parses the metrics of a run's log lines: JSON with ``step``, regexes, HF dicts.

    Each regex sees at most :data:`REGEX_PREFIX` characters of a line for at most
    :data:`REGEX_TIMEOUT_S`; a line it times out on gives no points from it, and after
    :data:`REGEX_STRIKES` timeouts it is no longer applied. ``notices`` collects
    ``(source, message)`` pairs for the follower to journal (once per run and source).
    ``names`` maps a point's name (a trainer's log key) to the curves' name."""

    def __init__(self, regexes=(), hf_dicts: bool = False, names: dict[str, str] | None = None):
        self.names = dict(names or {})
        self.patterns = [compile_regex(r) for r in regexes]
        self.strikes = [0] * len(self.patterns)
        self.hf_dicts = hf_dicts
        self.hf_count = 0
        self.notices: list[tuple[str, str]] = []

    def prime(self, store, run_id: str, offset: int) -> None:
        """Re-derive the HF line count from the log stored before ``offset`` (a follower
        starting, or one whose piece another specdeck stored first)."""
        self.hf_count = 0
        if self.hf_dicts and offset:
            for line in store.log_bytes(run_id, 0)[:offset].splitlines():
                for seg in line.split(b"\r"):
                    if not _json_step(seg) and hf_dict(seg) is not None:
                        self.hf_count += 1

    def parse(self, line: bytes) -> list[tuple[int, str, float]]:
        got = self._parse(line)
        if self.names:
            got = [(st, self.names.get(name, name), *rest) for st, name, *rest in got]
        return got

    def _parse(self, line: bytes) -> list[tuple[int, str, float]]:
        if not self.patterns and not self.hf_dicts:
            return parse_metrics(line)  # JSON lines only, the common case: the line whole
        out: list[tuple[int, str, float]] = []
        for seg in line.split(b"\r"):
            if not seg.strip():
                continue
            got = parse_metrics(seg)  # JSON with a step
            if got or _json_step(seg):
                out += got
                continue
            if self.hf_dicts:
                obj = hf_dict(seg)
                if obj is not None:
                    self.hf_count += 1
                    out += self._hf(obj)
                    continue
            if self.patterns:
                text = seg[:REGEX_PREFIX * 4].decode("utf-8", "replace")[:REGEX_PREFIX]
                for i, pat in enumerate(self.patterns):
                    out += self._match(i, pat, text)
        return out

    def _match(self, i: int, pat, text: str) -> list[tuple]:
        if self.strikes[i] >= REGEX_STRIKES:
            return []
        if isinstance(pat, re.Pattern):  # compile_regex without the regex package
            return [p for m in pat.finditer(text[:4096]) for p in regex_metrics(m)]
        try:
            return [p for m in pat.finditer(text, timeout=REGEX_TIMEOUT_S)
                    for p in regex_metrics(m)]
        except TimeoutError:
            self.strikes[i] += 1
            if self.strikes[i] == 1:
                self.notices.append((f"regex {i + 1}", (
                    f"metrics regex {i + 1} ({pat.pattern[:80]!r}) ran over "
                    f"{REGEX_TIMEOUT_S * 1000:.0f} ms on a line ({text[:60]!r}...) and gave up: "
                    f"that line gives no points from it; after {REGEX_STRIKES} such lines it is "
                    "no longer applied to this run (nested quantifiers? see "
                    "`specdeck validate`)")))
            if self.strikes[i] == REGEX_STRIKES:
                self.notices.append((f"regex {i + 1} off", (
                    f"metrics regex {i + 1} timed out on {REGEX_STRIKES} lines: no longer "
                    "applied to this run's lines (they are all kept)")))
            return []

    def _hf(self, obj: dict) -> list[tuple]:
        step = _step(obj.get("global_step", obj.get("step")))
        step = self.hf_count if step is None else step
        return [(step, str(k), v) for k, v in obj.items()
                if k not in ("global_step", "step") and _is_number(v)]


def _json_step(seg: bytes) -> bool:
    """Whether ``seg`` looks like a JSON record with a step (never an HF dict line)."""
    s = seg.strip()
    return s.startswith(b"{") and s.endswith(b"}") and (
        b'"step"' in s or (b'"steps"' in s and b'"progress"' in s))


def _may_have_step(s: bytes) -> bool:
    """Whether a JSON line may carry a step (a cheap look before parsing every line)."""
    return b'"step"' in s or b'"steps"' in s


STEP_PROGRESS = ("progress", ("steps", "step"))
"""A ``{"event": "progress", "unit": "steps"}`` record (``core.ml.formats.runio``'s, as
``core.ml.codemodel`` prints with its loss) is a training point at step ``done``."""
PROGRESS_POSITION = frozenset({"done", "total"})
"""A step progress record's fields that say where it is, not what it measures."""


def record_step(obj: dict) -> tuple[object, frozenset[str]] | None:
    """The step a JSON record's metrics are at and the fields that are not metrics: its
    ``step``, or a step progress record's ``done`` (:data:`STEP_PROGRESS`); None when it has
    neither (see :func:`_step` for what counts as a step)."""
    step = _step(obj.get("step"))
    if step is not None:
        return step, frozenset({"step"})
    event, units = STEP_PROGRESS
    if obj.get("event") == event and obj.get("unit") in units:
        step = _step(obj.get("done"))
        if step is not None:
            return step, PROGRESS_POSITION
    return None


def parse_metrics(line: bytes, regex: re.Pattern | None = None) -> list[tuple[int, str, float]]:
    """Metrics carried by one log line.

    A JSON object with an integer ``step`` gives one metric per numeric field (lists become
    ``name[i]``, nested objects ``name.sub``); so does a progress record counted in steps,
    at step ``done`` (:func:`record_step`: ``core.ml.codemodel``'s loss). With ``regex``
    (named groups, ``step`` among them), a text line such as ``step=10 loss=2.3`` gives its
    numeric groups.
    """
    s = line.strip()
    out: list[tuple[int, str, float]] = []
    if s.startswith(b"{") and _may_have_step(s):
        obj = json_line(s)
        if isinstance(obj, dict):
            at = record_step(obj)
            if at is not None:
                _flatten(at[0], obj, "", out, skip=at[1])
                return out
    if regex is not None:
        m = regex.search(s[:REGEX_PREFIX].decode("utf-8", "replace"))
        if m:
            out += regex_metrics(m)
    return out


def _flatten(step: int, obj, prefix: str, out: list, depth: int = 0,
             skip: frozenset[str] = frozenset({"step"})) -> None:
    """One point per numeric field of ``obj`` at ``step``; top-level fields in ``skip``
    (the step itself) are not metrics."""
    if depth > MAX_JSON_DEPTH or len(out) > 4096:
        return
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    for k, v in items:
        if prefix == "" and k in skip:
            continue
        name = f"{prefix}[{k}]" if isinstance(k, int) else (f"{prefix}.{k}" if prefix else str(k))
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out.append((step, name, v))  # the store drops a NaN or a 400-digit one, saying so
        elif isinstance(v, (dict, list)) and len(v) <= 256:
            _flatten(step, v, name, out, depth + 1)


def _text_number(s):
    """A regex group as a number: an int for digits (any length), else a float (``1e400``
    is inf); None for anything else."""
    if not isinstance(s, str):
        return None
    try:
        return int(s)
    except ValueError:  # not digits, or beyond int()'s digit limit
        pass
    try:
        return float(s)
    except ValueError:
        return None


def regex_metrics(m) -> list[tuple]:
    """The numeric named groups of a match, at its ``step`` group's step (a fractional
    step is cut to its integer; a huge or non-finite one is left for the store to drop)."""
    step = _text_number(m.group("step"))
    if step is None:
        return []
    if isinstance(step, float) and math.isfinite(step):
        step = int(step)
    out = []
    for k, v in m.groupdict().items():
        if k == "step" or v is None:
            continue
        x = _text_number(v)
        if x is not None:
            out.append((step, k, x))
    return out


def line_metrics(spec: MetricsParams | None, legacy_regex: str | None = None,
                 names: dict[str, str] | None = None) -> LineMetrics | None:
    """The parser for an action's log lines (None: JSON lines only, under their own names);
    ``names``: a trainer's log keys -> the curves' names."""
    regexes = list(spec.regexes if spec else ()) + ([legacy_regex] if legacy_regex else [])
    hf = bool(spec and spec.hf_dicts)
    if not regexes and not hf and not names:
        return None
    return LineMetrics(regexes, hf, names)


# -- TensorBoard event files -------------------------------------------------------------
class EventFileError(Exception):
    pass


def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord framing uses."""
    crc, table = 0xFFFFFFFF, _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@dataclass(frozen=True)
class Framing:
    """What the start of a piece of an event file holds (:func:`frame`)."""

    records: list[tuple[int, bytes]]
    """Whole, checked records: (the byte after it, relative to the piece; its data)."""
    need: int | None = None
    """The record after them, whose header is whole and checked, takes this many bytes in
    all (header, data, checksum) and the piece holds fewer: torn, or bigger than a read."""
    error: str | None = None
    """The record after them is corrupt (a header or data checksum): why."""

    @property
    def used(self) -> int:
        return self.records[-1][0] if self.records else 0


def frame(buf: bytes, where: str = "event file", base: int = 0) -> Framing:
    """The whole TFRecords at the start of ``buf`` (``base``: its offset in the file, for
    messages), and what stops them: a torn or oversized record, or a corrupt one. Never
    raises: the good records before a bad one are kept."""
    out, pos = [], 0
    while pos + 12 <= len(buf):
        head = buf[pos:pos + 8]
        (length,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", buf[pos + 8:pos + 12])
        if _masked_crc(head) != hcrc:
            return Framing(out, error=f"{where}: corrupt record header at byte {base + pos}")
        end = pos + 12 + length + 4
        if end > len(buf):
            return Framing(out, need=end - pos)
        data = buf[pos + 12:pos + 12 + length]
        (dcrc,) = struct.unpack("<I", buf[end - 4:end])
        if length <= CRC_MAX and _masked_crc(data) != dcrc:
            return Framing(out, error=f"{where}: corrupt record at byte {base + pos}")
        out.append((end, data))
        pos = end
    return Framing(out)


def read_records(buf: bytes, where: str = "event file") -> tuple[list[bytes], int]:
    """Whole TFRecords at the start of ``buf`` and the bytes they take (a torn tail waits);
    raises :class:`EventFileError` at a corrupt one."""
    f = frame(buf, where)
    if f.error:
        raise EventFileError(f.error)
    return [d for _, d in f.records], f.used


def scalars(record: bytes) -> list[tuple[int, str, float, float]]:
    """(step, tag, value, wall time) of the scalar summaries in one ``Event`` record."""
    from google.protobuf.message import DecodeError

    try:
        ev = _event_class().FromString(record)
    except DecodeError as e:
        raise EventFileError(f"a record is not an Event ({e})") from None
    out = []
    if not ev.HasField("summary"):
        return out
    for v in ev.summary.value:
        val = None
        if v.HasField("simple_value"):
            val = v.simple_value
        elif v.HasField("tensor"):
            val = _tensor_scalar(v.tensor)
        if val is not None:  # a NaN or inf is dropped by the store, which says so
            out.append((int(ev.step), v.tag, float(val), float(ev.wall_time)))
    return out


_EVENT_CLASS = None


def _event_class():
    """The ``Event`` message, declared from TensorBoard's event.proto / summary.proto /
    tensor.proto field numbers (only the fields read here; protobuf skips the others).
    Decoding is protobuf's; nothing imports torch, TensorFlow or tensorboard."""
    global _EVENT_CLASS
    if _EVENT_CLASS is not None:
        return _EVENT_CLASS
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="specdeck_tb_event.proto",
                                             package="specdeck_tb", syntax="proto3")

    def msg(name, *fields):
        m = fdp.message_type.add(name=name)
        for fname, num, typ, label, tname in fields:
            f = m.field.add(name=fname, number=num, type=typ, label=label)
            if tname:
                f.type_name = f".specdeck_tb.{tname}"

    one, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("Dim", ("size", 1, F.TYPE_INT64, one, None))
    msg("Shape", ("dim", 2, F.TYPE_MESSAGE, rep, "Dim"))
    msg("Tensor", ("dtype", 1, F.TYPE_INT32, one, None),
        ("tensor_shape", 2, F.TYPE_MESSAGE, one, "Shape"),
        ("tensor_content", 4, F.TYPE_BYTES, one, None),
        ("float_val", 5, F.TYPE_FLOAT, rep, None),
        ("double_val", 6, F.TYPE_DOUBLE, rep, None),
        ("int_val", 7, F.TYPE_INT32, rep, None),
        ("int64_val", 10, F.TYPE_INT64, rep, None))
    msg("Value", ("tag", 1, F.TYPE_STRING, one, None),
        ("simple_value", 2, F.TYPE_FLOAT, one, None),
        ("tensor", 8, F.TYPE_MESSAGE, one, "Tensor"))
    msg("Summary", ("value", 1, F.TYPE_MESSAGE, rep, "Value"))
    msg("Event", ("wall_time", 1, F.TYPE_DOUBLE, one, None),
        ("step", 2, F.TYPE_INT64, one, None),
        ("summary", 5, F.TYPE_MESSAGE, one, "Summary"))
    # simple_value is a oneof member in summary.proto: presence must be tracked
    fdp.message_type[3].field[1].proto3_optional = True
    fdp.message_type[3].oneof_decl.add(name="_simple_value")
    fdp.message_type[3].field[1].oneof_index = 0
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    _EVENT_CLASS = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("specdeck_tb.Event"))
    return _EVENT_CLASS


_TENSOR_FORMATS = {1: ("<f", "float_val"), 2: ("<d", "double_val"), 3: ("<i", "int_val"),
                   9: ("<q", "int64_val")}


def _tensor_scalar(t) -> float | None:
    fmt = _TENSOR_FORMATS.get(t.dtype)
    if fmt is None or any(d.size != 1 for d in t.tensor_shape.dim):
        return None
    if t.tensor_content:
        if len(t.tensor_content) != struct.calcsize(fmt[0]):
            return None
        return float(struct.unpack(fmt[0], t.tensor_content)[0])
    vals = getattr(t, fmt[1])
    return float(vals[0]) if len(vals) == 1 else None


class TensorBoardSource:
    """Reads one run's event files on its host, each byte once (offsets in the store).

    Problems are journaled once per file (:meth:`core.state.store.Store.metric_notice`) and told
    through ``errors``: a corrupt record (its file is read no further; every good record
    before it is kept), a record bigger than one read (:data:`TB_READ`; skipped: scalars are
    ~100 bytes, such records are images or graphs), and a record whose length runs past the
    end of its file once the run has ended (``final``) or the file has not grown for
    ``stale_s`` seconds (torn by a crash, or truncated)."""

    def __init__(self, host, store, run_id: str, directory: str, *, stale_s: float = 600.0,
                 names: dict[str, str] | None = None):
        self.host, self.store, self.run_id = host, store, run_id
        self.names = dict(names or {})
        """Tag -> the metric name it is stored under (the curves' ``loss``, ``accuracy``)."""
        self.dir = host.path(directory)
        self.stale_s = stale_s
        self.bad: set[str] = set()
        self.errors: list[str] = []
        self.grown: dict[str, tuple[int, float]] = {}
        """path -> (size, when it was first seen at that size)."""

    def key(self, path: str) -> str:
        return "tb:" + path

    def report(self, path: str, what: str, message: str) -> None:
        """Journal ``message`` once per file and kind of problem; tell it the first time."""
        if self.store.metric_notice(self.run_id, f"{self.key(path)} {what}", message):
            self.errors.append(message)

    async def files(self) -> list[tuple[str, int]]:
        res = await self.host.run(
            f"find {shlex.quote(self.dir)} -type f -name {shlex.quote(TB_GLOB)} "
            "-printf '%s %p\\n' 2>/dev/null | sort -k2", check=False)
        out = []
        for ln in res.stdout.splitlines():
            size, _, path = ln.partition(" ")
            if size.isdigit() and path:
                out.append((path, int(size)))
        return out

    async def baseline(self) -> None:
        """Files there before the run started are earlier runs': start at their end."""
        for path, size in await self.files():
            self.store.metric_source_init(self.run_id, self.key(path), size)

    async def poll(self, *, final: bool = False) -> int:
        """Store what the event files gained since the stored offsets; returns points stored.

        ``final``: the run has ended, so a record still torn at a file's end never will be
        whole: it is reported."""
        stored = 0
        now = time.monotonic()
        for path, size in await self.files():
            if path in self.bad:
                continue
            if self.grown.get(path, (None,))[0] != size:
                self.grown[path] = (size, now)
            idle = now - self.grown[path][1]
            stale = ("the run has ended" if final else
                     f"it has not grown for {idle:.0f} s" if idle >= self.stale_s else None)
            got = await self._read_file(path, size, stale)
            if got is None:
                break  # another specdeck stored this piece first: it reads on
            stored += got
        return stored

    async def _read_file(self, path: str, size: int, stale: str | None) -> int | None:
        """Read ``path`` from its stored offset to ``size``; None when another specdeck
        stored a piece first. ``stale``: why a torn end is final (None: it may grow)."""
        key, where = self.key(path), f"{self.host.name}:{path}"
        offset = self.store.metric_source_offset(self.run_id, key) or 0
        stored = 0
        while size > offset:
            buf = await self.host.read_from(path, offset, min(size - offset, TB_READ))
            f = frame(buf, where, offset)
            rows, used, error = [], 0, f.error
            for end, rec in f.records:
                try:
                    rows += [(st, self.names.get(tag, tag), *rest)
                             for st, tag, *rest in scalars(rec)]
                except EventFileError as e:
                    error = f"{where}: record at byte {offset + used}: {e}"
                    break
                used = end
            if used:
                if not self.store.add_source_metrics(self.run_id, key, offset, offset + used,
                                                     rows):
                    return None
                stored += len(rows)
                offset += used
            if error:
                self.bad.add(path)
                self.report(path, "corrupt", (
                    f"{where}: unreadable event file ({error.removeprefix(where + ': ')}); "
                    f"kept every record before byte {offset} (the {stored} point(s) read now "
                    "and all stored earlier); its later records are not read"))
                return stored
            if used:
                continue
            need = f.need or 12  # the record at ``offset`` is not whole in this read
            end = offset + need
            if need > TB_READ and end <= size:
                if not self.store.add_source_metrics(self.run_id, key, offset, end, []):
                    return None
                self.report(path, "big", (
                    f"{where}: skipped a record of {need:,} bytes at byte {offset} (more than "
                    f"one read, {TB_READ >> 20} MiB: an image, histogram or graph, no scalar); "
                    "later such records are skipped unreported"))
                offset = end
                continue
            if end > size and stale:
                claims = f"claims {f.need - 16:,} bytes" if f.need else "has no whole header"
                self.report(path, "torn", (
                    f"{where}: corrupt event file: the record at byte {offset} {claims} but "
                    f"the file ends at byte {size} and {stale}; every record before it is "
                    "kept"))
            break
        return stored


def tensorboard_source(spec: MetricsParams | None, host, store,
                       run_id: str) -> TensorBoardSource | None:
    """The reader of the TensorBoard files ``spec`` (an action's ``metrics:``) names."""
    if spec is None or not spec.tensorboard or host is None:
        return None
    return TensorBoardSource(host, store, run_id, spec.tensorboard, names=spec.names)



async def alongside(source: TensorBoardSource | None, work, *, every: float = 1.0,
                    on_error=None):
    """Await ``work`` while polling ``source``; poll once more after it (the final points)."""
    if source is None:
        return await work
    import asyncio  # here, not at the top: reading a plan needs none of it

    async def loop():
        while True:
            await _safe_poll(source, on_error)
            await asyncio.sleep(every)

    task = asyncio.create_task(loop())
    try:
        result = await work
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    await _safe_poll(source, on_error, final=True)
    return result


async def _safe_poll(source: TensorBoardSource, on_error, *, final: bool = False) -> None:
    from core.errors import HostUnreachable
    from core.faults import describe_fault

    try:
        await source.poll(final=final)
    except HostUnreachable:
        pass  # the log follower reports the outage; the next poll resumes at the offsets
    except Exception as e:  # noqa: BLE001 - a file gone between listing and reading, or any
        # fault no check foresaw: the run goes on, told once
        source.report(source.dir, "read", f"{source.host.name}:{source.dir}: event files not "
                      f"read: {describe_fault(e)} (the next poll tries again)")
    while source.errors:
        msg = source.errors.pop(0)
        if on_error:
            on_error(msg)
