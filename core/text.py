"""Making untrusted text safe for a terminal, untrusted JSON lines safe to parse, and
untrusted local files (plans, todo lists) read within their bounds.

One sanitizer for every output boundary (CLI stderr/stdout, the console's panes): remote log
lines, progress messages, file names, item text from an imported todo list, error messages
that quote any of those. It drops escape sequences (CSI, OSC, DCS/PM/APC strings, 8-bit CSI)
and replaces C0 and C1 control characters (U+0000-U+001F except tab and newline, U+007F,
U+0080-U+009F) with U+FFFD, so nothing written by a host or a file can move the cursor,
retitle the terminal or hide text.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any, Iterable

_ESC = re.compile(
    r"\x1b(\[[0-?]*[ -/]*[@-~]?"            # CSI ... final
    r"|[\]PX^_][^\x07\x1b\x9c]*(\x07|\x1b\\|\x9c)?"  # OSC / DCS / SOS / PM / APC strings
    r"|[ -/]*[0-~]?)"                       # nF / Fp / Fe / Fs escapes (or a lone ESC)
    r"|\x9b[0-?]*[ -/]*[@-~]?"              # 8-bit CSI
    r"|[\x90\x9d\x98\x9e\x9f][^\x07\x1b\x9c]*(\x07|\x1b\\|\x9c)?")  # 8-bit string controls
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CTRL_NL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def human(n: float) -> str:
    """A byte count for a person, in decimal units: ``0 B``, ``262.1 KB``, ``1.2 GB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def sanitize(line: str, *, max_len: int = 4000, newlines: bool = True) -> str:
    """Drop escape sequences and control characters (C0 and C1); cut very long lines.

    Tabs and newlines are kept (``newlines=False`` replaces newlines too, for one-line
    fields).
    """
    if not isinstance(line, str):
        line = str(line)
    s = (_CTRL if newlines else _CTRL_NL).sub("\ufffd", _ESC.sub("", line))
    if len(s) > max_len:
        s = s[:max_len] + f"… [{len(s) - max_len} more chars]"
    return s


MAX_JSON_LINE = 64 << 10
"""Longest log line parsed as JSON (metrics, progress, checkpoints); longer ones are text."""
MAX_JSON_DEPTH = 32
"""Deepest nesting looked into; a deeper line is kept as text."""


def too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``text`` nests brackets deeper than ``limit``: checked before the recursive JSON
    decoder sees untrusted text (brackets inside strings count too, which only makes the bound
    stricter), so parsing it never hits a RecursionError."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def json_line(line: bytes | str) -> Any:
    """A log line's JSON object, or None when it is not one, too long or too deep.

    Log lines are written by programs on hosts: they are stored whatever they hold, and
    parsing one never raises (no RecursionError from a deeply nested line).
    """
    s = line.strip()
    if not s or len(s) > MAX_JSON_LINE or s[:1] not in (b"{", "{"):
        return None
    if isinstance(s, bytes):
        s = s.decode("utf-8", "replace")
    if too_deep(s):
        return None
    try:
        return json.loads(s)
    except (ValueError, RecursionError):
        return None


def closest(word: str, choices: Iterable[str]) -> list[str]:
    """The ``choices`` closest to a mistyped ``word`` (``difflib``'s ratio, 0.6 at least):
    the best one, or those tied for best in the order given (``train-v6``: ``train-v4``,
    ``train-v5``); none when nothing is close."""
    import difflib

    choices = list(dict.fromkeys(choices))
    near = difflib.get_close_matches(word, choices, n=len(choices) or 1, cutoff=0.6)
    if not near:
        return []
    score = [difflib.SequenceMatcher(None, word, c).ratio() for c in near]
    best = {c for c, r in zip(near, score) if r == score[0]}
    return [c for c in choices if c in best]  # (a tie in the order given: a plan's order)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``; did you mean 'train-v5'?`` for a mistyped ``word`` when :func:`closest` finds
    one (``'a' or 'b'`` for a tie), else ""."""
    near = closest(word, choices)
    return f"; did you mean {' or '.join(repr(c) for c in near)}?" if near else ""


def collapse_cr(line: str) -> str:
    """What a terminal shows of a line redrawn with carriage returns (a tqdm bar's
    refreshes): the last non-empty redraw."""
    if "\r" not in line:
        return line
    parts = [p for p in line.split("\r") if p.strip()]
    return parts[-1] if parts else ""


def short(value: object, n: int = 70) -> str:
    """``repr(value)`` for a message, cut at ``n`` characters (saying how long it was)."""
    r = repr(value)
    return r if len(r) <= n else r[:n] + f"… ({len(r)} chars)"


def read_bounded(path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, refused (InvalidInput naming it, exit 2) before
    anything is read when it is a device, a FIFO, a socket or larger than ``limit`` bytes.

    Opened without blocking (a FIFO with no writer would wait forever) and checked on the
    open descriptor, so what is checked is what is read; at most ``limit + 1`` bytes are read
    (a file that grew meanwhile is refused too)."""
    from core.errors import InvalidInput

    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InvalidInput(f"{p}: no such {what}") from None
    except OSError as e:
        raise InvalidInput(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InvalidInput(f"{p}: is a directory, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(
                st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(
                st.st_mode) else "not a regular file")
            raise InvalidInput(f"{p}: is {kind}, not a {what} (a regular file); not read")
        if st.st_size > limit:
            raise InvalidInput(f"{p}: is {st.st_size:,} bytes; a {what} is at most "
                               f"{limit:,}; not read")
        chunks, left = [], limit + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
    except OSError as e:
        raise InvalidInput(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise InvalidInput(f"{p}: grew past {limit:,} bytes while read; a {what} is at most "
                           f"{limit:,}")
    return data


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` through libyaml's C loader where it is installed: the same values
    and errors (``yaml.YAMLError``), about 10x faster (three trainer configs read by
    ``validate`` and ``status``: 0.13 s -> 0.01 s); the pure-Python loader otherwise."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))



MAX_JSON_FILE = 16 << 20
"""Largest JSON file (a config.json, a safetensors index) read: a 27B target's config is a
few KB, its ``model.safetensors.index.json`` about 100 KB."""
INT64_MAX = 2**63 - 1


class _NonFinite:
    """What the decoder hands back for ``NaN``, ``Infinity`` or a literal too large for a
    float (``1e400``): found by :func:`json_value_problem`, never let through."""

    def __init__(self, text: str):
        self.text = text


def _finite_float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if value - value == 0 else _NonFinite(text)


def show_value(value: Any, n: int = 40) -> str:
    """A config value as a message quotes it: a huge integer as ``1e+30`` (or its size in
    bits), a float by ``repr``, a string, list or object cut at ``n`` characters."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        try:
            return f"{value:g}"
        except OverflowError:
            return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (dict, list)) and json_value_problem(value, depth=8, ints=False):
        return "a list" if isinstance(value, list) else "an object"  # too deep to quote (repr recurses)
    return short(value, n)


def json_value_problem(value: Any, *, depth: int = MAX_JSON_DEPTH,
                       ints: bool = True) -> tuple[str, str] | None:
    """The first value of a parsed JSON document (or a dict from elsewhere: a checkpoint's
    embedded config) that no reader may take, as ``(key path, problem)``; None when there is
    none. Refused: NaN or an infinity (JSON has neither; Python's decoder takes them), nesting
    deeper than ``depth``, and with ``ints`` an integer no 64-bit integer holds (what an
    engine or a tensor shape would overflow on). The key path reads ``a.b[2]`` ("" for the
    document itself). Walked without recursion, so any depth is safe to look at."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        v, path, level = stack.pop()
        if isinstance(v, (dict, list)):
            if level >= depth:
                return path, f"nested more than {depth} levels deep"
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in reversed(list(items)):
                sub = f"{path}[{k}]" if isinstance(v, list) else (f"{path}.{k}" if path else str(k))
                stack.append((x, sub, level + 1))
        elif isinstance(v, _NonFinite):
            return path, f"{v.text} is not a finite number (JSON has no NaN or Infinity)"
        elif isinstance(v, float) and v - v != 0:
            return path, f"{v!r} is not a finite number"
        elif ints and isinstance(v, int) and not isinstance(v, bool) and not -INT64_MAX - 1 <= v <= INT64_MAX:
            return path, f"{show_value(v)} does not fit a 64-bit integer"
    return None


def read_json_file(path, what: str, *, limit: int = MAX_JSON_FILE, depth: int = MAX_JSON_DEPTH,
                   hint: str | None = None) -> Any:
    """The JSON document in the file ``path``, read as untrusted input: a regular file of at
    most ``limit`` bytes (:func:`read_bounded`), UTF-8, nested at most ``depth`` levels
    (checked before the recursive decoder sees it), no NaN or Infinity anywhere.

    Raises:
        InvalidFile: naming the file (and the key, for a non-finite number) and what is wrong,
            with ``hint`` (what to do next); the CLI and every ``core.ml`` task exit 2 on it.
    """
    from core.errors import InvalidFile, InvalidInput

    shown = os.fspath(path)
    try:
        raw = read_bounded(path, limit, what)
    except InvalidInput as e:
        raise InvalidFile(shown, e.message.removeprefix(f"{shown}: "), hint=hint) from None
    return loads_untrusted(raw, shown, what, depth=depth, hint=hint)


def loads_untrusted(raw: bytes | str, shown: str, what: str, *, depth: int = MAX_JSON_DEPTH,
                    hint: str | None = None) -> Any:
    """The JSON document ``raw`` (the bytes of ``shown``, a file here or on a host): UTF-8,
    nested at most ``depth`` levels (checked before the recursive decoder sees it), no NaN or
    Infinity anywhere.

    Raises:
        InvalidFile: naming ``shown`` (and the key, for a non-finite number) and what is wrong.
    """
    from core.errors import InvalidFile

    try:
        text = raw.decode("utf-8-sig") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        raise InvalidFile(shown, f"not UTF-8 text (byte {e.start}: {e.reason}); a {what} is JSON", hint=hint) from None
    if too_deep(text, depth):
        raise InvalidFile(shown, f"JSON nested more than {depth} levels deep; a {what} is a few levels deep", hint=hint)
    try:
        value = json.loads(text, parse_constant=_NonFinite, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise InvalidFile(shown, f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}; a {what} "
                                 "is one JSON document", hint=hint) from None
    except (ValueError, RecursionError) as e:
        raise InvalidFile(shown, f"invalid JSON: {e}", hint=hint) from None
    bad = json_value_problem(value, depth=depth, ints=False)
    if bad:
        raise InvalidFile(shown, bad[1], field=bad[0] or None, hint=hint)
    return value
