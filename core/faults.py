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
    name: str = "interrupted (Ctrl-C)"
    exit_status: int = 130


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[Interruption]:
    """While inside, SIGTERM does what Ctrl-C does (asyncio cancels the main task, so
    in-process runs are marked interrupted and hosts closed), then exit status 143."""
    how = Interruption()

    def on_term(signum, frame) -> None:
        how.name, how.exit_status = "terminated (SIGTERM)", 143
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)  # asyncio.run's handler, or default_int_handler
        else:
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread (tests calling main() from a worker)
        yield how
        return
    try:
        yield how
    finally:
        signal.signal(signal.SIGTERM, previous)
