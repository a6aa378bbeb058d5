"""The train action keeps nothing between its hooks: each hook here runs on a fresh instance
with a fresh context (as after a specdeck restart, where the runner builds a new action per
call), on a real local host running real processes, and still does what one instance would.

The trainer is a stand-in interpreter (the host's ``python``): it finds ``--out`` in its
argv, writes ``step_10.pt`` there, logs a metric line and, while ``hold`` exists, waits to
be stopped. ``core.ml.train`` itself is not needed to see which words the hooks pass it."""

from __future__ import annotations

import asyncio
import json
import posixpath
import stat
from pathlib import Path

from core.capsules import jobs
from core.plans.planfile import parse_plan
from core.runs import life
from core.runs.runner import Runner, _Context
from core.state.store import Store
from tests.conftest import ROOT

FAKE_PY = """#!/bin/sh
out=""; prev=""
for a in "$@"; do [ "$prev" = "--out" ] && out="$a"; prev="$a"; done
echo "argv: $*"
[ -f train.yaml ] || { echo "no train.yaml in $(pwd)"; exit 3; }
mkdir -p "$out" && : > "$out/step_10.pt"
echo '{"step": 10, "loss": 1.5}'
while [ -f {hold} ]; do sleep 0.05; done
"""


def _plan(tmp_path, launch: dict, hosts=("box",)):
    py = tmp_path / "fakepy"
    py.write_text(FAKE_PY.replace("{hold}", str(tmp_path / "hold")))
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "v5.yaml").write_text((ROOT / "plans/train/v5.yaml").read_text())
    plan = tmp_path / "p.yaml"
    plan.write_text(json.dumps({
        "name": "hooks",
        "hosts": {h: {"local": True, "workdir": str(tmp_path / h), "python": str(py)}
                  for h in hosts},
        "items": [{"id": "train", "content": "train", "action": {
            "kind": "train", "host": hosts[0], "params": {
                "config": "train/v5.yaml", **launch,
                "overrides": {"target": "models/target", "data.features": "feats"}}}}]}))
    for h in hosts:
        (tmp_path / h).mkdir()
    return Runner(parse_plan(plan.read_text(), str(plan), path=plan), Store(tmp_path / "s.db"),
                  poll=0.05)


class Restarts:
    """Each call: the item's action built anew and a new context for the run (nothing an
    earlier hook left on an instance can be read)."""

    def __init__(self, runner: Runner, run_id: str):
        self.runner, self.run_id = runner, run_id
        self.item = runner.plan.item("train")
        self.instances: list = []  # kept alive, so that no two share an id

    async def __call__(self, hook: str, *args, **kw):
        action = self.runner.action(self.item)
        self.instances.append(action)
        host = await self.runner.host(self.item.action.host)
        ctx = _Context(self.runner, self.item, host, self.run_id)
        res = getattr(action, hook)(ctx, *args, **kw)
        return await res if asyncio.iscoroutine(res) else res

    def run(self):
        return self.runner.store.run(self.run_id)


async def _start(runner: Runner, run_id: str) -> tuple[Restarts, str]:
    """claim, prepare, command, launch: each on its own instance; returns the command."""
    store = runner.store
    assert store.claim_run(run_id, "train", "train", "box", owner=runner.owner) is not None
    hook = Restarts(runner, run_id)
    await hook("prepare")
    launch = await hook("command")
    host = await runner.host("box")
    info = await hook("launch", host, run_id, launch)
    store.update_run(run_id, state="running", pid=info.pid, pstart=info.pstart,
                     capsule=info.capsule)
    return hook, launch.command


def _outcome(st: jobs.CapsuleState, run, stopped=False) -> jobs.Outcome:
    return life.outcome_of(st, stopped=stopped, capsule=run.capsule, run_id=run.id)


async def _until_ended(hook: Restarts, host) -> jobs.CapsuleState:
    for _ in range(400):
        st = await hook("inspect", host, hook.run())
        if st.state != "running":
            return st
        await asyncio.sleep(0.05)
    raise AssertionError("the stand-in trainer did not end")


def test_train_hooks_on_fresh_instances_follow_finish_then_resume_and_stop(tmp_path):
    runner = _plan(tmp_path, {})
    fake = str(tmp_path / "fakepy")

    async def go():
        host = await runner.host("box")
        first, cmd = await _start(runner, "train-1")
        cap1 = jobs.capsule_path(host, "train-1")
        out1 = posixpath.join(cap1, "out")
        # what prepare worked out reached command through the run's record only
        assert cmd.startswith(f"{fake} -u -m core.ml.train --config train.yaml --out {out1}")
        assert "--resume" not in cmd
        lines: list[str] = []
        st = await first("follow", host, first.run(), lines.extend)
        assert st.state == "ended" and st.exit_code == 0, (st, lines)
        assert any('"step": 10' in ln for ln in lines), lines
        assert (await first("inspect", host, first.run())).state == "ended"
        res = await first("finish", _outcome(st, first.run()))
        assert res == {"out": out1, "checkpoints": [10]}
        # prepare, command, launch, follow, inspect, finish: six instances
        assert len({id(a) for a in first.instances}) == 6
        runner.store.update_run("train-1", state="failed")  # a failed attempt: the next resumes

        (tmp_path / "hold").write_text("")  # attempt 2 trains until stopped
        second, cmd2 = await _start(runner, "train-2")
        assert f"--out {out1} --resume auto" in cmd2, cmd2  # attempt 1's dir, resumed
        await second("stopping", second.run())
        st2 = await second("stop", host, second.run(), 2.0)
        assert st2.state == "ended" and (await second("inspect", host, second.run())
                                          ).state == "ended"
        res2 = await second("finish", _outcome(st2, second.run(), stopped=True))
        assert res2["out"] == out1 and res2["checkpoints"] == [10]
        await second("reconciling", follow=False)  # nothing outlives it: a no-op
        await runner.close()

    asyncio.run(asyncio.wait_for(go(), 120))


def test_torchrun_nodes_get_node_0s_config_and_all_stop_together(tmp_path):
    """Node 1's config is what prepare uploaded to node 0 (read back, not kept on the
    instance); a stop on a fresh instance ends every node and waits for each of them."""
    runner = _plan(tmp_path, {"launcher": "torchrun", "nodes": ["box1"]}, hosts=("box", "box1"))
    (tmp_path / "hold").write_text("")

    async def go():
        hook, cmd = await _start(runner, "train-1")
        assert "torch.distributed.run" in cmd and "--node_rank 0" in cmd
        box, box1 = await runner.host("box"), await runner.host("box1")
        cap0, cap1 = (jobs.capsule_path(h, "train-1") for h in (box, box1))
        uploaded = (Path(cap0) / "train.yaml").read_bytes()  # local hosts: paths here
        assert b"core.ml.train" not in uploaded and (Path(cap1) / "train.yaml"
                                                     ).read_bytes() == uploaded
        for h, cap in ((box, cap0), (box1, cap1)):
            for _ in range(400):
                if (await jobs.inspect(h, cap)).state == "running":
                    break
                await asyncio.sleep(0.05)
        st = await hook("stop", box, hook.run(), 2.0)
        assert st.state == "ended"
        # both nodes ended by the time stop returned: nothing left to a stray task
        assert [(await jobs.inspect(h, c)).state for h, c in ((box, cap0), (box1, cap1))] \
            == ["ended", "ended"]
        await runner.close()

    asyncio.run(asyncio.wait_for(go(), 120))

