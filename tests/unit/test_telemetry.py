"""Host telemetry on the real local host, with a fake ``nvidia-smi`` first on its PATH (the
one part that cannot exist here: tests/fakegpu.py): what a sample reads, what the store
keeps, a GPU that falls idle during a live train run raising exactly one stall alert (journal,
notice, the notifier's hook), and a host without nvidia-smi breaking nothing."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from core.capsules import telemetry
from core.capsules.telemetry import Alert, TelemetrySettings, parse_gpus, sample_host
from core.errors import PlanError
from core.hosts import LocalHost
from core.plans.planfile import parse_plan
from core.runs.events import Notice
from core.runs.runner import Runner
from core.state.store import Store
from tests import fakegpu
from tests.webhook import Webhook


@pytest.fixture
def gpus_on_path(tmp_path, monkeypatch):
    """The fake nvidia-smi first on the local host's PATH; GPU 2 idle from its 3rd query."""
    bin_dir = tmp_path / "fakebin"
    fakegpu.install(bin_dir, idle_after=2)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


@pytest.fixture
def no_gpu_path(tmp_path, monkeypatch):
    """A PATH without any nvidia-smi (the machine's own dirs, minus one that has it)."""
    dirs = [d for d in os.environ["PATH"].split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "nvidia-smi"))]
    monkeypatch.setenv("PATH", os.pathsep.join(dirs))


async def test_a_sample_reads_four_gpus_their_processes_and_the_disk(gpus_on_path, tmp_path):
    host = LocalHost("box", workdir=str(tmp_path / "wd"))
    await host.connect()
    ckpt = tmp_path / "wd" / "out" / "step_10.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"x" * 300_000)
    s = await sample_host(host, [".", "out/not-yet/deeper"], "out/step_10.pt")
    assert [g.index for g in s.gpus] == [0, 1, 2, 3] and s.no_gpus is None
    g0, g3 = s.gpus[0], s.gpus[3]
    assert (g0.name, g0.util, g0.mem_used, g0.mem_total, g0.power, g0.temp) == (
        "NVIDIA H100 80GB HBM3", 87.0, 61440.0, 81559.0, 312.45, 61.0)
    assert g3.power is None and g3.util == 89.0  # "[N/A]": no value, the rest read
    assert [(p.pid, p.used_mib, p.name) for p in g0.processes] == [
        (41213, 60928.0, "/usr/bin/python3")]
    assert [p.pid for g in s.gpus for p in g.processes] == [41213, 41214, 41215, 41216]
    st = os.statvfs(tmp_path)
    assert len(s.disks) == 2 and s.disks[0].path == str(tmp_path / "wd")
    assert s.disks[1].path == str(tmp_path / "wd/out/not-yet/deeper")  # its ancestor's fs
    assert abs(s.disks[0].free - st.f_bavail * st.f_frsize) < 64 << 20
    assert s.disks[0].total > s.disks[0].free > 0
    assert s.checkpoint_bytes is not None and 300_000 <= s.checkpoint_bytes < 400_000
    # busy for two queries, then GPU 2 falls to 0 %
    s2, s3 = await sample_host(host), await sample_host(host)
    assert [g.util for g in s2.gpus] == [87.0, 93.0, 91.0, 89.0] and s2.disks == ()
    assert [g.util for g in s3.gpus] == [87.0, 93.0, 0.0, 89.0]


async def test_without_nvidia_smi_a_sample_says_so_and_still_reads_the_disk(no_gpu_path,
                                                                            tmp_path):
    host = LocalHost("box", workdir=str(tmp_path))
    await host.connect()
    s = await sample_host(host, ["."])
    assert s.gpus == () and s.no_gpus == "no nvidia-smi on this host"
    assert len(s.disks) == 1 and s.disks[0].free > 0
    assert telemetry.describe(s.to_json()).startswith(
        "no GPU telemetry (no nvidia-smi on this host); disk ")


def test_parsing_what_nvidia_smi_prints_when_it_fails_or_lacks_a_value():
    assert parse_gpus("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                      "driver. Make sure that the latest NVIDIA driver is installed and "
                      "running.") == []
    s = telemetry.parse_sample("h", f"{telemetry.MARK} gpus\nNo devices were found\n"
                               f"{telemetry.MARK} rc 6\n{telemetry.MARK} apps\n")
    assert s.gpus == () and s.no_gpus == "nvidia-smi answered no GPU: No devices were found"
    g = parse_gpus("0, Tesla T4, [Not Supported], 3, 15360, [N/A], 40, GPU-abc\n")[0]
    assert (g.util, g.mem_used, g.power, g.mem_pct) == (None, 3.0, None, 100 * 3 / 15360)


def test_the_store_keeps_samples_history_and_raises_an_alert_once(tmp_path):
    path = tmp_path / "s.db"
    a, b = Store(path), Store(path)  # two specdecks on one state file
    gpus = parse_gpus("0, A100, 90, 100, 40960, 250.5, 55, GPU-a\n1, A100, [N/A], 1, 40960, "
                      "[N/A], 50, GPU-b\n")
    s1 = telemetry.HostSample("gpu1", 1000.0, tuple(gpus))
    a.add_telemetry(s1, run_id="r1")
    s2 = telemetry.HostSample("gpu1", 1010.0, tuple(gpus[:1]), disks=(
        telemetry.Disk("/w", 5 << 30, 10 << 30, "/"),))
    b.add_telemetry(s2, run_id="r1")
    assert a.gpu_history("gpu1", 0) == [(1000.0, 90.0, 100.0), (1010.0, 90.0, 100.0)]
    assert a.gpu_history("gpu1", 1) == [(1000.0, None, 1.0)]
    assert a.gpu_history("gpu1", 0, since=1005) == [(1010.0, 90.0, 100.0)]
    latest = a.latest_telemetry("gpu1")
    assert latest["at"] == 1010.0 and latest["run"] == "r1" and len(latest["gpus"]) == 1
    assert latest["disks"] == [{"path": "/w", "free": 5 << 30, "total": 10 << 30, "mount": "/"}]
    assert a.latest_telemetry("elsewhere") is None
    heard: list[Alert] = []
    off = telemetry.on_alert(heard.append)
    try:
        alert = Alert("gpu_idle", "gpu1", "train", "r1", "stall: GPU 0")
        assert telemetry.raise_alert(a, alert) is True
        assert telemetry.raise_alert(b, alert) is False  # the other process: already raised
        assert telemetry.raise_alert(a, Alert("gpu_idle", "gpu1", "train", "r2", "x")) is True
    finally:
        off()
    assert [x.run for x in heard] == ["r1", "r2"]
    alerts = a.events(kinds=["alert"])
    assert [(e.run_id, e.data, e.message) for e in alerts] == [
        ("r1", {"alert": "gpu_idle"}, "stall: GPU 0"), ("r2", {"alert": "gpu_idle"}, "x")]
    a.close()
    b.close()


def test_plan_telemetry_settings_are_checked_with_file_and_line():
    base = "name: p\nhosts: {h: {local: true, workdir: /tmp}}\nitems: []\n"
    assert parse_plan(base).telemetry == TelemetrySettings()
    plan = parse_plan(base + "telemetry: {every: 1, idle_minutes: 0.5, idle_util: 2}\n")
    assert (plan.telemetry.every, plan.telemetry.idle_minutes, plan.telemetry.idle_util,
            plan.telemetry.mem_full_pct) == (1.0, 0.5, 2.0, 97.0)
    with pytest.raises(PlanError) as e:
        parse_plan(base + "telemetry:\n  idle_minutes: 0\n  every: often\n", "p.yaml")
    text = str(e.value)
    assert "p.yaml:6:10: field 'telemetry.every': must be number" in text, text
    with pytest.raises(PlanError) as e:
        parse_plan(base + "telemetry: {idle_minutes: 0}\n", "p.yaml")
    assert "p.yaml:4:" in str(e.value) and "must be more than 0 minutes" in str(e.value)


TRAIN_PLAN = """
name: tele
hosts:
  box: {{local: true, workdir: {wd}, python: {py}}}
telemetry: {{every: 0.2, idle_minutes: 0.01, idle_util: 5}}
notify: [stall]
items:
  - id: train
    content: A trainer that runs until the test lets it end
    action: {{kind: train, host: box, params: {{command: "until [ -e {wd}/go ]; do sleep 0.1; done", out: out}}}}
"""


async def test_a_gpu_idle_past_the_threshold_raises_exactly_one_stall_alert(gpus_on_path,
                                                                         tmp_path, monkeypatch):
    """... and, the plan's ``notify:`` naming ``stall``, exactly one notification at a JSON
    webhook on loopback (issue 44: one stall alert and one notification)."""
    hook = Webhook()
    monkeypatch.setenv("SPECDECK_NOTIFY", f"json://127.0.0.1:{hook.port}/hook")
    wd = tmp_path / "wd"
    wd.mkdir()
    plan = parse_plan(TRAIN_PLAN.format(wd=wd, py=sys.executable))
    store = Store(tmp_path / "s.db")
    seen: list = []
    heard: list[Alert] = []
    off = telemetry.on_alert(heard.append)
    runner = Runner(plan, store, emit=seen.append, poll=0.05)
    running = asyncio.create_task(runner.run_items(["train"]))
    try:
        for _ in range(600):  # until the stall is raised (at most 60 s), then a few more samples
            if store.events(kinds=["alert"]) or running.done():
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        (wd / "go").touch()
        await asyncio.wait_for(running, 60)
    finally:
        (wd / "go").touch()
        off()
        await runner.close()  # waits for what it is sending
        hook.close()
    run = store.latest_run("train")
    assert len(hook.got) == 1, hook.got
    assert "stall" in hook.got[0][1]["title"] and "GPU 2" in hook.got[0][1]["message"]
    assert run.state == "succeeded"
    alerts = store.events(kinds=["alert"])
    assert len(alerts) == 1, [a.message for a in alerts]
    a = alerts[0]
    assert a.run_id == run.id and a.host == "box" and a.data == {"alert": "gpu_idle"}
    assert "GPU 2" in a.message and "GPU 0" not in a.message and "stall" in a.message
    assert [(h.kind, h.host, h.item, h.run) for h in heard] == [("gpu_idle", "box", "train", run.id)]
    notices = [e for e in seen if isinstance(e, Notice) and "stall" in e.message]
    assert len(notices) == 1 and notices[0].level == "warning"
    hist = store.gpu_history("box", 2, since=run.started_at)
    assert len(hist) >= 4 and hist[0][1] == 91.0 and hist[-1][1] == 0.0  # sampled while it lived
    latest = store.latest_telemetry("box")
    assert latest["run"] == run.id and len(latest["gpus"]) == 4
    assert json.loads(json.dumps(latest)) == latest
    store.close()


def test_memory_near_full_and_a_disk_short_of_the_next_checkpoint_raise_their_alerts():
    from core.state.records import Run

    store = Store(":memory:")
    run = Run("r1", "train", kind="train", host="gpu1", state="running", started_at=100.0)
    settings = TelemetrySettings(mem_full_pct=95)
    gpus = parse_gpus("0, H100, 99, 80000, 81559, 700.0, 80, GPU-a\n"
                      "1, H100, 98, 40000, 81559, 690.0, 79, GPU-b\n")
    disk = telemetry.Disk("/data/ckpts", 10 << 30, 1 << 40, "/data")
    sample = telemetry.HostSample("gpu1", 200.0, tuple(gpus), disks=(disk,),
                                  checkpoint_bytes=17 << 30)
    store.add_telemetry(sample, run_id="r1")
    got = {a.kind: a for a in telemetry.alerts_for(store, run, sample, settings)}
    assert set(got) == {"gpu_memory", "disk_low"}  # busy: no stall
    assert "GPU 0 78.1/79.6 GiB" in got["gpu_memory"].text and "GPU 1" not in got["gpu_memory"].text
    assert got["disk_low"].text == (
        "disk low: train (run r1) on gpu1: /data/ckpts has 10.0 GiB free, the last checkpoint "
        "took 17.0 GiB: the next one will not fit (free space on /data)")
    roomy = telemetry.HostSample("gpu1", 201.0, tuple(gpus[1:]), disks=(
        telemetry.Disk("/data/ckpts", 40 << 30, 1 << 40, "/data"),), checkpoint_bytes=17 << 30)
    assert telemetry.alerts_for(store, run, roomy, settings) == []
    off = TelemetrySettings(mem_full_pct=100, disk_alert=False)
    assert telemetry.alerts_for(store, run, sample, off) == []
    assert [telemetry.raise_alert(store, a) for a in got.values()] == [True, True]
    assert [telemetry.raise_alert(store, a) for a in got.values()] == [False, False]
    store.close()
