"""``python -m core.ml.watcher`` as it runs on a host: every checkpoint in order, one result
file per step, a failed eval recorded and the next one evaluated, exit once the train run has
ended; a stop file ends it after the current eval; a missing cache is named before anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.ml import extract as extract_mod  # noqa: E402
from core.ml.runio import run_main  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache(tiny_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("wcache") / "feats"
    argv = ["--target", str(tiny_dirs["target"]), "--prompts", str(tiny_dirs["prompts"]),
            "--layers", str(tiny_dirs["drafter"]), "--out", str(out), "--max-new-tokens", "16",
            "--limit", "2"]
    assert run_main(extract_mod.main, argv) == 0
    return out


def checkpoint(tiny_dirs, path: Path, step: int, scale: float = 1.0) -> None:
    """A core.ml.train-shaped checkpoint of the tiny drafter (weights scaled: another drafter)."""
    from safetensors.torch import load_file

    d = tiny_dirs["drafter"]
    state = {k: v * scale for k, v in load_file(d / "model.safetensors").items()}
    cfg = json.loads((d / "config.json").read_text())
    torch.save({"model": state, "optimizer": {}, "step": step, "drafter_config": cfg}, path)


def watcher(tiny_dirs, cache, ckpts, out, capsule, *extra, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "core.ml.watcher", "--ckpt-dir", str(ckpts), "--target",
         str(tiny_dirs["target"]), "--cache", str(cache), "--max-new-tokens", "16",
         "--train-capsule", str(capsule), "--out", str(out), "--poll", "0.2", "--settle", "0",
         "--where", "kpro6", "--limit", "2", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)})


def test_every_checkpoint_once_a_failed_eval_is_recorded_and_the_next_follows(
        tiny_dirs, cache, tmp_path):
    ckpts, capsule, out = tmp_path / "out", tmp_path / "train-capsule", tmp_path / "watch"
    ckpts.mkdir()
    capsule.mkdir()
    checkpoint(tiny_dirs, ckpts / "step_20.pt", 20)
    (ckpts / "step_40.pt").write_bytes(b"not a torch checkpoint")  # its eval fails
    checkpoint(tiny_dirs, ckpts / "step_60.pt", 60, scale=0.5)
    (capsule / "exit").write_text("exit 0\n")  # the train run has ended
    res = watcher(tiny_dirs, cache, ckpts, out, capsule)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = {int(p.stem[5:]): json.loads(p.read_text()) for p in (out / "results").glob("step_*.json")}
    assert sorted(recs) == [20, 40, 60]
    assert [recs[s]["state"] for s in (20, 40, 60)] == ["done", "failed", "done"], recs[20].get("error")
    assert "step_40.pt" in recs[40]["error"] and "result" not in recs[40]
    assert recs[20]["result"]["tau"] >= 1.0 and recs[20]["result"]["mode"] == "offline"
    assert recs[20]["result"]["prompts"]["count"] == 2
    assert recs[60]["result"]["drafter"]["fingerprint"] != recs[20]["result"]["drafter"]["fingerprint"]
    assert all(r["max_rss_bytes"] > 0 and r["seconds"] > 0 for r in recs.values())
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "ended" and status["last_step"] == 60 and status["queue"] == []
    assert status["done"] == [20, 60] and status["failed"] == [40]
    events = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert [(e["step"], e["state"]) for e in events if e["event"] == "watch"] == \
        [(20, "done"), (40, "failed"), (60, "done")]
    # started again (its capsule restarted): nothing is evaluated twice
    res = watcher(tiny_dirs, cache, ckpts, out, capsule)
    assert res.returncode == 0 and '"event": "watch"' not in res.stdout


def test_a_stop_file_ends_it_with_checkpoints_waiting(tiny_dirs, cache, tmp_path):
    ckpts, capsule, out = tmp_path / "out", tmp_path / "cap", tmp_path / "watch"
    ckpts.mkdir()
    capsule.mkdir()
    out.mkdir()
    checkpoint(tiny_dirs, ckpts / "step_20.pt", 20)
    (out / "stop").write_text("")
    res = watcher(tiny_dirs, cache, ckpts, out, capsule, timeout=120)
    assert res.returncode == 0, res.stderr
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "stopped" and status["queue"] == [20]
    assert not list((out / "results").glob("step_*.json"))


def test_a_missing_cache_is_named_and_nothing_runs(tiny_dirs, tmp_path):
    out = tmp_path / "watch"
    res = watcher(tiny_dirs, tmp_path / "nowhere", tmp_path, out, tmp_path, timeout=120)
    assert res.returncode == 2
    assert f"kpro6: no feature cache at {tmp_path / 'nowhere'}" in res.stderr
    assert "extract_hidden item on this host" in res.stderr and "Traceback" not in res.stderr
    assert json.loads((out / "status.json").read_text())["state"] == "failed"


def test_a_resumed_run_skips_the_earlier_runs_steps(tiny_dirs, cache, tmp_path):
    ckpts, capsule, out = tmp_path / "out", tmp_path / "cap", tmp_path / "watch"
    ckpts.mkdir()
    capsule.mkdir()
    for step in (20, 40):
        checkpoint(tiny_dirs, ckpts / f"step_{step}.pt", step)
    (capsule / "exit").write_text("exit 0\n")
    res = watcher(tiny_dirs, cache, ckpts, out, capsule, "--after", "20")
    assert res.returncode == 0, res.stderr[-2000:]
    assert [p.name for p in (out / "results").glob("step_*.json")] == ["step_40.json"]


def test_sampling_flags_reach_every_eval_the_baseline_too(tiny_dirs, tmp_path):
    ckpts, capsule, out = tmp_path / "out", tmp_path / "cap", tmp_path / "watch"
    ckpts.mkdir()
    capsule.mkdir()
    checkpoint(tiny_dirs, ckpts / "step_20.pt", 20)
    (capsule / "exit").write_text("exit 0\n")
    res = watcher(tiny_dirs, tmp_path / "no-cache", ckpts, out, capsule, "--mode", "online",
                  "--prompts", str(tiny_dirs["prompts"]), "--baseline", str(tiny_dirs["drafter"]),
                  "--temperature", "0.7", "--top-p", "0.9", "--top-k", "5", "--seed", "3",
                  "--samples", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    rec = json.loads((out / "results" / "step_20.json").read_text())
    assert rec["state"] == "done", rec.get("error")
    for r in (rec["result"], rec["baseline"]):
        assert (r["temperature"], r["top_p"], r["top_k"], r["seed"], r["samples"]) == (0.7, 0.9, 5, 3, 2)
        rows = r["per_prompt"]
        assert sorted({row["sample"] for row in rows}) == [0, 1] and all(row["seed"] for row in rows)


def test_offline_at_a_temperature_is_refused_before_anything_runs(tiny_dirs, tmp_path):
    out = tmp_path / "watch"
    res = watcher(tiny_dirs, tmp_path, tmp_path, out, tmp_path, "--temperature", "0.7", timeout=120)
    assert res.returncode == 2
    assert "kpro6: --temperature 0.7: offline tau" in res.stderr and "--mode online" in res.stderr
    assert "Traceback" not in res.stderr
    assert json.loads((out / "status.json").read_text())["state"] == "failed"
