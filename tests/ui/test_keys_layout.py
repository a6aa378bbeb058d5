"""Keys that never launch by accident, vim motion, follow mode, the layout at any size, and
"meanwhile" after an unclean exit (the console process killed)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from console import messages as m
from console.screens.confirm import ConfirmModal, launch_facts, plain, run_text
from console.widgets.item_detail import ItemDetail
from console.widgets.log_pane import LogPane, pretty_json
from console.widgets.metrics_pane import MetricsPane, ema, families
from console.widgets.plan_list import PlanPane
from core.plans.plan import params_summary
from core.plans.planfile import load_plan
from core.state.records import Run
from core.state.store import Store
from tests.ui.conftest import ROOT, build, pick, process_alive, running, settle, wait_for

TRAIN = """\
name: keys
hosts:
  gpu1: {{local: true, workdir: {root}/gpu1}}
  gpu2: {{local: true, workdir: {root}/gpu2}}
items:
  - id: prep
    content: Prepare
    action: {{kind: shell, host: gpu1, params: {{command: "echo prep"}}}}
  - id: train
    content: Train the drafter on two GPUs
    needs: [prep]
    action:
      kind: train
      host: gpu1
      params:
        launcher: torchrun
        nproc_per_node: 2
        command: "echo '{{\\"step\\": 1, \\"loss\\": 2.5}}'"
  - id: eval
    content: Evaluate
    needs: [train]
    action: {{kind: shell, host: gpu2, params: {{command: "echo eval"}}}}
"""


@pytest.fixture
def go(tmp_path):
    """The file that lets the tests' waiting shell commands finish; touched at teardown too,
    so that a failing test leaves no process behind on the host."""
    path = tmp_path / "here" / "go"
    yield path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def of(messages, kind, **match):
    return [x for x in messages if isinstance(x, kind)
            and all(getattr(x, k) == v for k, v in match.items())]


def keys_plan(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(TRAIN.format(root=tmp_path))
    return load_plan(path)


async def test_r_on_a_train_item_confirms_with_host_and_launcher(tmp_path):
    plan = keys_plan(tmp_path)
    store = Store(str(tmp_path / "state.db"))
    store.set_status("prep", "done")
    async with running(plan, store, select="train") as (app, pilot, seen):
        await pilot.press("r")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ConfirmModal) and modal.title_text == "Run train (attempt 1)?"
        body = modal.body
        for fact in ("kind       train", "host       gpu1", "launcher   torchrun",
                     "2 GPU workers: nproc_per_node 2 × 1 node (gpu1)",
                     """command    echo '{"step": 1, "loss": 2.5}'"""):
            assert fact in body, (fact, body)
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmModal)
        assert not store.runs_for_item("train") and not of(seen, m.RunStarted)
        await pilot.press("r")
        await pilot.pause()
        await pilot.press("y")
        await settle(pilot)
        runs = store.runs_for_item("train")
        assert len(runs) == 1 and runs[0].state == "succeeded"
        assert runs[0].launcher == "torchrun"
        assert len(of(seen, m.RunStarted, item_id="train")) == 1
        assert store.metric_series(runs[0].id, "loss") == [(1, 2.5)]
    store.close()


def test_launch_facts_for_slurm_and_ml_kinds(tmp_path):
    """Every kind that launches on a host names its launcher, resources and command."""
    text = TRAIN.format(root=tmp_path).replace(
        """        launcher: torchrun
        nproc_per_node: 2""", """        launcher: slurm
        slurm: {partition: gpu, nodes: 2, gpus_per_node: 8, time: "12:00:00"}""")
    path = tmp_path / "slurm.yaml"
    path.write_text(text)
    plan = load_plan(path)
    item = plan.item("train")
    facts = dict(launch_facts(item, params_summary(item), True))
    assert facts["launcher"] == "slurm"
    assert facts["resources"] == "sbatch partition=gpu, nodes=2, gpus_per_node=8, time=12:00:00"
    shell = plan.item("eval")
    facts = dict(launch_facts(shell, params_summary(shell), True))
    assert facts == {"kind": "shell", "host": "gpu2", "launcher": "detached capsule (setsid)",
                     "resources": "one process", "command": "echo eval"}
    title, body = run_text(shell, params_summary(shell), True, 3, "failed")
    assert title == "Run eval again (attempt 3)?" and "attempt    3 (its last attempt failed)" in body
    # params as an operator writes them, never a Python repr
    assert plain({"train": {"lr": 3e-4, "max_steps": 100}, "tags": ["a", "b"]}) == \
        "train.lr=0.0003, train.max_steps=100, tags=a, b"


async def test_vim_motion_moves_the_cursor(campaign):
    plan, store = campaign
    async with running(plan, store) as (app, pilot, _):
        ids = [it.id for it in plan.items]
        assert app.selected == ids[0]
        await pilot.press("j", "j")
        await settle(pilot)
        assert app.selected == ids[2]
        await pilot.press("k")
        await settle(pilot)
        assert app.selected == ids[1]
        await pilot.press("G")
        await settle(pilot)
        assert app.selected == ids[-1]
        await pilot.press("g")
        await settle(pilot)
        assert app.selected == ids[0]
        await pilot.press("ctrl+d")
        await settle(pilot)
        assert ids.index(app.selected) > 1
        # the tau table moves the same way
        await pilot.press("4")
        await settle(pilot)
        table = app.query_one("#tau-table")
        await pilot.press("j", "j", "j")
        assert table.cursor_row == 3
        await pilot.press("k")
        assert table.cursor_row == 2
        await pilot.press("G")
        assert table.cursor_row == table.row_count - 1
        # and the log scrolls
        await pilot.press("1", "g")
        await pick(pilot, "train-v5")
        await pilot.press("2")
        await settle(pilot)
        log = app.query_one("#log")
        await pilot.press("g")
        await pilot.pause()
        assert log.scroll_y == 0
        await pilot.press("j", "j")
        await pilot.pause()
        assert log.scroll_y == 2


def _chain_item(item_id: str, content: str, need: str | None, command: str) -> str:
    """One item of :data:`FOLLOW`'s chain: shell ``command`` on ``here`` after ``need``
    (braces left doubled: FOLLOW is a ``str.format`` template)."""
    needs = f"    needs: [{need}]\n" if need else ""
    return (f"  - id: {item_id}\n    content: {content}\n{needs}"
            '    action: {{kind: shell, host: here, params: {{command: "' + command + '"}}}}\n')


FOLLOW = """\
name: follow
hosts:
  here: {{local: true, workdir: {root}/here}}
items:
""" + "".join(_chain_item(*it) for it in [
    ("a", "first", None, "echo a"),
    ("b", "second", "a", "echo b; while [ ! -e go ]; do sleep 0.02; done"),  # held until the test says go
    ("c", "third", "b", "echo c"),
    ("d", "fourth", "c", "echo d"),
])
"""A chain a -> b -> c -> d of shell items on a local host; b waits for a ``go`` file."""


async def test_follow_mode_selects_each_new_run_during_A_until_a_key(tmp_path, go):
    path = tmp_path / "follow.yaml"
    path.write_text(FOLLOW.format(root=tmp_path))
    plan = load_plan(path)
    store = Store(str(tmp_path / "state.db"))
    async with running(plan, store, select="d") as (app, pilot, seen):
        at = len(seen)
        await pilot.press("A")
        try:
            started = await wait_for(seen, m.RunStarted, lambda x: x.item_id == "b",
                                     pilot=pilot, timeout=60)
        except AssertionError as e:  # say what the runs did (a slow, loaded machine?)
            runs = {i: (r.state, r.error) for i in "ab" if (r := store.latest_run(i))}
            raise AssertionError(f"{e}; statuses {store.item_statuses()}; runs {runs}") from e
        await wait_for(seen, m.LogLoaded, lambda x: x.item_id == "b", pilot=pilot)
        await pilot.pause()
        # each run, as it started, moved the cursor to its item (before the next one started)
        events: list = []
        for x in seen[at:]:  # (the hook sees a message once per node it bubbles through)
            if isinstance(x, (m.RunStarted, PlanPane.ItemSelected)):
                e = (type(x).__name__, x.item_id)
                if not events or events[-1] != e:
                    events.append(e)
        assert events == [("RunStarted", "a"), ("ItemSelected", "a"),
                          ("RunStarted", "b"), ("ItemSelected", "b")], events
        assert app.selected == "b" and app.query_one(PlanPane).selected == "b"
        assert app.query_one(LogPane).run_id == started.run_id  # the log follows too
        assert app.following
        # the run of b waits for "go": press a key meanwhile, then let it finish
        await pilot.press("k")
        await pilot.pause()
        assert not app.following and app.selected == "a"
        go.touch()
        for item in ("c", "d"):
            await wait_for(seen, m.RunEnded, lambda x, i=item: x.item_id == i, pilot=pilot)
        await settle(pilot)
        assert app.selected == "a"  # no longer following: the cursor stayed where the key put it
        assert [store.latest_run(i).state for i in "abcd"] == ["succeeded"] * 4
    store.close()


async def test_reopen_puts_the_cursor_on_the_most_recent_live_run(campaign):
    from tests.ui.conftest import T0, add_run

    plan, store = campaign
    add_run(store, "cleanup", 1, "running", "gpu1", start=T0 + 9000, seconds=0, log="x\n")
    add_run(store, "eval-base", 2, "running", "gpu2", start=T0 + 9500, seconds=0, log="y\n")
    async with running(plan, store, reconcile=False) as (app, pilot, _):
        assert app.selected == "eval-base"
        assert app.query_one(LogPane).run_id == "eval-base-0101-02"


async def test_layout_at_80x24_every_pane_reachable_and_log_readable(campaign):
    plan, store = campaign
    async with running(plan, store, select="train-v5", size=(80, 24)) as (app, pilot, _):
        assert app.compact and app.query_one("#tabs").display
        log = app.query_one("#log")
        assert log.region.height >= 8 and log.region.width >= 40
        # the focus cycle reaches every pane, each shown with room to read
        for _ in range(5):
            await pilot.press("tab")
            await settle(pilot)
            box = app.query_one({"plan": "#plan", "detail": "#detail", "log": "#logpane",
                                 "metrics": "#metrics", "tau": "#tau"}[app.current])
            assert box.display and box.region.height >= 10 and box.region.width >= 30, (
                app.current, box.region)
        visited = []
        for key in "12345":
            await pilot.press(key)
            await settle(pilot)
            visited.append(app.current)
        assert visited == ["plan", "log", "metrics", "tau", "detail"]
        # z fills the screen with the focused pane, and back
        await pilot.press("3", "z")
        await settle(pilot)
        metrics = app.query_one("#metrics")
        assert app.zoomed == "metrics" and metrics.region.width == 80
        assert metrics.region.height == 24 - 2  # all but the hosts bar and the footer
        assert not app.query_one("#plan").display
        await pilot.press("z")
        await settle(pilot)
        assert app.zoomed is None and app.query_one("#plan").display
        # the terminal grows: every pane at once, no tabs; and back
        await pilot.resize_terminal(140, 45)
        await settle(pilot)
        assert not app.compact and not app.query_one("#tabs").display
        assert all(app.query_one(b).display for b in ("#plan", "#detail", "#logpane",
                                                      "#metrics", "#tau"))
        await pilot.resize_terminal(80, 24)
        await settle(pilot)
        assert app.compact and app.query_one("#tabs").display
        assert not app.query_one("#tau").display or not app.query_one("#logpane").display


async def test_empty_panes_give_their_rows_away(live_plan):
    """A plan without eval results or curves: no rows spent on tau or curves when wide."""
    plan, store = live_plan
    async with running(plan, store, size=(160, 50)) as (app, pilot, _):
        assert not app.compact
        assert not app.query_one("#tau").display and not app.query_one("#metrics").display
        assert app.query_one("#logpane").region.height == 50 - 2
        notes: list = []
        app.notify = lambda message, **kw: notes.append(message)
        await pilot.press("4")  # an empty pane is not focused (hidden), it says why
        await settle(pilot)
        assert app.current == "plan" and notes == ["no eval results yet"]
        await pilot.press("r", "y")  # hello logs metrics: the curves appear
        await settle(pilot)
        await settle(pilot)
        assert app.query_one("#metrics").display and not app.query_one("#tau").display


async def test_manual_done_detail_and_unambiguous_dates(live_plan, utc):
    plan, store = live_plan
    store.set_status("tick", "done")
    async with running(plan, store, select="tick") as (app, pilot, _):
        d = app.query_one(ItemDetail)
        assert d.check[0] == "done" and "blocked" not in str(d.query_one("#detail-body").render())
    from console.widgets.item_detail import run_line

    line = run_line(Run("r", "i", attempt=2, state="failed", exit_code=1, started_at=1767225600.0,
                        ended_at=1767225700.0, error="x" * 500))
    assert "2026-01-01 00:00" in line.plain and "x" * 500 in line.plain  # never cut


def test_json_lines_pretty_and_curves_helpers():
    lines = pretty_json('{"step": 20, "loss": 3.14159, "acc": [0.61, 0.4], "lr": 0.0006, '
                        '"eta_s": 31.5}', 30)
    # the summary the CLI prints (core.capsules.progress), then the record's other fields
    assert lines[0].startswith("step 20, loss 3.1416") and all(len(x) <= 30 for x in lines)
    assert lines[1].startswith("    ") and "ETA 0m31s · acc 0.61 0.4 · lr 0.0006" in " ".join(
        x.strip() for x in lines)
    assert pretty_json("not json {", 30) is None and pretty_json("[1, 2]", 30) is None
    assert families({"loss", "elapsed_s", "eta_s", "lr"}) == ["loss", "lr"]
    assert families({"loss", "elapsed_s", "eta_s"}, bookkeeping=True) == [
        "loss", "elapsed_s", "eta_s"]
    sm = ema([1.0, 0.0, 1.0, 0.0], 0.5)
    assert sm[0] == 1.0 and 0.0 < min(sm) and max(sm[1:]) < 1.0
    assert ema([1.0, 2.0], 0.0) == [1.0, 2.0]


async def test_curve_controls(campaign):
    plan, store = campaign
    store.add_metrics("train-v5-0101-02", [(s, "elapsed_s", s * 3.6) for s in
                                           range(50, 1001, 50)])
    async with running(plan, store, select="train-v5") as (app, pilot, _):
        pane = app.query_one(MetricsPane)
        assert "elapsed_s" not in pane.families
        await pilot.press("3", "v", "l", "w")
        await settle(pilot)
        assert pane.smooth == 0.6 and pane.log_y and pane.wall
        title = str(pane.query_one("#metrics-title").render())
        assert "ema 0.6" in title and "log y" in title and "train-v5#2" in title
        await pilot.press("b")
        assert "elapsed_s" in pane.families
        while pane.family != "elapsed_s":
            await pilot.press("m")
        assert pane.family == "elapsed_s"


async def test_the_curves_keys_say_what_they_do(campaign):
    """The curves title names each view key with what it does, taken from the key's own
    binding (so it never names a key the pane lacks: ``s`` smoothed once, ``v`` does now);
    a narrower pane drops whole keys, never a word, and pressing a named key does it."""
    from rich.cells import cell_len

    from console.widgets.metrics_pane import view_keys

    plan, store = campaign
    async with running(plan, store, select="train-v5") as (app, pilot, _):
        pane = app.query_one(MetricsPane)
        await pilot.press("3")
        await settle(pilot)
        head = str(pane.query_one("#metrics-title").render()).split("\n")[0]
        keys = head[head.index("m next metric"):]
        assert keys.split("  ") == ["m next metric", "v smooth", "l log y", "w step/time",
                                    "b bookkeeping"], head
        described = {b.key: b.description.lower() for b in pane.BINDINGS}
        for unit in keys.split("  "):
            key, word = unit.split(" ", 1)
            assert described[key] == word  # the key is the pane's, and does what it says
        await pilot.press("v")
        await settle(pilot)
        assert pane.smooth == 0.6
    narrow = view_keys(MetricsPane.BINDINGS, 30, tau=True).plain
    assert narrow == "m next metric  t tau at step" and cell_len(narrow) <= 30
    assert view_keys(MetricsPane.BINDINGS, 12, tau=False).plain == ""  # no room: no half key


@pytest.mark.parametrize("which", ["example", "campaign"])
async def test_the_footer_shows_whole_keys_at_80x24(campaign, which):
    """At 80x24, whichever pane has the keys, each key the footer shows is whole and left of
    the palette's key (it read ``? Hel▏^p paletteQ``); the ones hidden to make room are the
    zoom and help keys the tabs line names, then the rightmost; at 120x40 all show."""
    from console.widgets.keys_footer import KeysFooter, key_width

    plan, store = campaign
    if which == "example":
        plan, store = load_plan(ROOT / "plans" / "example.yaml"), Store(":memory:")
    for size, panes in (((80, 24), ("1", "2", "3", "5")), ((120, 40), ("1",))):
        async with running(plan, store, select=plan.items[0].id, size=size) as (app, pilot, _):
            for pane in panes:
                await pilot.press(pane)
                await settle(pilot)
                await pilot.pause()
                footer = app.query_one(KeysFooter)
                keys = list(footer.query("FooterKey"))
                (palette,) = [k for k in keys if k.has_class("-command-palette")]
                shown = [k for k in keys if k.display and k is not palette]
                hidden = [k.action for k in keys if not k.display]
                assert shown and palette.display
                for k in shown:  # whole: as wide as its text, and clear of the palette's key
                    assert k.region.width == key_width(k) - k.styles.margin.width, k.key
                    assert k.region.right <= palette.region.x, (k.key, hidden)
                assert max(k.region.right for k in shown) < size[0] - 1  # the last cell free
                if size == (120, 40):
                    assert hidden == []
                    continue
                named = {"help", "zoom"} & {k.action for k in keys}
                rest = [k.action for k in keys if k is not palette and k.action not in named]
                gone = [a for a in rest if a in hidden]
                if gone:  # the tabs line names zoom and help: they give way first, then
                    assert named <= set(hidden), hidden  # the rightmost keys
                    assert rest[len(rest) - len(gone):] == gone, (rest, hidden)
    if which == "example":
        store.close()


CHILD = r"""
import sys
sys.path.insert(0, sys.argv[3])
from console.app import make_app
from core.plans.planfile import load_plan
from core.state.store import Store
plan = load_plan(sys.argv[1])
store = Store(sys.argv[2])
make_app(plan, store, gpu_every=0, autorun=True).run(headless=True, size=(100, 30))
"""

UNCLEAN = """\
name: unclean
hosts:
  here: {{local: true, workdir: {root}/here}}
items:
  - id: quick
    content: ends while the console watches
    action: {{kind: shell, host: here, params: {{command: "echo quick"}}}}
  - id: long
    content: ends after the console was killed
    action: {{kind: shell, host: here, params: {{command: "echo long; while [ ! -e go ]; do sleep 0.02; done; echo bye"}}}}
  - id: by-cli
    content: run from the CLI while no console was open
    action: {{kind: shell, host: here, params: {{command: "echo cli"}}}}
"""


async def test_unclean_exit_then_reopen_tells_each_change_once(tmp_path, go):
    path = tmp_path / "unclean.yaml"
    path.write_text(UNCLEAN.format(root=tmp_path).replace(
        "  - id: by-cli", "  - id: by-cli\n    priority: low").replace(
        "    content: run from the CLI", "    needs: [long]\n    content: run from the CLI"))
    plan = load_plan(path)
    db = tmp_path / "state.db"
    store = Store(str(db))
    store.journal("console_closed", "an older session, long ago")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(db), str(ROOT)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:  # the console shows quick's end and marks it seen; long is running
            quick, long_ = store.latest_run("quick"), store.latest_run("long")
            mark = store.seen_mark()
            ends = store.events(kinds=["run_succeeded"])
            if (quick and quick.state == "succeeded" and long_ and long_.state == "running"
                    and mark and ends and mark.event_id >= ends[-1].id):
                break
            assert child.poll() is None, child.stderr.read().decode()
            assert loop.time() < deadline, "the console did not run quick and long"
            await asyncio.sleep(0.05)
        os.killpg(child.pid, signal.SIGKILL)  # unclean: no console_closed, no last mark
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert process_alive(long_.pid)
    kinds = [e.kind for e in store.events()]
    assert kinds.count("console_opened") == 1 and kinds[-1] != "console_closed"
    # while no console is open: long ends on its host, and a CLI run ends (journalled)
    go.touch()
    store.claim_run("by-cli-0101-01", "by-cli", "shell", "here", owner="cli:1:1")
    store.end_run("by-cli-0101-01", "succeeded", exit_code=0)
    seen: list = []
    notes: list = []
    app = build(plan, store)
    async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
        app.notify = lambda message, **kw: notes.append((kw.get("title"), message))
        opened = await wait_for(seen, m.SessionOpened, pilot=pilot)
        await settle(pilot)
        assert [(c.item, c.was, c.now) for c in opened.changes] == [
            ("long", "running", "succeeded")]
        assert [e.run_id for e in opened.meanwhile] == ["by-cli-0101-01"]
        summary = [n for n in notes if n[0] and n[0].startswith("While the console")]
        assert len(summary) == 1
        title, text = summary[0]
        assert title == "While the console was closed: 2 succeeded"
        told = [ln.split(":")[0] for ln in text.splitlines()[:-1]]
        assert told == ["long", "by-cli"] and "quick" not in text
        # reopened on long (live when the store was last seen), its log drained to the end
        assert app.selected == "long" and app.query_one(LogPane).log.lines[-1] == "bye"
        assert app.query_one(LogPane).stream == "succeeded"
        await pilot.press("q")
    store.close()


async def test_json_records_wrap_again_when_the_log_gets_wider(campaign):
    plan, store = campaign
    async with running(plan, store, select="train-v5", size=(80, 24)) as (app, pilot, _):
        pane = app.query_one(LogPane)
        narrow = list(pane.log.lines)
        assert any(x.startswith("    ") for x in narrow)  # wrapped at 80x24
        assert narrow[-1] == "saved step_1000"
        await pilot.press("2", "z")  # the log fills the screen: records take one line each
        await settle(pilot)
        wide = list(pane.log.lines)
        assert len(wide) < len(narrow) and not any(x.startswith("    ") for x in wide)
        assert wide[-1] == "saved step_1000" and wide[-2].startswith("step 1000, loss 1.2283 · acc ")
        assert pane.log.scroll_y == pane.log.max_scroll_y  # still following the end
