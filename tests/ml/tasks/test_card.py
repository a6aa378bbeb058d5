"""Issue 45 §4: ``specdeck card``, a drafter's model card whose every figure traces to a stored
result, and whose sha256 is the exported weights'. A tiny drafter, exported, evaluated for real
(``core.ml.eval`` in process, as a baseline too), its rows stored as the eval action stores them."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

pytest.importorskip("torch")

from core.actions.eval import eval_rows  # noqa: E402
from core.ml.formats.runio import run_main  # noqa: E402
from core.ml.tasks import eval as eval_mod  # noqa: E402
from core.ml.tasks import export as export_mod  # noqa: E402
from core.state.store import Store  # noqa: E402
from tests.conftest import run_cli  # noqa: E402


@pytest.fixture(scope="module")
def campaign(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("card")
    target, drafter = tiny.make_tiny_pair(root, "qwen3", seed=0, block_size=8, num_layers=2, sliding_window=4)
    exp = root / "export"
    assert run_main(export_mod.main, [str(drafter), "--out", str(exp), "--dtype", "fp32"]) == 0
    prompts = tiny.write_tiny_prompts(root / "prompts.jsonl", n_text=3)
    result = root / "result.json"
    assert run_main(eval_mod.main, ["--target", str(target), "--drafter", str(exp), "--prompts", str(prompts),
                                    "--out", str(result), "--max-new-tokens", "24", "--dtype", "float32"]) == 0
    res = json.loads(result.read_text())
    state = root / "state.db"
    store = Store(str(state))
    store.add_eval_results(eval_rows("run-v5", "eval", res, "v5", "drafter", None)
                           + eval_rows("run-base", "eval", res, "base", "baseline", None))
    store.close()
    plan = root / "p.yaml"
    plan.write_text(f"name: cardplan\nstate: {state}\nhosts:\n  ev: {{local: true, workdir: {root / 'ev'}}}\n"
                    "items:\n  - id: eval\n    content: evaluate v5\n"
                    "    action: {kind: eval, host: ev, params: {drafter: drafters/v5, target: models/t}}\n")
    return {"plan": plan, "export": exp, "res": res, "root": root}


def test_a_card_traces_every_figure_to_a_stored_result(campaign, tmp_path):
    out = tmp_path / "serve"
    res = run_cli("card", campaign["plan"], "v5", "--drafter", campaign["export"], "--out", out,
                  "--license", "apache-2.0", "--base-model", "Qwen/Qwen3-8B", "--cost", "1,0.05")
    assert res.returncode == 0, res.stderr
    card = (out / "README.md").read_text()
    head = card.split("---")[1]
    assert "base_model: Qwen/Qwen3-8B" in head and "license: apache-2.0" in head and "- dflash" in head
    # the weights: the exported file's own sha256, and the one the eval recorded
    sha = hashlib.sha256((campaign["export"] / "model.safetensors").read_bytes()).hexdigest()
    assert f"sha256: `{sha}`" in card and campaign["res"]["drafter"]["weights"]["sha256"] == sha
    assert "recorded other weights" not in card
    # the architecture as the drafter's config says, and what llama.cpp does with its sliding layer
    assert "block size: 8 (drafts 7 tokens a round)" in card and "sliding window: 4" in card
    assert re.search(r"llama\.cpp .*differs", card), card
    # tau: each row of figures names the stored run it comes from; the three aggregations by name
    tau = card.split("## Acceptance length (tau)")[1].split("## Draft length")[0]
    rows = [line for line in tau.splitlines() if line.startswith("| v5 | in-process online")]
    assert rows and all("run run-v5" in line for line in rows), tau
    for name in ("per-request mean", "token-weighted", "pooled"):
        assert name in tau
    stored = f"{campaign['res']['tau']:.3f}"
    assert stored in rows[0], (stored, rows[0])
    verdict = [line for line in tau.splitlines() if ": vs base:" in line]
    assert len(verdict) == 1 and verdict[0].endswith("(runs run-v5)"), tau
    # the draft length from those rounds under the given cost, and what was not measured said
    dl = card.split("## Draft length to serve")[1].split("## Training recipe")[0]
    assert "From runs run-v5" in dl and "best k = " in dl and "num_speculative_tokens" in dl
    assert "Not measured by this card" in card.split("## Training recipe")[1]


def test_card_without_a_cost_or_of_an_unknown_drafter(campaign, tmp_path):
    plain = run_cli("card", campaign["plan"], "v5", "--drafter", campaign["export"])
    assert plain.returncode == 0, plain.stderr
    assert "Not measured: no round cost was given" in plain.stdout and "license: other" in plain.stdout
    bad = run_cli("card", campaign["plan"], "v9", "--drafter", campaign["export"], "--out", tmp_path / "x")
    assert bad.returncode == 2 and "no eval results of 'v9'" in bad.stderr and "v5" in bad.stderr
    assert not (tmp_path / "x").exists()
    cost = run_cli("card", campaign["plan"], "v5", "--drafter", campaign["export"], "--cost", "0,1")
    assert cost.returncode == 2 and "--cost 0,1" in cost.stderr


def test_a_card_into_a_shared_folder_changes_only_its_readme(campaign, tmp_path):
    """--out a folder with other people's files and links: README.md (a link there) is replaced
    by the card, not followed; a temp name's link and what links point to stay as they were."""
    out, elsewhere = tmp_path / "shared", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "theirs.md").write_text("theirs")
    (elsewhere / "tmp").write_text("tmp")
    (out / "README.md").symlink_to(elsewhere / "theirs.md")
    (out / ".README.md.specdeck-tmp").symlink_to(elsewhere / "tmp")
    (out / "notes.txt").write_text("notes")
    res = run_cli("card", campaign["plan"], "v5", "--drafter", campaign["export"], "--out", out)
    assert res.returncode == 0, res.stderr
    assert (elsewhere / "theirs.md").read_text() == "theirs" and (elsewhere / "tmp").read_text() == "tmp"
    assert not (out / "README.md").is_symlink() and (out / "README.md").read_text().startswith("---\n")
    assert oct((out / "README.md").stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in out.iterdir()) == [".README.md.specdeck-tmp", "README.md", "notes.txt"]
    assert (out / "notes.txt").read_text() == "notes"
