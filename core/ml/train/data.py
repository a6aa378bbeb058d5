"""Training data of the reference DFlash trainer: sources, packing, anchors, feature split.

Two sources give :class:`Sample` s (token ids, a loss mask over the response, and features):

* :class:`FeatureCache`: an extract cache (``python -m core.ml.extract``; layout in
  :mod:`core.ml.formats.featstore`): the target's own greedy continuations and their features, read
  one file per sample. Extract the drafter's ``target_layer_ids`` *plus the final layer N-1*
  (``--layers 1,9,17,25,33,35`` for a 36-layer target); fc sees only the taps and the final
  layer gives the target logits (the labels, and the teacher of the v4 soft KL). A cache of the
  taps only still trains the default v5 loss from its cached greedy labels (which are the
  argmax of that same final layer), but not the v4 options that need the final layer.
* :class:`JsonlSource`: a JSONL file; the target runs on the fly (:func:`featurize`).

"Final layer" means ``hidden_states[N]`` of the target, which transformers 5 returns *after*
the final norm, so ``lm_head(final)`` are exactly the target's logits (:class:`~core.ml.models.features.FeatureTap`
hooks the final norm for id N-1).

The v4/v5 noise difference lives in :func:`model_inputs`: the extracted tensor is
``[taps ; final]``; v5 adds noise to fc's input only (the target logits stay bit-identical to a
noise-free pass), v4 (``all_features``) adds it to the whole extracted tensor (the final layer
too, so labels and teacher logits are computed from noised states).

A step's samples are packed into one row (:func:`pack`): positions restart at 0 per sequence
and the context mask keeps each block inside its own sequence (document ids).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from core.ml.formats.runio import UsageError


@dataclass
class Sample:
    """One training sequence.

    Attributes:
        id: its id (prompt id or JSONL line).
        input_ids: [S] int64 prompt + response.
        loss_mask: [S] bool, True on response tokens (the supervised positions).
        taps: [S, K*H] features of the drafter's tapped layers, or None (computed on the fly).
        final: [S, H] the target's final (normed) hidden state, or None.
        labels: [S] int64 cached greedy labels (``labels[t]`` = target argmax at t), or None.
    """

    id: str
    input_ids: Tensor
    loss_mask: Tensor
    taps: Tensor | None = None
    final: Tensor | None = None
    labels: Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


# ----------------------------------------------------------------------------- sources


class FeatureCache:
    """Samples from an extract cache (lazy: one safetensors file read per sample).

    Args:
        root: the cache directory.
        taps: the drafter's tapped layer ids (fc input, in this order).
        final_id: the target's final layer id N-1.
        target_fingerprint: the target's fingerprint (must match the cache's).
        max_length: cut sequences to this many tokens.
        hidden_size: the target's H.

    Raises:
        UsageError: no manifest, another target, missing tapped layers.
    """

    def __init__(self, root: str | Path, taps: Sequence[int], final_id: int, target_fingerprint: str,
                 max_length: int, hidden_size: int) -> None:
        from core.ml.formats import featstore

        self.root = Path(root)
        manifest = featstore.load_manifest(self.root)
        if manifest is None:
            raise UsageError(f"data.features {root}: no manifest.json (run python -m core.ml.extract first)")
        if manifest["target"]["fingerprint"] != target_fingerprint:
            raise UsageError(f"data.features {root} was extracted from another target ({manifest['target']['path']})")
        layers = [int(i) for i in manifest["layer_ids"]]
        if int(manifest["hidden_size"]) != hidden_size:
            raise UsageError(f"data.features {root}: hidden size {manifest['hidden_size']} != the target's {hidden_size}")
        missing = [i for i in taps if i not in layers]
        if missing:
            raise UsageError(f"data.features {root} holds layers {layers}, not the drafter's target_layer_ids "
                             f"{missing}; extract --layers {','.join(map(str, [*taps, final_id]))}")
        H = hidden_size
        self.tap_cols = torch.cat([torch.arange(layers.index(i) * H, (layers.index(i) + 1) * H) for i in taps])
        self.final_cols = (torch.arange(layers.index(final_id) * H, (layers.index(final_id) + 1) * H)
                           if final_id in layers else None)
        self.has_final = self.final_cols is not None
        self.layer_ids = layers
        self.entries = manifest["entries"]
        self.ids = list(self.entries)
        self.max_length = max_length
        self.manifest = manifest

    def __len__(self) -> int:
        return len(self.ids)

    def loss_tokens(self, i: int) -> int:
        """Supervised tokens of sample ``i`` (from the manifest, no file read)."""
        e = self.entries[self.ids[i]]
        return max(0, min(int(e["num_tokens"]), self.max_length) - int(e["prompt_len"]))

    def load(self, i: int) -> Sample:
        from core.ml.formats import featstore

        pid = self.ids[i]
        seq = featstore.read_entry(self.root, pid, self.entries[pid])
        S = min(len(seq.input_ids), self.max_length)
        mask = torch.arange(S) >= seq.prompt_len
        feats = seq.features[:S]
        final = feats.index_select(1, self.final_cols) if self.final_cols is not None else None
        return Sample(pid, seq.input_ids[:S], mask, feats.index_select(1, self.tap_cols), final, seq.labels[:S])


class JsonlSource:
    """Samples from a JSONL file; features come from the target at train time (:func:`featurize`).

    One JSON object per line, with an optional ``"id"`` and one of:

    * ``"prompt"`` (text, chat template unless disabled) or ``"input_ids"`` (list of ints),
      optionally with ``"response"`` (text, tokenized without special tokens) or
      ``"response_ids"``: loss over the response. Without a response the target's greedy
      continuation of ``max_new_tokens`` tokens is generated once (and kept in memory), which
      matches what ``core.ml.extract`` caches.
    * ``"input_ids"`` with ``"loss_mask"`` (0/1 per token): explicit mask.
    * ``"text"``: plain text, loss over every token.

    Raises:
        UsageError: a malformed line (names file and line).
    """

    def __init__(self, path: str | Path, tokenizer: Any | None, vocab_size: int, max_length: int,
                 max_new_tokens: int, chat_template: bool = True) -> None:
        from core.ml.measure.prompts import Prompt, encode

        self.path = Path(path)
        if not self.path.is_file():
            raise UsageError(f"data.file {path}: not found")
        self.max_length, self.max_new_tokens = max_length, max_new_tokens
        self.rows: list[tuple[str, list[int], list[int] | None, list[bool] | None]] = []
        self._generated: dict[int, list[int]] = {}
        self.model: Any = None
        self.stop_ids: list[int] = []
        for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            where = f"{self.path.name}:{n}"
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise UsageError(f"{where}: not valid JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise UsageError(f"{where}: each line must be a JSON object")
            pid = str(row.get("id", f"line{n}"))
            heads = [k for k in ("prompt", "input_ids", "text") if k in row]
            if len(heads) != 1:
                raise UsageError(f"{where}: give exactly one of \"prompt\", \"input_ids\" or \"text\"")

            def ids_of(key: str, value: Any) -> list[int]:
                if not isinstance(value, list) or not all(isinstance(i, int) and 0 <= i < vocab_size for i in value):
                    raise UsageError(f"{where}: {key} must be a list of token ids in 0..{vocab_size - 1}")
                return list(value)

            def tokenize(key: str, text: Any, special: bool) -> list[int]:
                if not isinstance(text, str) or not text:
                    raise UsageError(f"{where}: {key} must be a non-empty string")
                if tokenizer is None:
                    raise UsageError(f"{where}: {key} is text but the target has no tokenizer")
                return [int(i) for i in tokenizer(text, add_special_tokens=special)["input_ids"]]

            try:
                if "text" in row:
                    ids = tokenize("text", row["text"], True)
                    self.rows.append((pid, ids, [], [True] * len(ids)))
                    continue
                if "prompt" in row:
                    if not isinstance(row["prompt"], str) or not row["prompt"]:
                        raise UsageError(f"{where}: prompt must be a non-empty string")
                    prompt = encode(Prompt(pid, text=row["prompt"]), tokenizer, vocab_size, chat_template)
                else:
                    prompt = ids_of("input_ids", row["input_ids"])
                if "loss_mask" in row:
                    mask = row["loss_mask"]
                    if not isinstance(mask, list) or len(mask) != len(prompt) or any(v not in (0, 1) for v in mask):
                        raise UsageError(f"{where}: loss_mask must be 0/1 per input_ids token")
                    self.rows.append((pid, prompt, [], [bool(v) for v in mask]))
                elif "response" in row:
                    self.rows.append((pid, prompt, tokenize("response", row["response"], False), None))
                elif "response_ids" in row:
                    self.rows.append((pid, prompt, ids_of("response_ids", row["response_ids"]), None))
                else:
                    self.rows.append((pid, prompt, None, None))
            except UsageError as exc:
                msg = str(exc)
                raise UsageError(msg if msg.startswith(where) else f"{where}: {msg}") from None
        if not self.rows:
            raise UsageError(f"data.file {path}: no rows")
        self.ids = [r[0] for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def loss_tokens(self, i: int) -> int:
        """Supervised tokens of row ``i`` (a row to be generated counts ``max_new_tokens``)."""
        _, prompt, response, mask = self.rows[i]
        if mask is not None:
            return sum(mask[: self.max_length])
        n = self.max_new_tokens if response is None else len(response)
        return max(0, min(len(prompt) + n, self.max_length) - len(prompt))

    def bind(self, model: Any, stop_ids: Sequence[int]) -> None:
        """The target used to generate missing responses."""
        self.model, self.stop_ids = model, list(stop_ids)

    def load(self, i: int) -> Sample:
        pid, prompt, response, mask = self.rows[i]
        if mask is not None:
            ids, m = prompt, mask
        else:
            if response is None:
                if i not in self._generated:
                    from core.ml.decoding.generate import greedy_generate

                    if self.model is None:
                        raise RuntimeError("JsonlSource.bind(target) first: rows without a response are generated")
                    self._generated[i] = greedy_generate(self.model, prompt, self.max_new_tokens, self.stop_ids).tokens
                response = self._generated[i]
            ids, m = prompt + response, [False] * len(prompt) + [True] * len(response)
        S = min(len(ids), self.max_length)
        return Sample(pid, torch.tensor(ids[:S], dtype=torch.long), torch.tensor(m[:S], dtype=torch.bool))


@torch.no_grad()
def featurize(model: Any, sample: Sample, taps: Sequence[int], final_id: int) -> Sample:
    """Fill ``taps`` and ``final`` of an on-the-fly sample with one target forward."""
    from core.ml.models.features import target_features

    device = next(model.parameters()).device
    ids = sample.input_ids.to(device)[None]
    _, feats = target_features(model, ids, [*taps, final_id], logits_to_keep=1)
    H = feats.shape[-1] // (len(taps) + 1)
    sample.taps, sample.final = feats[0, :, : len(taps) * H], feats[0, :, len(taps) * H:]
    return sample


# ----------------------------------------------------------------------------- batches


@dataclass
class Batch:
    """Samples packed into one row, with anchors.

    Attributes:
        input_ids: [S] int64.
        positions: [S] position of each token inside its own sequence.
        doc: [S] sequence index (0..n-1) of each token.
        loss_mask: [S] bool.
        taps: [S, K*H]; final: [S, H] or None; labels: [S] cached greedy labels or None.
        anchors: [A] anchor indices into the packed row, ascending.
        num_sequences: n.
    """

    input_ids: Tensor
    positions: Tensor
    doc: Tensor
    loss_mask: Tensor
    taps: Tensor
    final: Tensor | None
    labels: Tensor | None
    anchors: Tensor
    num_sequences: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> Batch:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Batch(move(self.input_ids), move(self.positions), move(self.doc), move(self.loss_mask),
                     move(self.taps), move(self.final), move(self.labels), move(self.anchors), self.num_sequences)


def anchor_candidates(loss_mask: Tensor) -> Tensor:
    """Anchor positions a with ``loss_mask[a] and loss_mask[a+1]`` (SpecForge's rule): -> [n]."""
    m = loss_mask.bool()
    return torch.nonzero(m[:-1] & m[1:]).flatten()


def sample_anchors(loss_mask: Tensor, num: int, gen: torch.Generator) -> Tensor:
    """Up to ``num`` distinct anchors, uniformly without replacement, ascending: -> [A] int64."""
    cand = anchor_candidates(loss_mask)
    if cand.numel() > num:
        cand = cand[torch.randperm(cand.numel(), generator=gen)[:num]]
    return torch.sort(cand).values


def pack(samples: Sequence[Sample], anchors_per_sequence: int, gen: torch.Generator) -> Batch:
    """Pack samples into one row and sample each one's anchors (``gen`` makes it reproducible)."""
    if any(s.taps is None for s in samples):
        raise ValueError("pack needs features: featurize on-the-fly samples first")
    offs, anchors = 0, []
    for s in samples:
        anchors.append(sample_anchors(s.loss_mask, anchors_per_sequence, gen) + offs)
        offs += len(s)
    has_final = all(s.final is not None for s in samples)
    has_labels = all(s.labels is not None for s in samples)
    return Batch(
        input_ids=torch.cat([s.input_ids for s in samples]),
        positions=torch.cat([torch.arange(len(s)) for s in samples]),
        doc=torch.cat([torch.full((len(s),), j, dtype=torch.long) for j, s in enumerate(samples)]),
        loss_mask=torch.cat([s.loss_mask for s in samples]),
        taps=torch.cat([s.taps.cpu() for s in samples]),
        final=torch.cat([s.final.cpu() for s in samples]) if has_final else None,
        labels=torch.cat([s.labels for s in samples]) if has_labels else None,
        anchors=torch.cat(anchors),
        num_sequences=len(samples),
    )


def uniform_noise(like: Tensor, std: float, gen: torch.Generator) -> Tensor:
    """``U(-std, std)`` shaped like ``like`` from ``gen`` (speculators' AddUniformNoise)."""
    u = torch.rand(like.shape, generator=gen, device=gen.device, dtype=torch.float32).to(like.device)
    return ((u * 2 - 1) * std).to(like.dtype)


def model_inputs(taps: Tensor, final: Tensor | None, fc_layers: str, noise_std: float, noise_target: str,
                 gen: torch.Generator | None) -> tuple[Tensor, Tensor | None]:
    """Split the extracted features into fc's input and the target's final layer, with noise.

    The extracted tensor is ``E = [taps ; final]`` ([S, (K+1)*H], or just the taps when the
    final layer is not available).

    * noise: ``fc_input`` (v5) adds ``U(-std, std)`` to fc's input only; ``all_features`` (v4)
      adds it to E, so the final layer (hence the target logits) is noised too. No noise
      when ``gen`` is None (validation) or ``std`` is 0.
    * fc_layers: ``taps`` (v5) gives fc the K*H tap columns; ``taps_and_final`` (v4) all of E.

    Args:
        taps: [S, K*H]; final: [S, H] or None.
        fc_layers / noise_std / noise_target: the config knobs.
        gen: the step's generator, or None for no noise.

    Returns:
        ``(fc_in [S, K*H or (K+1)*H], final [S, H] or None)``; with ``fc_input`` noise the
        returned final layer is the input tensor itself (bit-identical).
    """
    noisy = gen is not None and noise_std > 0
    KH = taps.shape[-1]
    ext = taps if final is None else torch.cat([taps, final], dim=-1)
    if noisy and noise_target == "all_features":
        ext = ext + uniform_noise(ext, noise_std, gen)
    if fc_layers == "taps_and_final":
        if final is None:
            raise ValueError("fc_layers taps_and_final needs the final layer")
        fc_in = ext
    else:
        fc_in = ext[:, :KH]
    if noisy and noise_target == "fc_input":
        fc_in = fc_in + uniform_noise(fc_in, noise_std, gen)
    out_final = None if final is None else (final if not (noisy and noise_target == "all_features") else ext[:, KH:])
    return fc_in, out_final
