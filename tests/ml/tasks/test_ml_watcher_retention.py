"""The detached watcher's retention (``--keep-newest 2`` and tau): a run's checkpoints are
evaluated for real (the fitted tiny drafter and weaker copies of it), then the newest two, the
best-tau one and a pinned one are kept; the rest are deleted only once evaluated, each listed
with the bytes it freed (stdout's ``retention`` event, ``retention.json``, ``status.json``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from core.ml.formats.runio import run_main  # noqa: E402
from core.ml.tasks import extract as extract_mod  # noqa: E402
from tests.ml.tasks.test_ml_watcher import ENV, REPO, checkpoint, results, run_dirs  # noqa: E402


@pytest.fixture(scope="module")
def fit_cache(tiny_dirs, tmp_path_factory):
    """A feature cache of the two prompts the fitted drafter memorised (tau > 1 there)."""
    root = tmp_path_factory.mktemp("rcache")
    prompts = root / "fit.jsonl"
    prompts.write_text("".join(l + "\n" for l in tiny_dirs["prompts"].read_text().splitlines()
                               if '"fit' in l))
    out = root / "feats"
    argv = ["--target", str(tiny_dirs["target"]), "--prompts", str(prompts), "--layers",
            str(tiny_dirs["drafter"]), "--out", str(out), "--max-new-tokens", "16"]
    assert run_main(extract_mod.main, argv) == 0
    return out


def run_watcher(tiny_dirs, cache, ckpts, out, capsule, *extra):
    argv = [sys.executable, "-m", "core.ml.watcher", "--ckpt-dir", str(ckpts), "--target",
            str(tiny_dirs["target"]), "--cache", str(cache), "--max-new-tokens", "16",
            "--train-capsule", str(capsule), "--out", str(out), "--poll", "0.2", "--settle", "0",
            "--where", "kpro6", *extra]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=ENV)


def test_keep_newest_two_keeps_the_best_tau_and_a_pinned_step_and_lists_what_it_freed(
        tiny_dirs, fit_cache, tmp_path):
    ckpts, capsule, out = run_dirs(tmp_path)
    scales = {10: 0.0, 20: 1.0, 30: 0.0, 40: 0.2, 50: 0.0, 60: 0.3}  # step 20: the fitted one
    for step, scale in scales.items():
        checkpoint(tiny_dirs, ckpts / f"step_{step}.pt", step, scale=scale)
    sizes = {s: (ckpts / f"step_{s}.pt").stat().st_size for s in scales}
    (capsule / "exit").write_text("exit 0\n")
    res = run_watcher(tiny_dirs, fit_cache, ckpts, out, capsule, "--keep-newest", "2",
                      "--pin", "30")
    assert res.returncode == 0, res.stderr[-3000:]
    recs = results(out)
    assert sorted(recs) == sorted(scales)  # every step was evaluated before any deletion
    taus = {s: r["result"]["tau"] for s, r in recs.items()}
    assert taus[20] > max(t for s, t in taus.items() if s != 20)  # the premise: 20 is the best
    kept = sorted(int(p.name[5:-3]) for p in ckpts.glob("step_*.pt"))
    assert kept == [20, 30, 50, 60]  # best, pinned, newest two
    events = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    deleted = [d for e in events if e["event"] == "retention" for d in e["deleted"]]
    assert sorted((d["step"], d["bytes"]) for d in deleted) == [(10, sizes[10]), (40, sizes[40])]
    log = json.loads((out / "retention.json").read_text())
    assert log["freed_bytes"] == sizes[10] + sizes[40]
    assert log["kept"] == {"20": ["best"], "30": ["pinned"], "50": ["newest"], "60": ["newest"]}
    status = json.loads((out / "status.json").read_text())
    assert status["deleted"] == [10, 40] and status["freed_bytes"] == sizes[10] + sizes[40]
    assert "retention: deleted step 10" in res.stderr and "freed" in res.stderr
    # deletion happened after evaluation: each deleted step's result is on file
    assert all(recs[s]["state"] == "done" for s in (10, 40))


def test_a_bad_pin_is_refused_before_anything_runs(tiny_dirs, fit_cache, tmp_path):
    ckpts, capsule, out = run_dirs(tmp_path)
    checkpoint(tiny_dirs, ckpts / "step_10.pt", 10)
    res = run_watcher(tiny_dirs, fit_cache, ckpts, out, capsule, "--keep-newest", "0")
    assert res.returncode == 2 and "--keep-newest 0: must be an integer >= 1" in res.stderr
    res = run_watcher(tiny_dirs, fit_cache, ckpts, out, capsule, "--keep-newest", "1",
                      "--pin", "-3")
    assert res.returncode == 2 and "--pin -3" in res.stderr
    assert (ckpts / "step_10.pt").exists() and not (out / "results").exists()
    assert os.listdir(ckpts) == ["step_10.pt"]
