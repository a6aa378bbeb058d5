"""The console's side of adopting: `A` never launches an in_progress item with no known run,
`a` on the item adopts a running process from the item pane, `x` stops it; a stop pressed
while a run is starting leaves no process behind."""

from __future__ import annotations

import asyncio
import subprocess

from console import messages as m
from console.screens.adopt import AdoptModal
from console.screens.confirm import ConfirmModal
from console.widgets.item_detail import ItemDetail
from core.plans.planfile import load_plan
from core.state.store import Store
from tests.ui.conftest import process_alive, running, settle, wait_for

PLAN = """\
name: adopt-ui
hosts:
  here: {{local: true, workdir: {root}/wd}}
items:
  - id: train-v4
    content: v4, started by hand last week
    status: in_progress
    action: {{kind: shell, host: here, params: {{command: "touch LAUNCHED; sleep 300"}}}}
  - id: slow
    content: a slow start
    needs: [train-v4]
    action: {{kind: shell, host: here, params: {{command: "echo $$$$ > started.pid; exec sleep 300"}}}}
"""


def _setup(tmp_path):
    (tmp_path / "wd").mkdir()
    path = tmp_path / "p.yaml"
    path.write_text(PLAN.format(root=tmp_path))
    return load_plan(path), Store(str(tmp_path / "state.db"))


async def test_run_all_skips_then_adopt_from_the_item_pane_and_stop(tmp_path):
    plan, store = _setup(tmp_path)
    log = tmp_path / "wd" / "v4.log"
    proc = subprocess.Popen(["bash", "-c", "for i in $(seq 1 100000); do echo \"line $i\"; "
                             "sleep 0.05; done"], stdout=open(log, "wb"), start_new_session=True)
    try:
        async with running(plan, store, select="train-v4") as (app, pilot, seen):
            shown = "\n".join(line.text for line in app.query_one("#detail-body").render_lines(
                app.query_one("#detail-body").region.reset_offset))
            assert "(started outside it?): a adopts it" in " ".join(shown.split())
            await pilot.press("A")  # run all: train-v4 is not launched a second time
            await settle(pilot)
            assert store.runs_for_item("train-v4") == [] and store.runs_for_item("slow") == []
            assert not (tmp_path / "wd" / "LAUNCHED").exists()
            assert any(isinstance(x, m.NoticePosted) and "specdeck adopt" in x.message
                       and x.item_id == "train-v4" for x in seen)

            await pilot.press("a")
            await pilot.pause()
            assert isinstance(app.screen, AdoptModal)
            await pilot.press(*"pid nope", "enter", "enter")  # typo: said in the modal
            await pilot.pause()
            assert isinstance(app.screen, AdoptModal)
            assert "pid 12345" in str(app.screen.query_one("#adopt-error").render())
            app.screen.query_one("#adopt-what").value = f"pid {proc.pid}"
            app.screen.query_one("#adopt-log").value = str(log)
            await pilot.press("enter")
            started = await wait_for(seen, m.RunStarted, lambda x: x.item_id == "train-v4",
                                     pilot=pilot)
            await wait_for(seen, m.LogLinesArrived, lambda x: x.run_id == started.run_id,
                           pilot=pilot)
            assert store.run(started.run_id).launcher == "adopt:pid"
            assert app.query_one(ItemDetail).live.id == started.run_id

            await pilot.press("x")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmModal)
            await pilot.press("y")
            ended = await wait_for(seen, m.RunEnded, lambda x: x.run_id == started.run_id,
                                   pilot=pilot)
            await settle(pilot)
            assert ended.state == "stopped" and app.statuses["train-v4"] == "stopped"
            proc.wait(10)
            assert not process_alive(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
        store.close()


async def test_stop_pressed_while_starting_leaves_no_process(tmp_path, slow_starts):
    plan, store = _setup(tmp_path)
    launching = slow_starts
    store.set_status("train-v4", "done")
    try:
        async with running(plan, store, select="slow") as (app, pilot, seen):
            await pilot.press("r", "y")  # run, confirmed (enter only inspects)
            deadline = asyncio.get_running_loop().time() + 30
            while not launching.is_set():
                assert asyncio.get_running_loop().time() < deadline, "the run never launched"
                await pilot.pause()
            assert store.live_run("slow").state == "starting"
            await pilot.press("x")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmModal)
            await pilot.press("y")
            starting = store.live_run("slow")
            deadline = asyncio.get_running_loop().time() + 30
            while store.run(starting.id).error != "stop requested":
                assert asyncio.get_running_loop().time() < deadline, "the stop was never asked"
                await pilot.pause()
            launching.release.set()  # the start goes on only once the stop was asked for
            await settle(pilot)
            run = store.latest_run("slow")
            assert run.state == "stopped" and app.statuses["slow"] == "stopped"
            pid = int((tmp_path / "wd" / "started.pid").read_text())
            assert not process_alive(pid)
    finally:
        store.close()
