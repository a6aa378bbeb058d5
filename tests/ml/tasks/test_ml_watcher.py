"""``python -m core.ml.watcher`` as it runs on a host: every checkpoint in order, one result
file per step, a failed eval recorded and the next one evaluated, exit once the train run has
ended; a stop file ends it after the current eval; a missing cache is named before anything;
a checkpoint whose save stalls half-way is evaluated once, when whole; bad entries among good
ones (a FIFO, a link loop, a header claiming more bytes than its file has) are named and the
good ones evaluated."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.ml.tasks import extract as extract_mod
from core.ml.formats.runio import run_main  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


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


def watcher_argv(tiny_dirs, cache, ckpts, out, capsule, *extra) -> list[str]:
    return [sys.executable, "-m", "core.ml.watcher", "--ckpt-dir", str(ckpts), "--target",
            str(tiny_dirs["target"]), "--cache", str(cache), "--max-new-tokens", "16",
            "--train-capsule", str(capsule), "--out", str(out), "--poll", "0.2", "--settle", "0",
            "--where", "kpro6", "--limit", "2", *extra]


ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def watcher(tiny_dirs, cache, ckpts, out, capsule, *extra, timeout=300):
    return subprocess.run(watcher_argv(tiny_dirs, cache, ckpts, out, capsule, *extra),
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, env=ENV)


def run_dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The trainer's output dir and its run capsule (made), and the watcher's dir."""
    ckpts, capsule, out = tmp_path / "out", tmp_path / "cap", tmp_path / "watch"
    ckpts.mkdir()
    capsule.mkdir()
    return ckpts, capsule, out


def results(out: Path) -> dict[int, dict]:
    return {int(p.stem[5:]): json.loads(p.read_text()) for p in (out / "results").glob("step_*.json")}


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


def test_a_speculators_save_that_stalls_half_way_is_evaluated_once_when_whole(
        tiny_dirs, cache, tmp_path):
    pytest.importorskip("speculators", reason="needs speculators==0.9.0 (scripts/bootstrap --test)")
    from core.ml.tasks import export as export_mod
    from tests.ml.train.trainer_savers import SpeculatorsRun

    spec = tmp_path / "spec"
    assert run_main(export_mod.main, [str(tiny_dirs["drafter"]), "--out", str(spec), "--format",
                                      "speculators", "--target", str(tiny_dirs["target"]),
                                      "--dtype", "fp32"]) == 0
    staged = SpeculatorsRun(spec, tmp_path / "staged").save(1)  # what its saver writes, whole
    ckpts, capsule, out = run_dirs(tmp_path)
    epoch = ckpts / "1"
    epoch.mkdir()
    shutil.copy(staged / "config.json", epoch)  # save_pretrained writes its config first
    blob = (staged / "model.safetensors").read_bytes()
    (epoch / "model.safetensors").write_bytes(blob[: len(blob) // 2])  # then stalls half-way
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(watcher_argv(tiny_dirs, cache, ckpts, out, capsule, "--settle", "2",
                                             "--trainer", "speculators"),
                                cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, env=ENV)
        try:
            seen = []
            for line in proc.stdout:  # until the watcher has read the half-written dir
                seen.append(json.loads(line))
                if seen[-1].get("step") == 1 and (seen[-1].get("phase") == "failed"
                                                  or seen[-1]["event"] == "watch"):
                    break
            with open(epoch / "model.safetensors", "ab") as f:  # the save goes on, within --settle
                f.write(blob[len(blob) // 2:])
            for f in staged.iterdir():
                if not (epoch / f.name).exists():
                    shutil.copy(f, epoch)
            (capsule / "exit").write_text("exit 0\n")
            rest, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, (tmp_path / "stderr").read_text()[-3000:]
    failed = seen[-1]
    assert failed["phase"] == "failed", failed  # read too early, and not recorded
    assert failed["error"] == (f"{epoch}/model.safetensors: truncated (header says {len(blob)} "
                               f"bytes, file has {len(blob) // 2})")
    events = seen + [json.loads(x) for x in rest.splitlines() if x.startswith("{")]
    assert any(e.get("phase") == "changed" and e["step"] == 1 for e in events)
    assert [(e["step"], e["state"]) for e in events if e["event"] == "watch"] == [(1, "done")]
    recs = results(out)
    assert list(recs) == [1] and recs[1]["state"] == "done" and recs[1]["result"]["tau"] >= 1.0
    assert recs[1]["checkpoint"] == str(epoch)
    status = json.loads((out / "status.json").read_text())
    assert status["done"] == [1] and status["failed"] == [] and status["settling"] == []


def test_bad_entries_among_good_ones_are_named_and_every_good_one_evaluated(
        tiny_dirs, cache, tmp_path):
    ckpts, capsule, out = run_dirs(tmp_path)
    checkpoint(tiny_dirs, ckpts / "step_20.pt", 20)
    checkpoint(tiny_dirs, ckpts / "step_60.pt", 60, scale=0.5)
    os.mkfifo(ckpts / "step_40.pt")  # a load would wait on it forever
    weights = (tiny_dirs["drafter"] / "model.safetensors").read_bytes()
    for epoch in (3, 5):
        (ckpts / str(epoch)).mkdir()
        shutil.copy(tiny_dirs["drafter"] / "config.json", ckpts / str(epoch))
    (ckpts / "3" / "model.safetensors").write_bytes(weights[:-100])  # its header claims 100 bytes more
    os.symlink("model.safetensors", ckpts / "5" / "model.safetensors")  # a link loop
    for name in ("latest", "checkpoint_best", "loop"):
        os.symlink(name, ckpts / name)  # pointers that point nowhere but at themselves
    (capsule / "exit").write_text("exit 0\n")
    res = watcher(tiny_dirs, cache, ckpts, out, capsule, "--settle", "0.5")
    assert res.returncode == 0, res.stderr[-3000:]
    recs = results(out)
    assert {s: r["state"] for s, r in recs.items()} == \
        {3: "failed", 5: "failed", 20: "done", 40: "failed", 60: "done"}
    assert recs[3]["error"] == (f"{ckpts}/3/model.safetensors: truncated (header says "
                                f"{len(weights)} bytes, file has {len(weights) - 100})")
    assert recs[5]["error"] == f"{ckpts}/5/model.safetensors: is a symbolic link, not a regular file"
    assert recs[40]["error"] == f"{ckpts}/step_40.pt: is a FIFO, not a regular file"
    assert recs[20]["result"]["tau"] >= 1.0 and recs[60]["result"]["tau"] >= 1.0
    events = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    named = {e["step"]: e["error"] for e in events if e["event"] == "watch" and e["state"] == "failed"}
    assert named == {s: recs[s]["error"] for s in (3, 5, 40)}
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "ended" and status["done"] == [20, 60] and status["failed"] == [3, 5, 40]
