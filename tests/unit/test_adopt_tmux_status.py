"""How an adopted tmux session's end is read from its panes (core.runs.adopt._inspect_tmux).

tmux prints ``#{pane_dead} #{pane_dead_status} #{pane_dead_signal}`` with empty fields kept:
a pane killed by a signal has no exit status ("1  9"), and a pane whose pty closed before
tmux reaped its process has neither yet ("1  "), which tmux 3.3a can leave so for good.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from core.runs import adopt


class Panes:
    """A host whose ``tmux list-panes`` answers the given outputs in turn (the last one repeats)."""

    def __init__(self, *outputs: str | None) -> None:
        self.outputs, self.asked = list(outputs), 0

    async def run(self, argv):
        assert argv[:2] == ["tmux", "list-panes"]
        out = self.outputs[min(self.asked, len(self.outputs) - 1)]
        self.asked += 1
        return SimpleNamespace(ok=out is not None, stdout=out or "")


INFO = {"session": "train", "pane_pid": 4242}


@pytest.mark.parametrize("outputs, state, code, sig", [
    (["0  \n"], "running", None, None),
    (["1  \n0  \n"], "running", None, None),  # one pane of the session still lives
    (["1 3 \n"], "ended", 3, None),
    (["1 0 \n"], "ended", 0, None),
    (["1  9\n"], "ended", None, "KILL"),  # a signal, not exit status 9
    (["1  15\n1 0 \n"], "ended", None, "TERM"),  # the first pane's
    (["1  \n", "1  \n", "1 3 \n"], "ended", 3, None),  # dead before reaped: asked again
    ([None], "lost", None, None),  # the session is gone
])
async def test_the_first_panes_status_or_signal(outputs, state, code, sig):
    host = Panes(*outputs)
    st = await adopt._inspect_tmux(host, INFO)
    assert (st.state, st.exit_code, st.signal) == (state, code, sig)
    if state == "running":
        assert st.pid == 4242


async def test_a_status_tmux_never_records_is_lost_after_the_wait(monkeypatch):
    monkeypatch.setattr(adopt, "TMUX_STATUS_WAIT_S", 0.3)
    host = Panes("1  \n")
    st = await adopt._inspect_tmux(host, INFO)
    assert st.state == "lost" and st.exit_code is None and 3 <= host.asked <= 6
