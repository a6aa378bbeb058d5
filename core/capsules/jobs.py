"""Run capsules: detached work on a host that outlives specdeck and any SSH channel.

A capsule is a directory ``<workdir>/.specdeck/runs/<run id>/`` on the host holding:

``cmd.sh``      the command, with its environment exported (quoted) and its cwd;
``wrapper.sh``  started with ``setsid`` (own session, stdin from /dev/null); it starts
                ``cmd.sh`` in a *further* session and process group, writes ``pid``, waits,
                and writes ``exit``. Because the wrapper is outside the command's process
                group, a stop (signals to the group) never kills the wrapper, so the exit
                status is recorded even for SIGKILL;
``pid``         ``<pid> <start ticks> <boot id> <wrapper pid> <wrapper start ticks>``: the
                start time (field 22 of /proc/PID/stat) and the boot id make a recycled pid
                or a rebooted host detectable;
``log``         stdout and stderr of the command;
``exit``        ``exit N`` or ``signal N``, written atomically by the wrapper at the end.

Everything specdeck needs to re-derive a run's state is on the host, so reconcile after a
restart or a reconnect is: read ``exit``, else compare ``pid`` with /proc, else it is lost.

Log following (:func:`follow`) reads from the run's stored byte offset and stores whole lines
only (a torn last line waits for its newline), so the store's copy of the log never has a
gap or a duplicated line however often the follower is restarted.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import sqlite3
import signal as _signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from core.errors import HostUnreachable, StateDiskFull
from core.hosts.base import Host
from core.ml.formats import strictjson
from core.text import json_line
from core.capsules.metrics_sources import LineMetrics

CAPSULES = ".specdeck/runs"
CHUNK = 4 << 20
"""Largest log read per poll; a line longer than this is stored in pieces."""

_WRAPPER = r"""#!/usr/bin/env bash
# specdeck run capsule wrapper: see core/capsules/jobs.py
D="$(cd "$(dirname "$0")" && pwd)"
ticks() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
setsid bash "$D/cmd.sh" >>"$D/log" 2>&1 </dev/null &
child=$!
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo noboot)
cstart=$(ticks "$child")
echo "$child ${cstart:-0} $boot $$ $(ticks $$)" >"$D/pid.tmp" && mv "$D/pid.tmp" "$D/pid"
wait "$child"
rc=$?
if [ "$rc" -gt 128 ] && [ "$rc" -lt 193 ]; then r="signal $((rc - 128))"; else r="exit $rc"; fi
echo "$r" >"$D/exit.tmp" && mv "$D/exit.tmp" "$D/exit"
"""


def notify_step() -> str:
    """The wrapper's last step: once the exit status is recorded, the capsule's ``notify.sh``
    (written only when the run's plan asks for notifications: ``core.runs.notify``) is
    started detached, so that a target slow or down never delays the run's end."""
    return ('if [ -f "$D/notify.sh" ]; then setsid bash "$D/notify.sh" </dev/null '
            '>>"$D/notify.log" 2>&1 & fi\n')


_WRAPPER += notify_step()

_INSPECT = r"""D={d}
ticks() {{ sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }}
N="$D/../../{notice}"
notice() {{ case "$1" in "signal 15"|"exit 143") if [ -f "$N" ] && [ "$N" -nt "$D/pid" ]; then
  printf ' preempted %s' "$(head -c 200 "$N" | tr '\n\t' '  ')"; fi;; esac; }}
if [ -f "$D/exit" ]; then echo "ended $(cat "$D/exit")$(notice "$(cat "$D/exit")")"; exit 0; fi
if [ ! -f "$D/pid" ]; then if [ -d "$D" ]; then echo nopid; else echo missing; fi; exit 0; fi
read pid pstart boot wpid wstart <"$D/pid"
curboot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo noboot)
if [ "$curboot" = "$boot" ]; then
  if [ -n "$pstart" ] && [ "$(ticks "$pid")" = "$pstart" ]; then echo "running $pid"; exit 0; fi
  if [ -n "$wstart" ] && [ "$(ticks "$wpid")" = "$wstart" ]; then echo "running $pid"; exit 0; fi
fi
if [ -f "$D/exit" ]; then echo "ended $(cat "$D/exit")$(notice "$(cat "$D/exit")")"; else echo lost; fi
"""
PREEMPT_NOTICE = "preempt-notice"
"""A file the host's spot reclaim hook writes (``<workdir>/.specdeck/preempt-notice``, its
text the notice): a run that then ends by SIGTERM (signal 15 or exit 143) after it appeared
was preempted, not failed (:attr:`CapsuleState.preempted`)."""


@dataclass(frozen=True)
class Launch:
    """A command to run detached in a capsule on the action's host."""

    command: str
    """Shell text, run by bash in the capsule; every spliced value already quoted."""
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    launcher: str = "process"
    """``process`` (setsid capsule) or ``slurm`` (sbatch); see core.capsules.jobs."""
    slurm: Mapping[str, Any] = field(default_factory=dict)
    metrics_regex: str | None = None
    """For trainers that print text: a regex with named groups, ``step`` among them."""


@dataclass
class Outcome:
    """How a detached run ended (``core.runs.life.outcome_of`` reads it from a capsule)."""

    state: Literal["succeeded", "failed", "stopped", "lost", "preempted"]
    exit_code: int | None = None
    signal: str | None = None
    capsule: str = ""
    """The capsule directory on the host (result files live beside the log)."""
    run_id: str = ""
    preempted: str | None = None
    """How its host took it away (``state`` preempted: :attr:`CapsuleState.preempted`)."""


@dataclass(frozen=True)
class CapsuleState:
    state: str
    """``running``, ``ended``, ``lost`` (no process, no exit status), ``nopid`` (launch not
    finished), ``missing`` (no capsule directory)."""
    exit_code: int | None = None
    signal: str | None = None
    pid: int | None = None
    preempted: str | None = None
    """Ended (or lost) by its host's doing, in words (``Slurm PREEMPTED``, ``Slurm
    NODE_FAIL``, a spot reclaim notice): the run is ``preempted``, not failed."""


@dataclass(frozen=True)
class Launched:
    """Where a detached launch went: what :func:`start` (and ``core.capsules.slurm.submit``) return,
    recorded on the run."""

    capsule: str
    """The run capsule directory on the host."""
    pid: int | None = None
    """The command's pid (None for a Slurm job, until it runs)."""
    pstart: str = ""
    """The pid's start ticks and boot id (tells it from a later process of that pid)."""
    job_id: str | None = None
    """The Slurm job id (``launcher: slurm``)."""


def capsule_path(host: Host, run_id: str) -> str:
    return host.path(f"{CAPSULES}/{run_id}")


def cmd_script(launch: Launch, host: Host, capsule: str | None = None) -> str:
    """The capsule's ``cmd.sh``: the host's and the launch's environment, then the command
    (a Slurm batch script runs the same file)."""
    # A stop's SIGTERM reaches every process of the run. Without a trap this shell would die
    # first and the run be recorded as ended while its command still works (a trainer saving
    # its checkpoint on SIGTERM), and then be killed as a leftover after 10 s; with it the
    # shell waits for them, so the run ends when they do (or at the stop's grace, by SIGKILL).
    lines = ["#!/usr/bin/env bash", "trap 'trap \"\" TERM; wait; exit 143' TERM"]
    env = {**host.env, **dict(launch.env)}
    if capsule:
        env[MARKER] = capsule  # inherited by every descendant, daemonised ones included
    for k, v in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ValueError(f"bad environment variable name {k!r}")
        lines.append(f"export {k}={shlex.quote(str(v))}")
    lines.append(f"cd {shlex.quote(host.path(launch.cwd or '.'))} || exit 97")
    lines.append(launch.command)
    return "\n".join(lines) + "\n"


async def start(host: Host, run_id: str, launch: Launch, *, timeout: float = 20.0
                ) -> Launched:
    """Start ``launch`` detached on ``host``; return its capsule, pid and pid start."""
    d = capsule_path(host, run_id)
    await host.makedirs(host.path(launch.cwd or "."))
    await host.write_file(f"{d}/cmd.sh", cmd_script(launch, host, d).encode(), mode=0o700)
    await host.write_file(f"{d}/wrapper.sh", _WRAPPER.encode(), mode=0o700)
    q = shlex.quote(d)
    # The braces keep the background job's stdio off the channel, so run() returns at once.
    await host.run(f"touch {q}/log && {{ setsid bash {q}/wrapper.sh </dev/null >/dev/null 2>&1 & }}",
                   check=True)
    deadline = time.monotonic() + timeout
    while True:
        raw = await host.read_from(f"{d}/pid", 0, 4096)
        if raw.strip():
            parts = raw.decode().split()
            return Launched(d, int(parts[0]), " ".join(parts[1:]) if len(parts) > 1 else "")
        if time.monotonic() > deadline:
            raise HostUnreachable(host.name, f"run capsule {d} did not start within {timeout}s")
        await asyncio.sleep(0.02)


def signame(num: int) -> str:
    """``9`` -> ``KILL``: a signal's name as runs record it (the number if unknown)."""
    try:
        return _signal.Signals(num).name.removeprefix("SIG")
    except ValueError:
        return str(num)


async def inspect(host: Host, capsule: str) -> CapsuleState:
    """Re-derive a run's state from its capsule (one round trip)."""
    res = await host.run(_INSPECT.format(d=shlex.quote(capsule), notice=PREEMPT_NOTICE),
                         check=True)
    words = res.stdout.split()
    if not words:
        return CapsuleState("lost")
    if words[0] == "ended":
        kind, num = words[1], int(words[2])
        why = (f"spot reclaim notice: {' '.join(words[4:]) or 'no text'}"
               if words[3:4] == ["preempted"] else None)
        if kind == "signal":
            return CapsuleState("ended", None, signame(num), preempted=why)
        return CapsuleState("ended", num, None, preempted=why)
    if words[0] == "running":
        return CapsuleState("running", pid=int(words[1]))
    return CapsuleState(words[0])


async def signal_group(host: Host, capsule: str, sig: str) -> bool:
    """Send ``sig`` to the run's process group if it is still the same process."""
    script = (f"D={shlex.quote(capsule)}; read pid pstart rest <\"$D/pid\" || exit 3; "
              f"[ \"$(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f20)\" = \"$pstart\" ]"
              f" || exit 4; kill -{sig} -- -$pid")
    res = await host.run(script)
    return res.ok


async def stop(host: Host, capsule: str, *, grace_s: float = 30.0,
               poll: float = 0.2) -> CapsuleState:
    """SIGTERM to the run's processes (its group, its session and every process carrying its
    marker), ``grace_s`` seconds, then SIGKILL; then the same for processes it left behind."""
    st = await inspect(host, capsule)
    if st.state == "running":
        st = await _stop_running(host, capsule, grace_s, poll)
    if st.state != "running":
        await end_leftovers(host, capsule, grace_s=min(grace_s, 10.0), poll=poll)
    return st


async def _stop_running(host: Host, capsule: str, grace_s: float, poll: float) -> CapsuleState:
    await signal_group(host, capsule, "TERM")
    await signal_tree(host, capsule, "TERM")
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        st = await inspect(host, capsule)
        if st.state != "running":
            return st
        await asyncio.sleep(poll)
    await signal_group(host, capsule, "KILL")
    await signal_tree(host, capsule, "KILL")
    for _ in range(100):
        st = await inspect(host, capsule)
        if st.state != "running":
            return st
        await asyncio.sleep(poll)
    return st


# -- the run's process tree --------------------------------------------------------------
MARKER = "SPECDECK_CAPSULE"
"""Exported in ``cmd.sh``: every process the command starts inherits it, so children that
leave its process group or session (``setsid``, a daemon's double fork) are still found."""

_TREE = r"""D={d}
read pid pstart rest <"$D/pid" 2>/dev/null || exit 0
[ -n "$pid" ] || exit 0
# The session id is the command's pid: Linux keeps a pid unused while a session refers to it,
# so its members are the run's; but a live process with that pid and another start time is
# a stranger's new session (the command's and every member are gone): only the marker counts.
cur=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f20)
sid=$pid; [ -z "$cur" ] || [ "$cur" = "$pstart" ] || sid=none
{{ ps -e -o pid=,sid= 2>/dev/null | awk -v s="$sid" '$2 == s {{print $1}}'
   grep -lzxF "{marker}=$D" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
}} | sort -un | grep -vx "$$" | while read p; do
  a=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-200)
  [ -n "$a" ] || [ -d "/proc/$p" ] || continue
  {action}
done
"""


async def leftovers(host: Host, capsule: str) -> list[tuple[int, str]]:
    """Processes of the run still alive (``[(pid, command line)]``): those in the command's
    session or carrying its marker. Empty for a run that left nothing behind."""
    res = await host.run(_TREE.format(d=shlex.quote(capsule), marker=MARKER,
                                      action='echo "$p $a"'))
    out = []
    for line in res.stdout.splitlines():
        pid, _, args = line.partition(" ")
        if pid.isdigit():
            out.append((int(pid), args.strip()))
    return out


async def signal_tree(host: Host, capsule: str, sig: str) -> None:
    """Send ``sig`` to every process of the run (see :func:`leftovers`)."""
    await host.run(_TREE.format(d=shlex.quote(capsule), marker=MARKER,
                                action=f'kill -{sig} "$p" 2>/dev/null'))


async def end_leftovers(host: Host, capsule: str, *, grace_s: float = 10.0,
                        poll: float = 0.2) -> int:
    """SIGTERM what the run left running, ``grace_s``, then SIGKILL; the count found."""
    found = await leftovers(host, capsule)
    if not found:
        return 0
    await signal_tree(host, capsule, "TERM")
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not await leftovers(host, capsule):
            return len(found)
        await asyncio.sleep(poll)
    await signal_tree(host, capsule, "KILL")
    return len(found)


def describe_leftovers(found: list[tuple[int, str]]) -> str:
    shown = "; ".join(f"pid {p} {a}" if a else f"pid {p}" for p, a in found[:5])
    more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
    return (f"the command left {len(found)} process{'es' if len(found) != 1 else ''} "
            f"running: {shown}{more}")


# -- log following -----------------------------------------------------------------------
def parse_artefact(line: bytes) -> tuple[str, str, int | None] | None:
    """``{"event": "checkpoint", "step": N, "path": P}`` -> ("checkpoint", P, N)."""
    s = line.strip()
    if not (s.startswith(b"{") and b'"event"' in s and b'"checkpoint"' in s):
        return None
    obj = json_line(s)
    if isinstance(obj, dict) and obj.get("event") == "checkpoint" and isinstance(obj.get("path"), str):
        step = obj.get("step")
        return ("checkpoint", obj["path"], step if isinstance(step, int) else None)
    return None


ROTATION_PROBE = 64
"""Bytes at the end of what is stored that an adopted log must still hold where they were
read from: a file truncated and written past that point again (copytruncate) differs there."""


async def follow_rotation(host: Host, store, run_id: str, log: str,
                          ident: str | None) -> tuple[str | None, bool]:
    """Whether an adopted log (a file the run's own program writes) was rotated since the
    follower last read it: replaced (logrotate: its inode changed), shrunk, or rewritten
    under what is stored (copytruncate, then new lines past the old end: the last stored
    bytes are no longer where they were read). Then the stored log continues from the new
    file's start (``log_base`` becomes that start minus the bytes stored, past any NUL hole
    copytruncate left before a writer without O_APPEND), with a journal notice: nothing
    written after the rotation is lost. ``ident`` is the ``inode device`` last seen; returns
    the current one and whether it rotated. The identity and where the current file's copy
    starts are kept in the run's ``adopt`` record, so a rotation while no specdeck followed
    is found too."""
    raw = await host.identity(log)
    if raw is None:
        return ident, False  # missing for a moment (between rename and create): look again
    words = raw.split()
    size, now_ident = int(words[0]), " ".join(words[1:3])
    row = store.run(run_id)
    info = dict(row.adopt or {})
    ident = ident or info.get("log_ident")
    stored, base = row.log_offset, row.log_base or 0
    since = stored - int(info.get("log_rotated_at", 0))  # stored from the current file
    replaced = ident is not None and now_ident != ident
    rotated = replaced or size < base + stored
    if not rotated and since > 0:
        k = min(ROTATION_PROBE, since)
        rotated = (await host.read_from(log, base + stored - k, k)
                   != store.log_bytes(run_id, stored - k)[:k])
    if not rotated:
        if info and info.get("log_ident") != now_ident:
            store.update_run(run_id, adopt=strictjson.dumps({**info, "log_ident": now_ident}))
        return now_ident, False
    hole = 0
    while hole < size and hole < (256 << 20):
        data = await host.read_from(log, hole, min(CHUNK, size - hole))
        n = len(data) - len(data.lstrip(b"\0"))
        hole += n
        if n < len(data) or not data:
            break
    how = ("replaced (a new file)" if replaced else f"truncated (now {size:,} bytes)")
    skipped = f", past the {hole:,} NUL bytes copytruncate left" if hole else ""
    fields: dict[str, Any] = {"log_base": hole - stored}
    if info:
        fields["adopt"] = strictjson.dumps({**info, "log_ident": now_ident, "log_rotated_at": stored})
    store.update_run(run_id, **fields)
    store.journal("log_rotated", f"log {log} on {host.name} was {how}: followed from its new "
                  f"start{skipped}; the stored log goes on at byte {stored:,}",
                  item_id=row.item_id, run_id=run_id, host=host.name)
    return now_ident, True


async def follow(host: Host, store, run_id: str, capsule: str, *,
                 on_lines: Callable[[list[str]], None] | None = None,
                 on_state: Callable[[str], None] | None = None,
                 regex: str | None = None, poll: float = 0.1, inspect_every: float = 0.5,
                 stop: asyncio.Event | None = None, inspector=None,
                 log_path: str | None = None) -> CapsuleState:
    """Copy the run's log into the store until the run ends; return how it ended.

    Survives transport failures: while the host is unreachable it waits and retries, then
    resumes from the stored offset. ``on_state`` is told ``"reconnecting"`` / ``"following"``.
    """
    # ``regex``: one regex (str) or a parser with ``parse(line)`` (core.capsules.metrics_sources)
    parser = regex if hasattr(regex, "parse") else LineMetrics([regex] if regex else [])
    log = log_path or f"{capsule}/log"
    inspector = inspector or (lambda: inspect(host, capsule))
    ended: CapsuleState | None = None
    last_inspect = 0.0
    degraded = False
    seen: int | None = None
    ident: str | None = None  # an adopted log's inode (follow_rotation)
    """What this follower has shown: another follower (a second specdeck) may store ahead of
    it; storing stays exactly-once through the store's offset check, showing is per viewer."""
    while True:
        if stop is not None and stop.is_set():
            return CapsuleState("running")
        try:
            row = store.run(run_id)
            stored, base = row.log_offset, row.log_base or 0
            if seen is None or stored != seen:
                _guarded(store, run_id, parser.prime, store, run_id, stored)  # earlier counts
            if log_path is not None:  # an adopted log: rotated since the last read?
                ident, rotated = await follow_rotation(host, store, run_id, log, ident)
                if rotated:
                    seen = None
                    continue
            if seen is None or stored < seen:
                # (stored < seen: a racing follower stored a shorter piece than ours; go back
                # so the store never keeps a gap — this viewer may see those lines twice)
                seen = stored
            data = await host.read_from(log, base + seen, CHUNK)
            if degraded:
                degraded = False
                if on_state:
                    on_state("following")
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) == CHUNK:
                cut = len(data)  # a line longer than CHUNK: store it in pieces
            if ended is not None and cut < len(data):
                cut = len(data)  # the run is over: the torn last line is final
            if cut:
                piece = data[:cut]
                if seen + len(piece) > stored >= seen:
                    new = piece[stored - seen:]  # starts on a stored boundary
                    metrics, artefacts = _parse_lines(store, run_id, parser, new)
                    if not _append(store, run_id, stored, new, metrics, artefacts):
                        _guarded(store, run_id, parser.prime, store, run_id,
                                 store.run(run_id).log_offset)
                if on_lines:  # lines end at \n only: a tqdm bar's \r redraws stay one line
                    text = piece.decode("utf-8", "replace")
                    _guarded(store, run_id, on_lines, text[:-1].split("\n")
                             if text.endswith("\n") else text.split("\n"), source="log display")
                seen += len(piece)
                if len(data) >= CHUNK:
                    continue
            if ended is not None:
                return ended
            now = time.monotonic()
            if now - last_inspect >= inspect_every:
                last_inspect = now
                st = await inspector()
                if st.state in ("ended", "lost", "missing"):
                    ended = st  # one more read drains what was written before the end
                    continue
            await asyncio.sleep(poll)
        except HostUnreachable:
            if not degraded:
                degraded = True
                if on_state:
                    on_state("reconnecting")
            await asyncio.sleep(min(2.0, poll * 10))


def _parse_lines(store, run_id: str, parser, data: bytes) -> tuple[list, list]:
    """The metrics and checkpoint events of ``data``'s lines. A line whose parsing raises
    gives none (one notice per run); the line itself is stored all the same."""
    metrics: list[tuple] = []
    artefacts: list[tuple] = []
    for line in data.splitlines():
        try:
            art = parse_artefact(line)
            if art is not None:
                artefacts.append(art)
            else:
                metrics.extend(parser.parse(line))
        except Exception as e:  # noqa: BLE001 - one line never ends the follower
            store.metric_notice(run_id, "log parser", (
                f"a log line's metrics were not read ({type(e).__name__}: {str(e)[:200]}; "
                f"line starts {line[:60]!r}); the line is kept, later such lines are not "
                "reported"))
    notices = getattr(parser, "notices", None)  # a regex that timed out...
    while notices:
        store.metric_notice(run_id, *notices.pop(0))
    return metrics, artefacts


def _append(store, run_id: str, offset: int, data: bytes, metrics: list,
            artefacts: list) -> bool:
    """``store.append_log``; when storing the points fails for another reason than the
    database itself (locked, full), the log bytes are stored without them, with a notice:
    points never cost the lines they came with."""
    try:
        return store.append_log(run_id, offset, data, metrics, artefacts)
    except (sqlite3.OperationalError, StateDiskFull):
        raise
    except Exception as e:  # noqa: BLE001 - a value no check foresaw
        if not (metrics or artefacts):
            raise
        ok = store.append_log(run_id, offset, data)
        lines = data.count(b"\n")
        if ok:
            store.metric_notice(run_id, "log store", (
                f"{len(metrics)} metric point(s) and {len(artefacts)} checkpoint event(s) of "
                f"{lines} log line(s) not stored ({type(e).__name__}: "
                f"{str(e)[:200]}); the lines are kept"))
        return ok


def _guarded(store, run_id: str, fn, *args, source: str = "log parser") -> None:
    """``fn(*args)``, its fault told once per run and ``source`` instead of raised."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - a line's parse or display never ends the follower
        store.metric_notice(run_id, source, f"{source} failed ({type(e).__name__}: "
                            f"{str(e)[:200]}); the log is stored all the same")
