"""What an item's ``adopt:`` names, and how it is written: the adopt vocabulary.

Below the plan loader (:mod:`core.plans.planfile` reads an item's ``adopt:`` with
:func:`parse_spec`; the console's adopt modal and ``specdeck adopt`` build the same
:class:`AdoptSpec`), so reading a plan loads no jobs, hosts or runner. Adopting what a spec
names is :mod:`core.runs.adopt`'s, through :meth:`core.runs.runner.Runner.adopt`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

HOWS = ("pid", "slurm", "tmux")
PID_MAX = 1 << 22
"""Linux's largest possible PID (``PID_MAX_LIMIT`` on 64-bit): anything above is no PID."""
PID_TEXT = re.compile(r"[0-9]{1,10}")
"""A PID as text: ASCII digits only (``str.isdigit`` takes '١٢٣', '²')."""
JOB_ID = re.compile(r"[0-9]{1,18}")
"""A Slurm job id: ASCII digits, likewise."""


def parse_pid(text: str | bytes) -> int:
    """A PID as typed or as a pid file holds it: ASCII digits, surrounding whitespace
    stripped, 2..PID_MAX. Raises ValueError saying what is wrong with anything else (empty,
    other digits, signs, binary, a number no PID can be)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"not a PID (binary or non-ASCII bytes: {text[:20]!r})") from None
    raw = text.strip(" \t\r\n")
    if not raw:
        raise ValueError("empty (no PID in it)")
    if not PID_TEXT.fullmatch(raw):
        raise ValueError(f"not a PID (ASCII digits only): {raw[:20]!r}"
                         + ("..." if len(raw) > 20 else ""))
    pid = int(raw)
    if not 1 < pid <= PID_MAX:
        raise ValueError(f"pid {pid} is not a process that can be adopted (PIDs run "
                         f"2..{PID_MAX})")
    return pid


@dataclass(frozen=True)
class AdoptSpec:
    """Where an item's run already is: exactly one of pid / pid_file / slurm_job / tmux."""

    pid: int | None = None
    pid_file: str | None = None
    slurm_job: str | None = None
    tmux: str | None = None
    log: str | None = None
    from_start: bool = False

    @property
    def how(self) -> str:
        if self.pid is not None or self.pid_file is not None:
            return "pid"
        return "slurm" if self.slurm_job is not None else "tmux"


PLAN_KEYS = ("pid_file", "log", "slurm_job", "tmux", "from_start")


def parse_spec(raw: Any) -> tuple[AdoptSpec | None, list[tuple[tuple, str]]]:
    """A plan item's ``adopt:`` mapping (``${vars}`` already replaced) -> spec, problems."""
    if not isinstance(raw, dict):
        return None, [((), "adopt must be a mapping: {pid_file, log} or {slurm_job} or {tmux}")]
    problems: list[tuple[tuple, str]] = []
    for k in raw:
        if k not in PLAN_KEYS:
            problems.append(((k,), f"unknown key {k!r} (known: {', '.join(PLAN_KEYS)})"))
    given = [k for k in ("pid_file", "slurm_job", "tmux") if raw.get(k) is not None]
    if len(given) != 1:
        problems.append(((), "give exactly one of pid_file (with log), slurm_job or tmux"))
    for k in ("pid_file", "log", "tmux"):
        if raw.get(k) is not None and (not isinstance(raw[k], str) or not raw[k].strip()):
            problems.append(((k,), f"{k} must be a non-empty string"))
    job = raw.get("slurm_job")
    if job is not None and not JOB_ID.fullmatch(str(job)):
        problems.append((("slurm_job",), f"slurm_job must be a job id (digits), got {job!r}"))
    if raw.get("from_start") not in (None, True, False):
        problems.append((("from_start",), "from_start must be true or false"))
    if problems:
        return None, problems
    return AdoptSpec(pid_file=raw.get("pid_file"), slurm_job=str(job) if job is not None else None,
                     tmux=raw.get("tmux"), log=raw.get("log"),
                     from_start=bool(raw.get("from_start"))), []


def spec_from_text(what: str, log: str = "", from_start: bool = False) -> AdoptSpec:
    """``pid 123`` / ``123`` / ``slurm 456`` / ``tmux NAME`` (as typed in the console)."""
    words = what.split()
    log = log.strip() or None
    if len(words) == 1 and words[0].isdigit():
        words = ["pid", words[0]]
    if len(words) == 2 and words[0] == "pid":
        try:
            return AdoptSpec(pid=parse_pid(words[1]), log=log, from_start=from_start)
        except ValueError as e:  # say what would be understood, as for any other typo
            raise ValueError(f"{e}: say pid 12345, slurm 678 or tmux SESSION") from None
    if len(words) == 2 and words[0] == "slurm" and JOB_ID.fullmatch(words[1]):
        return AdoptSpec(slurm_job=words[1], log=log, from_start=from_start)
    if len(words) == 2 and words[0] == "tmux":
        return AdoptSpec(tmux=words[1], log=log, from_start=from_start)
    raise ValueError(f"{what.strip() or 'nothing'!r}: say pid 12345, slurm 678 or tmux SESSION")
