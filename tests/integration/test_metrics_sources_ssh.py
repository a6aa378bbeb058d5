"""Metric sources on a real sshd host: a trainer writing TensorBoard event files (tensorboardX),
HF Trainer dict lines behind tqdm redraws, and text lines for two regexes. Every curve is in the
store and in ``specdeck metrics --csv`` exactly once across a kill -9 of specdeck and attach."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.state.store import Store
from tests.conftest import ROOT, cli_until, run_cli

pytestmark = pytest.mark.integration

STEPS = 60

TRAINER = r'''
import sys, time
from tensorboardX import SummaryWriter

tb, steps = sys.argv[1], int(sys.argv[2])
w = SummaryWriter(tb, flush_secs=1)
for s in range(1, steps + 1):
    loss = 5.0 / s
    w.add_scalar("train/loss", loss, s)
    w.add_scalar("train/lr", 1e-4 * s, s)
    w.flush()
    print(f"step {s} loss={loss:.6f}", flush=True)
    if s % 10 == 0:
        print(f"eval @ {s}: acc={s / 100:.2f}", flush=True)
    if s % 2 == 0:  # an HF Trainer log line, after a tqdm bar's redraws
        sys.stdout.write(f" {s}%|##  | {s}/{steps}\r {s}%|### | {s}/{steps}\r")
        print({"loss": round(loss, 6), "learning_rate": 1e-4 * s, "epoch": s / steps},
              flush=True)
    time.sleep(0.08)
w.close()
'''


def _old_event_file(d: Path) -> None:
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(d))
    w.add_scalar("old/loss", 9.0, 1)
    w.close()


def test_tensorboard_hf_and_regex_curves_exactly_once_across_kill_9(sshd, tmp_path):
    wd = tmp_path / "remote"
    (wd / "tb").mkdir(parents=True)
    _old_event_file(wd / "tb" / "earlier-run")  # an earlier run's file: never this run's
    script = wd / "trainer.py"
    script.write_text(TRAINER)
    plan = tmp_path / "m.yaml"
    plan.write_text(json.dumps({
        "name": "m", "hosts": {"gpu": {"ssh": sshd.alias, "workdir": str(wd)}},
        "items": [{"id": "train", "content": "a trainer with its own logging",
                   "action": {"kind": "train", "host": "gpu", "params": {
                       "command": f"{sys.executable} -u {script} {wd / 'tb' / 'run1'} {STEPS}",
                       "metrics": {
                           "tensorboard": "tb",
                           "hf_dicts": True,
                           "regex": [r"^step (?P<step>\d+) loss=(?P<txt_loss>[\d.]+)",
                                     r"eval @ (?P<step>\d+): acc=(?P<eval_acc>[\d.]+)"]}}}}]}))
    state = tmp_path / "s.db"
    proc = cli_until(state, "run", plan, "train", line="│ step 24 ")
    proc.kill()  # kill -9 mid-run: some points stored, the rest not yet
    proc.wait()
    store = Store(state)
    run = store.latest_run("train")
    before = {r.name for r in store.metric_rows(run.id)}
    assert "txt_loss" in before
    store.close()

    res = run_cli("attach", plan, env={"SPECDECK_STATE": str(state)}, timeout=120)
    assert res.returncode == 0, res.stderr
    # the tqdm redraws were shown as one line each: the HF dict, not the bars
    assert "│  2%|##" not in res.stderr

    store = Store(state)
    run = store.latest_run("train")
    assert run.state == "succeeded"
    rows = store.metric_rows(run.id)
    by = {}
    for r in rows:
        by.setdefault(r.name, []).append((r.step, r.value))
    assert "old/loss" not in by  # the earlier run's event file was skipped
    want = {
        "train/loss": [(s, 5.0 / s) for s in range(1, STEPS + 1)],
        "train/lr": [(s, 1e-4 * s) for s in range(1, STEPS + 1)],
        "txt_loss": [(s, round(5.0 / s, 6)) for s in range(1, STEPS + 1)],
        "eval_acc": [(s, s / 100) for s in range(10, STEPS + 1, 10)],
        # HF lines have no step: the kth such line is step k, also after the restart
        "loss": [(k, round(5.0 / (2 * k), 6)) for k in range(1, STEPS // 2 + 1)],
        "learning_rate": [(k, 1e-4 * 2 * k) for k in range(1, STEPS // 2 + 1)],
        "epoch": [(k, 2 * k / STEPS) for k in range(1, STEPS // 2 + 1)],
    }
    assert sorted(by) == sorted(want)
    for name, pts in want.items():
        assert [s for s, _ in by[name]] == [s for s, _ in pts], name
        assert [v for _, v in by[name]] == pytest.approx([v for _, v in pts], rel=1e-5), name
    # the event file was read to its end, once: the stored offset is its size
    (ev,) = (wd / "tb" / "run1").glob("events.out.tfevents*")
    assert store.metric_source_offset(run.id, f"tb:{ev}") == ev.stat().st_size
    store.close()

    out = run_cli("metrics", plan, "train", "--csv", env={"SPECDECK_STATE": str(state)})
    assert out.returncode == 0, out.stderr
    table = list(csv.reader(io.StringIO(out.stdout)))
    assert table[0] == ["step", "name", "value", "time"]
    keys = [(int(r[0]), r[1]) for r in table[1:]]
    assert len(keys) == len(set(keys)) == sum(len(p) for p in want.values())
    tb_times = [float(r[3]) for r in table[1:] if r[1] == "train/loss"]
    assert tb_times == sorted(tb_times) and tb_times[0] > 1e9  # the events' wall times
    only = run_cli("metrics", plan, "train", "--jsonl", "--names", "eval_acc,train/lr",
                   env={"SPECDECK_STATE": str(state)})
    got = [json.loads(x) for x in only.stdout.splitlines()]
    assert {g["name"] for g in got} == {"eval_acc", "train/lr"}
    assert len(got) == STEPS + STEPS // 10 and set(got[0]) == {"step", "name", "value", "time"}
