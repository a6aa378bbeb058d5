"""What the CLI prints for a person: one sanitized line on stderr (:func:`err`), and the
runner's events as they happen (:class:`Printer`); :func:`load_plan` and :func:`run_with`,
the two steps every plan command takes, load the plan reader and the session only when a
command takes them (``--version`` and ``--help`` load neither)."""

from __future__ import annotations

import sys
import time

from console.cli.conventions import runnable
from console.cli.render import paint
from console.glyphs import GLYPHS
from core.text import collapse_cr, sanitize



def err(msg: str, *, hints: bool = True) -> None:
    """One line for a person on stderr. Messages quote file names, hosts' output and plan
    text: one sanitizer at the boundary; the commands they suggest are spelled to run as
    printed (:func:`~console.cli.conventions.runnable`; ``hints=False`` for a host's own
    log lines, printed as the host wrote them)."""
    msg = sanitize(msg, max_len=20000)
    print(runnable(msg) if hints else msg, file=sys.stderr, flush=True)


class Printer:
    """Prints runner events on stderr for a person watching a terminal."""

    def __init__(self, *, quiet: bool = False):
        self.quiet = quiet
        self._last_progress: dict[str, float] = {}

    def __call__(self, ev) -> None:
        from core.runs.events import (HostStateChanged, LogLinesReceived, LogStreamChanged, Notice,
                                 Progress, RunEnded, RunStarted, StatusChanged)

        ts = time.strftime("%H:%M:%S")
        if isinstance(ev, LogLinesReceived):
            if not self.quiet and not ev.from_progress:
                for line in ev.lines:
                    err(f"  {ev.item_id} │ {sanitize(collapse_cr(line), newlines=False)}",
                        hints=False)
        elif isinstance(ev, RunStarted):
            verb = "attached to" if ev.attached else "started"
            where = f" on {ev.host}" if ev.host else ""
            err(f"[{ts}] {ev.item_id}: {verb} run {ev.run_id}{where}"
                 + (f" (pid {ev.pid})" if ev.pid else ""))
        elif isinstance(ev, RunEnded):
            how = (f"signal {ev.signal}" if ev.signal else f"exit {ev.exit_code}"
                   if ev.exit_code is not None else "exit status unknown")
            err(f"[{ts}] {ev.item_id}: run {ev.run_id} {paint(ev.state, ev.state, sys.stderr)}"
                 f" ({how})" + (f": {sanitize(ev.error)}" if ev.error else ""))
        elif isinstance(ev, StatusChanged):
            mark = paint(f"{GLYPHS.get(ev.status, '?')} {ev.status}", ev.status, sys.stderr)
            err(f"[{ts}] {ev.item_id}: {mark}" + (f" ({ev.reason})" if ev.reason else ""))
        elif isinstance(ev, Progress):
            now = time.monotonic()
            # Phase lines (no figures) always print; meter updates at most twice a second.
            if (not ev.fields or ev.fields.get("final")
                    or now - self._last_progress.get(ev.item_id or "", 0) >= 0.5):
                self._last_progress[ev.item_id or ""] = now
                err(f"[{ts}] {ev.item_id}: {ev.message}")
        elif isinstance(ev, HostStateChanged):
            if ev.state != "connected" or ev.reason:
                err(f"[{ts}] host {ev.host}: {ev.state}" + (f" ({ev.reason})" if ev.reason else ""))
        elif isinstance(ev, LogStreamChanged):
            err(f"[{ts}] {ev.item_id}: log stream {ev.state} ({ev.host}: {ev.reason})")
        elif isinstance(ev, Notice):
            err(f"[{ts}] {paint(ev.message, ev.level, sys.stderr)}")


def load_plan(path):
    """The plan at ``path`` (:func:`core.plans.planfile.load_plan`); the reader, and every action
    kind it validates against, loads on the first call."""
    from core.plans.planfile import load_plan as load

    return load(path)


def run_with(plan, args, work, *, show_events: bool = True, read: bool = False):
    """``work(session)`` in a :class:`core.session.Session` on ``plan`` (state: ``--state``;
    ``read``: opened to look, a runner and hosts only if a verb needs them); the runner's
    events are printed on stderr unless ``show_events`` is False (``-q`` keeps log lines
    quiet)."""
    from core.session import run_in_session

    emit = Printer(quiet=getattr(args, "quiet", False)) if show_events else None
    return run_in_session(plan, work, state=args.state, emit=emit, read=read)
