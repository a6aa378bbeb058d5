"""Issue 47 §2: the parts of the record that reproduces a run (core.ml.formats.reproduce), each
read from real files and a real git checkout: no torch needed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from core.ml.formats import reproduce

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def checkout(repo: Path, name: str, text: str) -> Path:
    """A real git repository at ``repo`` with one commit of the file ``name`` holding ``text``."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / name).write_text(text)
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", "first")
    return repo


def test_a_dirty_checkout_keeps_its_diff_beside_the_run_and_only_its_digest_in_the_record(tmp_path, monkeypatch):
    repo = checkout(tmp_path / "code", "a.py", "x = 1\n")
    monkeypatch.setenv(reproduce.SOURCE_ENV, str(repo))
    clean = reproduce.git_state(tmp_path / "run1")
    assert clean == {"dir": str(repo.resolve()), "commit": git(repo, "rev-parse", "HEAD"), "dirty": False}
    (repo / "a.py").write_text("x = 2  # '; rm -rf / $(boom)\n")  # a diff is data, never a command
    (repo / "untracked.txt").write_text("not part of the code\n")
    out = tmp_path / "run2"
    out.mkdir()
    dirty = reproduce.git_state(out)
    kept = Path(dirty["diff"])
    assert dirty["dirty"] is True and kept == (out / "git.diff").resolve()
    assert "+x = 2  # '; rm -rf / $(boom)" in kept.read_text() and "untracked" not in kept.read_text()
    assert dirty["diff_bytes"] == len(kept.read_bytes()) and not dirty["diff_truncated"]
    assert len(dirty["diff_sha256"]) == 64


def test_a_diff_past_the_cap_is_cut_and_said(tmp_path, monkeypatch):
    repo = checkout(tmp_path / "code", "big.txt", "")
    (repo / "big.txt").write_text("line of text\n" * 10_000)
    monkeypatch.setenv(reproduce.SOURCE_ENV, str(repo))
    monkeypatch.setattr(reproduce, "DIFF_CAP", 4096)
    rec = reproduce.git_state(tmp_path)
    assert rec["diff_truncated"] and rec["diff_bytes"] > 4096
    assert len((tmp_path / "git.diff").read_bytes()) == 4096


def test_not_a_git_checkout_is_said_never_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(reproduce.SOURCE_ENV, str(tmp_path))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert reproduce.git_state(tmp_path) == {"dir": str(tmp_path.resolve()), "commit": None,
                                             "note": "not a git checkout"}
    assert not (tmp_path / "git.diff").exists()


def test_the_targets_identity_revision_dtype_and_quantisation(tmp_path):
    snap = tmp_path / "models--Qwen--Qwen3-8B" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "qwen3", "torch_dtype": "bfloat16",
                                                  "quantization_config": {"quant_method": "awq", "bits": 4}}))
    got = reproduce.target_identity(snap, "bfloat16")
    assert got["revision"] == "0123abcd" and got["dtype"] == "bfloat16" and got["quantization"] == "awq 4-bit"
    assert got["config_sha256"] == __import__("hashlib").sha256((snap / "config.json").read_bytes()).hexdigest()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"dtype": "float32", "_commit_hash": "feed"}))
    assert reproduce.target_identity(plain)["revision"] == "feed"
    assert reproduce.target_identity(plain)["quantization"] is None
    assert reproduce.target_identity(tmp_path / "missing")["config_sha256"] is None


def test_a_wheels_code_hash_is_read_from_its_version(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.1.0+code.3f9a2c1b7e")
    assert reproduce.specdeck_version() == {"version": "0.1.0+code.3f9a2c1b7e", "code": "3f9a2c1b7e"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.1.0")
    assert reproduce.specdeck_version() == {"version": "0.1.0", "code": None}


def test_a_composite_targets_dtype_and_quantisation_are_read_from_its_text_config(tmp_path):
    """The campaign's target (Qwen3.6-27B, a composite ``qwen3_5``) keeps its dtype in
    ``text_config``: the record names it, so a bf16 target and a requantised one differ."""
    from tests.ml.train.test_campaign_config import qwen36_27b_target_config

    bf16, quant = tmp_path / "bf16", tmp_path / "quant"
    for d, extra in ((bf16, {}), (quant, {"quantization_config": {"quant_method": "awq", "bits": 4}})):
        d.mkdir()
        cfg = qwen36_27b_target_config()
        cfg["text_config"] = {**cfg["text_config"], "dtype": "bfloat16", **extra}
        (d / "config.json").write_text(json.dumps(cfg))
    a, b = reproduce.target_identity(bf16), reproduce.target_identity(quant)
    assert a["dtype"] == b["dtype"] == "bfloat16"
    assert (a["quantization"], b["quantization"]) == (None, "awq 4-bit")
    assert a["config_sha256"] != b["config_sha256"]
