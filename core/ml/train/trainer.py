"""``python -m core.ml.train``: the reference DFlash trainer (docs/training.md).

    python -m core.ml.train --config FILE.yaml [--out DIR] [--resume PATH|auto] [--max-steps N]
                            [--set KEY=VALUE ...] [--describe] [--print-config] [--debug-dump-weights DIR]
    python -m torch.distributed.run --nproc_per_node 2 -m core.ml.train --config FILE.yaml   # DDP

What one step does (defaults = the v5 trainer):

1. Take ``train.batch_size`` sequences (the target's own greedy continuations from an extract
   cache, or JSONL rows run through the target on the fly), pack them into one row.
2. Sample up to ``train.anchors_per_sequence`` random anchors per sequence among response
   positions a with ``loss_mask[a] and loss_mask[a+1]``; re-drawn every step.
3. Noise ``U(-std, std)`` on fc's input only (training split; validation is never noised).
4. ONE multi-anchor forward: context ``hidden_norm(fc(taps))`` for every position, A blocks
   ``[x_a, MASK * (B-1)]`` at positions ``a..a+B-1``, block mask with the strict ``t < a``
   context rule (:func:`core.ml.models.drafter.multi_anchor_forward`); logits through the target's
   frozen LM head.
5. Labels: the target's greedy token at ``a+k`` = argmax of the target logits at ``a+k-1``,
   from the final layer (reserved for this: fc never sees it). Hard CE with
   ``w_k = exp(-(k-1)/gamma)``, gamma by block size (:mod:`core.ml.train.loss`).
6. AdamW, linear warmup + cosine, grad clip; DDP averages gradients across ranks.

v4 vs v5. The v4 trainer had three bugs that v5 fixes; each survives here as an explicit knob,
off by default (:data:`core.ml.train.config.V4_KNOBS`; table in :mod:`core.ml.train.config`):
``noise.target: all_features`` (noise on the whole extracted tensor, which reaches the target
logits and so the labels), ``fc_layers: taps_and_final`` (fc fed the final layer that gives
the labels: a shortcut; fc becomes (K+1)*H wide), and ``loss.soft_kl_weight: 0.7`` +
``loss.temperature: 2`` + ``loss.streak_weighting: true`` + ``loss.gamma: 10`` (the v4 loss).
``plans/train/v5.yaml`` and ``plans/train/v4-legacy.yaml`` differ in exactly those knobs.

Data (:mod:`core.ml.train.data`): extract the drafter's taps *plus the target's final layer*
(``python -m core.ml.extract --layers 1,9,17,25,33,35`` for a 36-layer target with the default
taps), or give a JSONL file (``data.file``) and let the target run on the fly.

stdout (rank 0 only; one JSON object per line):

* metrics, every ``train.log_every`` steps, the only lines WITHOUT an ``"event"`` key::

    {"step": 20, "epoch": 2.5, "loss": 3.1, "lr": 0.0006, "acc": [0.61, 0.40, ...],
     "full_acc": 0.35, "eal": 1.2, "streak": 1.1, "grad_norm": 0.8, "tokens": 5120,
     "tokens_per_s": 2400.0, "eta_s": 31.5, "elapsed_s": 2.1}

  ``acc[k-1]`` = teacher-forced top-1 accuracy of draft slot k over supervised slots (0.0 when
  none); ``eal`` = ``sum_k prod_{i<=k} acc_i`` (expected accepted draft tokens, no bonus token;
  see :func:`core.ml.train.loss.expected_acceptance_length`); ``streak`` = mean exact
  teacher-forced streak per block; ``loss`` = weighted loss over the logged window;
  ``tokens_per_s`` = packed sequence tokens per second over all ranks; ``eta_s`` = remaining
  steps x mean step time of this process.
* ``{"event": "info", "task": "train", ...}`` once at the start (sizes, world size, fc width).
* ``{"event": "validation", "step": N, "val_loss": .., "val_acc": [..], "val_eal": .., "val_streak": ..}``
* ``{"event": "checkpoint", "step": N, "path": "/abs/out/step_N.pt"}`` after each checkpoint.
* ``{"event": "stopped", "step": N}`` after SIGTERM/SIGINT (a checkpoint line precedes it).
* ``{"event": "result", "task": "train", "step": N, "path": "/abs/out/step_N.pt"}`` at the end.

Human messages go to stderr.

``--print-config`` prints the fully resolved config as ONE JSON object on stdout (keys nested as
in the YAML: ``drafter.block_size``, ``drafter.layer_types``, ``loss.gamma``, ``train.lr`` ...)
and exits without loading any model. Target-derived keys come from the target's config.json
when it is readable here; otherwise they stay as the file states them (stderr says which are
still null).

Preflight (before any device is touched): the target's config.json, ``drafter.init`` and the
feature cache's manifest.json must fit the config (taps inside the target and in the cache,
hidden size, vocabulary, the final layer when a knob needs it); a mismatch exits 2 naming
both sides and the fix.

Output directory: ``step_{N}.pt`` = ``{"model": drafter state_dict (published tensor names),
"optimizer", "scheduler", "step": N, "config": resolved trainer config (nested plain dict),
"drafter_config": the drafter's config.json dict, "run": {...}}`` written atomically (loads with
``torch.load(weights_only=True)``); ``latest`` (the newest checkpoint's file name);
``resolved_config.yaml``; ``config.json`` (the drafter config); ``provenance.json``.
``python -m core.ml.strip OUT/step_N.pt DRAFTER_DIR`` turns a checkpoint into a drafter
directory (config.json + model.safetensors) for ``core.ml.eval``.

Resume: ``--resume PATH`` or ``--resume auto`` (``OUT/latest`` if any, else a fresh start)
restores weights, optimizer, scheduler and the step number; data order, anchors and noise are
functions of (seed, step, rank), so a resumed run repeats the uninterrupted loss curve. A
fresh start refuses an output directory that already holds checkpoints.

Signals: the first SIGTERM or SIGINT finishes the current step, writes a checkpoint, prints
the stopped line and exits with status 0 (all ranks agree on stopping after the same step); a
second SIGINT aborts at once (130). Exit statuses: 0 done or stopped, 2 bad config or input
(the message names the key), 1 other failure. Under torchrun, SIGTERM to the launcher reaches
every rank the same way (checkpoint and stopped line are written), but torchrun itself then
exits 1 with its own SignalException traceback, and it kills ranks that take longer than its
grace period (about 30 s) to finish the step and the checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.ml.formats import bounds, strictjson
from core.ml.formats.drafter_config import read_config_file
from core.ml.formats.runio import (TaskError, UsageError, atomic_write_json, atomic_write_text, fixed_mmap_threshold, provenance,
                          say)
from core.ml.train.config import ConfigError
from core.ml.train.runtime import (
    Dist,
    StopFlag,
    lr_factor,
    print_line,
    resolve_resume,
    save_checkpoint,
    step_seed,
)

RESOLVED = "resolved_config.yaml"


# ----------------------------------------------------------------------------- setup


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.train", description="train a DFlash drafter (reference trainer)")
    p.add_argument("--config", help="trainer config YAML (see --describe)")
    p.add_argument("--out", help="output directory (overrides out_dir)")
    p.add_argument("--resume", help="a step_N.pt checkpoint, or 'auto' (OUT/latest when present)")
    p.add_argument("--max-steps", type=int, help="override train.max_steps")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a knob, e.g. --set loss.gamma=5 (repeatable; YAML values; paths "
                        "relative to the config file)")
    p.add_argument("--describe", action="store_true", help="print every config knob with its default and exit")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config as one JSON object and exit (loads no model)")
    p.add_argument("--debug-dump-weights", metavar="DIR",
                   help="(tests) after each step every rank saves {model: drafter weights, sequences: ids it "
                        "trained on} to DIR/rank{R}_step{N}.pt")
    return p


def load_resolved(args: argparse.Namespace) -> tuple[Any, dict[str, Any], Any]:
    """Load, override and resolve the config. Returns (config, target text config, tokenizer).

    Raises:
        UsageError: any config problem (the message names the file and key).
    """
    from core.ml.train import config as tc

    if not args.config:
        raise UsageError("--config FILE.yaml is required (see --describe for the knobs)")
    over = tc.parse_overrides(args.set)
    if args.out:
        over["out_dir"] = str(Path(args.out).resolve())
    if args.max_steps is not None:
        over.setdefault("train", {})["max_steps"] = args.max_steps
    cfg = tc.load_config(args.config, over)
    where = Path(args.config).name
    if cfg.out_dir is None and not args.print_config:
        raise ConfigError(f"{where}: 'out_dir' is required (or pass --out DIR)")
    if args.print_config and not (Path(cfg.target) / "config.json").is_file():
        target_cfg, tokenizer = None, None
    else:
        from core.ml.models.target import load_tokenizer

        target_cfg = tc.read_target_config(cfg.target)
        # --print-config needs the tokenizer only for a null mask_token_id
        tokenizer = None if args.print_config and cfg.drafter.mask_token_id is not None else load_tokenizer(cfg.target)
    mask_id = None
    if tokenizer is not None:
        tid = tokenizer.convert_tokens_to_ids("<|MASK|>")
        mask_id = tid if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None) else None
    init_cfg = None
    if cfg.drafter.init is not None:
        init_path = Path(cfg.drafter.init) / "config.json"
        if not init_path.is_file():
            raise ConfigError(f"{where}: 'drafter.init' {cfg.drafter.init} has no config.json")
        init_cfg = read_config_file(init_path)  # InvalidFile: a bad value, by file and key
    return tc.resolve(cfg, where, target_cfg, mask_id, init_cfg), target_cfg, tokenizer


def print_config(cfg: Any, target_cfg: dict[str, Any] | None) -> int:
    """``--print-config``: the resolved config as one JSON object on stdout."""
    from core.ml.train.config import unresolved

    if target_cfg is None:
        left = unresolved(cfg)
        say(f"target {cfg.target}: no config.json here; resolved from the config file alone"
            + (f" ({', '.join(left)} still null)" if left else ""))
    sys.stdout.write(strictjson.dumps(cfg.to_dict()) + "\n")
    return 0


def preflight(cfg: Any) -> None:
    """Refuse a config that cannot fit its feature cache, before any device is touched.

    Raises:
        UsageError: each problem, naming both sides and the fix.
    """
    from core.ml.tasks.extract import target_fingerprint
    from core.ml.train.config import cache_problems, drafter_config_dict

    problems = []
    if cfg.data.features is not None:
        path = Path(cfg.data.features) / "manifest.json"
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"data.features {cfg.data.features}: no readable manifest.json ({exc}); "
                             f"run python -m core.ml.extract first") from None
        fp = (manifest.get("target") or {}).get("fingerprint")
        if fp is not None and fp != target_fingerprint(cfg.target):
            problems.append(f"data.features {cfg.data.features} was extracted from "
                            f"{manifest['target'].get('path')}, not from the target {cfg.target}: extract it "
                            f"from {cfg.target} or point 'target' at that model")
        problems += cache_problems(cfg, manifest)
    if problems:
        raise UsageError("; ".join(problems))
    drafter_config_dict(cfg)  # an init drafter's config must parse


def new_drafter(config_dict: dict[str, Any], init_std: float, seed: int) -> Any:
    """A fresh drafter: linear weights ~ N(0, init_std), norm weights 1 (seeded)."""
    import torch

    from core.ml.models.drafter import DFlashDrafter
    from core.ml.formats.drafter_config import DFlashConfig

    torch.manual_seed(seed)
    model = DFlashDrafter(DFlashConfig.from_dict(config_dict))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, init_std)
    return model.float()


def build_source(cfg: Any, target_cfg: dict[str, Any], tokenizer: Any) -> Any:
    """The data source named by the config (extract cache or JSONL)."""
    from core.ml.tasks.extract import target_fingerprint
    from core.ml.train.data import FeatureCache, JsonlSource

    final_id = int(target_cfg["num_hidden_layers"]) - 1
    if cfg.data.features is not None:
        # (preflight has already refused a cache without the final layer when a knob needs it)
        return FeatureCache(cfg.data.features, cfg.drafter.target_layer_ids, final_id,
                            target_fingerprint(cfg.target), cfg.data.max_length, int(target_cfg["hidden_size"]))
    return JsonlSource(cfg.data.file, tokenizer, int(target_cfg["vocab_size"]), cfg.data.max_length,
                       cfg.data.max_new_tokens, cfg.data.chat_template)


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.describe:
        from core.ml.train.config import describe

        sys.stdout.write(describe())
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    fixed_mmap_threshold()  # no heap creep from gradients re-allocated every step: the peak is what it holds
    try:
        cfg, target_cfg, tokenizer = load_resolved(args)
        if args.print_config:
            return print_config(cfg, target_cfg)
        preflight(cfg)
    except ValueError as exc:  # ConfigError, or a drafter.init config.json that does not parse
        raise UsageError(str(exc)) from None
    stop = StopFlag()
    stop.install()
    dist = Dist()
    try:
        return Trainer(cfg, target_cfg, tokenizer, args, dist, stop).run()
    finally:
        stop.uninstall()
        dist.close()


def train_record(cfg: Any, out: Path) -> dict[str, Any]:
    """What reproduces this run (:mod:`core.ml.formats.reproduce`): the target, the data by digest
    (the feature cache's manifest.json, else the JSONL file); the resolved config is
    ``resolved_config.yaml`` beside it (the console stores it as the run's config, which ``diff``
    compares), so the record names the file rather than hold it twice."""
    from core.ml.formats.reproduce import file_digest, reproduction, target_identity

    src = (Path(cfg.data.features) / "manifest.json") if cfg.data.features else (
        Path(cfg.data.file) if cfg.data.file else None)
    data = file_digest(src) if src is not None else {}
    return reproduction(out, config={"file": RESOLVED}, data=data,
                        target=target_identity(cfg.target, cfg.dtype) if cfg.target else None)


def no_sequences_left(cfg: Any, loss_tokens: Sequence[int], kept: int, val_n: int) -> str:
    """The error when no sequence is left to train on, with the figures that say which knob to turn."""
    n, need = len(loss_tokens), cfg.data.min_loss_tokens
    msg = (f"no training sequences left ({n} in the data, {n - kept} too short, {val_n} held out for "
           "validation)")
    if kept == 0:
        longest = max(loss_tokens, default=0)
        msg += (f"; the longest has {longest} supervised tokens and data.min_loss_tokens is {need}: the "
                "target's answers end early. Lower data.min_loss_tokens, extract longer answers (a larger "
                "max_new_tokens; a target that stops at EOS this soon may need more training), or use more prompts")
    else:  # long enough, but all held out
        msg += f": {kept} long enough, all held out; lower data.val_count ({val_n}) or use more prompts"
    return msg


class Trainer:
    """State of one training run (see the module docstring for what a step does)."""

    def __init__(self, cfg: Any, target_cfg: dict[str, Any], tokenizer: Any, args: argparse.Namespace,
                 dist: Dist, stop: StopFlag) -> None:
        self.cfg, self.target_cfg, self.tokenizer, self.args = cfg, target_cfg, tokenizer, args
        self.dist, self.stop = dist, stop
        self.out = Path(cfg.out_dir)

    def say(self, msg: str) -> None:
        if self.dist.main:
            say(msg)

    # -- setup ----------------------------------------------------------------------------

    def setup(self) -> None:
        import torch

        from core.ml.train import config as tc
        from core.ml.models.target import load_target, resolve_device, stop_token_ids
        from core.ml.train.data import JsonlSource
        from core.ml.train.loss import TrainForward

        cfg = self.cfg
        device = resolve_device(cfg.device)
        if device.type == "cuda" and self.dist.world > 1:
            device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(device)
        self.dist.init(device.type)
        self.device = device
        self.autocast_dtype = None
        if device.type == "cuda" and cfg.dtype in ("auto", "bfloat16"):
            self.autocast_dtype = torch.bfloat16
        elif device.type == "cpu" and cfg.dtype == "bfloat16":
            self.autocast_dtype = torch.bfloat16
        self.resume_path = resolve_resume(self.args.resume, self.out)
        if self.args.resume == "auto" and self.resume_path is None:
            self.say(f"--resume auto: no checkpoint in {self.out}, starting fresh")
        self.final_id = int(self.target_cfg["num_hidden_layers"]) - 1

        self.source = build_source(cfg, self.target_cfg, self.tokenizer)
        target_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        if isinstance(self.source, JsonlSource):  # the target runs on the fly: all of it
            self.say(f"loading target {cfg.target} on {device}")
            self.target = load_target(cfg.target, device, target_dtype).requires_grad_(False)
        else:  # cached features: the loss needs only the embedding and the LM head, by name, memory-mapped
            from core.ml.formats.weights import gb, load_embed_head

            self.target = load_embed_head(cfg.target, device, target_dtype)
            part = sum(p.numel() * p.element_size() for p in self.target.parameters())
            self.say(f"loading the embedding and LM head of {cfg.target} on {device} ({gb(part)}; "
                     f"the decoder layers stay on disk)")
        self.embed, self.head = self.target.get_input_embeddings(), self.target.get_output_embeddings()
        if isinstance(self.source, JsonlSource):
            self.source.bind(self.target, stop_token_ids(self.target, self.tokenizer))

        keep = [i for i in range(len(self.source)) if self.source.loss_tokens(i) >= cfg.data.min_loss_tokens]
        if len(keep) < len(self.source):
            self.say(f"skipping {len(self.source) - len(keep)} sequences with fewer than "
                     f"{cfg.data.min_loss_tokens} supervised tokens (data.min_loss_tokens)")
        order = torch.randperm(len(keep), generator=torch.Generator().manual_seed(step_seed(cfg.seed, "split")))
        val_n = cfg.data.val_count
        self.val_idx = sorted(keep[i] for i in order[:val_n].tolist())
        self.train_idx = [keep[i] for i in sorted(order[val_n:].tolist())]
        if not self.train_idx:
            raise UsageError(no_sequences_left(cfg, [self.source.loss_tokens(i) for i in range(len(self.source))],
                                               len(keep), val_n))
        per_step = cfg.train.batch_size * self.dist.world
        self.steps_per_epoch = math.ceil(len(self.train_idx) / per_step)
        self.total = (cfg.train.max_steps if cfg.train.max_steps is not None
                      else math.ceil(cfg.train.epochs * self.steps_per_epoch))
        if bounds.int64(self.total):  # a step past 64 bits could be neither seeded, stored nor resumed
            raise UsageError(f"train.epochs {cfg.train.epochs:g} x {self.steps_per_epoch} steps per epoch is "
                             "past 64 bits of steps: lower train.epochs, or set train.max_steps")
        self.cfg = cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=self.total))
        self.cfg_dict = cfg.to_dict()
        self.drafter_cfg = tc.drafter_config_dict(cfg, self.target_cfg)

        if cfg.drafter.init is not None:
            from core.ml.models.drafter import load_drafter

            drafter = load_drafter(cfg.drafter.init, device="cpu", dtype=torch.float32)
        else:
            drafter = new_drafter(self.drafter_cfg, cfg.drafter.init_std, cfg.seed)
        self.drafter = drafter.to(device).train()
        self.forward = TrainForward(self.drafter, cfg.train.attention)
        if self.dist.active:
            from torch.nn.parallel import DistributedDataParallel

            self.forward = DistributedDataParallel(self.forward, device_ids=[device] if device.type == "cuda" else None)
        t = cfg.train
        # fused: one kernel per step, no per-tensor temporaries (the unfused step allocates about
        # three copies of the largest weight on top of weights, grads and moments)
        self.opt = torch.optim.AdamW(self.drafter.parameters(), lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay,
                                     fused=device.type in ("cpu", "cuda"))
        warmup = t.warmup_steps if t.warmup_steps is not None else int(round(t.warmup_ratio * self.total))
        self.warmup = warmup
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_factor(s, self.total, warmup, t.min_lr_ratio))
        self.step = 0
        if self.resume_path is not None:
            self.load(self.resume_path)
        self.run_info = {"world_size": self.dist.world, "total_steps": self.total,
                         "steps_per_epoch": self.steps_per_epoch, "warmup_steps": warmup,
                         "train_sequences": len(self.train_idx), "val_sequences": len(self.val_idx),
                         "fc_in_features": self.drafter.fc.in_features,
                         "fc_layer_ids": list(self.drafter.config.target_layer_ids), "final_layer_id": self.final_id,
                         "label_source": cfg.loss.labels,
                         "attention": self.drafter.config.attention_summary()}
        if self.dist.main:
            self.out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.out / RESOLVED, tc.to_yaml(cfg, "resolved config of this run (core.ml.train)"))
            atomic_write_json(self.out / "config.json", self.drafter_cfg, allow_nan=False)
            atomic_write_json(self.out / "provenance.json", provenance(seed=cfg.seed, task="train", extra={
                "run": self.run_info, "reproduce": train_record(cfg, self.out)}))

    def load(self, path: Path) -> None:
        """Restore weights, optimizer, scheduler and the step from a checkpoint."""
        import torch

        from core.ml.train.config import knob_diff

        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
            self.drafter.load_state_dict(ckpt["model"])
            self.opt.load_state_dict(ckpt["optimizer"])
            self.sched.load_state_dict(ckpt["scheduler"])
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise TaskError(f"--resume {path}: cannot restore this run from it ({str(exc).splitlines()[0]})") from exc
        self.step = int(ckpt["step"])
        diff = knob_diff(ckpt.get("config") or {}, self.cfg_dict)
        if diff:
            self.say(f"warning: resuming with knobs that differ from the checkpoint's: "
                     + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items()))
        self.say(f"resumed from {path} at step {self.step}")

    # -- data -----------------------------------------------------------------------------

    def _perm(self, epoch: int) -> list[int]:
        import torch

        if getattr(self, "_perm_epoch", None) != epoch:
            g = torch.Generator().manual_seed(step_seed(self.cfg.seed, "epoch", epoch))
            self._perm_cache = torch.randperm(len(self.train_idx), generator=g).tolist()
            self._perm_epoch = epoch
        return self._perm_cache

    def samples_for(self, step: int) -> list[int]:
        """Source indices of this rank's sequences at 1-based ``step`` (a function of seed, step, rank)."""
        bs, n = self.cfg.train.batch_size, len(self.train_idx)
        first = ((step - 1) * self.dist.world + self.dist.rank) * bs
        return [self.train_idx[self._perm(i // n)[i % n]] for i in range(first, first + bs)]

    def batch(self, indices: Sequence[int], gen: Any) -> Any:
        from core.ml.train.data import featurize, pack

        samples = []
        for i in indices:
            s = self.source.load(i)
            if s.taps is None:
                s = featurize(self.target, s, self.cfg.drafter.target_layer_ids, self.final_id)
            samples.append(s)
        return pack(samples, self.cfg.train.anchors_per_sequence, gen).to(self.device)

    # -- loop -----------------------------------------------------------------------------

    def autocast(self) -> Any:
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def agree_stop(self, local: bool) -> bool:
        import torch

        return bool(self.dist.sum(torch.tensor([float(local)])).item() > 0)

    def train_step(self, step: int) -> tuple[Any, float, int]:
        """One optimizer step; returns (LossOutput, grad norm, tokens of this rank)."""
        import torch

        from core.ml.train.loss import batch_loss

        cfg = self.cfg
        gen = torch.Generator().manual_seed(step_seed(cfg.seed, "step", step, self.dist.rank))
        batch = self.batch(self.samples_for(step), gen)
        with self.autocast():
            out = batch_loss(self.forward, self.embed, self.head, batch, cfg, gen, self.drafter.config)
        self.opt.zero_grad(set_to_none=True)
        if not math.isfinite(out.num):
            raise TaskError(f"loss is not finite at step {step} (lower train.lr, check the features)")
        out.loss.backward()
        clip = cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf")
        gnorm = float(torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), clip))
        self.opt.step()
        self.sched.step()
        return out, gnorm, batch.num_tokens

    def validate(self) -> dict[str, Any]:
        """Loss and accuracy on the held-out sequences: no noise, fixed anchors."""
        import torch

        from core.ml.train.loss import batch_loss, expected_acceptance_length, per_position_accuracy

        B = self.cfg.drafter.block_size
        acc = torch.zeros(4 + 2 * (B - 1), dtype=torch.float64)
        self.drafter.eval()
        with torch.no_grad():
            for j, i in enumerate(self.val_idx):
                if j % self.dist.world != self.dist.rank:
                    continue
                gen = torch.Generator().manual_seed(step_seed(self.cfg.seed, "val", i))
                batch = self.batch([i], gen)
                with self.autocast():
                    out = batch_loss(self.forward.module if self.dist.active else self.forward,
                                     self.embed, self.head, batch, self.cfg, None, self.drafter.config)
                acc += torch.tensor([out.num, out.den, out.streak_sum, out.blocks, *out.correct.tolist(),
                                     *out.total.tolist()], dtype=torch.float64)
        self.drafter.train()
        acc = self.dist.sum(acc)
        num, den, streak, blocks = acc[:4].tolist()
        a = per_position_accuracy(acc[4:4 + B - 1], acc[4 + B - 1:])
        return {"event": "validation", "step": self.step, "val_loss": num / den if den else 0.0, "val_acc": a,
                "val_eal": expected_acceptance_length(a), "val_streak": streak / blocks if blocks else 0.0}

    def checkpoint(self) -> Path | None:
        path = None
        if self.dist.main:
            path = save_checkpoint(self.out, self.step, self.drafter, self.opt, self.sched, self.cfg_dict,
                                   self.drafter_cfg, self.run_info, self.cfg.train.keep_checkpoints,
                                   self.cfg.train.keep_steps)
            print_line({"event": "checkpoint", "step": self.step, "path": str(path.resolve())})
        if self.dist.active:
            self.dist.dist.barrier()
        self.last_saved = self.step
        return path

    def dump_weights(self) -> None:
        import torch

        d = Path(self.args.debug_dump_weights)
        d.mkdir(parents=True, exist_ok=True)
        torch.save({"model": {k: v.detach().cpu() for k, v in self.drafter.state_dict().items()},
                    "sequences": [self.source.ids[i] for i in self.samples_for(self.step)]},
                   d / f"rank{self.dist.rank}_step{self.step}.pt")

    def run(self) -> int:
        import torch

        from core.ml.train.loss import expected_acceptance_length, per_position_accuracy

        self.setup()
        cfg, B = self.cfg, self.cfg.drafter.block_size
        if self.dist.main:
            print_line({"event": "info", "task": "train", **self.run_info, "start_step": self.step,
                        "resumed_from": str(self.resume_path.resolve()) if self.resume_path else None,
                        "out_dir": str(self.out.resolve())})
        self.say(f"drafter attention: {self.drafter.config.attention_text()}")
        self.say(f"training {self.total} steps ({self.steps_per_epoch}/epoch, world {self.dist.world}); "
                 f"fc {self.drafter.fc.in_features} wide, layers {self.drafter.config.target_layer_ids}")
        self.last_saved = -1
        window = torch.zeros(5 + 2 * (B - 1), dtype=torch.float64)  # num, den, streak, blocks, tokens, correct.., total..
        t_start = t_window = time.perf_counter()
        done_here = 0
        stopped = self.agree_stop(self.stop.set)
        while not stopped and self.step < self.total:
            lr = self.sched.get_last_lr()[0]
            out, gnorm, tokens = self.train_step(self.step + 1)
            self.step += 1
            done_here += 1
            if self.args.debug_dump_weights:
                self.dump_weights()
            row = torch.tensor([out.num, out.den, out.streak_sum, out.blocks, tokens, *out.correct.tolist(),
                                *out.total.tolist(), float(self.stop.set)], dtype=torch.float64)
            row = self.dist.sum(row)
            stopped = bool(row[-1] > 0)
            window += row[:-1]
            if self.step % cfg.train.log_every == 0 or self.step == self.total or stopped:
                now = time.perf_counter()
                num, den, streak, blocks, tok = window[:5].tolist()
                correct, slots = window[5:5 + B - 1], window[5 + B - 1:]
                acc = per_position_accuracy(correct, slots)
                total_correct, total_slots = float(correct.sum()), float(slots.sum())
                per_step = (now - t_start) / max(done_here, 1)
                if self.dist.main:
                    print_line({"step": self.step, "epoch": round(self.step / self.steps_per_epoch, 4),
                                "loss": num / den if den else 0.0, "lr": lr, "acc": acc,
                                "full_acc": total_correct / total_slots if total_slots else 0.0,
                                "eal": expected_acceptance_length(acc), "streak": streak / blocks if blocks else 0.0,
                                "grad_norm": gnorm, "tokens": int(tok),
                                "tokens_per_s": round(tok / max(now - t_window, 1e-9), 2),
                                "eta_s": round((self.total - self.step) * per_step, 2),
                                "elapsed_s": round(now - t_start, 3)})
                window.zero_()
                t_window = now
            if self.val_idx and cfg.train.val_every and self.step % cfg.train.val_every == 0:
                self.report_validation()
            if self.step % cfg.train.checkpoint_every == 0 or self.step == self.total:
                self.checkpoint()
        if stopped:
            if self.last_saved != self.step:
                self.checkpoint()
            if self.dist.main:
                print_line({"event": "stopped", "step": self.step})
            self.say(f"stopped at step {self.step}; resume with --resume auto")
            return 0
        if self.last_saved != self.step:
            self.checkpoint()
        if self.val_idx and not (cfg.train.val_every and self.step % cfg.train.val_every == 0):
            self.report_validation()
        if self.dist.main:
            print_line({"event": "result", "task": "train", "step": self.step,
                        "path": str((self.out / f"step_{self.step}.pt").resolve())})
        return 0

    def report_validation(self) -> None:
        line = self.validate()
        if self.dist.main:
            print_line(line)

