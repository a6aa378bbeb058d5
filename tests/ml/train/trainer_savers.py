"""SpecForge 0.2.0's and speculators 0.9.0's own checkpoint savers, on a tiny drafter.

No layout is written by hand here: a checkpoint is what THEIR code writes when given a
drafter, so specdeck's readers are tested against the real thing.

* SpecForge: its ``DFlashDraftModel`` loads the tiny z-lab drafter (strict names), wrapped in
  its ``OnlineDFlashModel``; its ``TrainerController.save_checkpoint`` (with its
  ``DFlashTrainStrategy`` choosing the keys) writes ``{run_id}-step{N}/training_state.pt`` and
  ``{run_id}-latest``, its ``CheckpointManager`` keeps ``{run_id}-best`` by
  ``eval/simulated_acc_len``.
* speculators: its ``DFlashDraftModel`` loads specdeck's speculators export of the drafter, and
  its ``SingleGPUCheckpointer`` writes ``{epoch}/`` (``save_pretrained``), ``val_metrics.json``
  and ``checkpoint_best``.

As a program (the "trainer" a test launches), it saves one checkpoint every ``--every``
seconds (the drafter's weights scaled a little each time, so each step is another drafter) at
the steps ``--steps`` lists; with ``--gate FILE`` it creates FILE after each save and saves
the next one only once the test has removed it (so a test knows which checkpoints exist
while it kills and restarts specdeck). ``--config`` (a SpecForge YAML) is only read by
specdeck, as the run's config::

    python tests/ml/train/trainer_savers.py specforge|speculators --drafter DIR --out DIR
        --steps 10,20,30 [--every S] [--gate FILE] [--config FILE]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import types
from pathlib import Path

import torch


def scale_(model: torch.nn.Module, factor: float) -> None:
    """Scale every weight in place (another drafter, same shapes)."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(factor)


class SpecForgeRun:
    """A SpecForge run's checkpointing, as its trainer drives it (no training step)."""

    def __init__(self, drafter: Path, out: Path, run_id: str = "tiny"):
        from torch import nn
        from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
        from specforge.modeling.draft.dflash import DFlashDraftModel
        from specforge.training.controller import TrainerController
        from specforge.training.strategies.base import DFlashTrainStrategy

        cfg = json.loads((drafter / "config.json").read_text())
        self.draft = DFlashDraftModel.from_pretrained(str(drafter))
        h, v = cfg["hidden_size"], cfg["vocab_size"]
        self.online = OnlineDFlashModel(self.draft, nn.Linear(h, v, bias=False), nn.Embedding(v, h),
                                        mask_token_id=cfg["dflash_config"]["mask_token_id"],
                                        block_size=cfg["block_size"], attention_backend="sdpa")
        for p in [*self.online.lm_head.parameters(), *self.online.embed_tokens.parameters()]:
            p.requires_grad_(False)  # the target's, frozen as in its trainer
        backend = types.SimpleNamespace(
            state_dict=lambda: {"model": self.online.state_dict(), "optimizer": {}, "rng": {}},
            optimizer_state_is_replicated=False)
        core = types.SimpleNamespace(backend=backend, strategy=DFlashTrainStrategy(self.online))
        self.controller = TrainerController(core, run_id=run_id, output_dir=str(out))

    def save(self, step: int, acc_len: float | None = None) -> Path:
        ckpt = self.controller.save_checkpoint(step)
        if acc_len is not None:
            mgr = self.controller._checkpoint_manager()  # noqa: SLF001 - its own, as its trainer does
            metrics = {"eval/simulated_acc_len": acc_len}
            if mgr.is_better(metrics):
                mgr.update_best(step, metrics)
        return Path(ckpt.checkpoint_uri.removeprefix("file://"))


class SpeculatorsRun:
    """A speculators run's checkpointing, as its trainer drives it (no training step)."""

    def __init__(self, speculators_dir: Path, out: Path):
        from speculators.models.dflash import DFlashDraftModel
        from speculators.train.checkpointer import SingleGPUCheckpointer

        self.model = DFlashDraftModel.from_pretrained(str(speculators_dir))
        self.draft = self.model
        self.optimizer = torch.optim.AdamW(self.model.parameters())
        self.ckpt = SingleGPUCheckpointer(out)

    def save(self, epoch: int, val_loss: float | None = None) -> Path:
        self.ckpt.save_checkpoint(self.model, self.optimizer, epoch, float_dtype=torch.float32)
        if val_loss is not None:
            self.ckpt.save_val_metrics(epoch, {"loss_epoch": val_loss, "full_acc_epoch": 0.5})
            if val_loss < getattr(self, "best", float("inf")):
                self.best = val_loss
                self.ckpt.update_best_symlink(epoch)
        return out_dir(self.ckpt.path, epoch)


def out_dir(path: Path, epoch: int) -> Path:
    return Path(path) / str(epoch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("trainer", choices=["specforge", "speculators"])
    p.add_argument("--drafter", required=True, help="z-lab dir (specforge) / speculators dir")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", required=True)
    p.add_argument("--every", type=float, default=1.0)
    p.add_argument("--gate", help="created after each save; the next waits until it is gone")
    p.add_argument("--config", help="the run's config, for specdeck to read (unused here)")
    p.add_argument("--term-save-s", type=float, default=0.0,
                   help="how long the save on SIGTERM takes (a big drafter's, simulated)")
    args = p.parse_args(argv)
    out = Path(args.out)
    run = (SpecForgeRun if args.trainer == "specforge" else SpeculatorsRun)(Path(args.drafter), out)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    for i, step in enumerate(int(s) for s in args.steps.split(",")):
        due = time.monotonic() + args.every
        while (time.monotonic() < due or (args.gate and Path(args.gate).exists())) and not stop:
            time.sleep(0.05)
        if stop:
            time.sleep(args.term_save_s)
        scale_(run.draft, 0.97)
        path = run.save(step, 1.0 + 0.1 * i if args.trainer == "specforge" else 2.0 - 0.1 * i)
        print(json.dumps({"step": step, "loss": 2.0 - 0.1 * i, "saved": str(path)}), flush=True)
        if args.gate:
            Path(args.gate).touch()
        if stop:  # both trainers save once more on SIGTERM, then end
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
