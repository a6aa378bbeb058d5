"""Preemption is not failure: a Slurm job requeued under it (``scontrol requeue``) resumes
from its checkpoint in place and is journaled preempted, a job ending PREEMPTED ends its run
``preempted``, and a local run killed by SIGTERM while its host's spot reclaim notice stands
is ``preempted`` too; ``on_preempt: resume`` launches it again, ``retries:`` untouched."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

from core.plans.planfile import parse_plan
from core.runs import life
from core.runs.runner import Runner
from core.state.store import Store
from tests.integration.slurm import SlurmCluster, missing

# a trainer that keeps its own checkpoint (the step it reached) and resumes from it
TRAINER = ("mkdir -p {ck}; s=$(cat {ck}/last 2>/dev/null || echo 0); echo \"start at $s\"; "
           "while [ $s -lt {steps} ]; do s=$((s+1)); echo \"{{\\\"step\\\": $s, \\\"loss\\\": 1}}\"; "
           "echo $s > {ck}/last; sleep {pause}; done")


def plan_for(tmp_path, host: dict, params: dict, **item):
    doc = {"name": "pre", "hosts": {"h": host},
           "items": [{"id": "train", "content": "train", **item,
                      "action": {"kind": "train", "host": "h", "params": params}}]}
    return parse_plan(json.dumps(doc))


async def wait_for(pred, timeout=120.0):
    for _ in range(int(timeout / 0.05)):
        got = pred()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def slurm_trainer(tmp_path, slurm, ck, steps: int, partition: str, cpus: int, until: int,
                        **item):
    """The :data:`TRAINER` launched on Slurm by ``run_items`` (``on_preempt: resume``), once
    it logged step ``until``: (store, runner, the run_items task, the run)."""
    plan = plan_for(tmp_path, {"local": True, "workdir": str(tmp_path / "cluster"),
                               "env": slurm.env},
                    {"command": TRAINER.format(ck=ck, steps=steps, pause=0.1), "launcher": "slurm",
                     "slurm": {"partition": partition, "cpus_per_task": cpus, "time": "10:00"}},
                    on_preempt="resume", **item)
    store = Store(tmp_path / "s.db")
    runner = Runner(plan, store, poll=0.05)
    task = asyncio.create_task(runner.run_items(["train"]))
    run = await wait_for(lambda: (r := store.live_run("train")) and r.job_id and r)
    await wait_for(lambda: step_reached(store, run.id, until))
    return store, runner, task, run


async def requeue_now(slurm, job: str) -> None:
    """``scontrol requeue`` the job, then let it start again soon (Slurm holds a requeued
    job back a while, Reason=BeginTime). Not at once: slurmd revokes the killed run's
    credential with a one-second clock, and a relaunch within the same second is refused
    ("Job credential revoked", the job FAILED), which Slurm's own hold exists to avoid."""
    env = {**os.environ, **slurm.env}
    subprocess.run(["scontrol", "requeue", job], env=env, check=True)
    await wait_for(lambda: "JobState=PENDING" in subprocess.run(
        ["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True).stdout, 60)
    await asyncio.sleep(2.5)
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], env=env, check=True)


def step_reached(store: Store, run_id: str, n: int) -> bool:
    return any(s >= n for s, _ in store.metric_series(run_id, "loss"))


@pytest.mark.integration
@pytest.mark.slurm
async def test_a_requeued_slurm_job_resumes_from_its_checkpoint_and_uses_no_retry(
        slurm, tmp_path):
    store, runner, task, run = await slurm_trainer(tmp_path, slurm, "ck", 40, "debug", 1, 5,
                                                   retries=1)
    await requeue_now(slurm, run.job_id)
    summary = await asyncio.wait_for(task, 180)
    assert summary.done == ("train",)
    runs = store.runs_for_item("train")
    assert [r.state for r in runs] == ["succeeded"] and runs[0].job_id == run.job_id
    log = store.log_tail(run.id, 200)
    requeued = [json.loads(x) for x in log if x.startswith('{"event": "requeued"')]
    assert requeued == [{"event": "requeued", "restart": 1, "job": run.job_id}]
    starts = [int(x.split()[-1]) for x in log if x.startswith("start at ")]
    assert starts[0] == 0 and len(starts) == 2 and starts[1] >= 5  # resumed, not from 0
    assert log.index(f"start at {starts[1]}") > log.index(next(x for x in log if '"requeued"' in x))
    events = [e for e in store.events(kinds=["run_requeued"]) if e.run_id == run.id]
    assert len(events) == 1 and "preempted: Slurm requeued job" in events[0].message
    assert life.retries_left(1, runs) == 1  # untouched
    await runner.close()



@pytest.fixture
def preempting_slurm(tmp_path):
    """A single-node Slurm whose ``high`` partition preempts (cancels) jobs in ``low``."""
    why = missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path / "slurm", preempting=True)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.mark.integration
@pytest.mark.slurm
async def test_a_job_a_preempting_partition_cancels_is_preempted_and_resumes(
        preempting_slurm, tmp_path):
    slurm = preempting_slurm
    store, runner, task, run = await slurm_trainer(tmp_path, slurm, tmp_path / "ck", 30, "low", 2,
                                                   3, retries=2)
    env = {**os.environ, **slurm.env}
    subprocess.run(["sbatch", "-p", "high", "-c", "1", "-o", str(tmp_path / "high.out"),
                    "--wrap", "sleep 2"], env=env, check=True,
                   capture_output=True)
    summary = await asyncio.wait_for(task, 180)
    assert summary.done == ("train",)
    runs = store.runs_for_item("train")
    assert [r.state for r in runs] == ["preempted", "succeeded"]
    assert f"Slurm PREEMPTED (job {run.job_id})" in runs[0].error
    assert runs[0].signal == "TERM" and runs[1].job_id != run.job_id
    reached = max(s for s, _ in store.metric_series(runs[0].id, "loss"))
    assert store.log_tail(runs[1].id)[0] == f"start at {reached}" and reached >= 3
    assert life.failures(runs) == 0 and life.retries_left(2, runs) == 2  # none counted
    await runner.close()

@pytest.mark.integration
async def test_a_local_run_killed_under_a_spot_reclaim_notice_is_preempted_and_resumes(tmp_path):
    wd = tmp_path / "spot"
    plan = plan_for(tmp_path, {"local": True, "workdir": str(wd)},
                    {"command": TRAINER.format(ck=tmp_path / "ck", steps=30, pause=0.1)},
                    retries=1, on_preempt="resume")
    store = Store(tmp_path / "s.db")
    runner = Runner(plan, store, poll=0.05)
    task = asyncio.create_task(runner.run_items(["train"]))
    run = await wait_for(lambda: (r := store.live_run("train")) and r.capsule and r)
    await wait_for(lambda: step_reached(store, run.id, 5))
    # the host's reclaim hook writes its notice, then the cloud sends SIGTERM
    (wd / ".specdeck" / "preempt-notice").write_text("instance i-0abc reclaimed\n")
    pid = int((wd / ".specdeck" / "runs" / run.id / "pid").read_text().split()[0])
    os.killpg(pid, signal.SIGTERM)
    summary = await asyncio.wait_for(task, 120)
    assert summary.done == ("train",)
    runs = store.runs_for_item("train")
    assert [r.state for r in runs] == ["preempted", "succeeded"]
    assert runs[0].error.startswith("train (process) on h preempted (signal TERM: spot reclaim "
                                    "notice: instance i-0abc reclaimed)")
    assert life.retries_left(1, runs) == 1  # the preemption used none
    first = store.log_tail(runs[0].id)
    second = store.log_tail(runs[1].id)
    reached = max(s for s, _ in store.metric_series(runs[0].id, "loss"))
    assert first[0] == "start at 0" and second[0] == f"start at {reached}" and reached >= 5
    ends = [e.kind for e in store.events() if e.run_id == runs[0].id]
    assert ends[-1] == life.journal_kind(life.PREEMPTED)
    await runner.close()


@pytest.mark.integration
async def test_sigterm_without_a_notice_is_a_failure_and_counts(tmp_path):
    wd = tmp_path / "plain"
    (wd / ".specdeck").mkdir(parents=True)
    old = wd / ".specdeck" / "preempt-notice"
    old.write_text("a reclaim long ago\n")
    os.utime(old, (1, 1))  # older than the run: not its notice
    plan = plan_for(tmp_path, {"local": True, "workdir": str(wd)},
                    {"command": "echo up; sleep 300"}, retries=0, on_preempt="resume")
    store = Store(tmp_path / "s.db")
    runner = Runner(plan, store, poll=0.05)
    task = asyncio.create_task(runner.run_items(["train"]))
    run = await wait_for(lambda: (r := store.live_run("train")) and r.capsule
                         and store.log_tail(r.id) and r)
    pid = int((wd / ".specdeck" / "runs" / run.id / "pid").read_text().split()[0])
    os.killpg(pid, signal.SIGTERM)
    summary = await asyncio.wait_for(task, 60)
    assert summary.failed == ("train",)
    runs = store.runs_for_item("train")
    assert [r.state for r in runs] == ["failed"] and life.failures(runs) == 1
    await runner.close()


@pytest.mark.integration
@pytest.mark.slurm
@pytest.mark.ml
@pytest.mark.slow
async def test_core_ml_train_requeued_by_slurm_resumes_from_its_last_checkpoint(
        slurm, tiny_models, tmp_path):
    """The real trainer: ``on_preempt: resume`` makes a Slurm launch pass ``--resume auto``,
    so the job Slurm runs again starts from the checkpoint its first run left."""
    import shutil

    from core.runs.runner import Runner as _Runner
    from tests.conftest import ROOT

    wd = tmp_path / "cluster"
    (wd / "models").mkdir(parents=True)
    shutil.copytree(tiny_models / "target", wd / "models/target")
    (wd / "prompts.jsonl").write_text((tiny_models / "prompts.jsonl").read_text())
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "v5.yaml").write_text((ROOT / "plans/train/v5.yaml").read_text())
    doc = {"name": "pre", "hosts": {"login": {
               "local": True, "workdir": str(wd), "python": sys.executable,
               "env": {**slurm.env, "PYTHONPATH": str(ROOT)}}},
           "items": [
               {"id": "feats", "content": "features", "action": {
                   "kind": "extract_hidden", "host": "login", "params": {
                       "target": "models/target", "prompts": "host:prompts.jsonl",
                       "layers": [0, 2, 3], "out": "feats", "max_new_tokens": 24}}},
               {"id": "train", "content": "train on the cluster", "needs": ["feats"],
                "retries": 1, "on_preempt": "resume",
                "action": {"kind": "train", "host": "login", "params": {
                    "config": "train/v5.yaml", "launcher": "slurm",
                    "slurm": {"partition": "debug", "cpus_per_task": 2, "time": "10:00"},
                    "overrides": {"target": "models/target", "data.features": "feats",
                                  "train.max_steps": 80, "train.checkpoint_every": 10,
                                  "train.log_every": 10}}}}]}
    plan_path = tmp_path / "pre.yaml"
    plan_path.write_text(json.dumps(doc))
    plan = parse_plan(plan_path.read_text(), str(plan_path), path=plan_path)
    store = Store(tmp_path / "s.db")
    runner = _Runner(plan, store, poll=0.05)
    assert (await asyncio.wait_for(runner.run_items(["feats"]), 300)).done == ("feats",)
    task = asyncio.create_task(runner.run_items(["train"]))
    run = await wait_for(lambda: (r := store.live_run("train")) and r.job_id and r, 120)
    await wait_for(lambda: any((a.step or 0) >= 20 for a in store.artefacts("train", "checkpoint")),
                   300)
    await requeue_now(slurm, run.job_id)
    summary = await asyncio.wait_for(task, 600)
    assert summary.done == ("train",)
    runs = store.runs_for_item("train")
    assert [r.state for r in runs] == ["succeeded"] and life.retries_left(1, runs) == 1
    infos = [json.loads(x) for x in store.log_tail(run.id, 5000)
             if x.startswith('{"event": "info"') and '"task": "train"' in x]
    assert len(infos) == 2 and infos[0]["resumed_from"] is None
    assert infos[1]["start_step"] >= 20
    assert infos[1]["resumed_from"].endswith(f"step_{infos[1]['start_step']}.pt")
    assert [e.kind for e in store.events(kinds=["run_requeued"]) if e.run_id == run.id] == \
        ["run_requeued"]
    assert max(a.step for a in store.artefacts("train", "checkpoint")) == 80
    await runner.close()
