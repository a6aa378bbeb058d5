"""Tau over training with the laptop closed: a detached watcher (core.ml.watcher) on the real
sshd training host evaluates every checkpoint of a tiny training run while no specdeck runs;
specdeck ingests each result exactly once however often it is killed and started again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.state.store import Store
from tests.conftest import ROOT, run_cli
from tests.integration.mlplan import extract_item, ssh_host

pytestmark = [pytest.mark.integration, pytest.mark.ml, pytest.mark.slow]
PY = sys.executable
STEPS, EVERY = 100, 20


def make_plan(tmp_path, tiny, gpu, *, steps=STEPS, watch=None, ev=None):
    """kpro6 trains; the tau cache is made on kpro6, or on ``ev`` (a second host) when given."""
    wd = tmp_path / "kpro6"
    prompts = (tiny / "prompts.jsonl").read_text().splitlines()
    for d in (wd, tmp_path / "ct129") if ev else (wd,):
        (d / "models").mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(tiny / "target"), str(d / "models/target")], check=True)
        (d / "prompts.jsonl").write_text("\n".join(prompts) + "\n")
        (d / "eval-prompts.jsonl").write_text("\n".join(prompts[:2]) + "\n")
    hosts = {"kpro6": ssh_host(gpu, wd)}
    if ev:
        hosts["ct129"] = ssh_host(ev, tmp_path / "ct129")
    (tmp_path / "train").mkdir(exist_ok=True)
    (tmp_path / "train" / "v5.yaml").write_text((ROOT / "plans/train/v5.yaml").read_text())
    plan = tmp_path / "watch.yaml"
    plan.write_text(json.dumps({
        "name": "watch",
        "hosts": hosts,
        "items": [
            extract_item("feats", "features for training", "kpro6", prompts="host:prompts.jsonl",
                         layers=[0, 2, 3], out="feats/train", max_new_tokens=24),
            extract_item("feats-eval", "the tau cache, where the watcher runs", "ct129" if ev else "kpro6",
                         prompts="host:eval-prompts.jsonl", layers=[0, 2], out="feats/eval",
                         max_new_tokens=24),
            {"id": "train", "content": "train v5 with a detached tau watcher",
             "needs": ["feats", "feats-eval"],
             "action": {"kind": "train", "host": "kpro6", "params": {
                 "config": "train/v5.yaml",
                 "overrides": {"target": "models/target", "data.features": "feats/train",
                               "train.max_steps": steps, "train.checkpoint_every": EVERY,
                               "train.log_every": 10, "train.anchors_per_sequence": 8},
                 "watch_eval": watch or {"target": "models/target", "cache": "feats/eval",
                                         "mode": "offline", "max_new_tokens": 16}}}},
        ]}))
    return plan, wd


def spawn(args, state):
    env = {**os.environ, "SPECDECK_STATE": str(state), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([PY, "-m", "console.cli", *map(str, args)], env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def kill_when(proc, needle: str, timeout: float = 600) -> list[str]:
    """Read the process's stderr until a line has ``needle``; then kill -9 it."""
    seen, deadline = [], time.monotonic() + timeout
    for line in proc.stderr:
        seen.append(line)
        if needle in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert any(needle in ln for ln in seen), "".join(seen)[-3000:]
    return seen


def capsules(wd: Path, run_id: str) -> tuple[Path, Path]:
    runs = wd / ".specdeck/runs"
    return runs / run_id, runs / f"{run_id}-watch"


def wait_exit(path: Path, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while not (path / "exit").exists():
        assert time.monotonic() < deadline, f"{path} did not end"
        time.sleep(0.5)
    return (path / "exit").read_text().strip()


def check_series(state, steps=STEPS):
    """tau stored for every checkpoint, each once, as metrics and eval rows."""
    s = Store(state)
    run = s.latest_run("train")
    entries = s.watch_entries(run.id)
    want = list(range(EVERY, steps + 1, EVERY))
    assert [(e.step, e.state) for e in entries] == [(st, "done") for st in want], entries
    assert [st for st, _ in s.metric_series(run.id, "tau")] == want
    rows = [r for r in s.eval_results("train") if r.role == "drafter"]
    per_step = {st: sorted(r.prompt_id for r in rows if r.step == st) for st in want}
    n = len(per_step[want[0]])
    assert n >= 1 and all(len(v) == n and len(set(v)) == n for v in per_step.values()), per_step
    assert {r.step for r in rows} == set(want)
    return s, run


def launched_then_killed(sshd_factory, tiny_models, tmp_path):
    """The plan run by a specdeck killed (-9) right after it launched the train run."""
    (gpu,) = sshd_factory(1)
    plan, wd = make_plan(tmp_path, tiny_models, gpu)
    state = tmp_path / "s.db"
    kill_when(spawn(["run", plan, "--all"], state), "train: started run")
    return plan, wd, state, Store(state).latest_run("train")


def test_killed_at_launch_then_attach_after_the_end_stores_every_step_once(
        sshd_factory, tiny_models, tmp_path):
    plan, wd, state, run = launched_then_killed(sshd_factory, tiny_models, tmp_path)
    s = Store(state)
    assert run.live and s.watcher(run.id) is not None  # started with the run
    s.close()
    train_cap, watch_cap = capsules(wd, run.id)
    assert wait_exit(train_cap) == "exit 0"
    assert wait_exit(watch_cap) == "exit 0"  # it ended by itself, no specdeck running
    written = sorted(int(p.stem[5:]) for p in (watch_cap / "results").glob("step_*.json"))
    assert written == list(range(EVERY, STEPS + 1, EVERY))
    res = run_cli("attach", plan, env={"SPECDECK_STATE": str(state)}, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "evaluated while specdeck was away: tau at steps 20, 40, 60, 80, 100" in res.stderr
    s, run = check_series(state)
    assert s.run(run.id).state == "succeeded"
    assert [e.kind for e in s.events(kinds=["watch_meanwhile"])] == ["watch_meanwhile"]
    s.close()
    res = run_cli("compare", plan, "--step", "60", "--json", env={"SPECDECK_STATE": str(state)})
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert "train@60" in res.stdout and "train@40" not in res.stdout, doc
    # a second attach stores nothing again
    res = run_cli("attach", plan, env={"SPECDECK_STATE": str(state)}, timeout=120)
    assert res.returncode == 0 and "evaluated while" not in res.stderr
    check_series(state)
    doc = json.loads(run_cli("status", plan, "--json",
                             env={"SPECDECK_STATE": str(state)}).stdout)
    w = {i["id"]: i.get("watcher") for i in doc["items"]}["train"]
    assert w["state"] == "ended" and w["last_step"] == STEPS and w["queue"] == []
    assert w["evaluated"] == list(range(EVERY, STEPS + 1, EVERY))


def test_killed_and_restarted_twice_during_training_no_duplicate_no_missing_step(
        sshd_factory, tiny_models, tmp_path):
    plan, wd, state, run = launched_then_killed(sshd_factory, tiny_models, tmp_path)
    train_cap, _ = capsules(wd, run.id)
    deadline = time.monotonic() + 60
    while not (train_cap / "pid").exists():
        assert time.monotonic() < deadline, "the train run wrote no pid"
        time.sleep(0.1)
    pgid = int((train_cap / "pid").read_text().split()[0])  # a capsule is its own group
    # The trainer is paused while each specdeck starts and is killed, so both kills land
    # while the run trains (however fast the tiny model is); between them it writes one
    # more checkpoint while no specdeck runs.
    def checkpoints() -> int:
        return len(list((train_cap / "out").glob("step_*.pt")))

    os.killpg(pgid, signal.SIGSTOP)
    try:
        for _ in range(2):
            kill_when(spawn(["attach", plan], state), "train: attached to run")
            assert not (train_cap / "exit").exists()  # it was still training
            have = checkpoints()
            os.killpg(pgid, signal.SIGCONT)
            deadline = time.monotonic() + 300
            while checkpoints() == have:
                assert time.monotonic() < deadline, "no checkpoint while no specdeck ran"
                time.sleep(0.02)
            os.killpg(pgid, signal.SIGSTOP)
        assert checkpoints() < STEPS // EVERY  # both restarts came before the last one
    finally:
        os.killpg(pgid, signal.SIGCONT)
    res = run_cli("attach", plan, env={"SPECDECK_STATE": str(state)}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    s, run = check_series(state)
    assert s.run(run.id).state == "succeeded"
    assert s.watcher(run.id).state == "ended"


def test_stopping_the_train_item_ends_its_watcher(sshd_factory, tiny_models, tmp_path):
    (gpu,) = sshd_factory(1)
    plan, wd = make_plan(tmp_path, tiny_models, gpu, steps=100000)
    state = tmp_path / "s.db"
    proc = spawn(["run", plan, "--all"], state)
    kill_when(proc, "detached)")
    run = Store(state).live_run("train")
    res = run_cli("stop", plan, "train", "--yes", env={"SPECDECK_STATE": str(state)}, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    _, watch_cap = capsules(wd, run.id)
    assert wait_exit(watch_cap, 120) == "exit 0"
    assert json.loads((watch_cap / "status.json").read_text())["state"] == "stopped"
    doc = json.loads(run_cli("status", plan, "--json",
                             env={"SPECDECK_STATE": str(state)}).stdout)
    item = {i["id"]: i for i in doc["items"]}["train"]
    assert item["run"]["state"] == "stopped" and item["watcher"]["state"] == "stopped"
    assert (item["watcher"]["last_step"] or 0) >= EVERY, item["watcher"]


def test_on_the_eval_host_reading_checkpoints_by_path(sshd_factory, tiny_models, tmp_path):
    gpu, ev = sshd_factory(2)
    plan, wd = make_plan(tmp_path, tiny_models, gpu, ev=ev, steps=2 * EVERY, watch={
        "on": "eval", "host": "ct129", "fetch": "direct", "target": "models/target",
        "cache": "feats/eval", "max_new_tokens": 16})
    state = tmp_path / "s.db"
    res = run_cli("run", plan, "--all", env={"SPECDECK_STATE": str(state)}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    s, run = check_series(state, 2 * EVERY)
    w = s.watcher(run.id)
    assert w.host == "ct129" and w.state == "ended"
    assert w.capsule.startswith(str(tmp_path / "ct129"))  # it ran on the eval host
    assert not (wd / ".specdeck/runs" / f"{run.id}-watch").exists()


def test_run_ended_while_away_status_does_not_wait_and_attach_follows_the_watcher(
        sshd_factory, tiny_models, tmp_path):
    (gpu,) = sshd_factory(1)
    plan, wd = make_plan(tmp_path, tiny_models, gpu, steps=3 * EVERY)
    state = tmp_path / "s.db"
    env = {"SPECDECK_STATE": str(state)}
    kill_when(spawn(["run", plan, "--all"], state), "train: started run")
    run = Store(state).live_run("train")
    train_cap, watch_cap = capsules(wd, run.id)
    assert wait_exit(train_cap) == "exit 0"
    # right after training ended the watcher is usually still on its last checkpoints:
    # status finishes the run and stores what is there, without waiting for the rest
    doc = json.loads(run_cli("status", plan, "--json", env=env).stdout)
    item = {i["id"]: i for i in doc["items"]}["train"]
    assert item["run"]["state"] == "succeeded", item
    w = item["watcher"]
    assert w["state"] in ("watching", "evaluating", "ending", "ended") and w["host"] == "kpro6"
    assert w["evaluated"] == [s for s in (20, 40, 60) if s in w["evaluated"]]
    res = run_cli("attach", plan, env=env, timeout=300)  # follows the watcher to its end
    assert res.returncode == 0, res.stderr[-3000:]
    s, _ = check_series(state, 3 * EVERY)
    assert s.watcher(run.id).state == "ended" and (watch_cap / "exit").exists()
    table = run_cli("status", plan, env={**env, "COLUMNS": "200"}).stdout  # the plain table
    assert "tau watch train: ended on kpro6 · last step 60 · queue 0" in table, table


def test_a_killed_watcher_is_started_again_and_carries_on(sshd_factory, tiny_models, tmp_path):
    (gpu,) = sshd_factory(1)
    plan, wd = make_plan(tmp_path, tiny_models, gpu)
    state = tmp_path / "s.db"
    proc = spawn(["run", plan, "--all"], state)
    seen = []
    for line in proc.stderr:  # the first tau is stored: kill -9 the watcher (an OOM kill)
        seen.append(line)
        if "detached)" in line:
            break
    run = Store(state).live_run("train")
    _, watch_cap = capsules(wd, run.id)
    os.killpg(int((watch_cap / "pid").read_text().split()[0]), signal.SIGKILL)
    rest = proc.stderr.read()
    assert proc.wait(600) == 0, rest[-3000:]
    assert "tau watcher on kpro6: watcher killed by signal KILL; started again" in rest
    s, run = check_series(state)
    assert [e.kind for e in s.events(kinds=["watch_restarted"])] == ["watch_restarted"]


async def test_an_adopted_run_gets_its_watcher(tiny_models, tmp_path):
    """A run started by hand and adopted: its watcher starts at the adoption and records each
    checkpoint (these are not torch files: each eval fails, is recorded, the next follows)."""
    from core.plans.adopt_spec import AdoptSpec
    from core.plans.planfile import parse_plan
    from core.runs.runner import Runner

    wd = tmp_path / "wd"
    (wd / "models").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(tiny_models / "target"), str(wd / "models/target")], check=True)
    subprocess.run([PY, "-m", "core.ml.extract", "--target", str(wd / "models/target"),
                    "--prompts", str(tiny_models / "prompts.jsonl"), "--layers", "0,2",
                    "--out", str(wd / "feats"), "--max-new-tokens", "8", "--limit", "1"],
                   check=True, capture_output=True, cwd=ROOT)
    (wd / "trainer.sh").write_text(
        "mkdir -p out; sleep 1\nfor s in 10 20; do echo junk > out/step_$s.pt; "
        "echo \"{\\\"step\\\": $s, \\\"loss\\\": 1.5}\"; sleep 1; done\n")
    proc = subprocess.Popen(["bash", str(wd / "trainer.sh")], cwd=wd,
                            stdout=open(wd / "train.log", "wb"), start_new_session=True)
    plan = tmp_path / "t.yaml"
    plan.write_text(json.dumps({
        "name": "t", "hosts": {"gpu": {"local": True, "workdir": str(wd), "python": PY}},
        "items": [{"id": "train-v4", "content": "v4", "status": "in_progress",
                   "action": {"kind": "train", "host": "gpu", "params": {
                       "command": "false", "out": "out",
                       "watch_eval": {"target": "models/target", "cache": "feats",
                                      "max_prompts": 1}}}}]}))
    store = Store(tmp_path / "s.db")
    runner = Runner(parse_plan(plan.read_text(), str(plan), path=plan), store, poll=0.05)
    try:
        await asyncio.wait_for(runner.adopt("train-v4",
                                          AdoptSpec(pid=proc.pid, log=str(wd / "train.log"))), 120)
        run = store.latest_run("train-v4")
        w = store.watcher(run.id)
        assert w.host == "gpu" and w.ckpt_dir == str(wd / "out") and w.state == "ended"
        entries = store.watch_entries(run.id)
        assert [(e.step, e.state) for e in entries] == [(10, "failed"), (20, "failed")]
        assert all("step_" in e.error and "torch checkpoint" in e.error for e in entries)
    finally:
        if proc.poll() is None:
            proc.kill()
        await runner.close()
        store.close()
