"""Fixtures for the console tests: a real Store, a real Runner, local hosts.

``campaign`` is a populated state (runs with fixed ids and times, logs, training curves and
eval results) for tests that look at what is shown; ``live_plan`` is a plan whose shell items
really run on a local host, for tests that run and stop things.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from console.app import make_app
from core.plans.planfile import load_plan
from core.state.records import EvalRow
from core.state.store import Store



def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.ui)

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC: fixed, so renderings never show the clock

CAMPAIGN = """\
name: v5-relaunch
hosts:
  gpu1: {{local: true, workdir: {root}/gpu1}}
  gpu2: {{local: true, workdir: {root}/gpu2}}
items:
  - id: venv
    content: Build the venv on both GPU hosts
    priority: high
    action: {{kind: shell, host: gpu1, params: {{command: "python -m venv .venv"}}}}
  - id: relay-ckpt
    content: Relay the v4 checkpoint to gpu2
    priority: high
    needs: [venv]
    action: {{kind: shell, host: gpu2, params: {{command: "cp -r ckpt/v4 ."}}}}
  - id: train-v5
    content: Train the v5 drafter (block 8, 2k steps)
    priority: high
    needs: [relay-ckpt]
    action: {{kind: shell, host: gpu1, params: {{command: "python train.py --steps 2000"}}}}
  - id: eval-v5
    content: Evaluate v5 on the eval prompts
    needs: [train-v5]
    action: {{kind: shell, host: gpu2, params: {{command: "python -m core.ml.eval v5"}}}}
  - id: eval-base
    content: Evaluate the baseline drafter
    needs: [relay-ckpt]
    action: {{kind: shell, host: gpu2, params: {{command: "python -m core.ml.eval base"}}}}
  - id: decide
    content: Read the tau table and decide
    needs: [eval-v5, eval-base]
  - id: cleanup
    content: Remove old feature caches
    priority: low
    action: {{kind: shell, host: gpu1, params: {{command: "rm -rf feats/old"}}}}
"""

SETTINGS = {"mode": "online", "block_size": 8, "tree_budget": None, "target": "qwen3-8b",
            "prompts": "mt-bench-80", "definition": "tau = accepted + 1"}


def add_run(store: Store, item_id: str, attempt: int, state: str, host: str, *,
            start: float, seconds: float, exit_code: int | None = 0, log: str = "",
            metrics=(), error: str | None = None) -> str:
    run_id = f"{item_id}-0101-{attempt:02d}"
    store.claim_run(run_id, item_id, "shell", host, owner="test:1:1")
    store.update_run(run_id, state="running", pid=4000 + attempt, started_at=start,
                     capsule=f"/capsules/{run_id}")
    if log:
        store.append_log(run_id, 0, log.encode(), list(metrics))
    if state not in ("running", "starting"):
        store.end_run(run_id, state, exit_code=exit_code, error=error)
        store.update_run(run_id, ended_at=start + seconds)
    return run_id


def train_log(steps: int, *, lr: float = 3e-4, decay: float = 400.0, every: int = 50):
    lines, metrics = [], []
    for s in range(every, steps + 1, every):
        loss = 4.0 * math.exp(-s / decay) + 0.9
        acc = [round(min(0.95, 0.35 + 0.5 * (1 - math.exp(-s / (decay * (k + 1))))), 4)
               for k in range(4)]
        rate = lr * min(1.0, s / 200)
        rec = {"step": s, "loss": round(loss, 4), "acc": acc, "lr": rate}
        lines.append(json.dumps(rec))
        metrics += [(s, "loss", round(loss, 4)), (s, "lr", rate)]
        metrics += [(s, f"acc[{k}]", a) for k, a in enumerate(acc)]
    return "\n".join(lines) + "\n", metrics


def eval_rows(run_id: str, drafter: str, role: str, taus: list[list[int]], *,
              settings=SETTINGS, block: int = 8, step: int | None = None) -> list[EvalRow]:
    rows = []
    for i, rounds in enumerate(taus):
        pp = [sum(1 for r in rounds if r - 1 >= k) / len(rounds) for k in range(1, block)]
        rows.append(EvalRow(run_id=run_id, item_id=run_id.rsplit("-0101", 1)[0],
                            drafter=drafter, role=role, prompt_id=f"p{i + 1}",
                            tau=sum(rounds) / len(rounds), rounds=rounds, per_position=pp,
                            settings=dict(settings), step=step, at=T0))
    return rows


def populate(store: Store) -> None:
    """The v5 campaign half way: venv and relay done, train failed once then succeeded,
    both evals done (one measured at another block size), decide pending, cleanup skipped."""
    add_run(store, "venv", 1, "succeeded", "gpu1", start=T0, seconds=42.0,
            log="created venv\n")
    add_run(store, "relay-ckpt", 1, "succeeded", "gpu2", start=T0 + 60, seconds=312.0,
            log="relayed 14.2 GiB\n")
    log1, met1 = train_log(300, decay=300.0)
    add_run(store, "train-v5", 1, "failed", "gpu1", start=T0 + 400, seconds=95.0, exit_code=1,
            log=log1 + "RuntimeError: CUDA out of memory\n", metrics=met1)
    log2, met2 = train_log(1000)
    add_run(store, "train-v5", 2, "succeeded", "gpu1", start=T0 + 600, seconds=3725.0,
            log="loading target qwen3-8b\n" + log2 + "saved step_1000\n", metrics=met2)
    rv = add_run(store, "eval-v5", 1, "succeeded", "gpu2", start=T0 + 4400, seconds=610.0,
                 log="tau 3.41\n")
    rb = add_run(store, "eval-base", 1, "succeeded", "gpu2", start=T0 + 4400, seconds=580.0,
                 log="tau 2.95\n")
    store.add_eval_results(
        eval_rows(rb, "z-lab-b8", "baseline", [[3, 2, 4, 3], [2, 3, 3, 2], [4, 4, 2, 3]])
        + eval_rows(rv, "v5", "drafter", [[4, 3, 5, 4], [3, 3, 4, 2], [5, 4, 3, 4]])
        + eval_rows(rv, "v5-b16", "drafter", [[6, 5, 7, 5]],
                    settings={**SETTINGS, "block_size": 16}, block=16))
    for item, status in (("venv", "done"), ("relay-ckpt", "done"), ("train-v5", "done"),
                         ("eval-v5", "done"), ("eval-base", "done"), ("cleanup", "skipped")):
        store.set_status(item, status)


WATCH_STEPS = (200, 400, 600, 800, 1000)


def add_tau_watch(store: Store, run_id: str = "train-v5-0101-02", *,
                  steps=WATCH_STEPS, baseline: float = 3.1) -> None:
    """What core.actions.watch_eval records for a train run: tau at each evaluated step (metrics ``tau``,
    ``tau_pooled``, ``tau_acc[k]``, ``tau_baseline``) and the eval results (drafter
    ``<item>@<step>``, ``step``), plus the baseline's results once."""
    item = run_id.rsplit("-0101", 1)[0]
    metrics, rows = [], []
    for i, s in enumerate(steps):
        tau = round(2.4 + 1.3 * (1 - math.exp(-s / 400.0)), 3)
        metrics += [(s, "tau", tau), (s, "tau_pooled", round(tau + 0.05, 3)),
                    (s, "tau_baseline", baseline), (s, "tau_ci95_lo", round(tau - 0.3, 3)),
                    (s, "tau_ci95_hi", round(tau + 0.3, 3))]
        metrics += [(s, f"tau_acc[{k}]", round(0.9 - 0.15 * k + 0.05 * i, 3)) for k in range(3)]
        rows += eval_rows(run_id, item, "drafter", [[round(tau) + d for d in (0, 1, -1, 0)]] * 2,
                          step=s)
    rows += eval_rows(run_id, "baseline", "baseline", [[3, 3, 4, 2], [3, 4, 3, 3]])
    store.add_metrics(run_id, metrics)
    store.add_eval_results(rows)


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def campaign(tmp_path):
    """(plan, store) of the populated v5 campaign (hosts are local folders under tmp_path)."""
    path = tmp_path / "v5.yaml"
    path.write_text(CAMPAIGN.format(root=tmp_path))
    plan = load_plan(path)
    store = Store(":memory:")
    populate(store)
    yield plan, store
    store.close()


LIVE = """\
name: live
hosts:
  here: {{local: true, workdir: {root}/here}}
items:
  - id: hello
    content: Print a few lines and metrics
    priority: high
    action:
      kind: shell
      host: here
      params:
        command: >-
          echo hello; for s in 1 2 3; do echo "{{\\"step\\": $s, \\"loss\\": $s.5}}"; done
  - id: broken
    content: Always fails
    action: {{kind: shell, host: here, params: {{command: "echo about to fail; exit 3"}}}}
  - id: slow
    content: Runs until stopped
    action: {{kind: shell, host: here, params: {{command: "echo started; exec sleep 60"}}}}
  - id: tick
    content: Check the numbers by hand
    needs: [hello]
  - id: later
    content: Needs the manual tick
    needs: [tick]
    action: {{kind: shell, host: here, params: {{command: "echo later"}}}}
"""


@pytest.fixture
def live_plan(tmp_path):
    """(plan, store) of a small plan whose shell items really run on a local host."""
    path = tmp_path / "live.yaml"
    path.write_text(LIVE.format(root=tmp_path))
    plan = load_plan(path)
    store = Store(str(tmp_path / "state.db"))
    yield plan, store
    store.close()


def build(plan, store, **kw):
    """The app through its factory, without GPU polling (nothing machine-specific shown)."""
    kw.setdefault("gpu_every", 0)
    return make_app(plan, store, **kw)


async def settle(pilot) -> None:
    """Let posted messages land and every worker finish (no sleeps)."""
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def pick(pilot, item_id: str) -> None:
    """Settle, put the plan's cursor on ``item_id``, settle (its detail, log and curves in)."""
    from console.widgets.plan_list import PlanPane

    await settle(pilot)
    pilot.app.query_one(PlanPane).select(item_id)
    await settle(pilot)


@asynccontextmanager
async def running(plan, store, *, select: str | None = None, size=(120, 40), **kw):
    """The app (:func:`build`) under a test pilot, settled: ``(app, pilot, seen)``, where
    ``seen`` collects every message posted (for :func:`wait_for`); with ``select``, that
    item under the plan's cursor (:func:`pick`)."""
    seen: list = []
    app = build(plan, store, **kw)
    async with app.run_test(size=size, message_hook=seen.append) as pilot:
        if select is None:
            await settle(pilot)
        else:
            await pick(pilot, select)
        yield app, pilot, seen


async def wait_for(messages: list, kind, pred=lambda m: True, *, timeout: float = 20.0,
                   pilot=None):
    """Wait until a message of ``kind`` matching ``pred`` has been posted (event-driven)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        for msg in messages:
            if isinstance(msg, kind) and pred(msg):
                return msg
        if loop.time() > deadline:
            raise AssertionError(f"no {kind.__name__} within {timeout}s; saw "
                                 f"{[type(x).__name__ for x in messages][-20:]}")
        if pilot is not None:
            await pilot.pause()
        else:
            await asyncio.sleep(0)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


ROOT = Path(__file__).resolve().parents[2]
