"""Runner events in, Textual messages out (Toolong's watcher pattern).

The runner reports through one plain callback (``emit``) with :mod:`core.runs.events`
dataclasses. :class:`EventBridge` is that callback: it turns each event into a message from
:mod:`console.messages` and posts it to the app. It knows nothing about widgets.

Log lines are the main flood (and progress, which the runner derives from them). A follower hands over a chunk per poll; at 10k lines/s that is
a message per chunk per run, each costing a repaint. The bridge instead gathers lines per run
and flushes every ``flush_interval`` seconds, so the app sees at most one
:class:`~console.messages.LogLinesArrived` per run per flush whatever the rate, and keeps at
most ``max_pending`` lines per run between flushes (older ones are dropped from the batch:
they are in the store, and the pane only shows its last lines). Progress is flushed with
them: only each item's latest progress since the last flush is posted. A run's pending lines are
flushed before its :class:`~console.messages.RunEnded`, so the end comes after its lines.

The runner calls ``emit`` on the event loop's thread; a call from another thread is handed
to the loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from textual.message import Message

from console import messages as m
from core.runs import events as ev

class EventBridge:
    """The runner's ``emit`` callback for the console.

    Args:
        flush_interval: Seconds between log flushes (the batching window).
        max_pending: Lines kept per run between flushes.
    """

    def __init__(self, *, flush_interval: float = 0.05, max_pending: int = 5000):
        self.flush_interval = flush_interval
        self.max_pending = max_pending
        self._post: Callable[[Message], object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._pending: dict[str, tuple[str, list[str], int]] = {}
        self._progress: dict[str | None, ev.Progress] = {}
        """The latest progress per item since the last flush (older ones are superseded)."""
        self._flush_handle: asyncio.TimerHandle | None = None
        self.lines_seen = 0
        """Log lines received so far (for the bench and tests)."""

    def bind(self, post: Callable[[Message], object]) -> None:
        """Start posting to ``post`` (the app's ``post_message``); call on the loop's thread."""
        self._post = post
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def unbind(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._pending.clear()
        self._progress.clear()
        self._post = None

    # -- the callback --------------------------------------------------------------------
    def __call__(self, event: ev.Event) -> None:
        if self._post is None:
            return
        if self._thread != threading.get_ident():
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self, event)
            return
        if isinstance(event, ev.LogLinesReceived):
            self._gather(event)
            return
        if isinstance(event, ev.Progress):
            self._progress[event.item_id] = event
            self._schedule()
            return
        if isinstance(event, ev.RunEnded):
            self.flush(event.run_id)
            last = self._progress.pop(event.item_id, None)  # before the end, not after it
            if last is not None:
                self._post(m.ProgressReported(last.item_id, last.message, dict(last.fields)))
        msg = self.translate(event)
        if msg is not None:
            self._post(msg)

    @staticmethod
    def translate(event: ev.Event) -> Message | None:
        """The message for one (non-log) event, or None for events the console ignores."""
        if isinstance(event, ev.StatusChanged):
            return m.ItemStatusChanged(event.item_id or "", event.status, event.reason)
        if isinstance(event, ev.RunStarted):
            return m.RunStarted(event.item_id or "", event.run_id, event.host, event.pid,
                                event.attached)
        if isinstance(event, ev.RunEnded):
            return m.RunEnded(event.item_id or "", event.run_id, event.state, event.exit_code,
                              event.signal, event.error)
        if isinstance(event, ev.HostStateChanged):
            return m.HostStateChanged(event.host, event.state, event.reason)
        if isinstance(event, ev.Progress):
            return m.ProgressReported(event.item_id, event.message, dict(event.fields))
        if isinstance(event, ev.LogStreamChanged):
            return m.LogStreamChanged(event.item_id or "", event.state, event.reason)
        if isinstance(event, ev.Notice):
            return m.NoticePosted(event.item_id, event.message, event.level)
        return None

    # -- log batching --------------------------------------------------------------------
    def _gather(self, event: ev.LogLinesReceived) -> None:
        self.lines_seen += len(event.lines)
        item_id, lines, dropped = self._pending.get(event.run_id, (event.item_id or "", [], 0))
        lines.extend(event.lines)
        if len(lines) > self.max_pending:
            cut = len(lines) - self.max_pending
            del lines[:cut]
            dropped += cut
        self._pending[event.run_id] = (item_id, lines, dropped)
        self._schedule()

    def _schedule(self) -> None:
        if self._flush_handle is None and self._loop is not None:
            self._flush_handle = self._loop.call_later(self.flush_interval, self.flush)

    def flush(self, run_id: str | None = None) -> None:
        """Post the gathered lines (of one run, or of all runs and the latest progress)."""
        progress: list[ev.Progress] = []
        if run_id is None:
            self._flush_handle = None
            batches = list(self._pending.items())
            self._pending.clear()
            progress = list(self._progress.values())
            self._progress.clear()
        else:
            batch = self._pending.pop(run_id, None)
            batches = [(run_id, batch)] if batch else []
        if self._post is None:
            return
        for rid, (item_id, lines, dropped) in batches:
            if lines:
                self._post(m.LogLinesArrived(item_id, rid, lines, dropped))
        for p in progress:
            self._post(m.ProgressReported(p.item_id, p.message, dict(p.fields)))
