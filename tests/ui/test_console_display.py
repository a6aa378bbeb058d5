"""What the console shows is readable (issue 29, point 6): the selection is always on
screen (j, reopen), ctrl+c says how to quit in plain words, no key that changes state shares
its letter with a view toggle, the item pane gives values room, logs and events wrap alike,
events read as text, and the tau pane keeps verdicts, notes and drafter names whole."""

from __future__ import annotations

import re

import pytest

from console.widgets.plan_list import GLYPHS, PlanPane
from core.demo import open_workspace
from core.plans.planfile import load_plan
from core.state.store import Store
from tests.ui.conftest import add_run, build, pick, running, settle, T0


@pytest.fixture
def demo(tmp_path):
    """(plan, store) of the demo campaign's 15 items (long titles, long needs), no runs."""
    _, path, _ = open_workspace(str(tmp_path / "demo"), False, str(tmp_path / "s.db"))
    store = Store(":memory:")
    yield load_plan(path), store
    store.close()


def visible_lines(widget) -> list[str]:
    """The widget's lines as they are on screen now (its scroll position applied)."""
    return [widget.render_line(y).text for y in range(widget.size.height)]


def on_screen(pane: PlanPane, item_id: str) -> bool:
    """The item's title line (glyph, id) is among the plan list's visible lines."""
    title = re.compile(rf"^[{''.join(GLYPHS.values())}] {re.escape(item_id)} ")
    return any(title.match(ln) for ln in visible_lines(pane.options))


async def test_j_and_k_never_leave_the_selection_off_screen_at_120x40(demo):
    plan, store = demo
    async with running(plan, store) as (app, pilot, _):
        pane = app.query_one(PlanPane)
        seen = []
        for key in ["j"] * (len(plan.items) - 1) + ["k"] * (len(plan.items) - 1):
            await pilot.press(key)
            await settle(pilot)
            seen.append(pane.selected)
            assert on_screen(pane, pane.selected), (key, pane.selected,
                                                    visible_lines(pane.options))
        assert seen[len(plan.items) - 2] == plan.items[-1].id and seen[-1] == plan.items[0].id


async def test_reopen_scrolls_the_cursor_item_into_view(demo):
    plan, store = demo
    last = [it for it in plan.items if it.action][-1].id  # far down the list
    add_run(store, last, 1, "running", "eval", start=T0, seconds=0)
    async with running(plan, store, probe_hosts=False, reconcile=False) as (app, pilot, _):
        pane = app.query_one(PlanPane)
        assert pane.selected == last
        assert on_screen(pane, last), visible_lines(pane.options)


async def test_ctrl_c_says_how_to_quit_in_plain_words(campaign):
    plan, store = campaign
    app = build(plan, store)
    shown = []
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        real = app.notify
        app.notify = lambda message, **kw: (shown.append(message), real(message, **kw))
        await pilot.press("ctrl+c")
        await settle(pilot)
        assert app.is_running  # ctrl+c never quits
    (text,) = shown
    assert "[" not in text and re.match(r"Press (q or ctrl\+q|ctrl\+q or q) to quit", text), text


def test_no_key_that_changes_state_shares_its_letter_with_another_key():
    """r R A x a d s u act on runs and items; no pane may bind their letters to a view
    toggle (s was "skip" in the plan and "smooth" in the curves pane)."""
    from textual.widget import Widget

    import console.app as app_module
    import console.widgets.item_detail
    import console.widgets.log_pane
    import console.widgets.metrics_pane
    import console.widgets.plan_list
    import console.widgets.tau_table  # noqa: F401 (their classes are walked below)

    acting = {"run_item", "run_again", "run_all", "stop_run", "adopt", "mark"}
    owners: dict[str, set[str]] = {}
    classes = [app_module.SpecdeckApp] + [c for c in _subclasses(Widget)
                                          if c.__module__.startswith("console.")]
    for cls in classes:
        for b in getattr(cls, "BINDINGS", []):
            for key in b.key.split(","):
                owners.setdefault(key, set()).add(b.action.split("(")[0])
    state_keys = {k for k, acts in owners.items() if acts & acting}
    assert {"r", "R", "A", "x", "a", "d", "s", "u"} <= state_keys
    for key in state_keys:
        assert owners[key] <= acting, (key, owners[key])


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


async def test_the_item_pane_gives_values_room_beside_long_keys(demo):
    plan, store = demo
    async with running(plan, store) as (app, pilot, _):
        app.query_one(PlanPane).select("eval-v5")  # allow_block_size_mismatch: 25 letters
        await settle(pilot)
        body = app.query_one("#detail-body")
        lines = [ln.rstrip() for ln in visible_lines(body)]
        assert any(re.fullmatch(r" target +models/code-target", ln) for ln in lines), lines
        i = lines.index(next(ln for ln in lines if ln.strip() == "allow_block_size_mismatch"))
        assert lines[i + 1].strip() == "no"  # its value under it, the column stays narrow


LONG = "epoch 3 " + " ".join(f"batch={i} loss=0.{i:03d}" for i in range(40)) + " THE-END"
EVENT = ('{"event": "model", "layers": [{"layer": 0, "type": "full_attention"}, '
         '{"layer": 1, "type": "linear_attention"}], "ok": true, "note": null}')


@pytest.mark.parametrize("size", [(120, 40), (200, 60)])
async def test_log_lines_wrap_like_events_and_events_read_as_text(campaign, size):
    from rich.cells import cell_len

    from console.widgets.log_pane import LogPane

    plan, store = campaign
    app = build(plan, store)
    async with app.run_test(size=size) as pilot:
        await pick(pilot, "venv")
        pane = app.query_one(LogPane)
        assert pane.append(pane.run_id, [LONG, EVENT])
        await settle(pilot)
        width = pane.log.scrollable_content_region.width
        shown = [str(x) for x in pane.log.lines]
        assert all(cell_len(x) <= width for x in shown), (width, shown)
        start = shown.index(next(x for x in shown if x.startswith("epoch 3 ")))
        end = next(i for i, x in enumerate(shown) if x.endswith("THE-END"))
        assert end > start  # wrapped, not cut: every word is there
        assert " ".join(x.strip() for x in shown[start:end + 1]) == LONG
        event = " ".join(x.strip() for x in shown[end + 1:])
        assert ("layers[0].layer 0 · layers[0].type full_attention · layers[1].layer 1"
                in event and "ok true · note null" in event), event
        assert "{'" not in event and "True" not in event and "None" not in event


@pytest.mark.parametrize("size", [(120, 40), (200, 60)])
async def test_the_tau_pane_keeps_names_notes_and_verdicts_whole(campaign, size):
    from console.widgets.tau_table import TauPane
    from tests.ui.conftest import SETTINGS, eval_rows

    plan, store = campaign
    store.add_eval_results(eval_rows("eval-v5-0101-01", "train-v5@240 ddtree-8", "drafter",
                                     [[5, 3, 5, 4], [3, 4, 4, 2], [5, 4, 4, 4]],
                                     settings={**SETTINGS, "tree_budget": 8}))
    app = build(plan, store)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        tau = app.query_one(TauPane)
        table = tau.query_one("#tau-table")
        row = next(r for r in tau.ordered_rows
                   if r.drafter == "train-v5@240 ddtree-8" and r.prompt == "Σ macro")
        table.move_cursor(row=tau.ordered_rows.index(row), animate=False)
        await settle(pilot)
        lines = visible_lines(table)
        (shown,) = [ln for ln in lines if "Σ macro" in ln and "train-v5@240" in ln]
        assert "train-v5@240 ddtree-8 ⚠" in shown and "⚠ tree_budget " in shown, lines
        verdict = " ".join(ln.strip() for ln in visible_lines(tau.query_one("#tau-verdict")))
        o = tau.comparison.overall_of("train-v5@240 ddtree-8")
        assert " ".join(o.verdict_text.split()) in " ".join(verdict.split()), verdict
        assert "…" not in verdict


async def test_the_tau_pane_shows_the_temperature_of_sampled_figures(campaign):
    """A drafter sampled at T 0.7 (two seeds per prompt): the title names the temperatures, the
    drafter's line its sampling, and its prompts average their seeds."""
    from dataclasses import replace

    from console.widgets.tau_table import TauPane
    from tests.ui.conftest import SETTINGS, eval_rows

    plan, store = campaign
    sampled = {**SETTINGS, "temperature": 0.7, "top_p": 0.95, "top_k": 0, "samples": 2}
    rows = eval_rows("eval-t07-0101-01", "v5-t07", "drafter", [[3, 3], [2, 4], [4, 4]], settings=sampled)
    rows += [replace(r, settings={**sampled, "sample": 1})  # each prompt's second seed
             for r in eval_rows("eval-t07-0101-01", "v5-t07", "drafter", [[1], [1], [1]], settings=sampled)]
    store.add_eval_results(rows)
    async with running(plan, store, size=(200, 60)) as (app, pilot, _):
        tau = app.query_one(TauPane)
        title = " ".join(visible_lines(tau.query_one("#tau-title")))
        assert "T 0 / T 0.7" in title, title
        row = next(r for r in tau.ordered_rows if r.drafter == "v5-t07" and r.prompt == "Σ macro")
        tau.query_one("#tau-table").move_cursor(row=tau.ordered_rows.index(row), animate=False)
        await settle(pilot)
        verdict = " ".join(ln.strip() for ln in visible_lines(tau.query_one("#tau-verdict")))
        assert "v5-t07 sampled at T 0.7, top-p 0.95, 2 seeds per prompt" in verdict, verdict
        assert tau.comparison.cell("p1", "v5-t07").tau == 2.0  # (3 + 1) / 2: the seeds averaged


async def test_the_pk_chart_wraps_a_name_it_cannot_fit_never_cuts_it(campaign):
    """Five drafters marked for the per-position chart at 200x60: a name wider than its
    column wraps onto the next line with a ``…`` where it breaks; ``train-v5@60`` never shows
    as ``train-v5@6`` (another step), and the chart fits the rows it asks for."""
    import re

    from console.widgets.acceptance_bars import AcceptanceBars
    from console.widgets.tau_table import TauPane
    from tests.ui.conftest import eval_rows

    plan, store = campaign
    names = ("train-v5@60", "train-v5@600", "train-v5@240 ddtree-8", "train-v4@60", "v5")
    for name in names:
        store.add_eval_results(eval_rows("eval-v5-0101-01", name, "drafter",
                                         [[5, 3, 5, 4], [3, 4, 4, 2], [5, 4, 4, 4]]))
    async with running(plan, store, size=(200, 60)) as (app, pilot, _):
        tau = app.query_one(TauPane)
        table = tau.query_one("#tau-table")
        for name in names:
            row = next(r for r in tau.ordered_rows if r.drafter == name)
            table.move_cursor(row=tau.ordered_rows.index(row), animate=False)
            await pilot.press("4", "space")
            await settle(pilot)
        assert tau.marked == list(names)
        bars = tau.query_one("#tau-bars", AcceptanceBars)
        shown = visible_lines(bars)
        first = next(i for i, ln in enumerate(shown) if ln.lstrip().startswith("k1 "))
        heads = shown[1:first]  # the names' lines, between the title and k1
        assert len(heads) > 1 and "train-v5@6 " not in " ".join(heads) + " ", heads
        starts = [m.start() for m in re.finditer(r"\S+", heads[0])]
        assert len(starts) == len(names), heads[0]
        for i, name in enumerate(names):  # each column's pieces make its name whole
            pieces = [ln[starts[i]:starts[i + 1] if i + 1 < len(starts) else None].strip()
                      for ln in heads]
            pieces = [p for p in pieces if p]
            assert all(p.endswith("…") for p in pieces[:-1]), (name, pieces)
            assert "".join(p.rstrip("…") for p in pieces).replace(" ", "") == \
                name.replace(" ", ""), (name, heads)
        assert bars.rows_needed == 1 + len(heads) + 1 + 7  # title, names, k1..k7, summary
        assert bars.rows_needed <= bars.size.height
