"""A job submitted with plain ``sbatch`` (not by specdeck), adopted by its id on a real
single-node Slurm, followed to its end with its exit code."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest

from core.plans.adopt_spec import AdoptSpec
from core.errors import InvalidInput
from core.plans.planfile import parse_plan
from core.runs.runner import Runner
from core.state.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


async def test_plain_sbatch_job_adopted_by_id_and_followed_to_its_exit_code(slurm, tmp_path):
    wd = tmp_path / "cluster"
    wd.mkdir()
    env = {**os.environ, **slurm.env}
    out = subprocess.run(
        ["sbatch", "--parsable", "-o", str(wd / "v4-%j.out"), "--chdir", str(wd),
         "--wrap", "for i in $(seq 1 40); do echo \"{\\\"step\\\": $i, \\\"loss\\\": 1}\"; "
                   "sleep 0.1; done; exit 3"],
        env=env, capture_output=True, text=True, check=True).stdout
    job = out.strip().split(";")[0]
    plan = parse_plan(json.dumps({
        "name": "sl", "hosts": {"login": {"local": True, "workdir": str(wd), "env": slurm.env}},
        "items": [{"id": "train-v4", "content": "v4, sbatch by hand", "status": "in_progress",
                   "action": {"kind": "train", "host": "login", "params": {
                       "command": "false", "launcher": "slurm"}}}]}))
    store = Store(tmp_path / "s.db")
    runner = Runner(plan, store, poll=0.05)
    try:
        with pytest.raises(InvalidInput, match="Slurm job 999999 on login: unknown"):
            await runner.adopt("train-v4", AdoptSpec(slurm_job="999999"))
        assert store.runs_for_item("train-v4") == []
        status = await asyncio.wait_for(
            runner.adopt("train-v4", AdoptSpec(slurm_job=job, from_start=True)),
            120)
        run = store.latest_run("train-v4")
        assert (status, run.state, run.exit_code, run.job_id) == (
            "failed", "failed", 3, job)
        assert run.adopt["log"] == str(wd / f"v4-{job}.out")  # scontrol's StdOut
        assert [s for s, _ in store.metric_series(run.id, "loss")] == list(range(1, 41))

        # a second hand-submitted job, adopted and stopped: scancel, state stopped
        job2 = subprocess.run(["sbatch", "--parsable", "-o", str(wd / "v4b.out"), "--wrap",
                               "echo up; sleep 300"], env=env, capture_output=True, text=True,
                              check=True).stdout.strip().split(";")[0]
        runner.mark("train-v4", "in_progress")
        await runner.adopt("train-v4", AdoptSpec(slurm_job=job2), follow=False)
        live = store.live_run("train-v4")
        outcome = await asyncio.wait_for(runner.stop_run(live.id, grace_s=2), 90)
        assert outcome.state == "stopped"
        left = subprocess.run(["squeue", "-h", "-j", job2, "-o", "%T"], env=env,
                              capture_output=True, text=True).stdout.strip()
        assert left in ("", "COMPLETING", "CANCELLED")
    finally:
        await runner.close()
        store.close()
