"""Issue 42 §6: what validate accepts, the run can do. A number the run cannot use at the type it
uses it (a seed past 64 bits for torch.manual_seed, a temperature whose division overflows
float32 logits, a learning rate infinite in float32, a token count of 10**20, a top_k past the
vocabulary) is refused by ``specdeck validate`` and ``run`` (exit 2, ``file:line:col``, the item
and the field named, nothing run) and by the ``python -m core.ml.*`` command lines a host runs
(exit 2, the flag or key named, nothing written), never an internal error halfway."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from tests.fault.conftest import local_plan, no_traceback, run_cli
from tests.preloaded import run_module

BIG = "100000000000000000000"  # 10**20: past 64 bits
SEED = str(2 ** 64)  # torch.manual_seed raises on it


def _eval(params: str) -> str:
    return ("  - id: ev\n    content: measure tau\n    action: {kind: eval, host: here, params: "
            "{drafter: d, target: T, " + params + "}}\n")


def _train(params: str) -> str:
    return ("  - id: tr\n    content: train\n    action: {kind: train, host: here, params: "
            "{config: train.yaml, " + params + "}}\n")


CASES = [
    # (item yaml, item id, field path under action.params, words the message holds)
    (_eval(f"seed: {SEED}"), "ev", "seed", "64 bits"),
    (_eval("temperature: 1.0e-45"), "ev", "temperature", "float32 logits"),
    (_eval("temperature: .inf"), "ev", "temperature", "finite"),
    (_eval("temperature: 0.5, top_p: 1.0e-300"), "ev", "top_p", "float32"),
    (_eval("temperature: 0.5, top_k: 100000"), "ev", "top_k", "320 tokens"),
    (_eval(f"max_new_tokens: {BIG}"), "ev", "max_new_tokens", "64 bits"),
    (_eval("max_new_tokens: 3000000000"), "ev", "max_new_tokens", "<= 2147483647"),
    (_eval("temperature: 0.5, samples: 3000000000"), "ev", "samples", "<= 2147483647"),
    (_eval(f"step: {BIG}"), "ev", "step", "64 bits"),
    ("  - id: ex\n    content: extract\n    action: {kind: extract_hidden, host: here, params: "
     "{target: T, out: feats, layers: [1, -1]}}\n", "ex", "layers[1]", ">= 0"),
    (_train('overrides: {"train.lr": 1.0e+39}'), "tr", "config", "'train.lr' 1e+39"),
    (_train('overrides: {"loss.gamma": 1.0e-46}'), "tr", "config", "'loss.gamma' 1e-46"),
    (_train(f'overrides: {{"seed": {SEED}}}'), "tr", "config", "'seed'"),
    (_train(f'overrides: {{"data.max_new_tokens": {BIG}}}'), "tr", "config", "'data.max_new_tokens'"),
    (_train('overrides: {"loss.temperature": 1.0e-30}'), "tr", "config", "'loss.temperature'"),
    (_train("stop_grace_s: 1.0e+300"), "tr", "stop_grace_s", "seconds"),
    (_train("rdzv_port: 70000"), "tr", "rdzv_port", "<= 65535"),
    (_train('watch_eval: {target: T, cache: c, seed: ' + SEED + '}'), "tr", "watch_eval.seed", "64 bits"),
    (_train("watch_eval: {target: T, cache: c, max_prompts: 0}"), "tr", "watch_eval.max_prompts", ">= 1"),
]


TARGET = {"model_type": "qwen3", "vocab_size": 320, "num_hidden_layers": 4, "hidden_size": 64,
          "num_attention_heads": 4, "intermediate_size": 128}


def _plan(tmp_path, item: str, target_config: dict = TARGET):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(target_config))
    (tmp_path / "train.yaml").write_text(f"target: {target}\nout_dir: out\ndata: {{features: feats}}\n")
    return local_plan(tmp_path, item.replace("target: T", f"target: {target}"))


@pytest.mark.parametrize("item, item_id, field, words", CASES, ids=[f"{c[1]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_a_number_the_run_cannot_use_is_refused_by_validate_and_run(tmp_path, item, item_id, field, words):
    plan = _plan(tmp_path, item)
    db = tmp_path / "state.db"
    for args in (("validate", plan), ("--state", db, "run", plan, item_id)):
        res = run_cli(*args)
        no_traceback(res)
        assert res.returncode == 2, (args, res.stderr)
        line = next((ln for ln in res.stderr.splitlines() if f"field 'action.params.{field}'" in ln), "")
        assert line.startswith(f"{plan}:") and f"item '{item_id}'" in line and words in line, res.stderr
    assert not db.exists()  # nothing run, nothing recorded
    assert not (tmp_path / "wd").exists()


def test_the_bounds_leave_every_usable_value_alone(tmp_path):
    """The edges a run can use pass: a seed of -2**63 and 2**63-1, temperature 1e-4 and 1e4,
    a top_k of the whole vocabulary, 2**31-1 new tokens, limit 0 (every prompt, as unset)."""
    item = (_eval("seed: -9223372036854775808, temperature: 1.0e-4, top_k: 320, top_p: 1.2e-38, "
                  "max_new_tokens: 2147483647, limit: 0")
            + _eval("seed: 9223372036854775807, temperature: 1.0e+4").replace("id: ev", "id: ev2")
            + _train('overrides: {"train.lr": 3.0e+38, "loss.gamma": 1.2e-38, "seed": 9223372036854775807}'))
    res = run_cli("validate", _plan(tmp_path, item))
    assert res.returncode == 0, res.stderr


def test_a_target_config_json_without_a_size_is_named_not_a_crash(tmp_path):
    """validate reads a local target's config.json for the trainer's sizes: one that lacks
    num_hidden_layers was a KeyError (exit 1); now the key and the file are named (exit 2)."""
    partial = {k: v for k, v in TARGET.items() if k != "num_hidden_layers"}
    res = run_cli("validate", _plan(tmp_path, _train("launcher: process"), partial))
    no_traceback(res)
    assert res.returncode == 2, res.stderr
    assert "field 'action.params.config'" in res.stderr and "num_hidden_layers None" in res.stderr, res.stderr


def _ml(module: str, *args, cwd):
    res = run_module(module, *args, cwd=cwd, timeout=120,  # its own process (tests/preloaded.py)
                     env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    no_traceback(res)
    return res


@pytest.fixture
def dirs(tmp_path):
    """A target, drafter and prompts as the ml tasks' first checks read them (nothing is loaded:
    the numbers are refused before)."""
    for name in ("target", "drafter"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 320}))
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    return tmp_path


@pytest.mark.parametrize("flags, flag, words", [
    (["--seed", SEED], "--seed", "64 bits"),
    (["--seed", str(-2 ** 63 - 1)], "--seed", "64 bits"),
    (["--temperature", "1e-45"], "--temperature", "float32 logits"),
    (["--temperature", "nan"], "--temperature", "finite"),
    (["--temperature", "0.5", "--top-p", "1e-300"], "--top-p", "float32"),
    (["--temperature", "0.5", "--top-k", "100000"], "--top-k", "320 tokens"),
    (["--max-new-tokens", BIG], "--max-new-tokens", "<= 2147483647"),
    (["--limit", "0"], "--limit", ">= 1"),
    (["--tree-budget", "99999999999"], "--tree-budget", "<= 2147483647"),
    (["--temperature", "0.5", "--samples", "99999999999"], "--samples", "<= 2147483647"),
    (["--engine", "llama.cpp", "--engine-context", "99999999999"], "--engine-context", "<= 2147483647"),
])
def test_eval_refuses_a_number_it_cannot_run_by_flag(dirs, flags, flag, words):
    out = dirs / "r.json"
    res = _ml("core.ml.eval", "--target", dirs / "target", "--drafter", dirs / "drafter", "--prompts",
              dirs / "p.jsonl", "--out", out, *flags, cwd=dirs)
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {flag} ") and words in last, res.stderr
    assert not out.exists() and not (dirs / "provenance.json").exists()


@pytest.mark.parametrize("flags, flag", [(["--seed", SEED], "--seed"), (["--max-new-tokens", BIG], "--max-new-tokens")])
def test_extract_refuses_a_number_it_cannot_run_by_flag(dirs, flags, flag):
    res = _ml("core.ml.extract", "--target", dirs / "target", "--prompts", dirs / "p.jsonl", "--layers", "1",
              "--out", dirs / "feats", *flags, cwd=dirs)
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith(f"error: {flag} "), res.stderr
    assert not (dirs / "feats").exists()


@pytest.mark.parametrize("flags, words", [
    (["--set", "train.lr=1e39"], "'train.lr' 1e+39"),
    (["--set", "loss.gamma=1e-46"], "'loss.gamma' 1e-46"),
    (["--set", f"seed={SEED}"], "'seed'"),
    (["--max-steps", BIG], "'train.max_steps'"),
])
def test_train_refuses_a_knob_float32_or_int64_cannot_hold(dirs, flags, words):
    (dirs / "t.yaml").write_text(f"target: {dirs / 'target'}\ndata: {{features: {dirs / 'feats'}}}\n")
    res = _ml("core.ml.train", "--config", dirs / "t.yaml", "--out", dirs / "out", *flags, cwd=dirs)
    assert res.returncode == 2, res.stderr
    assert words in res.stderr.strip().splitlines()[-1], res.stderr
    assert not (dirs / "out").exists()


@pytest.mark.parametrize("flags, flag", [(["--seed", SEED], "--seed"), (["--poll", "1e300"], "--poll"),
                                         (["--every", BIG], "--every")])
def test_the_watcher_refuses_once_before_any_checkpoint(dirs, flags, flag):
    res = _ml("core.ml.watcher", "--ckpt-dir", dirs / "ck", "--target", dirs / "target", "--mode", "online",
              "--prompts", dirs / "p.jsonl", "--out", dirs / "w", *flags, cwd=dirs)
    assert res.returncode == 2 and f"{flag} " in res.stderr.strip().splitlines()[-1], res.stderr
    assert json.loads((dirs / "w" / "status.json").read_text())["state"] == "failed"
