"""Sampled speculative decoding: the tempered, filtered distributions and lossless acceptance
(docs/evaluation.md §2, "Sampling").

The semantics are those of z-lab's reference (``dflash_generate`` in ``dflash`` 0.1.0) and of
speculative sampling (Leviathan et al. 2023, Chen et al. 2023):

* a distribution is ``softmax(logits / T)`` restricted to the ``top_k`` largest logits (0: all)
  and then to the smallest set of most likely tokens whose mass reaches ``top_p`` (renormalised);
  the target's ``p`` and a DFlash drafter's ``q`` are both made so;
* each draft token ``x`` is drawn from ``q`` and accepted with probability ``min(1, p(x) / q(x))``,
  slot after slot until one is rejected;
* at the rejected slot the correction is drawn from the residual ``max(p - q, 0)`` renormalised;
  after a fully accepted block the bonus token is drawn from ``p`` at the slot after it.

Then every committed token is distributed exactly as the target's own sampling at that position,
whatever ``q`` is (lossless; tests/ml/models/test_sampling.py checks it as a distribution). A drafter
whose draft is not drawn from its tempered logits (a DFlash-2 drafter's candidate selector) passes
the ``q`` it actually drew from.

Everything draws from one seeded ``torch.Generator`` per generation, so a seed gives the same
rounds (:func:`sample_seed` derives each (prompt, sample)'s seed from the run's ``--seed``).

This module is pure Python (the eval action validates its params with it, on a laptop without
torch); the tensor side is :mod:`core.ml.models.sampling_torch`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from core.ml.formats import bounds


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn: ``temperature`` 0 is greedy (argmax, no randomness)."""

    temperature: float = 0.0
    top_p: float = 1.0
    """Keep the most likely tokens whose mass reaches this (1: all)."""
    top_k: int = 0
    """Keep the ``top_k`` largest logits (0: all)."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def problem(self) -> tuple[str, str] | None:
        """``(field, what is wrong with it)``, or None when these settings are usable."""
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            return "temperature", f"{self.temperature}: must be a finite number >= 0 (0: greedy)"
        why = bounds.temperature(self.temperature)
        if why:
            return "temperature", why
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            return "top_p", f"{self.top_p}: must be in (0, 1] (1: no nucleus filter)"
        why = bounds.float32(self.top_p)  # the nucleus compares float32 masses with it
        if why:
            return "top_p", f"{why} (a top_p that is 0 in float32 keeps no token)"
        if self.top_k < 0:
            return "top_k", f"{self.top_k}: must be >= 0 (0: no top-k filter)"
        why = bounds.count(self.top_k, 0)
        if why:
            return "top_k", f"{why} (0: no top-k filter)"
        if self.greedy and (self.top_p != 1 or self.top_k != 0):
            return ("top_p" if self.top_p != 1 else "top_k",
                    "top-p / top-k filter the sampling distribution, and greedy decoding (temperature 0) "
                    "samples nothing: set a temperature > 0, or drop them")
        return None

    def to_json(self) -> dict:
        return {"temperature": float(self.temperature), "top_p": float(self.top_p), "top_k": int(self.top_k)}


def top_k_problem(top_k: int, target_config: dict | None) -> str | None:
    """Why ``top_k`` cannot filter the target's vocabulary (its config.json, ``text_config`` of
    a composite one; None when unknown): more tokens than the target has. None when it can."""
    cfg = target_config.get("text_config") or target_config if isinstance(target_config, dict) else {}
    vocab = cfg.get("vocab_size") if isinstance(cfg, dict) else None
    if not top_k or not bounds.is_int(vocab) or top_k <= vocab:
        return None
    return (f"{top_k}: the target has {vocab} tokens (vocab_size in its config.json), so top-k keeps at most "
            f"that many: give {vocab} or less (0: no top-k filter)")


def sample_seed(seed: int, prompt_id: str, sample: int) -> int:
    """The generator seed of one (prompt, sample) of a run seeded ``seed``: distinct per prompt and
    sample, the same on every host and run (recorded in result.json's per-prompt rows)."""
    digest = hashlib.sha256(f"{seed}:{prompt_id}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def add_arguments(parser) -> None:
    """``--seed``, ``--temperature``, ``--top-p``, ``--top-k``, ``--samples`` on ``parser``: one
    definition for ``core.ml.eval`` and ``core.ml.watcher``, which passes them to every eval it runs."""
    parser.add_argument("--seed", type=int, default=0, help="the run's seed: each sampled (prompt, sample) "
                        "draws from a generator seeded from it, the prompt id and the sample index")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sampled "
                        "speculative decoding, lossless (chain, online only)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="nucleus filter of the sampling distribution (1: none)")
    parser.add_argument("--top-k", type=int, default=0, help="top-k filter of the sampling distribution (0: none)")
    parser.add_argument("--samples", type=int, default=1, help="sampled: generations per prompt, each with its "
                        "own seed (tau at T > 0 is a random variable per prompt)")


def cli_flags(p) -> list:
    """The flags of :func:`add_arguments` for ``p`` (params or parsed args with ``temperature``,
    ``top_p``, ``top_k``, ``seed``, ``samples``); none when greedy, so a greedy command line stays
    what it was."""
    if not p.temperature:
        return []
    return ["--temperature", p.temperature, "--top-p", p.top_p, "--top-k", p.top_k,
            "--seed", p.seed, "--samples", p.samples]
