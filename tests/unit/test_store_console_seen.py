"""The console's mark in the store: how far a console has seen the journal, and when."""

from core.state.records import SeenMark
from core.state.store import Store


def test_mark_seen_moves_forward_only_and_survives_reopen(tmp_path):
    db = tmp_path / "s.db"
    s = Store(db)
    assert s.seen_mark() is None and s.last_event_id() == 0
    s.journal("console_opened", "opened")
    first = s.mark_seen()
    assert first == s.last_event_id() == 1
    s.journal("run_succeeded", "x", run_id="r1")
    s.journal("run_failed", "y", run_id="r2")
    assert s.mark_seen(event_id=2) == 2
    assert s.mark_seen(event_id=1) == 2  # never back
    assert s.mark_seen(event_id=99) == 3  # never past the journal
    at = s.seen_mark().at
    s.close()
    s = Store(db)  # a new process (a console reopened after kill -9) reads the same mark
    assert s.seen_mark() == SeenMark(name="console", event_id=3, at=at)
    assert [e.run_id for e in s.events(since_id=1, kinds=["run_succeeded", "run_failed"])] \
        == ["r1", "r2"]
    s.close()
