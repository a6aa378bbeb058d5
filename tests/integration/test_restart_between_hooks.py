"""Actions keep no state between hooks: a run driven hook by hook, with specdeck restarted
(a fresh store connection, runner, action and context) before every hook, ends with the same
result, log and artefacts as the same run driven on one instance.

The hooks are called in the order :meth:`core.runs.runner.Runner.run_item` calls them (check,
prepare, command, launch, inspect, follow, finish) on a real local host, each kind's real
command (the tiny models for the ML kinds). ``train`` is driven the same way in its own
tests; a kind is added here by adding its plan item to ``KINDS``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from core.plans.planfile import load_plan
from core.runs import life
from core.runs.runner import Runner, _Context
from core.state.store import Store

pytestmark = [pytest.mark.integration]


def _weights(tiny: Path, wd: Path) -> dict:
    """extract_weights: a training checkpoint (``{"model": state_dict}``) of the tiny drafter."""
    import torch
    from safetensors.torch import load_file

    (wd / "ckpt").mkdir(parents=True)
    torch.save({"model": load_file(tiny / "drafter" / "model.safetensors"), "step": 4},
               wd / "ckpt" / "step_4.pt")
    return {"checkpoint": "ckpt/step_4.pt", "out": "drafters/v5",
            "config": str(tiny / "drafter")}


KINDS = {
    "shell": lambda tiny, wd: {
        "command": "for i in 1 2 3; do echo \"step=$i loss=0.$i\"; done; echo ok > out.txt",
        "creates": "out.txt",
        "metrics": {"regex": r"step=(?P<step>\d+) loss=(?P<loss>[0-9.]+)"}},
    "extract_weights": _weights,
    "extract_hidden": lambda tiny, wd: {
        "target": str(tiny / "target"), "prompts": f"host:{tiny / 'prompts.jsonl'}",
        "layers": [0, 2, 3], "out": "feats", "max_new_tokens": 8, "limit": 2},
    "eval": lambda tiny, wd: {
        "drafter": str(tiny / "drafter"), "target": str(tiny / "target"),
        "prompts": f"host:{tiny / 'prompts.jsonl'}", "max_new_tokens": 8, "limit": 2,
        "label": "v5"},
}
ML = {"extract_weights", "extract_hidden", "eval"}


def _plan(tmp: Path, kind: str, tiny: Path) -> Path:
    wd = tmp / "remote"
    wd.mkdir(parents=True)
    p = tmp / "plan.yaml"
    p.write_text(json.dumps({
        "name": "restart", "hosts": {"gpu": {"local": True, "workdir": str(wd),
                                             "python": sys.executable}},
        "items": [{"id": "it", "content": f"one {kind} run",
                   "action": {"kind": kind, "host": "gpu", "params": KINDS[kind](tiny, wd)}}]}))
    return p


class _Specdeck:
    """What one specdeck process holds (store, runner); ``restart`` makes a new one."""

    def __init__(self, plan_path: Path, db: Path):
        self.plan_path, self.db = plan_path, db
        self.store = self.runner = None

    async def restart(self) -> None:
        if self.runner is not None:
            await self.runner.close()
            self.store.close()
        self.store = Store(self.db)
        self.runner = Runner(load_plan(self.plan_path), self.store, poll=0.05)

    async def hook(self, run_id: str | None):
        """A fresh action and context, as the runner builds for each call."""
        item = self.runner.plan.item("it")
        host = await self.runner.host(item.action.host)
        return self.runner.action(item), _Context(self.runner, item, host, run_id), host


async def _drive(plan_path: Path, db: Path, *, restart: bool) -> tuple[dict, str]:
    """The item's run hook by hook; returns its result and the run id."""
    sd = _Specdeck(plan_path, db)
    await sd.restart()

    async def step(run_id):
        if restart:
            await sd.restart()
        return await sd.hook(run_id)

    try:
        action, ctx, host = await step(None)
        assert (await action.check(ctx)).state == "ready"
        run_id = "it-0101-000000-abcd"
        item = sd.runner.plan.item("it")
        assert sd.store.claim_run(run_id, item.id, item.action.kind, host.name,
                                  owner=sd.runner.owner, launcher=action.launcher_name())
        action, ctx, host = await step(run_id)
        await action.prepare(ctx)
        action, ctx, host = await step(run_id)
        launch = action.command(ctx)
        action, ctx, host = await step(run_id)
        assert action.command(ctx) == launch  # asked again on a fresh instance: the same
        launched = await action.launch(ctx, host, run_id, launch)
        sd.store.update_run(run_id, state="running", pid=launched.pid, pstart=launched.pstart,
                            capsule=launched.capsule, job_id=launched.job_id)
        action, ctx, host = await step(run_id)
        assert (await action.inspect(ctx, host, sd.store.run(run_id))).state in ("running",
                                                                                  "ended")
        action, ctx, host = await step(run_id)
        st = await action.follow(ctx, host, sd.store.run(run_id), lambda lines: None)
        action, ctx, host = await step(run_id)
        run = sd.store.run(run_id)
        outcome = life.outcome_of(st, capsule=run.capsule, run_id=run_id)
        assert outcome.state == "succeeded", sd.store.log_bytes(run_id, 0).decode()[-2000:]
        result = await action.finish(ctx, outcome)
        sd.store.end_run(run_id, outcome.state, exit_code=outcome.exit_code, result=result)
        return result, run_id
    finally:
        await sd.runner.close()
        sd.store.close()


def _what_it_left(db: Path, run_id: str, wd: Path, *, timed: bool) -> dict:
    """The run's end, result, metrics, eval rows and (unless ``timed``: an ML task's log
    carries timings) log as stored, its work dir written ``WD`` (each mode ran in its own)."""
    store = Store(db)
    try:
        run = store.run(run_id)
        left = {"state": run.state, "result": run.result,
                "metrics": [(p.step, p.name) + (() if timed else (p.value,))
                            for p in store.metric_rows(run_id)],
                "eval": [(r.drafter, r.role, r.prompt_id, r.tau, r.rounds)
                         for r in store.eval_results()]}
        if not timed:
            left["log"] = store.log_bytes(run_id, 0).decode()
    finally:
        store.close()
    return json.loads(json.dumps(left).replace(str(wd), "WD"))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_restart_between_every_two_hooks_changes_nothing(kind, tmp_path, request):
    if kind in ML:
        pytest.importorskip("torch")
    tiny = request.getfixturevalue("tiny_models") if kind in ML else tmp_path
    left = {}
    for mode in ("once", "restarted"):
        plan = _plan(tmp_path / mode, kind, tiny)
        db = tmp_path / mode / "s.db"
        _, run_id = asyncio.run(_drive(plan, db, restart=mode == "restarted"))
        left[mode] = _what_it_left(db, run_id, tmp_path / mode / "remote", timed=kind in ML)
    assert left["restarted"] == left["once"]
    assert left["once"]["state"] == "succeeded"
    if kind == "shell":
        assert left["once"]["metrics"] == [[1, "loss", 0.1], [2, "loss", 0.2], [3, "loss", 0.3]]
    if kind == "eval":
        assert left["once"]["result"]["tau"] and left["once"]["eval"]


def test_venv_command_after_a_restart_installs_the_wheel_prepare_uploaded(tmp_path):
    """venv's launch installs uv and packages from the network (tests/integration/
    test_venv_ssh.py), so here only its stateful pair: the command a fresh instance builds
    after ``prepare`` ran on another names the wheel that ``prepare`` uploaded."""
    wd = tmp_path / "remote"
    wd.mkdir()
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({
        "name": "restart", "hosts": {"gpu": {"local": True, "workdir": str(wd)}},
        "items": [{"id": "it", "content": "a venv", "action": {
            "kind": "venv", "host": "gpu", "params": {"torch": "none", "install_self": True}}}]}))

    async def go() -> tuple[str, str]:
        sd = _Specdeck(plan, tmp_path / "s.db")
        await sd.restart()
        run_id = "it-0101-000000-abcd"
        sd.store.claim_run(run_id, "it", "venv", "gpu", owner=sd.runner.owner)
        action, ctx, _ = await sd.hook(run_id)
        await action.prepare(ctx)
        same = action.command(ctx).command
        await sd.restart()
        action, ctx, _ = await sd.hook(run_id)
        fresh = action.command(ctx).command
        await sd.runner.close()
        sd.store.close()
        return same, fresh

    same, fresh = asyncio.run(go())
    assert fresh == same
    (wheel,) = (wd / ".specdeck" / "runs" / "it-0101-000000-abcd").glob("specdeck-*.whl")
    assert str(wheel) in fresh
