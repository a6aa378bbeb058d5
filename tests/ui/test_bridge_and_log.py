"""The event bridge batches floods; the log pane stays bounded, follows, searches, sanitizes."""

from __future__ import annotations

import asyncio

from console import messages as m
from console.bridge import EventBridge
from console.widgets.log_pane import MAX_LINES, LogPane
from console.widgets.plan_list import PlanPane
from core.runs import events as ev
from core.state.records import Run
from tests.ui.conftest import running, settle


async def test_bridge_batches_log_lines_and_flushes_before_the_end():
    posted: list = []
    bridge = EventBridge(flush_interval=0.01, max_pending=1000)
    bridge.bind(posted.append)
    for i in range(300):  # 300 chunks of 10 lines, two runs interleaved
        bridge(ev.LogLinesReceived("a", "ra", [f"a{i}-{k}" for k in range(10)]))
        bridge(ev.LogLinesReceived("b", "rb", [f"b{i}-{k}" for k in range(10)]))
    bridge(ev.RunEnded("a", "ra", "succeeded", 0))
    assert [type(x).__name__ for x in posted] == ["LogLinesArrived", "RunEnded"]
    first = posted[0]
    assert first.run_id == "ra" and len(first.lines) == 1000 and first.dropped == 2000
    assert first.lines[-1] == "a299-9"  # the newest lines are kept
    flushed = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, flushed.set)  # after the flush window
    await flushed.wait()
    rest = posted[2:]
    assert len(rest) == 1 and rest[0].run_id == "rb" and rest[0].lines[-1] == "b299-9"
    assert bridge.lines_seen == 6000


async def test_bridge_translates_events():
    posted: list = []
    bridge = EventBridge()
    bridge.bind(posted.append)
    bridge(ev.StatusChanged("x", "done", "ok"))
    bridge(ev.HostStateChanged(None, "h", "reconnecting", "reset"))
    bridge(ev.LogStreamChanged("x", "r1", "reconnecting", "h", "reset"))
    bridge(ev.Notice("x", "x: something else"))
    for pct in range(10, 60, 10):  # progress floods too: only the latest per flush is posted
        bridge(ev.Progress("x", f"{pct}%", {"done": pct}))
    bridge(ev.Progress("y", "1%"))
    assert [type(x) for x in posted] == [m.ItemStatusChanged, m.HostStateChanged,
                                         m.LogStreamChanged, m.NoticePosted]
    assert posted[2].state == "reconnecting"
    bridge.flush()
    assert [(x.item_id, x.message) for x in posted[4:]] == [("x", "50%"), ("y", "1%")]
    # superseded copies of high-rate messages are dropped from the queue
    assert m.ProgressReported("x", "60%").can_replace(m.ProgressReported("x", "50%"))
    assert not m.ProgressReported("y", "60%").can_replace(m.ProgressReported("x", "50%"))
    bridge.unbind()
    bridge(ev.StatusChanged("x", "failed"))  # after unbind: ignored
    assert len(posted) == 6


async def test_log_pane_bounded_follow_search_and_sanitized(campaign):
    plan, store = campaign
    async with running(plan, store) as (app, pilot, _):
        pane = app.query_one(LogPane)
        pane.show_run("train-v5", Run("r", "train-v5", host="gpu1", state="running"), [])
        for i in range(12):  # 12 flushes of 1000 lines: more than the pane keeps
            app.post_message(m.LogLinesArrived("train-v5", "r",
                                               [f"line {i * 1000 + k}" for k in range(1000)]))
        app.post_message(m.LogLinesArrived("train-v5", "other", ["not shown"]))
        app.post_message(m.LogLinesArrived("train-v5", "r", ["\x1b[31mred\x1b[0m \x07bell"]))
        await pilot.pause()
        log = pane.log
        assert log.line_count == MAX_LINES
        assert log.lines[-1] == "red \ufffdbell"  # no escape sequence reaches the terminal
        assert "not shown" not in log.lines
        assert log.lines[-2] == "line 11999" and log.is_vertical_scroll_end
        log.focus()
        await pilot.press("f")
        assert pane.follow is False and log.auto_scroll is False
        await pilot.press("slash", *"line 1100", "enter")
        await pilot.pause()
        assert pane.matches and log.lines[pane.matches[pane.match_index]].startswith("line 1100")
        first = pane.match_index
        await pilot.press("n")
        assert pane.match_index == (first + 1) % len(pane.matches)
        await pilot.press("escape")
        assert pane.query_text == "" and not pane.matches
        await pilot.press("f")
        assert pane.follow and log.is_vertical_scroll_end


async def test_flood_through_a_real_run_is_batched(live_plan):
    """A run printing 20k lines at once reaches the app in a few batches, not 20k messages."""
    plan, store = live_plan
    import dataclasses

    item = plan.item("hello")
    flood = dataclasses.replace(item.action.params, command="seq 1 20000")
    plan = dataclasses.replace(plan, items=tuple(
        dataclasses.replace(it, action=dataclasses.replace(it.action, params=flood))
        if it.id == "hello" else it for it in plan.items))
    async with running(plan, store) as (app, pilot, seen):
        app.query_one(PlanPane).select("hello")
        await pilot.press("r", "y")
        await settle(pilot)
        batches = [x for x in seen if isinstance(x, m.LogLinesArrived)]
        assert sum(len(x.lines) + x.dropped for x in batches) == 20000
        assert len(batches) < 50
        assert app.query_one(LogPane).log.lines[-1] == "20000"
        assert store.run(batches[0].run_id).log_lines == 20000


async def test_selecting_a_streaming_run_shows_each_line_once(campaign):
    """Lines the bridge still holds are already stored: the pane must not show them twice."""
    from tests.ui.conftest import T0, add_run

    plan, store = campaign
    log = "".join(f"line {i}\n" for i in range(1, 11))
    rid = add_run(store, "cleanup", 1, "running", "gpu1", start=T0, seconds=0, log=log)
    async with running(plan, store, reconcile=False) as (app, pilot, _):
        assert app.selected == "cleanup"  # reopened on the live run
        app.query_one(PlanPane).select("venv")
        await settle(pilot)
        app.bridge(ev.LogLinesReceived("cleanup", rid, ["line 9", "line 10"]))  # in flight
        app.query_one(PlanPane).select("cleanup")
        await settle(pilot)
        app.bridge(ev.LogLinesReceived("cleanup", rid, ["line 11"]))
        app.bridge.flush()
        await pilot.pause()
        assert app.query_one(LogPane).log.lines == [f"line {i}" for i in range(1, 12)]


def test_gpu_parsing_and_badge():
    """nvidia-smi's CSV (core.capsules.telemetry's query: index, name, utilisation, memory,
    power, temperature, uuid) read into GPUs, and the hosts bar's badge of them."""
    import dataclasses

    from core.capsules.telemetry import parse_gpus
    from console.widgets.hosts_bar import gpu_text

    out = ("0, NVIDIA H100 80GB HBM3, 45, 10240, 81559, 301.20, 51, GPU-a\n"
           "1, NVIDIA H100 80GB HBM3, 95, 70000, 81559, [N/A], 60, GPU-b\n"
           "N/A, [Not Supported], 1, 2\n")
    gpus = [dataclasses.asdict(g) for g in parse_gpus(out)]
    assert [{k: g[k] for k in ("index", "util", "mem_used", "mem_total")} for g in gpus] == [
        {"index": 0, "util": 45, "mem_used": 10240, "mem_total": 81559},
        {"index": 1, "util": 95, "mem_used": 70000, "mem_total": 81559}]
    assert gpu_text(gpus[:1]).plain == " gpu 45% 10.0/80G"
    assert gpu_text(gpus).plain == " 2 gpus 70% 78.4/159G"
    assert parse_gpus("") == [] and parse_gpus("bash: nvidia-smi: command not found") == []
    gpus[0]["util"] = gpus[1]["util"] = None  # [N/A] utilisation: said, not counted as 0
    assert gpu_text(gpus).plain == " 2 gpus n/a 78.4/159G"


async def test_log_pane_says_a_progress_record_as_the_cli_does(campaign, capsys):
    """A progress record (core.ml.formats.runio's emitter, as codemodel prints it) reads in the log
    pane as the CLI's progress line says it, then its loss: no ``tokens_per_s 1.17e+04``."""
    from core.ml.formats.runio import emit
    from core.capsules.progress import describe

    emit("progress", task="codemodel", done=58, total=300, unit="steps", tokens_per_s=11703.2,
         eta_s=21.2, loss=2.3412)
    line = capsys.readouterr().out.strip()
    assert describe(line) == "codemodel: 58/300 steps, 11,703 tokens/s, ETA 0m21s"
    plan, store = campaign
    async with running(plan, store, size=(200, 40)) as (app, pilot, _):
        pane = app.query_one(LogPane)
        pane.show_run("train-v5", Run("r", "train-v5", host="gpu1", state="running"), [])
        assert pane.append("r", [line])
        await pilot.pause()
        shown = " ".join(str(x).strip() for x in pane.log.lines)
        assert shown == f"{describe(line)} · loss 2.341", shown
        assert "tokens_per_s" not in shown and "event" not in shown
