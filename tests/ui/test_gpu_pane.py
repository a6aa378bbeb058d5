"""The GPUs pane (6): a host's four GPUs from a fake ``nvidia-smi`` first on the local host's
PATH (tests/fakegpu.py), one row each with its history, processes and the disk; a train run
whose GPU falls idle raises one stall alert the console shows; a host without nvidia-smi
gets a pane that says so, and nothing fails."""

from __future__ import annotations

import os
import sys

import pytest
from textual.worker import Worker, WorkerState

from console import messages as m
from console.widgets.gpu_pane import GpuPane
from console.widgets.hosts_bar import HostsBar
from core.plans.planfile import load_plan
from core.state.store import Store
from tests import fakegpu
from tests.ui.conftest import running, settle, wait_for

pytestmark = pytest.mark.ui

PLAN = """
name: gpus
hosts:
  box: {{local: true, workdir: {root}/box, python: {py}}}
telemetry: {{every: 0.2, idle_minutes: 0.01}}
items:
  - id: train
    content: A trainer that runs until the test lets it end
    action: {{kind: train, host: box, params: {{command: "until [ -e {root}/go ]; do sleep 0.1; done", out: out}}}}
"""


@pytest.fixture
def gpu_plan(tmp_path):
    (tmp_path / "box").mkdir()
    path = tmp_path / "gpus.yaml"
    path.write_text(PLAN.format(root=tmp_path, py=sys.executable))
    store = Store(tmp_path / "state.db")
    yield load_plan(path), store
    store.close()
    (tmp_path / "go").touch()  # a failed test leaves no trainer waiting on the host


def _failed_workers(seen) -> list[str]:
    return [f"{x.worker.name}: {x.worker.error!r}" for x in seen
            if isinstance(x, Worker.StateChanged) and x.state == WorkerState.ERROR]


async def test_four_gpus_in_the_pane_and_one_stall_alert(gpu_plan, tmp_path, monkeypatch):
    bin_dir = tmp_path / "fakebin"
    fakegpu.install(bin_dir, idle_after=3)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    plan, store = gpu_plan
    async with running(plan, store, size=(170, 48), gpu_every=1.5) as (app, pilot, seen):
        await wait_for(seen, m.GpuSampled, lambda x: x.sample is not None, pilot=pilot)
        await settle(pilot)
        pane = app.query_one(GpuPane)
        assert pane.display and pane.region.height >= 6  # a wide terminal makes room for it
        text = pane.text().plain
        rows = [ln for ln in text.splitlines() if "H100 80GB HBM3" in ln]
        assert len(rows) == 4, text
        assert [r.split()[0] for r in rows] == ["0", "1", "2", "3"]
        assert text.splitlines()[0].startswith("box · 4 GPUs · disk ") and "GiB free of" in text
        assert "60.0/79.6G" in rows[0] and "312 W" in rows[0] and "61°C" in rows[0]
        assert "41213 python3 59.5G" in rows[0]
        assert "n/a" in rows[3]  # power.draw [N/A]
        assert "4 gpus" in str(app.query_one(HostsBar).render())
        await pilot.press("6")
        await settle(pilot)
        assert app.current == "gpus" and app.screen.focused is pane

        fakegpu.install(bin_dir, idle_after=4)  # count again: GPU 2 busy as the run starts
        app.start_item("train", False)
        notice = await wait_for(seen, m.NoticePosted, lambda x: "stall" in x.message,
                                timeout=30, pilot=pilot)
        assert "GPU 2" in notice.message and notice.level == "warning"
        await pilot.pause(1.0)  # a few more samples of the idle GPU: raised once all the same
        (tmp_path / "go").touch()
        await wait_for(seen, m.RunEnded, lambda x: x.item_id == "train", timeout=30, pilot=pilot)
        await settle(pilot)
        await wait_for(seen, m.GpuSampled, lambda x: x.history.get(2) and x.history[2][-1] == 0,
                       pilot=pilot)
        await settle(pilot)
        row2 = [ln for ln in pane.text().plain.splitlines() if ln.startswith(" 2 ")][0]
        assert "  0 %" in row2 and "█" in row2 or "▇" in row2, row2  # busy, then idle: drawn
        assert len([x for x in seen if isinstance(x, m.NoticePosted) and "stall" in x.message]) == 1
        alerts = store.events(kinds=["alert"])
        assert len(alerts) == 1 and alerts[0].data == {"alert": "gpu_idle"}, alerts
        assert not _failed_workers(seen)


async def test_a_host_without_nvidia_smi_gets_a_pane_that_says_so(gpu_plan, monkeypatch):
    dirs = [d for d in os.environ["PATH"].split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "nvidia-smi"))]
    monkeypatch.setenv("PATH", os.pathsep.join(dirs))
    plan, store = gpu_plan
    async with running(plan, store, size=(170, 48), gpu_every=1.5) as (app, pilot, seen):
        msg = await wait_for(seen, m.GpuSampled, lambda x: x.sample is not None, pilot=pilot)
        assert msg.gpus is None and msg.sample["no_gpus"] == "no nvidia-smi on this host"
        await settle(pilot)
        pane = app.query_one(GpuPane)
        assert not pane.display  # no GPU anywhere: the wide layout keeps its room for the rest
        assert "gpu" not in str(app.query_one(HostsBar).render()).split("box", 1)[1]
        await pilot.press("6")
        await settle(pilot)
        assert pane.display and app.current == "gpus"
        text = pane.text().plain
        assert text.startswith("box · no nvidia-smi on this host (no GPU telemetry) · disk "), text
        assert not _failed_workers(seen)
