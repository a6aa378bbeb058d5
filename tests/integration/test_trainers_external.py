"""SpecForge and speculators runs as specdeck sees them, their checkpoints written by THEIR
savers (tests/ml/train/trainer_savers.py, SpecForge 0.2.0 and speculators 0.9.0 as installed by
scripts/bootstrap --test) on a tiny drafter, on a real local host:

* a detached watch_eval over such a run gets tau at every checkpoint, each once, while the
  specdeck driving it is killed (-9) and started again between checkpoints;
* ``item:train@best`` (their own best pointer) goes through extract_weights, and the eval of
  the result equals the eval of the checkpoint as it is and of the same weights saved in
  specdeck's own layout (``step_N.pt``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.state.store import Store
from tests.conftest import ROOT, run_cli
from tests.integration.mlplan import extract_item
from tests.integration.test_watch_detached import capsules, kill_when, spawn, wait_exit
from tests.shared import build_once

pytestmark = [pytest.mark.integration, pytest.mark.ml, pytest.mark.slow]
pytest.importorskip("specforge", reason="needs specforge==0.2.0 (scripts/bootstrap --test)")
pytest.importorskip("speculators", reason="needs speculators==0.9.0 (scripts/bootstrap --test)")
torch = pytest.importorskip("torch")

SAVER = ROOT / "tests/ml/train/trainer_savers.py"
STEPS = {"specforge": [10, 20, 30], "speculators": [1, 2, 3]}
"""The steps each writes (speculators numbers its checkpoints by epoch)."""


def workdir(tmp_path: Path, tiny: Path) -> Path:
    """The host's workdir: the tiny target and drafter (z-lab, and speculators' layout of it,
    which its saver loads), prompts and a SpecForge config naming them."""
    wd = tmp_path / "box"
    (wd / "models").mkdir(parents=True)
    for name in ("target", "drafter"):
        shutil.copytree(tiny / name, wd / "models" / name)
    subprocess.run([sys.executable, "-m", "core.ml.export", str(wd / "models/drafter"), "--out",
                    str(wd / "models/spec"), "--format", "speculators", "--target",
                    str(wd / "models/target"), "--dtype", "fp32"],
                   check=True, capture_output=True, cwd=ROOT)
    prompts = (tiny / "prompts.jsonl").read_text().splitlines()
    (wd / "eval-prompts.jsonl").write_text("\n".join(prompts[:2]) + "\n")
    (wd / "run.yaml").write_text(json.dumps({
        "model": {"target_model_path": "models/target",
                  "draft_model_config": "models/drafter/config.json"},
        "data": {"prompts_path": "eval-prompts.jsonl"}, "run_id": "tiny",
        "output_dir": "ckpts", "training": {"save_interval": 10}}))
    return wd


def train_item(trainer: str, wd: Path, *, gate: Path | None = None, watch: dict | None = None,
               needs=(), extra: tuple = ()) -> dict:
    steps = ",".join(map(str, STEPS[trainer]))
    drafter = wd / "models" / ("drafter" if trainer == "specforge" else "spec")
    cmd = [sys.executable, str(SAVER), trainer, "--drafter", str(drafter), "--out",
           str(wd / "ckpts"), "--steps", steps, "--every", "0.5"]
    cmd += ["--config", "run.yaml"] if trainer == "specforge" else []
    cmd += ["--gate", str(gate)] if gate else []
    cmd += list(extra)
    params = {"trainer": trainer, "command": " ".join(cmd), "out": "ckpts"}
    if watch:
        params["watch_eval"] = watch
    return {"id": "train", "content": f"train with {trainer}", "needs": list(needs),
            "action": {"kind": "train", "host": "box", "params": params}}


def write_plan(tmp_path: Path, wd: Path, items: list[dict]) -> Path:
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"name": "ext", "hosts": {"box": {
        "local": True, "workdir": str(wd), "python": sys.executable}}, "items": items}))
    return plan


def wait_for(cond, what: str, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return got


def watched_plan(trainer: str, tiny: Path, tmp_path: Path, **where) -> tuple[Path, Path, Path]:
    """(workdir, gate, plan): a tau cache, then a gated train item with an offline watch_eval
    (``where``: its ``on`` / ``host``)."""
    wd = workdir(tmp_path, tiny)
    gate = tmp_path / "gate"
    plan = write_plan(tmp_path, wd, [
        extract_item("feats-eval", "the tau cache", "box", prompts="host:eval-prompts.jsonl",
                     layers=[0, 2], out="feats/eval", max_new_tokens=16),
        train_item(trainer, wd, gate=gate, needs=["feats-eval"], watch={
            **where, "target": "models/target", "cache": "feats/eval", "mode": "offline",
            "max_new_tokens": 16})])
    return wd, gate, plan


@pytest.mark.parametrize("trainer", ["specforge", "speculators"])
def test_watch_eval_tau_at_each_of_their_checkpoints_once_across_specdeck_kills(
        trainer, tiny_models, tmp_path):
    wd, gate, plan = watched_plan(trainer, tiny_models, tmp_path)
    state = tmp_path / "s.db"
    steps = STEPS[trainer]
    kill_when(spawn(["run", plan, "--all"], state), "train: started run")
    run = Store(state).latest_run("train")
    train_cap, watch_cap = capsules(wd, run.id)
    for i, step in enumerate(steps):
        # the watcher evaluates each checkpoint as it lands, with no specdeck running
        wait_for(lambda: (watch_cap / "results" / f"step_{step}.json").exists(),
                 f"no tau for step {step}")
        if i < len(steps) - 1:
            assert not (train_cap / "exit").exists()  # still training: the gate holds the next
            kill_when(spawn(["attach", plan], state), "train: attached to run")
        gate.unlink()
    assert wait_exit(train_cap) == "exit 0"
    res = run_cli("attach", plan, env={"SPECDECK_STATE": str(state)}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    s = Store(state)
    run = s.latest_run("train")
    assert s.run(run.id).state == "succeeded"
    entries = s.watch_entries(run.id)
    assert [(e.step, e.state) for e in entries] == [(st, "done") for st in steps], entries
    series = s.metric_series(run.id, "tau")
    assert [st for st, _ in series] == steps and all(v >= 1.0 for _, v in series)
    rows = [r for r in s.eval_results("train") if r.role == "drafter"]
    assert sorted({r.step for r in rows}) == steps
    per_step = {st: [r.prompt_id for r in rows if r.step == st] for st in steps}
    assert all(len(v) == len(set(v)) == 2 for v in per_step.values()), per_step  # once each
    recs = [json.loads((watch_cap / "results" / f"step_{st}.json").read_text()) for st in steps]
    layout = "tiny-step{}/training_state.pt" if trainer == "specforge" else "{}"
    assert [r["checkpoint"] for r in recs] == [str(wd / "ckpts" / layout.format(st))
                                              for st in steps]
    # each checkpoint is another drafter (the saver scales the weights each time)
    assert len({r["result"]["drafter"]["fingerprint"] for r in recs}) == len(steps)
    arts = s.artefacts("train", "checkpoint")
    assert [a.step for a in arts] == steps and {a.data["layout"] for a in arts} == {trainer}
    s.close()


@pytest.mark.parametrize("trainer", ["specforge", "speculators"])
def test_the_consoles_watcher_finds_their_checkpoints_in_the_output_dir(trainer, tiny_models, tmp_path):
    """``on: console``: they print no checkpoint lines, so specdeck lists their output dir while
    they train; each checkpoint is evaluated once it is whole, before the next is written."""
    wd, gate, plan = watched_plan(trainer, tiny_models, tmp_path, on="console", host="box")
    state = tmp_path / "s.db"
    steps = STEPS[trainer]
    proc = spawn(["run", plan, "--all"], state)
    said: list[str] = []
    threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True).start()  # never a full pipe

    def evaluated(step):
        s = Store(state)
        try:
            run = s.latest_run("train")
            return run is not None and any(e.step == step and e.state == "done" for e in s.watch_entries(run.id))
        finally:
            s.close()
    try:
        for step in steps:
            wait_for(lambda: evaluated(step) or proc.poll() is not None, f"no tau for step {step}")
            assert evaluated(step), "".join(said)[-3000:]
            wait_for(gate.exists, "the saver waiting")
            gate.unlink()  # the next checkpoint is written only once this one has its tau
        assert proc.wait(timeout=600) == 0, "".join(said)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    s = Store(state)
    run = s.latest_run("train")
    assert s.run(run.id).state == "succeeded"
    assert [(e.step, e.state) for e in s.watch_entries(run.id)] == [(st, "done") for st in steps]
    assert [st for st, _ in s.metric_series(run.id, "tau")] == steps
    arts = s.artefacts("train", "checkpoint")
    assert [a.step for a in arts] == steps and {a.data["layout"] for a in arts} == {trainer}
    s.close()


def specdeck_layout(art_path: str, trainer: str, drafter: Path, out: Path) -> None:
    """The weights of one of their checkpoints, saved as core.ml.train saves its own."""
    from safetensors.torch import load_file

    if trainer == "specforge":
        state = torch.load(art_path, weights_only=True)["draft_state_dict"]
    else:
        state = load_file(Path(art_path) / "model.safetensors")
    cfg = json.loads((drafter / "config.json").read_text())
    torch.save({"model": state, "optimizer": {}, "step": 1, "drafter_config": cfg}, out)


def eval_item(item_id: str, drafter: str, needs: list[str]) -> dict:
    return {"id": item_id, "content": f"tau of {drafter}", "needs": needs, "action": {
        "kind": "eval", "host": "box", "params": {
            "drafter": drafter, "target": "models/target", "prompts": "host:eval-prompts.jsonl",
            "mode": "online", "max_new_tokens": 16}}}


@pytest.fixture(scope="session")
def fitted_tiny(tmp_path_factory):
    """The tiny target with a drafter fitted to it (tau > 1: equal taus are not all 1.0), built
    once per test run for every worker (the fit is this module's costliest set-up) and read
    only (``workdir`` copies it)."""
    return build_once(tmp_path_factory, "tiny-models-fitted", lambda root: subprocess.run(
        [sys.executable, "-m", "core.ml.tiny", str(root)], check=True, capture_output=True, cwd=ROOT))


@pytest.mark.parametrize("trainer", ["specforge", "speculators"])
def test_extract_weights_of_their_best_evaluates_as_the_same_weights_in_specdecks_layout(
        trainer, fitted_tiny, tmp_path):
    wd = workdir(tmp_path, fitted_tiny)
    items = [train_item(trainer, wd)]
    plan = write_plan(tmp_path, wd, items)
    state = tmp_path / "s.db"
    env = {"SPECDECK_STATE": str(state)}
    res = run_cli("run", plan, "train", env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    s = Store(state)
    run = s.latest_run("train")
    arts = {a.step: a for a in s.artefacts("train", "checkpoint")}
    assert sorted(arts) == STEPS[trainer]
    # their best pointer: SpecForge's highest simulated_acc_len (the last), speculators'
    # lowest val loss (the last) as the saver reports them
    best = run.result["best"]
    assert best == {"step": STEPS[trainer][-1], "path": arts[STEPS[trainer][-1]].path}
    if trainer == "speculators":  # its val_metrics.json, per epoch, under the curves' names
        assert s.metric_series(run.id, "val_loss") == [(1, 2.0), (2, 1.9), (3, 1.8)]
        assert [v for _, v in s.metric_series(run.id, "val_accuracy")] == [0.5] * 3
    s.close()
    specdeck_layout(best["path"], trainer, wd / "models/drafter", wd / "step_30.pt")
    items += [
        {"id": "weights", "content": "their best as a drafter", "needs": ["train"], "action": {
            "kind": "extract_weights", "host": "box", "params": {
                "checkpoint": "item:train@best", "out": "drafters/best"}}},
        eval_item("eval-extracted", "drafters/best", ["weights"]),
        eval_item("eval-theirs", "item:train@best", ["train"]),
        eval_item("eval-specdeck", "step_30.pt", []),
    ]
    plan = write_plan(tmp_path, wd, items)
    res = run_cli("run", plan, "--all", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    from safetensors.torch import load_file

    got = load_file(wd / "drafters/best/model.safetensors")
    want = specdeck_weights(wd / "step_30.pt")
    assert set(got) == set(want) and all(torch.equal(got[k].float(), want[k].float()) for k in want)
    s = Store(state)
    taus = {i: s.latest_run(i).result["tau"] for i in ("eval-extracted", "eval-theirs",
                                                       "eval-specdeck")}
    assert taus["eval-extracted"] == taus["eval-theirs"] == taus["eval-specdeck"] > 1.0, taus
    per = {i: sorted((r.prompt_id, r.tau) for r in s.eval_results(i) if r.role == "drafter")
           for i in taus}
    assert per["eval-extracted"] == per["eval-theirs"] == per["eval-specdeck"] and \
        len(per["eval-specdeck"]) == 2, per
    s.close()


def specdeck_weights(path: Path) -> dict:
    return torch.load(path, weights_only=True)["model"]


def test_a_stop_gives_them_the_time_to_save_and_diff_shows_what_changed(tiny_models, tmp_path):
    """SpecForge saves on SIGTERM: a stop asked with a 1 s grace still waits its 300 s, so
    the save that takes 3 s lands and is recorded; a second attempt's changed config is what
    diff shows."""
    wd = workdir(tmp_path, tiny_models)
    gate = tmp_path / "gate"
    plan = write_plan(tmp_path, wd, [train_item("specforge", wd, gate=gate,
                                                extra=("--term-save-s", "3"))])
    state = tmp_path / "s.db"
    env = {"SPECDECK_STATE": str(state)}
    proc = spawn(["run", plan, "train"], state)
    wait_for(gate.exists, "no first checkpoint")
    res = run_cli("stop", plan, "train", "--yes", "--grace", "1", env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    proc.wait(timeout=600)
    s = Store(state)
    run = s.latest_run("train")
    assert run.state == "stopped", run
    assert [a.step for a in s.artefacts("train", "checkpoint")] == [10, 20]  # the SIGTERM save
    s.close()
    cfg = json.loads((wd / "run.yaml").read_text())
    cfg["training"]["learning_rate"] = 3e-4
    (wd / "run.yaml").write_text(json.dumps(cfg))
    plan = write_plan(tmp_path, wd, [train_item("specforge", wd)])  # no gate: straight through
    res = run_cli("run", plan, "train", "--again", env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_cli("diff", plan, "train#1", "train#2", "--json", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "learning_rate" in res.stdout and "0.0003" in res.stdout, res.stdout
