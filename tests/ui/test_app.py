"""Pilot tests of the console on a real Store and a real Runner with local hosts.

Waiting is event-driven: ``settle`` (pilot.pause + workers.wait_for_complete) or ``wait_for``
a posted message; no test sleeps for a fixed time.
"""

from __future__ import annotations

from console import messages as m
from console.commands import COMMANDS
from console.screens.confirm import ConfirmModal
from console.screens.help import HelpScreen
from console.screens.journal import JournalScreen
from console.widgets.item_detail import ItemDetail
from console.widgets.log_pane import LogPane
from console.widgets.metrics_pane import MetricsPane
from console.widgets.plan_list import PlanPane
from console.widgets.tau_table import TauPane
from core.capsules import jobs
from core.state.records import Run
from tests.ui.conftest import add_tau_watch, build, process_alive, running, settle, wait_for


def of(messages, kind, **match):
    return [x for x in messages if isinstance(x, kind)
            and all(getattr(x, k) == v for k, v in match.items())]


async def test_select_item_shows_detail_log_and_curves(campaign):
    plan, store = campaign
    async with running(plan, store) as (app, pilot, seen):
        assert app.selected == "venv"  # the first item is highlighted on open
        await pilot.press("down", "down")
        await settle(pilot)
        assert [x.item_id for x in of(seen, PlanPane.ItemSelected)][-1] == "train-v5"
        detail = of(seen, m.ItemDetailLoaded, item_id="train-v5")[-1]
        assert [r.attempt for r in detail.runs] == [1, 2]
        assert of(seen, m.CheckFinished, item_id="train-v5")[-1].state == "ready"
        d = app.query_one(ItemDetail)
        assert d.item_id == "train-v5" and d.check == ("ready", "")
        log = app.query_one(LogPane)
        assert log.run_id == "train-v5-0101-02" and log.stream == "succeeded"
        assert log.log.lines[-1] == "saved step_1000"
        curves = app.query_one(MetricsPane)
        assert [r["label"] for r in curves.runs] == ["train-v5#1", "train-v5#2"]
        assert curves.families == ["loss", "acc", "lr"] and curves.family == "loss"
        app.query_one(MetricsPane).focus()
        await pilot.press("m")
        assert curves.family == "acc"


async def test_run_item_and_watch_status_change(live_plan):
    plan, store = live_plan
    async with running(plan, store) as (app, pilot, seen):
        assert app.selected == "hello"
        await pilot.press("r", "y")
        await settle(pilot)
        statuses = [x.status for x in of(seen, m.ItemStatusChanged, item_id="hello")]
        assert statuses == ["in_progress", "done"]
        started = of(seen, m.RunStarted, item_id="hello")[0]
        ended = of(seen, m.RunEnded, item_id="hello")[0]
        assert ended.run_id == started.run_id and ended.state == "succeeded"
        assert seen.index(started) < seen.index(ended)
        lines = [ln for x in of(seen, m.LogLinesArrived, run_id=started.run_id) for ln in x.lines]
        assert lines[0] == "hello" and len(lines) == 4
        pane = app.query_one(PlanPane)
        assert pane.statuses["hello"] == "done" and "hello" not in pane.live
        assert app.query_one(LogPane).log.lines[0] == "hello"
        assert store.metric_series(started.run_id, "loss") == [(1, 1.5), (2, 2.5), (3, 3.5)]
        await settle(pilot)
        assert [r["label"] for r in app.query_one(MetricsPane).runs] == ["hello#1"]


async def test_enter_inspects_and_never_runs(live_plan):
    """Enter on a runnable item (pending or failed) shows its detail and starts nothing."""
    plan, store = live_plan
    async with running(plan, store) as (app, pilot, seen):
        for item_id in ("hello", "broken"):
            app.query_one(PlanPane).select(item_id)
            await settle(pilot)
            app.query_one("#plan-options").focus()
            await pilot.press("enter")
            await settle(pilot)
            assert app.current == "detail" and app.query_one(ItemDetail).has_focus
            assert app.query_one(ItemDetail).item_id == item_id
            await pilot.press("escape")  # back to the plan
            await settle(pilot)
            assert app.current == "plan"
        assert not store.runs_for_item("hello") and not of(seen, m.RunStarted)
        store.claim_run("broken-0101-01", "broken", "shell", "here", owner="cli:1:1")
        store.end_run("broken-0101-01", "failed", exit_code=3)
        store.set_status("broken", "failed")
        app.action_reload()
        app.query_one(PlanPane).select("broken")
        await settle(pilot)
        await pilot.press("enter")  # a failed item: still only inspected
        await settle(pilot)
        assert len(store.runs_for_item("broken")) == 1 and not of(seen, m.RunStarted)


async def test_run_again_after_failure(live_plan):
    plan, store = live_plan
    async with running(plan, store, select="broken") as (app, pilot, seen):
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        assert app.screen.title_text == "Run broken (attempt 1)?"
        await pilot.press("y")
        await settle(pilot)
        assert app.statuses["broken"] == "failed"
        assert of(seen, m.RunEnded, item_id="broken")[0].exit_code == 3
        await pilot.press("r")  # a failed item runs again as a new attempt, asked first
        await pilot.pause()
        assert app.screen.title_text == "Run broken again (attempt 2)?"
        assert "its last attempt failed" in app.screen.body
        await pilot.press("y")
        await settle(pilot)
        assert [r.attempt for r in store.runs_for_item("broken")] == [1, 2]
        assert app.query_one(ItemDetail).runs[-1].attempt == 2
        # a done item asks too, and cancelling starts nothing
        app.query_one(PlanPane).select("hello")
        await pilot.press("r", "y")
        await settle(pilot)
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal) and "attempt 2" in app.screen.title_text
        assert "it is done" in app.screen.body
        await pilot.press("n")
        await settle(pilot)
        assert len(store.runs_for_item("hello")) == 1


async def test_stop_a_live_run_through_the_confirmation(live_plan):
    plan, store = live_plan
    async with running(plan, store, select="slow") as (app, pilot, seen):
        await pilot.press("r", "y")
        started = await wait_for(seen, m.RunStarted, lambda x: x.item_id == "slow", pilot=pilot)
        await wait_for(seen, m.LogLinesArrived, lambda x: x.run_id == started.run_id,
                       pilot=pilot)
        assert app.query_one(PlanPane).live == {"slow"}
        assert app.query_one(LogPane).stream == "following"
        pid = store.run(started.run_id).pid
        assert process_alive(pid)

        await pilot.press("x")  # cancel first: nothing is killed
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("n")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmModal) and process_alive(pid)

        await pilot.press("x")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ConfirmModal)
        assert started.run_id in modal.body and "host here" in modal.body
        assert f"pid {pid}" in modal.body and "SIGTERM" in modal.body and "SIGKILL" in modal.body
        await pilot.press("y")
        await settle(pilot)
        ended = of(seen, m.RunEnded, run_id=started.run_id)[0]
        assert ended.state == "stopped"
        assert app.statuses["slow"] == "stopped" and not app.query_one(PlanPane).live
        assert app.query_one(LogPane).stream == "stopped"
        assert not process_alive(pid)


async def test_filter_with_slash(campaign):
    plan, store = campaign
    async with running(plan, store) as (app, pilot, _):
        pane = app.query_one(PlanPane)
        await pilot.press("slash", *"eval", "enter")
        await settle(pilot)
        assert pane.shown == ["eval-v5", "eval-base"] and app.selected == "eval-v5"
        await pilot.press("slash", "backspace", "backspace", "backspace", "backspace",
                          *"skipped")
        await pilot.pause()
        assert pane.shown == ["cleanup"]
        await pilot.press("escape")
        await pilot.pause()
        assert pane.shown == [it.id for it in plan.items] and pane.filter_text == ""


async def test_mark_manual_done_and_skip(live_plan):
    plan, store = live_plan
    async with running(plan, store, select="tick") as (app, pilot, seen):
        pane = app.query_one(PlanPane)
        await pilot.press("enter")  # a manual item is not run (nor is any item on enter)
        await pilot.press("r")
        await settle(pilot)
        assert not store.runs_for_item("tick") and not isinstance(app.screen, ConfirmModal)
        app.query_one("#plan-options").focus()
        await pilot.press("d")
        await settle(pilot)
        assert of(seen, PlanPane.MarkRequested)[-1].status == "done"
        assert store.item_statuses()["tick"] == "done" and pane.statuses["tick"] == "done"
        pane.select("later")
        await settle(pilot)
        await pilot.press("s")  # an action item asks before being skipped
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("y")
        await settle(pilot)
        assert app.statuses["later"] == "skipped"
        await pilot.press("u")
        await settle(pilot)
        assert app.statuses["later"] == "pending"
        await pilot.press("d")  # an action item asks before being marked done unrun
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("escape")
        await settle(pilot)
        assert app.statuses["later"] == "pending"


async def test_help_palette_and_bindings(campaign):
    plan, store = campaign
    async with running(plan, store) as (app, pilot, _):
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = str(app.screen.sections)
        for c in COMMANDS:
            assert c.title in text and c.keys in text
        await pilot.press("escape")
        await pilot.pause()
        # every key bound anywhere in the console is in the help, and none needs ctrl+enter
        from console.app import SpecdeckApp
        from console.widgets.log_pane import LogPane as LP
        helped = text
        for cls in (SpecdeckApp, PlanPane, LP, MetricsPane, TauPane):
            for b in cls.BINDINGS:
                assert "ctrl+enter" not in b.key
                if b.action in ("cursor_down", "cursor_up", "close_search", "clear_filter"):
                    continue
                key = {"slash": "/", "question_mark": "?"}.get(b.key, b.key)
                assert key in helped, (cls.__name__, b.key)
        titles = [s.title for s in app.get_system_commands(app.screen)]
        for c in COMMANDS:
            assert c.title in titles
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert app.screen.__class__.__name__ == "CommandPalette"
        await pilot.press("escape")
        await pilot.pause()
        await app.run_action("sort_tau")  # a palette command runs the same action as its key
        assert app.query_one(TauPane).sort_column == "prompt"


async def test_tau_pane_sorts_and_flags(campaign):
    plan, store = campaign
    async with running(plan, store) as (app, pilot, _):
        tau = app.query_one(TauPane)
        rows = tau.ordered_rows
        assert [(r.prompt, r.drafter) for r in rows[:2]] == [("Σ macro", "z-lab-b8"),
                                                             ("Σ pooled", "z-lab-b8")]
        flagged = [r for r in rows if r.mismatch]
        assert flagged and all(r.drafter == "v5-b16" and r.mismatch == ("block_size",)
                               for r in flagged)
        tau.sort_by("tau", reverse=True)
        per_prompt = [r for r in tau.ordered_rows if r.group == 1]
        taus = [r.tau for r in per_prompt]
        assert taus == sorted(taus, reverse=True)
        assert all(r.group == 0 for r in tau.ordered_rows[:6])
        tau.query_one("#tau-table").focus()
        await pilot.press("O")
        per_prompt = [r.tau for r in tau.ordered_rows if r.group == 1]
        assert per_prompt == sorted(per_prompt)
        await pilot.press("space")
        assert tau.marked == [tau.ordered_rows[0].drafter]
        macro = {r.drafter: r for r in tau.ordered_rows if r.prompt == "Σ macro"}
        assert round(macro["v5"].delta, 3) == 0.75 and round(macro["v5"].pct, 1) == 125.7


async def test_hosts_bar_and_stream_states(campaign):
    plan, store = campaign
    async with running(plan, store) as (app, pilot, _):
        bar = app.query_one("#hosts")
        assert bar.states == {"gpu1": ("connected", ""), "gpu2": ("connected", "")}
        app.post_message(m.GpuSampled("gpu1", [{"index": 0, "util": 45, "mem_used": 10240,
                                                "mem_total": 81920}]))
        await pilot.pause()
        assert "gpu 45% 10.0/80G" in str(bar.render())
        # the shown run's host drops: the log pane says so
        log = app.query_one(LogPane)
        log.show_run("train-v5", Run("x", "train-v5", host="gpu1", state="running"), [])
        app.post_message(m.HostStateChanged("gpu1", "reconnecting", "connection reset"))
        await pilot.pause()
        assert log.stream == "reconnecting" and "reconnecting" in str(bar.render())
        app.post_message(m.HostStateChanged("gpu1", "connected"))
        await pilot.pause()
        assert log.stream == "following"
        app.post_message(m.RunEnded("train-v5", "x", "lost"))
        await pilot.pause()
        assert log.stream == "lost"


async def test_recovery_tells_what_happened_meanwhile(live_plan):
    plan, store = live_plan
    from core.runs.runner import Runner

    # an earlier console session closed; then a run ended (CLI), and a run whose console
    # crashed kept going on its host and ended while nobody watched
    store.journal("console_closed", "console closed")
    store.claim_run("hello-0101-01", "hello", "shell", "here", owner="cli:1:1")
    store.end_run("hello-0101-01", "succeeded", exit_code=0)
    runner = Runner(plan, store)
    host = await runner.host("here")
    from core.actions.base import Launch

    store.claim_run("broken-0101-01", "broken", "shell", "here", owner="gone:1:1")
    launched = await jobs.start(host, "broken-0101-01", Launch("exit 4"))
    store.update_run("broken-0101-01", state="running", pid=launched.pid,
                     capsule=launched.capsule)
    while (await jobs.inspect(host, launched.capsule)).state == "running":
        pass  # the command exits at once; inspect is a real round trip, not a sleep
    seen: list = []
    app = build(plan, store)
    notes: list = []
    async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
        app.notify = lambda message, **kw: notes.append((kw.get("title"), message))
        await settle(pilot)
        opened = of(seen, m.SessionOpened)[0]
        assert [(c.item, c.now) for c in opened.changes] == [("broken", "failed")]
        assert [e.run_id for e in opened.meanwhile] == ["hello-0101-01"]
        assert len(notes) == 1  # one summary, not a toast per run
        title, text = notes[0]
        assert title == "While the console was closed: 1 failed, 1 succeeded"
        assert "broken: run broken-0101-01 running → failed" in text and "hello" in text
        assert app.statuses["broken"] == "failed"
        await pilot.press("e")
        await settle(pilot)
        assert isinstance(app.screen, JournalScreen)
        assert any("broken-0101-01" in x for x in app.screen.meanwhile)
        kinds = [e.kind for e in app.screen.events]
        assert "console_opened" in kinds and "run_failed" in kinds and "run_succeeded" in kinds
        await pilot.press("escape")
        await pilot.press("q")
        await pilot.pause()
    kinds = [e.kind for e in store.events()]
    assert kinds[-1] == "console_closed"


async def test_quit_never_stops_runs_and_says_which_keep_going(live_plan):
    plan, store = live_plan
    from console.app import keep_going_text

    async with running(plan, store) as (app, pilot, seen):
        app.query_one(PlanPane).select("slow")
        await pilot.press("r", "y")
        started = await wait_for(seen, m.RunStarted, lambda x: x.item_id == "slow", pilot=pilot)
        await pilot.press("q")
        await pilot.pause()
    run = store.run(started.run_id)
    assert [r.id for r in app.keep_going] == [started.run_id]
    assert run.state == "running" and process_alive(run.pid)
    text = keep_going_text(plan, app.keep_going)
    assert f"slow: run {started.run_id} on here" in text and "specdeck attach" in text
    closed = store.events(kinds=["console_closed"])[-1]
    assert started.run_id in closed.message
    # the next console attaches to it and shows it live; stop it to clean up
    seen2: list = []
    app2 = build(plan, store)
    async with app2.run_test(size=(120, 40), message_hook=seen2.append) as pilot:
        await wait_for(seen2, m.RunStarted, lambda x: x.attached, pilot=pilot)
        app2.query_one(PlanPane).select("slow")
        await pilot.pause()
        await pilot.press("x", "y")
        await settle(pilot)
        assert of(seen2, m.RunEnded, run_id=started.run_id)[0].state == "stopped"
    assert not process_alive(run.pid)


async def test_pinned_curves_stay_overlaid(campaign):
    plan, store = campaign
    async with running(plan, store, select="train-v5") as (app, pilot, _):
        pane = app.query_one(PlanPane)
        await pilot.press("p")
        await settle(pilot)
        assert app.pinned == {"train-v5": "train-v5-0101-02"} and pane.pinned == {"train-v5"}
        pane.select("venv")  # venv logged no metrics: the pinned run's curves stay
        await settle(pilot)
        assert [r["label"] for r in app.query_one(MetricsPane).runs] == ["train-v5#2"]
        pane.select("decide")  # a manual item without runs: p refuses, nothing pinned
        await settle(pilot)
        await pilot.press("p")
        await settle(pilot)
        assert "decide" not in pane.pinned and "decide" not in app.pinned


async def test_tau_over_training_and_tau_at_step(campaign):
    """A watched train run: tau next to the loss, the tau family in the m cycle, and t
    filtering the tau table to one step (enter: the latest; a step nobody evaluated: an
    error that keeps the current filter; all: every result again)."""
    plan, store = campaign
    add_tau_watch(store)
    async with running(plan, store, select="train-v5") as (app, pilot, _):
        pane = app.query_one(MetricsPane)
        assert pane.family == "loss" and pane.families[:2] == ["loss", "tau"]
        assert "tau_baseline" not in pane.families
        assert pane.split and app.query_one("#metrics-tau").display
        await pilot.press("3", "m")
        await settle(pilot)
        assert pane.family == "tau" and not pane.split
        assert not app.query_one("#metrics-tau").display
        await pilot.press("M")
        await settle(pilot)
        assert pane.family == "loss" and app.query_one("#metrics-tau").display

        tau = app.query_one(TauPane)
        await pilot.press("t", "enter")
        await settle(pilot)
        assert app.tau_step == 1000 and tau.step == 1000
        steps = {d.step for d in tau.comparison.drafters if d.role != "baseline"}
        names = {d.label for d in tau.comparison.drafters}
        assert steps == {1000} and "train-v5@1000" in names
        assert "v5" not in names and "z-lab-b8" in names  # other steps' drafters out, baselines in

        notes = []
        app.notify = lambda msg, **kw: notes.append(msg)
        await pilot.press("t", *"123", "enter")
        await settle(pilot)
        assert app.tau_step == 1000 and any("no tau evaluated at step 123" in n for n in notes)
        # the same refusal as `specdeck compare --step 123` (tests/test_cli_compare.py::
        # test_compare_at_a_step_keeps_the_baselines_and_refuses_a_step_nobody_evaluated)
        assert any("evaluated steps: 200, 400, 600, 800, 1000" in n for n in notes), notes

        await pilot.press("t", *"400", "enter")
        await settle(pilot)
        assert tau.step == 400 and "train-v5@400" in {d.label for d in tau.comparison.drafters}
        await pilot.press("t", *"all", "enter")
        await settle(pilot)
        assert tau.step is None and "v5" in {d.name for d in tau.comparison.drafters}
        await app.run_action("tau_at_step")  # the palette command opens the same prompt
        await pilot.pause()
        assert app.query_one("#metrics-step").display
        await pilot.press("escape")
        await pilot.pause()
        assert not app.query_one("#metrics-step").display


def test_tau_chart_helpers():
    from console.widgets.metrics_pane import baselines, families, tau_steps

    runs = [{"label": "a#1", "series": {"tau": [(100, 2.0), (200, 2.5)],
                                        "tau_baseline": [(100, 3.0), (200, 3.1)]}},
            {"label": "a#2", "series": {"loss": [(1, 1.0)]}}]
    assert baselines(runs) == [("baseline", 3.1)]
    assert tau_steps(runs) == [100, 200]
    assert families({"loss", "tau", "tau_baseline", "tau_acc[0]", "lr"}) == [
        "loss", "tau", "tau_acc", "lr"]
    runs[1]["series"]["tau_baseline"] = [(5, 2.9)]
    assert baselines(runs) == [("baseline a#1", 3.1), ("baseline a#2", 2.9)]


async def test_tau_pane_shows_intervals_and_verdicts(campaign):
    """Σ macro rows carry the interval and, for drafters, the verdict against the baseline;
    the line under the title says the cursor row drafter's verdict in words."""
    plan, store = campaign
    async with running(plan, store) as (app, pilot, _):
        tau = app.query_one(TauPane)
        macro = {r.drafter: r for r in tau.ordered_rows if r.prompt == "Σ macro"}
        o = tau.comparison.overall_of("v5")
        assert macro["v5"].ci == o.macro_ci95 and macro["v5"].verdict == o.verdict
        assert macro["z-lab-b8"].verdict is None and macro["z-lab-b8"].ci is not None
        table = tau.query_one("#tau-table")
        table.focus()
        table.move_cursor(row=tau.ordered_rows.index(macro["v5"]), animate=False)
        await settle(pilot)
        line = str(tau.query_one("#tau-verdict").render())
        assert line == o.verdict_text and "v5" in line and "95 % CI" in line
