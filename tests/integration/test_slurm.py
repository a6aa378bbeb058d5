"""The Slurm launcher against a real single-node Slurm: submit, follow, metrics, scancel."""

from __future__ import annotations

import asyncio
import json

import pytest

from core.plans.planfile import parse_plan
from core.runs.runner import Runner
from core.state.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def plan_for(tmp_path, cluster, command):
    doc = {
        "name": "sl",
        "hosts": {"login": {"local": True, "workdir": str(tmp_path / "cluster"), "env": cluster.env}},
        "items": [{"id": "train", "content": "train on the cluster",
                   "action": {"kind": "train", "host": "login", "params": {
                       "command": command, "launcher": "slurm",
                       "slurm": {"partition": "debug", "cpus_per_task": 1, "time": "10:00"}}}}]}
    return parse_plan(json.dumps(doc))


TRAINER = ("for s in $(seq 1 20); do echo \"{\\\"step\\\": $s, \\\"loss\\\": $(awk \"BEGIN {print 5/$s}\")}\"; "
           "sleep 0.1; done")


async def test_sbatch_follow_to_completion_with_metrics(slurm, tmp_path):
    plan = plan_for(tmp_path, slurm, TRAINER)
    store = Store(tmp_path / "s.db")
    runner = Runner(plan, store, poll=0.05)
    assert await asyncio.wait_for(runner.run_item(plan.item("train")), 120) == "done"
    run = store.latest_run("train")
    assert run.launcher == "slurm" and run.job_id.isdigit()
    assert run.exit_code == 0
    series = store.metric_series(run.id, "loss")
    assert [s for s, _ in series] == list(range(1, 21))
    assert series[-1][1] == pytest.approx(0.25)
    await runner.close()


async def test_scancel_stops_the_job_and_reconcile_uses_the_job_id(slurm, tmp_path):
    plan = plan_for(tmp_path, slurm, "echo up; sleep 300")
    store = Store(tmp_path / "s.db")
    runner = Runner(plan, store, poll=0.05)
    task = asyncio.create_task(runner.run_item(plan.item("train")))
    for _ in range(600):
        run = store.live_run("train")
        if run and run.job_id and store.log_tail(run.id):
            break
        await asyncio.sleep(0.05)
    assert store.log_tail(run.id) == ["up"]
    # a second specdeck (fresh runner on the same store) finds the job by its id
    other = Runner(plan, Store(tmp_path / "s.db"), poll=0.05)
    assert await other.reconcile() == []
    outcome = await other.stop_run(run.id, grace_s=2)
    assert outcome.state == "stopped" and outcome.signal == "TERM"
    assert await asyncio.wait_for(task, 30) == "stopped"  # the item too, not failed
    assert store.run(run.id).state == "stopped"
    await runner.close()
    await other.close()
