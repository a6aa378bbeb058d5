"""A plan opened for work: its state database and its runner, opened and closed together.

The one way every face starts work on a plan (the CLI's commands, the console, the demo, the
benches)::

    async with Session.open(plan, state=path, emit=print_event) as s:
        await s.runner.run_items(None)
        s.emit(Notice(None, "done"))

or, from synchronous code (a CLI command), :func:`run_in_session`, which also makes SIGTERM
act like Ctrl-C inside the event loop (:func:`core.faults.watch_signals_in_loop`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

from core.events import Event
from core.plan import Plan
from core.runner import Runner
from core.store import Store, state_path_for

T = TypeVar("T")


def open_store(plan: Plan, state: str | Path | None = None) -> Store:
    """The plan's state database: ``state`` if given, else where :func:`state_path_for` says."""
    return Store(state_path_for(plan, str(state) if state is not None else None))


def _drop(event: Event) -> None:
    """The default event sink: nobody is watching."""


class Session:
    """A plan with its store and runner. Close it (``await close()``, or ``async with``).

    Attributes:
        plan: The validated plan.
        store: Its state database.
        runner: The runner over both; events go to the session's ``emit``.
    """

    def __init__(self, plan: Plan, store: Store, runner: Runner, *, owns_store: bool):
        self.plan = plan
        self.store = store
        self.runner = runner
        self._owns_store = owns_store

    @classmethod
    def open(cls, plan: Plan, *, state: str | Path | None = None, store: Store | None = None,
             emit: Callable[[Event], None] | None = None, hosts: dict | None = None,
             **runner_options) -> "Session":
        """Open ``plan``: its store (``store`` as given, else the one ``state`` names) and a
        runner emitting to ``emit`` (default: nowhere). A given store stays open on close."""
        owns = store is None
        store = open_store(plan, state) if store is None else store
        try:
            runner = Runner(plan, store, emit=emit or _drop, hosts=hosts, **runner_options)
        except BaseException:
            if owns:
                store.close()
            raise
        return cls(plan, store, runner, owns_store=owns)

    def emit(self, event: Event) -> None:
        """Send an event to whoever watches the session (the CLI's printer, the console)."""
        self.runner.emit(event)

    async def close(self) -> None:
        """Close the hosts the runner contacted, then the store (if the session opened it)."""
        try:
            await self.runner.close()
        finally:
            if self._owns_store:
                self.store.close()

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def run_in_session(plan: Plan, work: Callable[[Session], Awaitable[T]], *,
                   state: str | Path | None = None,
                   emit: Callable[[Event], None] | None = None) -> T:
    """``asyncio.run`` of ``work(session)`` on a session opened for it and closed after.

    SIGTERM cancels the work like Ctrl-C does (runs inside this process are marked
    interrupted; detached runs keep going on their hosts).
    """
    from core.faults import watch_signals_in_loop

    async def go() -> T:
        watch_signals_in_loop()
        async with Session.open(plan, state=state, emit=emit) as session:
            return await work(session)

    return asyncio.run(go())
