"""Online speculative decoding with a DFlash drafter: chain (docs/evaluation.md §2) and DDTree (docs/evaluation.md §3).

Greedy (temperature 0): drafts are argmax (a DFlash-2 drafter's: its candidate selector's
path, :func:`core.ml.models.drafter.draft_path`), the target's argmax decides acceptance, so the
committed tokens are exactly the target's greedy decoding (lossless; tests check it token for
token against :func:`greedy_generate`).

Sampled (chain only, ``sampling`` with a temperature > 0): drafts are drawn from the drafter's
tempered, filtered distribution (a DFlash-2 drafter's: along its selector,
:func:`core.ml.models.drafter.draft_sample`) and accepted by speculative sampling
(:func:`core.ml.models.sampling_torch.accept`), so the committed tokens are distributed as the target's own
sampling (lossless as a distribution; tests/ml/models/test_sampling.py). DDTree has no lossless tree
verification here (nor in the reference) and stays greedy.

One round, chain: block ``[x_s, MASK * (B-1)]`` -> drafter -> B-1 draft tokens -> target
verifies the B block tokens in one forward -> ``n_acc`` = leading drafts equal to the target's
argmax -> commit ``block[0..n_acc]`` plus the target's token after them (bonus), record
``tau_round = n_acc + 1``, feed the accepted positions' features to the drafter next round.
DDTree replaces the chain by the best-first tree and walks it along the target's argmax.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from core.ml.models import sampling_torch as sampler
from core.ml.measure import tau as taulib
from core.ml.decoding.ddtree import build_tree, topk_per_depth
from core.ml.models.drafter import (DFlashDrafter, DraftCache, block_embeddings, draft_logits, draft_path, draft_sample,
                             refuse_tree)
from core.ml.models.sampling import Sampling
from core.ml.models.target import TargetRunner, cache_kwarg, new_cache


@dataclass
class GenerationResult:
    """Outcome of one prompt.

    Attributes:
        tokens: generated ids (at most ``max_new_tokens``, cut after the first stop token).
        rounds: per-round acceptance lengths (tau_round = accepted drafts + 1).
        prompt_len: number of prompt tokens.
        stopped: a stop token ended generation.
        prefill_s / decode_s / draft_s / verify_s: wall times in seconds.
        target_forwards / target_tokens: target forwards and tokens fed to it (prefill included).
        drafter_forwards: drafter forwards (one per round).
    """

    tokens: list[int]
    rounds: list[int]
    prompt_len: int
    stopped: bool = False
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    target_forwards: int = 0
    target_tokens: int = 0
    drafter_forwards: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tau(self) -> float | None:
        return taulib.mean_tau(self.rounds)


class Proposer(Protocol):
    """Anything that drafts B-1 tokens for a block (the DFlash drafter, or a test oracle)."""

    def reset(self) -> None: ...

    def propose(self, block: Sequence[int], start: int, new_feats: Tensor | None) -> Tensor:
        """Draft logits [B-1, V] for block ``[x_start, MASK...]`` given the new context rows."""
        ...


def draft_tokens(proposer: Proposer, block: Sequence[int], start: int, new_feats: Tensor | None) -> list[int]:
    """The B-1 greedy draft tokens of a block: the proposer's own ``draft`` when it has one (a
    DFlash-2 drafter's selector path is not the argmax of its logits), else the argmax of
    :meth:`Proposer.propose`."""
    draft = getattr(proposer, "draft", None)
    if draft is not None:
        return draft(block, start, new_feats)
    return proposer.propose(block, start, new_feats).argmax(-1).tolist()


def sample_tokens(proposer: Proposer, block: Sequence[int], start: int, new_feats: Tensor | None,
                  sampling: Sampling, generator: torch.Generator) -> tuple[list[int], Tensor]:
    """The B-1 sampled draft tokens of a block and the distributions [B-1, V] they were drawn
    from: the proposer's own ``sample`` when it has one (a DFlash-2 drafter draws along its
    selector), else draws from the tempered, filtered :meth:`Proposer.propose` logits."""
    own = getattr(proposer, "sample", None)
    if own is not None:
        return own(block, start, new_feats, sampling, generator)
    q = sampler.probs(proposer.propose(block, start, new_feats), sampling)
    return sampler.draw(q, generator).tolist(), q


class DFlashProposer:
    """Drafts with a :class:`DFlashDrafter`, the target's embeddings and LM head (docs/evaluation.md §2).

    The draft cache holds context K/V of every committed position < block start; each call
    appends the features of the positions committed since the previous call.
    """

    def __init__(self, drafter: DFlashDrafter, target: nn.Module) -> None:
        self.drafter = drafter
        self.embed = target.get_input_embeddings()
        self.head = target.get_output_embeddings()
        self.cache = DraftCache()

    def reset(self) -> None:
        self.cache = DraftCache()

    @torch.no_grad()
    def propose(self, block: Sequence[int], start: int, new_feats: Tensor | None) -> Tensor:
        return self._forward(block, start, new_feats)[1]

    @torch.no_grad()
    def draft(self, block: Sequence[int], start: int, new_feats: Tensor | None) -> list[int]:
        """The greedy draft tokens [B-1] (:func:`core.ml.models.drafter.draft_path`: argmax, or the selector's path)."""
        hidden, logits = self._forward(block, start, new_feats)
        anchor = torch.tensor([int(block[0])], device=logits.device)
        return draft_path(self.drafter, hidden[None], logits[None], anchor)[0].tolist()

    @torch.no_grad()
    def sample(self, block: Sequence[int], start: int, new_feats: Tensor | None, sampling: Sampling,
               generator: torch.Generator) -> tuple[list[int], Tensor]:
        """Sampled draft tokens [B-1] and the distributions [B-1, V] they were drawn from
        (:func:`core.ml.models.drafter.draft_sample`)."""
        hidden, logits = self._forward(block, start, new_feats)
        anchor = torch.tensor([int(block[0])], device=logits.device)
        tokens, q = draft_sample(self.drafter, hidden[None], logits[None], anchor, sampling, generator)
        return tokens[0].tolist(), q[0]

    def _forward(self, block: Sequence[int], start: int, new_feats: Tensor | None) -> tuple[Tensor, Tensor]:
        """Draft hidden states [B-1, H] and float32 logits [B-1, V] of the block's slots 1..."""
        c0 = len(self.cache)
        assert new_feats is not None and new_feats.shape[1] == start - c0, "context rows out of step"
        device = self.drafter.fc.weight.device
        ids = torch.tensor([list(block)], device=self.embed.weight.device)
        positions = torch.arange(c0, start + len(block), device=device)[None]  # [1, c+q]
        cfg = self.drafter.config
        hidden = self.drafter(block_embeddings(cfg, self.embed, ids).to(device), new_feats.to(device), positions,
                              cache=self.cache)
        return hidden[0, 1:], draft_logits(cfg, self.head, hidden[0, 1:]).float()  # [B-1, H], [B-1, V]


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def finish_tokens(out: list[int], max_new: int, stop_ids: Sequence[int]) -> tuple[list[int], bool]:
    """``out`` cut to ``max_new`` tokens and after the first stop token; whether one stopped it."""
    tokens = out[:max_new]
    stops = set(stop_ids)
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[: i + 1], True
    return tokens, False


@torch.no_grad()
def greedy_generate(model: nn.Module, prompt: Sequence[int], max_new_tokens: int,
                    stop_ids: Sequence[int] = ()) -> GenerationResult:
    """Plain greedy decoding, one token per forward (the lossless reference).

    Deliberately independent of :class:`TargetRunner`: a transformers cache, implicit
    positions, nothing rolled back.
    """
    device = next(model.parameters()).device
    kw = cache_kwarg(model)
    cache = new_cache(model)
    t0 = _sync(device)
    logits = model(torch.tensor([list(prompt)], device=device), **{kw: cache}, use_cache=True).logits
    t1 = _sync(device)
    out: list[int] = []
    stops = set(stop_ids)
    while True:
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        if len(out) >= max_new_tokens or nxt in stops:
            break
        logits = model(torch.tensor([[nxt]], device=device), **{kw: cache}, use_cache=True).logits
    t2 = _sync(device)
    tokens, stopped = finish_tokens(out, max_new_tokens, stop_ids)
    return GenerationResult(tokens, [1] * len(tokens), len(prompt), stopped, t1 - t0, t2 - t1,
                            target_forwards=len(out), target_tokens=len(prompt) + len(out) - 1)


@torch.no_grad()
def chain_generate(proposer: Proposer | None, runner: TargetRunner, prompt: Sequence[int], max_new_tokens: int,
                   block_size: int, mask_token_id: int, stop_ids: Sequence[int] = (),
                   sampling: Sampling | None = None, seed: int = 0,
                   last_blocks: str = taulib.SHRINK) -> GenerationResult:
    """Chain DFlash speculative decoding, docs/evaluation.md §2: greedy, or sampled with ``sampling``.

    Args:
        proposer: the drafter wrapper (None only with ``block_size == 1``: plain decoding
            through the same harness, the speed baseline).
        runner: the target (its taps must match the drafter's ``target_layer_ids``).
        prompt: prompt ids.
        max_new_tokens: generation stops once this many tokens are committed.
        block_size: B (may be smaller than the drafter's trained block size).
        mask_token_id: id of the masked block slots.
        stop_ids: stop token ids.
        sampling: temperature, top-p, top-k (None or temperature 0: greedy, exactly as before).
        seed: the seed of this generation's generator (sampled only): the same seed gives the
            same rounds and tokens.
        last_blocks: how the rounds near ``max_new_tokens`` run (:func:`core.ml.measure.tau.end_block`):
            :data:`~core.ml.measure.tau.SHRINK`, the reference's (the block shrinks to the tokens left), or
            :data:`~core.ml.measure.tau.FULL_BLOCK`, llama.cpp's server's (a full block, its draft cut to
            the tokens left - 1; the last token decoded alone, the drafter not run).
    """
    if proposer is not None:
        proposer.reset()
    dev = runner.device
    sampled = sampling is not None and not sampling.greedy
    gen = sampler.generator(seed, dev) if sampled else None
    t0 = _sync(dev)
    logits, feats = runner.prefill(prompt)
    # out[i] sits at position P + i; sampled, the first token is drawn from the target, as the reference's
    out = [int(sampler.draw(sampler.probs(logits, sampling), gen)) if sampled else int(logits.argmax())]
    t1 = _sync(dev)
    P, start, rounds = len(prompt), len(prompt), []
    end = P + max_new_tokens  # the reference's max_length: no token is committed at or past it
    draft_s = verify_s = 0.0
    stops = set(stop_ids)
    stopped = out[0] in stops
    drafted = 0
    while start + 1 < end and not stopped:
        # the block the drafter sees and the drafts verified: the reference shrinks the last blocks to
        # what is left; llama.cpp drafts a full block and cuts the draft (taulib.end_block)
        width, n_draft = taulib.end_block(last_blocks, block_size, end - start - 1)
        x = out[start - P]
        ta = _sync(dev)
        block = [x] + [mask_token_id] * (width - 1)
        q = None
        if n_draft <= 0:
            draft = []
        elif sampled:
            draft, q = sample_tokens(proposer, block, start, feats, sampling, gen)
            draft, q = draft[:n_draft], q[:n_draft]
        else:
            draft = draft_tokens(proposer, block, start, feats)[:n_draft]
        drafted += n_draft > 0
        tb = _sync(dev)
        vlogits, vfeats = runner.verify_chain([x] + draft)
        if sampled:  # speculative sampling: accept with min(1, p/q), correct from the residual
            n_acc, nxt = sampler.accept(draft, q, sampler.probs(vlogits, sampling), gen)
        else:
            post = vlogits.argmax(-1).tolist()  # post[i]: target's token after block[i]
            n_acc = taulib.streak(draft, post[:-1])
            nxt = post[n_acc]
        produced, stopped = taulib.committed(draft[:n_acc] + [nxt], end - start - 1, stops)
        runner.commit_chain(produced)
        tc = _sync(dev)
        draft_s, verify_s = draft_s + (tb - ta), verify_s + (tc - tb)
        out += (draft[:n_acc] + [nxt])[:produced]
        rounds.append(produced)
        start += produced
        feats = vfeats[:, :produced] if vfeats is not None else None
    t2 = _sync(dev)
    tokens, stopped = finish_tokens(out, max_new_tokens, stop_ids)
    return GenerationResult(tokens, rounds, P, stopped, t1 - t0, t2 - t1, draft_s, verify_s,
                            drafter_forwards=drafted, **runner.counts())


@torch.no_grad()
def ddtree_generate(proposer: Proposer, runner: TargetRunner, prompt: Sequence[int], max_new_tokens: int,
                    block_size: int, mask_token_id: int, budget: int, stop_ids: Sequence[int] = ()) -> GenerationResult:
    """DDTree speculative decoding (greedy), docs/evaluation.md §3: one tree of ``budget`` nodes per round.

    ``tau_round`` = accepted nodes including the root (= accepted drafts + 1), as for chain.

    Raises:
        ValueError: a DFlash-2 drafter (its draft is the selector's path, the reference builds
            no tree from it, and a tree of per-slot top-k logits would ignore the selector).
    """
    refuse_tree(getattr(proposer, "drafter", None))
    proposer.reset()
    dev = runner.device
    t0 = _sync(dev)
    logits, feats = runner.prefill(prompt)
    out = [int(logits.argmax())]
    t1 = _sync(dev)
    P, start, rounds = len(prompt), len(prompt), []
    end = P + max_new_tokens
    draft_s = verify_s = 0.0
    stops = set(stop_ids)
    stopped = out[0] in stops
    nodes = 0
    while start + 1 < end and not stopped:
        width = min(block_size, end - start)
        x = out[start - P]
        ta = _sync(dev)
        draft_logits = proposer.propose([x] + [mask_token_id] * (width - 1), start, feats)
        tree = build_tree(x, topk_per_depth(draft_logits, budget), budget)
        tb = _sync(dev)
        vlogits, vfeats = runner.verify_tree(tree.tokens, tree.parents, tree.depths)
        accepted, bonus = tree.follow(vlogits.argmax(-1).tolist())
        new = [tree.tokens[i] for i in accepted[1:]] + [bonus]
        produced, stopped = taulib.committed(new, end - start - 1, stops)
        kept = accepted[:produced]  # the root and the accepted nodes whose tokens precede the last commit
        runner.commit_tree(kept)
        tc = _sync(dev)
        draft_s, verify_s = draft_s + (tb - ta), verify_s + (tc - tb)
        out += new[:produced]
        rounds.append(produced)
        nodes += len(tree) - 1
        start += produced
        feats = vfeats[:, kept] if vfeats is not None else None
    t2 = _sync(dev)
    tokens, stopped = finish_tokens(out, max_new_tokens, stop_ids)
    res = GenerationResult(tokens, rounds, P, stopped, t1 - t0, t2 - t1, draft_s, verify_s,
                           drafter_forwards=len(rounds), **runner.counts())
    res.extra["mean_tree_nodes"] = nodes / len(rounds) if rounds else 0.0
    return res
