"""core.ml.formats.layouts and core.ml.strip over checkpoints SpecForge 0.2.0 and speculators 0.9.0
wrote with their own savers (tests/ml/train/trainer_savers.py): which entries are checkpoints, in
step order, the best pointer, a save cut short, and strip without ``--key``."""

from __future__ import annotations

import json
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("specforge", reason="needs specforge==0.2.0 (scripts/bootstrap --test)")
pytest.importorskip("speculators", reason="needs speculators==0.9.0 (scripts/bootstrap --test)")

from core.ml.tasks import export as export_mod
from core.ml.formats import layouts
from core.ml.tasks import strip as strip_mod
from core.ml.formats.runio import run_main  # noqa: E402
from tests.ml.train.trainer_savers import SpecForgeRun, SpeculatorsRun, scale_  # noqa: E402


def test_specforge_checkpoints_in_step_order_best_pointer_and_strip_without_key(tiny_dirs, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "out"
    run = SpecForgeRun(tiny_dirs["drafter"], out, run_id="r1")
    # numeric order, not the names' (SpecForge's own saver deletes steps >= the one it saves)
    for step, acc in ((9, 1.5), (20, 2.0), (100, 1.8)):  # best: 20 (higher acc_len wins)
        run.save(step, acc)
    # a save cut short: the dir without its training_state.pt is not a checkpoint
    (out / "r1-step400").mkdir()
    got = layouts.scan_dir(str(out))
    assert [(c.step, c.layout) for c in got] == [(9, "specforge"), (20, "specforge"),
                                                 (100, "specforge")]
    assert got[0].path == str(out / "r1-step9" / "training_state.pt") and got[0].needs_strip
    assert layouts.best_step(str(out)) == 20
    assert layouts.scan_dir(str(out), "speculators") == []  # another trainer's layout: none
    assert layouts.scan_dir(str(out), settle=3600) == []  # none has settled yet

    # strip reads SpecForge's draft_state_dict without --key; its drafter config is given
    drafter = tmp_path / "drafter"
    assert run_main(strip_mod.main, [got[-1].path, str(drafter), "--config",
                                     str(tiny_dirs["drafter"] / "config.json")]) == 0
    stripped = load_file(drafter / "model.safetensors")
    want = run.draft.state_dict()
    assert set(stripped) == {k for k in want if "rotary" not in k}
    assert all(torch.equal(stripped[k], want[k]) for k in stripped)
    prov = json.loads((drafter / "provenance.json").read_text())
    assert prov["step"] == 100  # SpecForge's global_step
    # without a config it says which one SpecForge's checkpoint needs
    with pytest.raises(strip_mod.UsageError, match="draft_model_config"):
        strip_mod.main([got[-1].path, str(tmp_path / "nocfg")])


def test_speculators_epoch_dirs_are_drafters_and_their_best_pointer_is_read(tiny_dirs, tmp_path):
    spec = tmp_path / "spec"
    assert run_main(export_mod.main, [str(tiny_dirs["drafter"]), "--out", str(spec), "--format",
                                      "speculators", "--target", str(tiny_dirs["target"]),
                                      "--dtype", "fp32"]) == 0
    out = tmp_path / "ckpts"
    run = SpeculatorsRun(spec, out)
    for epoch, loss in ((0, 2.0), (1, 1.5), (2, 1.8)):  # best: epoch 1 (lowest val loss)
        scale_(run.draft, 0.9)
        run.save(epoch, loss)
    os.symlink("2", out / "epoch2_step99")  # speculators' descriptive links are no checkpoints
    (out / "interrupted").mkdir()
    got = layouts.scan_dir(str(out))
    assert [(c.step, c.layout, c.needs_strip) for c in got] == \
        [(0, "speculators", False), (1, "speculators", False), (2, "speculators", False)]
    assert got[1].path == str(out / "1")
    assert layouts.best_step(str(out)) == 1
    # eval's loader reads the epoch dir as it is: the saved weights
    from core.ml.models.drafter import load_drafter

    back = load_drafter(out / "2")
    assert back.config.source_format == "speculators"
    body = {k: v for k, v in run.draft.state_dict().items() if k in dict(back.named_parameters())}
    assert body and all(torch.equal(dict(back.named_parameters())[k].detach(), v) for k, v in body.items())
    shutil.rmtree(out / "2")
    assert [c.step for c in layouts.scan_dir(str(out))] == [0, 1]


def test_entry_names_of_each_layout():
    assert layouts.parse_entry("step_40.pt") == ("specdeck", 40, "step_40.pt")
    assert layouts.parse_entry("v5-run-step40") == ("specforge", 40, "v5-run-step40/training_state.pt")
    assert layouts.parse_entry("7") == ("speculators", 7, "7/model.safetensors")
    for name in ("latest", "v5-run-latest", "v5-run-best", "checkpoint_best", "run.yaml",
                 "step_x.pt", "epoch0_step16626"):
        assert layouts.parse_entry(name) is None, name
    assert layouts.parse_entry("step_40.pt", "specforge") is None
    assert layouts.is_best_pointer("v5-run-best") and layouts.is_best_pointer("checkpoint_best")
    assert not layouts.is_best_pointer("checkpoint_best", "specforge")
    assert layouts.out_dir_of("/o/r-step4/training_state.pt", "specforge") == "/o"
    assert layouts.out_dir_of("/o/4/", "speculators") == "/o"
    assert layouts.out_dir_of("/o/step_4.pt") == "/o"
