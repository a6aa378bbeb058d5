"""Reference trainer end to end: ``python -m core.ml.train`` as a user (and specdeck) runs it.

Training runs in-process through ``run_main(train.main, argv)`` (the ``python -m`` code path)
to keep the suite fast; SIGTERM, torchrun and the exit status of a bad config use real
subprocesses. Workspace: :func:`tests.ml.train.test_train.workspace`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")

from core.ml.train import trainer as train_mod  # noqa: E402
from core.ml.train import config as tc  # noqa: E402
from core.ml.formats.runio import run_main  # noqa: E402
from tests.ml.train.test_train import B, REPO, workspace  # noqa: E402

NUMERIC = ("loss", "lr", "eal", "tokens_per_s", "eta_s", "full_acc", "streak", "grad_norm")


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tiny, qwen3_target) -> Path:
    return workspace(tmp_path_factory, tiny, qwen3_target)


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def train(ws: Path, capsys, *argv: str, config: Path | None = None) -> tuple[int, list[dict], str]:
    """Run the trainer in-process; returns (exit status, stdout JSON lines, stderr)."""
    capsys.readouterr()
    rc = run_main(train_mod.main, ["--config", str(config or ws / "base.yaml"), *argv])
    out = capsys.readouterr()
    return rc, [json.loads(line) for line in out.out.splitlines() if line.strip()], out.err


def metrics(lines: list[dict]) -> list[dict]:
    return [x for x in lines if "event" not in x]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
            "TRANSFORMERS_VERBOSITY": "error"}


# ----------------------------------------------------------------------------- the trained drafter


@pytest.fixture(scope="module")
def trained(ws, tmp_path_factory):
    """200 steps of the default (v5) trainer on the 6 cached sequences."""
    out = tmp_path_factory.mktemp("run") / "v5"
    from io import StringIO  # capsys is function-scoped: capture by hand in this module fixture

    buf, err, old = StringIO(), StringIO(), (sys.stdout, sys.stderr)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    sys.stdout, sys.stderr = buf, err
    try:
        t0 = time.perf_counter()
        rc = run_main(train_mod.main, ["--config", str(ws / "base.yaml"), "--out", str(out)])
        seconds = time.perf_counter() - t0
    finally:
        sys.stdout, sys.stderr = old
        torch.set_num_threads(n)
    assert rc == 0, err.getvalue()
    return {"out": out, "lines": [json.loads(x) for x in buf.getvalue().splitlines()], "err": err.getvalue(),
            "seconds": seconds}


def offline_tau(ws: Path, drafter_dir: Path, out: Path, capsys) -> float:
    from core.ml.tasks import eval as eval_mod

    argv = ["--target", str(ws / "target"), "--drafter", str(drafter_dir), "--prompts", str(ws / "prompts.jsonl"),
            "--mode", "offline", "--cache", str(ws / "feats_taps"), "--out", str(out)]
    assert run_main(eval_mod.main, argv) == 0, capsys.readouterr().err
    return json.loads(out.read_text())["tau"]


def test_trained_drafter_beats_an_untrained_one(ws, trained, tmp_path, capsys):
    """train -> strip -> eval (offline, the target's own greedy continuations): tau clearly up."""
    from core.ml.tasks import strip as strip_mod
    from core.ml.models.drafter import load_drafter, save_drafter

    run = trained["out"]
    ckpt = run / "step_200.pt"
    assert run_main(strip_mod.main, [str(ckpt), str(tmp_path / "trained"), "--config", str(run)]) == 0
    state = torch.load(ckpt, weights_only=True)
    loaded = load_drafter(tmp_path / "trained")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state["model"].items())
    untrained = train_mod.new_drafter(state["drafter_config"], 0.02, 0)  # the run's own step-0 weights
    save_drafter(untrained, tmp_path / "untrained")
    tau_trained = offline_tau(ws, tmp_path / "trained", tmp_path / "t.json", capsys)
    tau_untrained = offline_tau(ws, tmp_path / "untrained", tmp_path / "u.json", capsys)
    print(f"tau trained {tau_trained:.3f} vs untrained {tau_untrained:.3f}; training took {trained['seconds']:.1f} s")
    assert tau_untrained < 1.2 and tau_trained > tau_untrained + 1.0


def test_stdout_lines_and_checkpoints_follow_the_contract(trained):
    from core.ml.models.drafter import expected_tensors
    from core.ml.formats.drafter_config import DFlashConfig

    lines, run = trained["lines"], trained["out"]
    rows = metrics(lines)
    assert [r["step"] for r in rows] == list(range(10, 201, 10))
    for r in rows:
        assert isinstance(r["step"], int) and len(r["acc"]) == B - 1
        assert all(isinstance(r[k], (int, float)) and not isinstance(r[k], bool) for k in NUMERIC)
        assert r["eal"] == pytest.approx(sum(__import__("math").prod(r["acc"][:k]) for k in range(1, B)))
    assert rows[-1]["loss"] < rows[0]["loss"] / 2 and rows[-1]["eal"] > rows[0]["eal"]
    assert rows[-1]["eta_s"] == 0 and rows[0]["eta_s"] > 0
    ckpts = [x for x in lines if x.get("event") == "checkpoint"]
    assert [(c["step"], c["path"]) for c in ckpts] == [(n, str(run / f"step_{n}.pt")) for n in (100, 200)]
    assert set(ckpts[0]) == {"event", "step", "path"}
    assert lines[0]["event"] == "info" and lines[-1] == {"event": "result", "task": "train", "step": 200,
                                                          "path": str(run / "step_200.pt")}
    assert (run / "latest").read_text().strip() == "step_200.pt"
    ckpt = torch.load(run / "step_100.pt", weights_only=True)  # plain types only
    assert set(ckpt) >= {"model", "optimizer", "scheduler", "step", "config", "drafter_config"}
    assert ckpt["step"] == 100 and ckpt["optimizer"]["state"]
    assert ckpt["config"] == yaml.safe_load((run / "resolved_config.yaml").read_text())
    assert ckpt["drafter_config"] == json.loads((run / "config.json").read_text())
    want = expected_tensors(DFlashConfig.from_dict(ckpt["drafter_config"]))
    assert {k: tuple(v.shape) for k, v in ckpt["model"].items()} == want  # published tensor names


def test_strip_reads_the_drafter_config_from_the_checkpoint(trained, tmp_path):
    from core.ml.tasks import strip as strip_mod
    from core.ml.models.drafter import load_drafter

    ckpt = trained["out"] / "step_100.pt"  # no --config: strip finds checkpoint["drafter_config"]
    assert run_main(strip_mod.main, [str(ckpt), str(tmp_path / "d")]) == 0
    state = torch.load(ckpt, weights_only=True)["model"]
    loaded = load_drafter(tmp_path / "d").state_dict()
    assert set(loaded) == set(state) and all(torch.equal(loaded[k], v) for k, v in state.items())


# ----------------------------------------------------------------------------- v4 vs v5


def test_v4_and_v5_runs_differ_exactly_in_the_v4_knobs(ws, tmp_path, capsys):
    common = ["--set", f"target={ws / 'target'}", "--set", f"data.features={ws / 'feats'}", "--max-steps", "2"]
    resolved, fc = {}, {}
    for name in ("v5", "v4-legacy"):
        rc, lines, err = train(ws, capsys, *common, "--out", str(tmp_path / name),
                               config=REPO / "plans" / "train" / f"{name}.yaml")
        assert rc == 0, err
        resolved[name] = yaml.safe_load((tmp_path / name / "resolved_config.yaml").read_text())
        fc[name] = torch.load(tmp_path / name / "step_2.pt", weights_only=True)["model"]["fc.weight"].shape
        assert lines[0]["fc_in_features"] == fc[name][1]
    diff = tc.knob_diff(resolved["v5"], resolved["v4-legacy"])
    assert set(diff) == set(tc.V4_KNOBS)
    assert diff["loss.gamma"] == (4.0, 10.0) and diff["noise.target"] == ("fc_input", "all_features")
    assert fc == {"v5": (64, 128), "v4-legacy": (64, 192)}  # K*H vs (K+1)*H


# ----------------------------------------------------------------------------- resume


def test_resume_continues_the_loss_curve(ws, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    args = ["--max-steps", "6", "--set", "train.checkpoint_every=3", "--set", "train.log_every=1"]
    rc, full, err = train(ws, capsys, "--out", str(a), *args)
    assert rc == 0, err
    rc, resumed, err = train(ws, capsys, "--out", str(b), *args, "--resume", str(a / "step_3.pt"))
    assert rc == 0, err
    assert "resumed from" in err and resumed[0]["start_step"] == 3
    curve = {r["step"]: r for r in metrics(full)}
    assert [r["step"] for r in metrics(resumed)] == [4, 5, 6]
    for r in metrics(resumed):
        assert r["loss"] == pytest.approx(curve[r["step"]]["loss"], rel=1e-6)
        assert r["lr"] == pytest.approx(curve[r["step"]]["lr"])
    end_a = torch.load(a / "step_6.pt", weights_only=True)
    end_b = torch.load(b / "step_6.pt", weights_only=True)
    for k, v in end_a["model"].items():
        assert torch.allclose(v, end_b["model"][k], atol=1e-6), k  # optimizer moments restored too
    exp_a = end_a["optimizer"]["state"][0]["exp_avg_sq"]
    assert torch.allclose(exp_a, end_b["optimizer"]["state"][0]["exp_avg_sq"], rtol=1e-5)
    assert end_b["optimizer"]["state"][0]["step"] == 6
    rc, _, err = train(ws, capsys, "--out", str(a), *args)
    assert rc == 2 and "already holds checkpoints" in err  # a fresh start never overwrites a run
    rc, more, err = train(ws, capsys, "--out", str(a), "--resume", "auto", "--max-steps", "7")
    assert rc == 0 and more[0]["start_step"] == 6 and metrics(more)[-1]["step"] == 7


# ----------------------------------------------------------------------------- data file, validation


def test_on_the_fly_jsonl_training_with_validation(ws, tmp_path, capsys):
    from core.ml.formats.featstore import load_manifest, read_entry

    m = load_manifest(ws / "feats")
    rows = []
    for pid, e in list(m["entries"].items())[:3]:
        seq = read_entry(ws / "feats", pid, e)
        ids = seq.input_ids.tolist()
        rows.append({"id": pid, "input_ids": ids[: seq.prompt_len], "response_ids": ids[seq.prompt_len:]})
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, lines, err = train(ws, capsys, "--out", str(tmp_path / "o"), "--max-steps", "3",
                           "--set", f"data.file={tmp_path / 'data.jsonl'}", "--set", "data.features=null",
                           "--set", "data.val_count=1", "--set", "train.log_every=1")
    assert rc == 0, err
    assert lines[0]["train_sequences"] == 2 and lines[0]["val_sequences"] == 1
    val = [x for x in lines if x.get("event") == "validation"]
    assert len(val) == 1 and val[0]["step"] == 3 and len(val[0]["val_acc"]) == B - 1
    assert "loss" not in val[0] and val[0]["val_loss"] > 0  # never mistaken for a metrics line
    # what reproduces the run (issue 47 §2): the data by digest, the target, the versions
    rec = json.loads((tmp_path / "o" / "provenance.json").read_text())["reproduce"]
    digest = __import__("hashlib").sha256((tmp_path / "data.jsonl").read_bytes()).hexdigest()
    assert rec["data"] == {"path": str((tmp_path / "data.jsonl").resolve()), "sha256": digest}
    assert rec["target"]["path"] == str((ws / "target").resolve()) and rec["target"]["config_sha256"]
    assert rec["versions"]["torch"] == torch.__version__ and rec["config"] == {"file": "resolved_config.yaml"}


# ----------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_two_ranks_agree_after_a_step(ws, tmp_path):
    dump = tmp_path / "dump"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "core.ml.train", "--config", str(ws / "base.yaml"),
           "--out", str(tmp_path / "o"), "--max-steps", "2", "--set", "train.log_every=1",
           "--debug-dump-weights", str(dump)]
    res = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.strip()]
    assert [r["step"] for r in metrics(lines)] == [1, 2]  # rank 0 only prints
    assert lines[0]["world_size"] == 2 and lines[0]["steps_per_epoch"] == 3
    r0, r1 = (torch.load(dump / f"rank{r}_step1.pt", weights_only=True) for r in (0, 1))
    assert r0["sequences"] != r1["sequences"]  # different data on each rank ...
    for k, v in r0["model"].items():
        assert torch.equal(v, r1["model"][k]), k  # ... same weights after the all-reduced step
    init = train_mod.new_drafter(torch.load(tmp_path / "o" / "step_2.pt", weights_only=True)["drafter_config"], 0.02, 0)
    assert not torch.equal(init.state_dict()["fc.weight"], r0["model"]["fc.weight"])


def test_sigterm_leaves_a_loadable_checkpoint(ws, tmp_path):
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "core.ml.train", "--config", str(ws / "base.yaml"), "--out", str(out),
           "--max-steps", "100000", "--set", "train.log_every=1", "--set", "train.checkpoint_every=100000"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(json.loads(line))
            if "event" not in seen[-1]:
                break  # training is under way
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines = seen + [json.loads(x) for x in rest.splitlines() if x.strip()]
    stopped, ckpt = lines[-1], lines[-2]
    assert stopped["event"] == "stopped" and ckpt["event"] == "checkpoint" and ckpt["step"] == stopped["step"] >= 1
    assert metrics(lines)[-1]["step"] == stopped["step"]  # no more than the current step is lost
    state = torch.load(ckpt["path"], weights_only=True)
    assert state["step"] == stopped["step"] and (out / "latest").read_text().strip() == Path(ckpt["path"]).name
    assert "SIGTERM" in err


def test_bad_config_exits_2_naming_the_key(ws, tmp_path):
    bad = tmp_path / "train.yaml"
    bad.write_text((ws / "base.yaml").read_text() + "loss: {gama: 5}\n")
    res = subprocess.run([sys.executable, "-m", "core.ml.train", "--config", str(bad)], cwd=REPO, env=env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines()[-1] == \
        "error: train.yaml: unknown key 'gama' in section 'loss' (did you mean 'gamma'?)"
