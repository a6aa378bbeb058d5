"""Issue 47 §2: every eval run records what reproduces it, and ``diff``/``compare`` read it.

Two eval items run for real on a local host (``core.ml.eval`` launched by ``specdeck run``),
one against a float32 tiny target, the other against the same target saved in bfloat16; the
code's checkout (a real git repository, ``SPECDECK_SOURCE_DIR``) is clean for the first and
dirty for the second. ``compare`` warns that the verdict pairs different targets; ``diff``
names the target's dtype and the dirty tree, and the diff is kept beside the run."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # two evals launched for real: about a minute and a half on 2 loaded CPUs

from tests.conftest import ROOT, run_cli  # noqa: E402
from tests.ml.formats.test_reproduce_record import checkout, git  # noqa: E402

def _bf16_copy(src: Path, dst: Path) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(f).items()}, f, metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg.pop("torch_dtype", None)
    cfg["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def campaign(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    target, drafter = tiny.make_tiny_pair(root, "qwen3", seed=0, block_size=4, num_layers=2)
    bf16 = _bf16_copy(target, root / "target-bf16")
    prompts = tiny.write_tiny_prompts(root / "prompts.jsonl", n_text=2)
    repo = checkout(root / "code", "train.py", "LR = 3e-4\n")
    plan = root / "p.yaml"

    def item(name, label, tgt):
        return (f"  - id: {name}\n    content: tau of {label}\n    action: {{kind: eval, host: ev, params: "
                f"{{drafter: {drafter}, target: {tgt}, prompts: {prompts}, label: {label}, "
                f"max_new_tokens: 12, chat_template: false}}}}\n")

    plan.write_text(f"name: repro\nhosts:\n  ev: {{local: true, workdir: {root / 'ev'}, python: {sys.executable}, "
                    f"env: {{PYTHONPATH: {ROOT}, SPECDECK_SOURCE_DIR: {repo}}}}}\nitems:\n"
                    + item("eval-a", "v5", target) + item("eval-b", "v4", bf16))
    env = {"SPECDECK_STATE": str(root / "state.db")}
    res = run_cli("run", plan, "eval-a", env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (repo / "train.py").write_text("LR = 1e-3  # tried by hand\n")  # the tree is dirty from here on
    res = run_cli("run", plan, "eval-b", env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return {"plan": plan, "env": env, "repo": repo, "commit": git(repo, "rev-parse", "HEAD")}


def test_compare_warns_when_a_verdict_pairs_different_targets(campaign):
    res = run_cli("compare", campaign["plan"], "--pair", "v5", "v4", "--json", env=campaign["env"])
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    (warning,) = [w for w in doc["warnings"] if w.startswith("⚠ v5 vs v4: measured against different targets")]
    assert "checkpoint dtype float32≠bfloat16" in warning and "ran in float32≠bfloat16" in warning, warning
    assert warning in res.stderr  # said in every format, not only in the JSON


def test_diff_names_the_targets_dtype_and_the_dirty_tree(campaign):
    res = run_cli("diff", campaign["plan"], "eval-a", "eval-b", "--json", env=campaign["env"])
    assert res.returncode == 0, res.stderr
    diff = json.loads(res.stdout)
    assert diff["record.target.dtype"] == {"eval-a#1": "float32", "eval-b#1": "bfloat16"}
    assert diff["record.git.dirty"] == {"eval-a#1": False, "eval-b#1": True}
    assert "record.git.commit" not in diff  # one commit: the difference is the dirty tree, not the commit
    assert "record.target.config_sha256" in diff and "record.data.prompts_sha256" not in diff
    text = run_cli("diff", campaign["plan"], "eval-a", "eval-b", env=campaign["env"])
    assert text.returncode == 0 and "record.target.dtype" in text.stdout and "record.git.dirty" in text.stdout
    (line,) = [ln for ln in text.stdout.splitlines() if ln.startswith("eval-b#1: its checkout was dirty")]
    kept = Path(line.rsplit(": ", 1)[1])
    assert kept.name == "git.diff" and "+LR = 1e-3  # tried by hand" in kept.read_text()


def test_each_run_records_versions_commit_and_data(campaign):
    from core.state.store import Store

    store = Store(campaign["env"]["SPECDECK_STATE"])
    try:
        runs = {i: store.latest_run(i) for i in ("eval-a", "eval-b")}
    finally:
        store.close()
    for run in runs.values():
        rec = run.result["record"]
        assert rec["git"]["commit"] == campaign["commit"]
        assert rec["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
        assert rec["versions"]["torch"] == torch.__version__
        assert rec["specdeck"]["version"] is not None
        assert len(rec["data"]["prompts_sha256"]) == 64 and rec["config"]["max_new_tokens"] == 12
        assert rec["target"]["quantization"] is None and rec["target"]["revision"] is None
    assert "diff" not in runs["eval-a"].result["record"]["git"]  # a clean tree keeps no diff
