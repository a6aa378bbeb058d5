"""``core.ml.eval --stop settled``: a paired online eval that stops when its verdict is settled, run on
the tiny Qwen3 target (issue 45 §2)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from core.ml.formats import resultfile  # noqa: E402
from core.ml.formats.runio import run_main  # noqa: E402
from core.ml.measure import sequential  # noqa: E402
from core.ml.tasks import eval as eval_mod  # noqa: E402


@pytest.fixture()
def many_prompts(tiny, tmp_path):
    """14 input_ids prompts: more than the 10 a settled verdict needs at least."""
    rows = [{"id": f"p{s}", "input_ids": tiny.fit_prompt(torch.Generator().manual_seed(s))} for s in range(14)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _argv(tiny_dirs, prompts, tmp_path, *extra):
    return ["--target", str(tiny_dirs["target"]), "--drafter", str(tiny_dirs["drafter"]), "--prompts", str(prompts),
            "--max-new-tokens", "8", "--ignore-eos", "--out", str(tmp_path / "result-drafter.json"),
            "--baseline-drafter", str(tiny_dirs["drafter"]), "--baseline-out", str(tmp_path / "baseline/result.json"),
            "--label", "v5", "--baseline-label", "v4", "--stop", "settled", *extra]


def test_equal_drafters_settle_no_difference_before_the_cap(tiny_dirs, many_prompts, tmp_path, capsys):
    """The same drafter on both sides: every paired difference is 0, so the set closes around 0 at the
    first prompt a verdict may be given (10), and the 4 prompts left are never run."""
    assert run_main(eval_mod.main, _argv(tiny_dirs, many_prompts, tmp_path, "--min-difference", "0.5")) == 0
    mine = json.loads((tmp_path / "result-drafter.json").read_text())
    theirs = json.loads((tmp_path / "baseline/result.json").read_text())
    assert resultfile.problem(mine) is None and resultfile.problem(theirs) is None
    seq = mine["sequential"]
    assert seq == theirs["sequential"]
    assert seq["verdict"] == sequential.NO_DIFFERENCE
    assert seq["prompts"] == sequential.MIN_PROMPTS and seq["fixed_prompts"] == 14 and seq["prompts_saved"] == 4
    assert seq["text"].startswith("v5 vs v4: no difference as large as 0.5: settled after 10 of 14 prompts")
    assert [r["id"] for r in mine["per_prompt"]] == [f"p{s}" for s in range(10)]
    assert [r["rounds"] for r in mine["per_prompt"]] == [r["rounds"] for r in theirs["per_prompt"]]
    assert mine["prompts"]["ids"] == [f"p{s}" for s in range(10)]
    assert mine["harness"] == theirs["harness"] == "in-process online"
    assert "settled stop: v5 vs v4" in capsys.readouterr().err


def test_the_cap_ends_an_unsettled_eval_and_says_so(tiny_dirs, tmp_path):
    """Under 10 prompts nothing is settled: the eval runs all of them (its cap, --limit 4) and says so."""
    argv = _argv(tiny_dirs, tiny_dirs["prompts"], tmp_path, "--min-difference", "0.5", "--limit", "4")
    assert run_main(eval_mod.main, argv) == 0
    seq = json.loads((tmp_path / "result-drafter.json").read_text())["sequential"]
    assert seq["verdict"] == sequential.UNSETTLED and seq["prompts"] == seq["fixed_prompts"] == 4


@pytest.mark.parametrize("drop, add, says", [
    ("--baseline-out", (), "--baseline-out"),
    (None, ("--min-difference", "0"), "--min-difference"),
    (None, ("--min-difference", "0.5", "--tree-budget", "4"), "--tree-budget"),
    ("--stop", ("--min-difference", "0.5"), "only with --stop settled"),
])
def test_a_settled_stop_without_what_it_needs_exits_2(tiny_dirs, tmp_path, capsys, drop, add, says):
    argv = _argv(tiny_dirs, tiny_dirs["prompts"], tmp_path, *add)
    if drop:
        i = argv.index(drop)
        del argv[i:i + 2]
    assert run_main(eval_mod.main, argv) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "result-drafter.json").exists()
