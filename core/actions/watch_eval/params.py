"""``watch_eval`` of a train item, typed: where tau over training runs and how.

A train item may declare (typed: :class:`WatchEvalParams`)::

    watch_eval:
      on: console              # train | eval: a detached watcher (watch_eval.detached) on the
                               # training host / on host; console: specdeck drives it.
                               # Default: train for offline mode without another host.
      fetch: relay             # on: eval reads checkpoints by path (direct); console relays
      backfill: false          # console: evaluate every missed checkpoint, oldest first
      device: cpu              # a detached watcher's eval device
      host: ct129              # the eval host (not the training GPUs)
      target: models/target    # the target model dir on it
      cache: features/coding   # offline mode: an extract_hidden cache on it
      mode: offline            # offline (cheap, every checkpoint) | online (the final word)
      every: checkpoint        # or N: at most one eval per N steps
      prompts: coding          # online mode's prompt set
      baseline: drafters/zlab  # evaluated once per run: the reference line
      max_prompts: 8
      dtype: auto              # the target's dtype: auto keeps the checkpoint's own (bf16 stays bf16)
      max_memory: 60G          # refuse before loading above this (default: what the host has free)
      temperature: 0           # > 0: sampled evals, online only (top_p, top_k, seed, samples: as eval's)
      settle_s: 30             # a checkpoint its trainer marks nowhere as complete is read once
                               # unchanged this long; a failed read is recorded once unchanged
                               # this long after it (else read again once whole)
      alerts: {drop_pct: 10, flat_evals: 3, flat_eps: 0.02}
      keep_checkpoints: 2      # a detached watcher deletes the rest once evaluated, but the
      keep_best: 1             # best K by tau and every step another item names (@step:N)

How the evals run: :mod:`core.actions.watch_eval` (the package doc).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from core.ml.formats.layouts import SETTLE_S

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class WatchAlerts:
    drop_pct: float = 10.0
    """tau more than this % below the best so far (and detectably worse): an alert."""
    flat_evals: int = 3
    """tau not rising over this many evals while the loss fell: an alert."""
    flat_eps: float = 0.02
    """"not rising": the last eval at most this x mean above the window's first."""


@dataclass(frozen=True)
class WatchEvalParams:
    """``watch_eval`` of a train item: tau at each checkpoint while it trains (module doc)."""

    target: str
    """The target model dir on the host the evals run on."""
    host: str | None = None
    """The eval host (``on: eval`` / ``on: console``); ``on: train`` runs on the train item's."""
    on: Literal["train", "eval", "console"] | None = None
    """Where the evals are driven from: ``train`` (a detached watcher on the training host),
    ``eval`` (a detached watcher on ``host``), ``console`` (specdeck relays each checkpoint).
    Default: ``train`` for offline mode without another ``host``, else ``console``."""
    fetch: Literal["relay", "direct"] | None = None
    """How the eval host gets a checkpoint: ``relay`` through specdeck (``on: console``) or
    ``direct``: by its path on the training host (a shared or mounted filesystem)."""
    backfill: bool = False
    """``on: console``: evaluate every checkpoint missed while no specdeck ran, oldest first
    (default: only the newest waiting one; the others are recorded skipped)."""
    mode: Literal["offline", "online"] = "offline"
    cache: str | None = None
    """offline mode: an extract_hidden cache dir on the host the evals run on."""
    every: int | str = "checkpoint"
    """``checkpoint`` or N: at most one eval per N steps."""
    prompts: str = "coding"
    """online mode's prompt set (as eval's: zlab:NAME[:PATH] too, ``max_prompts`` its subset)."""
    baseline: str | None = None
    """A reference drafter dir, evaluated once per run."""
    max_prompts: int | None = None
    block_size: int | None = None
    max_new_tokens: int = 64
    allow_block_size_mismatch: bool = False
    dtype: str = "auto"
    """The target's dtype: auto keeps the checkpoint's own (bf16 stays bf16)."""
    device: str = "cpu"
    """Detached watcher: the device its evals run on (``cpu``, ``cuda``, ``cuda:1``...)."""
    max_memory: str | None = None
    temperature: float = 0.0
    """0: greedy; > 0: every eval samples (online only), as eval's ``temperature``: tau over
    training at the temperature the drafter will be served at."""
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    samples: int = 1
    """Sampled: generations per prompt, each with its own seed (as eval's)."""
    settle_s: float = SETTLE_S
    """Seconds a checkpoint its trainer does not mark complete (speculators' epoch dir saved
    with no pointer to it, a ``step_N.pt`` no ``latest`` names) must stay unchanged, its files,
    their sizes and mtimes, before it is read; and seconds a checkpoint whose read failed must
    stay unchanged before that failure is recorded (one that changes is read again once whole).
    Longer than the training host's disk may pause inside one save (:mod:`core.ml.formats.layouts`)."""
    alerts: WatchAlerts = field(default_factory=WatchAlerts)
    keep_checkpoints: int | None = None
    """A detached watcher's retention (:mod:`core.ml.formats.retention`): keep the newest N
    checkpoints, the ``keep_best`` best by tau and each step another item names
    (``item:<this>@step:N``), deleting the others once evaluated, the bytes freed logged.
    None: the trainer config's ``train.keep_checkpoints`` (specdeck's trainer; handed over to
    the watcher so the trainer no longer prunes tau-blind), else keep all."""
    keep_best: int = 1
    """With ``keep_checkpoints``: keep the best K by tau (0: the newest N only)."""

    def validate(self):
        from core.actions.eval import sampling_problems
        from core.plans.params import counts

        out = sampling_problems(self, offline_field="temperature")
        out += counts(self, max_prompts=1, block_size=1, max_new_tokens=1, keep_checkpoints=1,
                      keep_best=0)
        if not (self.every == "checkpoint" or (isinstance(self.every, int) and self.every > 0)):
            out.append((("every",), "every: a number of steps or 'checkpoint'"))
        if self.mode == "offline" and not self.cache:
            out.append((("cache",), "offline mode needs cache: the extract_hidden dir on the "
                                    "host the evals run on"))
        if self.max_memory is not None:
            from core.ml.formats.runio import parse_bytes

            try:
                parse_bytes(self.max_memory)
            except ValueError as exc:
                out.append((("max_memory",), f"max_memory: {exc}"))
        on = self.placement(None)
        if on in ("eval", "console") and not self.host:
            out.append((("host",), f"on: {on} needs host: the eval host"))
        fetch = self.fetch
        if on == "console" and fetch not in (None, "relay"):
            out.append((("fetch",), "on: console relays each checkpoint through specdeck "
                                    "(fetch: relay); a direct fetch needs on: eval"))
        if on == "eval" and fetch not in (None, "direct"):
            out.append((("fetch",), "on: eval reads checkpoints by path (fetch: direct); a relay "
                                    "through specdeck is on: console"))
        if self.backfill and on != "console":
            out.append((("backfill",), "backfill is for on: console (a detached watcher "
                                       "evaluates every checkpoint anyway)"))
        from core.ml.formats import bounds

        why = bounds.seconds(self.settle_s)
        if why:
            out.append((("settle_s",), f"settle_s: {why}"))
        if self.dtype not in DTYPES:
            out.append((("dtype",), f"dtype: one of {', '.join(DTYPES)} (auto keeps the "
                                    "checkpoint's own)"))
        if not re.fullmatch(r"cpu|auto|cuda(:\d+)?", self.device):
            out.append((("device",), f"device: cpu, auto, cuda or cuda:N, got {self.device!r}"))
        if on == "console" and self.device != "cpu":
            out.append((("device",), "device is for a detached watcher (on: train or on: eval)"))
        return out

    def placement(self, train_host: str | None) -> str:
        """``train``, ``eval`` or ``console`` (the default worked out, see ``on``)."""
        if self.on is not None:
            return self.on
        if self.mode == "offline" and (self.host is None or self.host == train_host):
            return "train"
        return "console"

    def eval_host(self, train_host: str) -> str:
        """The plan host the evals run on."""
        return train_host if self.placement(train_host) == "train" else self.host


def parse_watch(spec: Any) -> WatchEvalParams:
    """Plain ``watch_eval`` values (or params already) -> :class:`WatchEvalParams`; raises
    ``ExceptionGroup`` of :class:`core.plans.params.ParamError` (see ``parse_params``)."""
    if isinstance(spec, WatchEvalParams):
        return spec
    from core.plans.params import parse_params

    return parse_params(WatchEvalParams, spec)


def validate_watch(spec, plan, item) -> list[tuple[tuple, str]]:
    """Problems of a ``watch_eval`` mapping in ``plan`` as ``(field path, message)``."""
    try:
        p = parse_watch(spec)
    except ExceptionGroup as eg:
        return [(e.path, e.message) for e in eg.exceptions]
    out: list[tuple[tuple, str]] = []
    train_host = item.action.host if item is not None and item.action else None
    if p.host is not None and p.host not in plan.hosts:
        out.append((("host",), f"unknown host {p.host!r}"))
    if p.on == "train" and p.host is not None and train_host and p.host != train_host:
        out.append((("host",), f"on: train runs on the training host {train_host!r}; drop "
                               f"host {p.host!r} or use on: eval"))
    if p.keep_checkpoints is not None and p.placement(train_host) == "console":
        out.append((("keep_checkpoints",), "keep_checkpoints is a detached watcher's (on: "
                    "train, or on: eval with fetch: direct): it deletes where the checkpoints are"))
    if p.mode == "online":
        from core.actions.mlbase import validate_prompts

        err = validate_prompts(plan, p.prompts)
        if err:
            out.append((("prompts",), err))
    return out
