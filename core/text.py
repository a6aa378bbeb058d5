"""Making untrusted text (remote logs) safe to print on a terminal."""

from __future__ import annotations

import re

_ESC = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def sanitize(line: str, *, max_len: int = 4000) -> str:
    """Drop ANSI escape sequences and control characters; cut very long lines."""
    s = _CTRL.sub("\ufffd", _ESC.sub("", line))
    if len(s) > max_len:
        s = s[:max_len] + f"… [{len(s) - max_len} more chars]"
    return s


def collapse_cr(line: str) -> str:
    """What a terminal shows of a line redrawn with carriage returns (a tqdm bar's
    refreshes): the last non-empty redraw."""
    if "\r" not in line:
        return line
    parts = [p for p in line.split("\r") if p.strip()]
    return parts[-1] if parts else ""
