"""Faults at the edges: how an unexpected exception is told, and SIGTERM taken as Ctrl-C.

No traceback reaches a user: the CLI and the runner turn any exception into one line naming
its kind, its message and (for OS errors) the path, via :func:`describe_fault`.
"""

from __future__ import annotations

import contextlib
import signal
from dataclasses import dataclass
from typing import Iterator

from core.errors import SpecdeckError


def describe_fault(exc: BaseException) -> str:
    """One line for an exception: SpecdeckError's message, else its kind and message."""
    if isinstance(exc, SpecdeckError):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where} ({type(exc).__name__})"
    if isinstance(exc, RecursionError):
        return "input nested too deeply to process (RecursionError)"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class Interruption:
    """What ended the work: Ctrl-C (SIGINT) or SIGTERM (the CLI's exit status follows it)."""

    name: str = "interrupted (Ctrl-C)"
    signum: int = signal.SIGINT


_current: Interruption | None = None


def watch_signals_in_loop() -> None:
    """Called first thing in the CLI's event loop: SIGTERM cancels the main task (like
    Ctrl-C). Registering it with the loop also wakes the loop for every signal, which a plain
    ``signal.signal`` handler does not when a worker thread (a relay's copy, a child
    watcher) happens to receive it while the loop sleeps."""
    how = _current
    if how is None:
        return
    import asyncio

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def on_term() -> None:
        how.name, how.signum = "terminated (SIGTERM)", signal.SIGTERM
        if task is not None and not task.done():
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, on_term)
    except (ValueError, RuntimeError, NotImplementedError):
        pass


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[Interruption]:
    """While inside, SIGTERM does what Ctrl-C does (the main task is cancelled, so
    in-process runs are marked interrupted and hosts closed)."""
    global _current
    how = _current = Interruption()

    def on_term(signum, frame) -> None:
        how.name, how.signum = "terminated (SIGTERM)", signal.SIGTERM
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)  # asyncio.run's handler, or default_int_handler
        else:
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread (tests calling main() from a worker)
        _current = None
        yield how
        return
    try:
        yield how
    finally:
        _current = None
        signal.signal(signal.SIGTERM, previous)
