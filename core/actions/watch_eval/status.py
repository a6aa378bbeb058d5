"""A tau watcher's state as ``status`` and the item pane show it, read from the store.

Apart from :mod:`.detached` (which starts, ingests and stops watchers and so loads the job,
host and asyncio machinery) so that ``specdeck status`` reads a watcher without loading any
of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.state.records import WatcherStatus

if TYPE_CHECKING:
    from core.state.store import Store


def status_of(store: "Store", run_id: str | None) -> WatcherStatus | None:
    """The watcher of a run for ``status --json`` and the item pane: state, last step
    evaluated, queue."""
    w = store.watcher(run_id) if run_id else None
    if w is None:
        return None
    entries = store.watch_entries(run_id)
    gone = [e.data for e in store.events(kinds=("checkpoints_deleted",))
            if e.run_id == run_id and isinstance(e.data, dict)]
    return WatcherStatus(host=w.host, state=w.state, current=w.current,
                         last_step=w.last_step, queue=list(w.queue or []),
                         evaluated=[e.step for e in entries if e.state == "done"],
                         failed=[e.step for e in entries if e.state == "failed"],
                         error=w.error, capsule=w.capsule,
                         deleted=[s for d in gone for s in d.get("steps", ())],
                         freed_bytes=sum(d.get("freed_bytes", 0) for d in gone))


def describe(w: WatcherStatus) -> str:
    """A watcher's :func:`status_of` in one line for a person: its state (and the step it is
    evaluating), where, the last step evaluated, the queue, the failed steps."""
    state = w.state + (f" (step {w.current})" if w.current is not None else "")
    from core.text import human

    return (f"{state} on {w.host} · last step {w.last_step or '–'} · queue {len(w.queue)}"
            + (f" · failed {', '.join(map(str, w.failed))}" if w.failed else "")
            + (f" · deleted {', '.join(map(str, w.deleted))} (freed {human(w.freed_bytes)})"
               if w.deleted else ""))
