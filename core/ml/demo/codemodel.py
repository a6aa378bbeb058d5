"""A tiny code model: a small Qwen3 target trained for about a minute on Python's own sources.

The demo campaign needs a target whose greedy continuations have structure a drafter can
learn (a random target's argmax is noise). Nothing may be downloaded, so the model is trained
here, on CPU, on real text that ships with every Python: the standard library's ``.py`` files::

    python -m core.ml.codemodel OUT_DIR [--seconds 60] [--vocab-size 2048] [--seed 0] [--max-files N]
                                        [--max-bytes B] [--max-steps N] [--threads N] [--force]

writes ``OUT_DIR`` as an ordinary transformers model directory (``config.json``,
``model.safetensors``, tokenizer files with a chat template, a greedy ``generation_config.json``)
plus ``OUT_DIR/codemodel.json`` (corpus stats, loss curve, validation loss, sample
continuations, provenance). It loads with :func:`core.ml.models.target.load_target` and with
``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``. A second run with the same
settings finds the finished directory and exits at once (``--force`` retrains).

Choices, and why (measured on a 2-core CPU; "steps" are AdamW steps of 8 x 128 tokens):

* **Corpus.** ``sysconfig.get_paths()["stdlib"]``, without test suites, ``site-packages``,
  ``encodings`` (mostly code-page tables) and files over :data:`MAX_FILE_BYTES`. Files are
  ordered by a hash of their relative path (deterministic, but spread over the whole library,
  so a byte cap keeps a mix of modules rather than the alphabetically first ones) and taken
  up to ``--max-bytes`` (default 4 MB, ~1.2 M tokens: a minute of training sees a fifth) and
  ``--max-files``. Every :data:`VAL_EVERY`-th file is held out for the validation loss. The
  corpus depends on the interpreter version, which is recorded.
* **Chat examples.** Demo prompts go through the chat template ("Write a Python function
  fizzbuzz(n)" as a user turn). A model that never saw ``<|im_start|>`` answers such a prompt
  from untrained embeddings, so half of each batch (:data:`CHAT_FRACTION`) comes from
  chat-formatted examples built with :mod:`ast` from the same training files: user "Write a
  Python function name(args)" (or "Implement name(args) in Python.", or with the docstring's
  first line), assistant = that function's source (:data:`CHAT_CHARS` long), then
  ``<|im_end|>``. The model learns to answer with a ``def`` and to stop; the validation
  chat loss is reported next to the plain-code one. (Answers keep their docstrings: code-only
  answers made the samples loop more. Short functions give several examples per window.)
* **Tokenizer.** ByteLevel BPE trained offline with ``tokenizers`` on the training files,
  2048 tokens by default (3.2 bytes per token on this corpus, vs 2.7 at 1024; in our runs the
  greedy samples repeated themselves less at 2048 for the same number of steps). The pre-tokenizer
  split is GPT-2's with ``_`` counted as a letter (:data:`SPLIT_PATTERN`), so identifiers
  such as ``__init__`` can become single tokens. Byte-level, hence lossless:
  ``decode(encode(x)) == x`` for any text. Special tokens as in :mod:`core.ml.tiny`:
  ``<|endoftext|>`` 0 (pad, document separator), ``<|im_start|>`` 1, ``<|im_end|>`` 2 (eos),
  ``<|MASK|>`` 3 (the DFlash drafter's mask token), and the same ChatML-like template.
* **Model.** ``Qwen3ForCausalLM`` (:data:`MODEL_SHAPE`): hidden 96, 4 layers, 4 query / 2 KV
  heads of 24, MLP 288, RoPE theta 10k, untied input and output embeddings (like the large
  Qwen3 targets; ``lm_head.weight`` is a tensor of its own in the safetensors file; tied was
  also worse here), 0.84 M parameters at vocab 2048. Four layers leave DFlash distinct
  feature taps (e.g. layers 0 and 2). For the same CPU time, hidden 96 for ~850 steps beat
  hidden 128 for ~600 steps and hidden 64 for ~1200 (validation loss and samples).
* **Training.** AdamW (peak 3e-3, betas 0.9/0.95, weight decay 0.1 on matrices), random
  windows (:data:`BATCH_SIZE` x :data:`SEQ_LEN`), gradient clipping at 1. The budget is wall
  time (``--seconds``), so the learning rate follows elapsed time: linear warm-up over the
  first 5 %, then cosine decay to 10 % (``--max-steps`` switches it to steps: deterministic,
  and without ``--seconds`` no wall-time limit applies). Windows and initialisation depend
  only on ``--seed``; under a time budget the number of steps depends on the machine: 250 to
  650 in 60 s on 2-core machines, more when idle. The demo uses ``--max-steps``: a model
  trained by time behaves differently on each machine, and early in training its answers'
  lengths swing (measured on the demo's 32 training prompts, answers of 16+ tokens after 30,
  60, 120, 180, 300, 600, 1000 steps: 32, 11, 23, 32, 30, 32, 32).
  Quality follows steps: after ~500 the samples look like Python but can fall into loops
  (``'s', 's', 's'``), after ~1000 they mostly end with ``<|im_end|>`` by themselves.
  Intra-op threads are tuned while training (:class:`ThreadTuner`) because two threads on
  a busy 2-core machine are several times slower than one.
* **Saving.** Everything is written to a temp directory beside ``OUT_DIR`` and renamed into
  place, so ``OUT_DIR`` is either absent, the previous model, or the complete new one. The
  reuse key (:meth:`Settings.key`) holds the CLI settings, the recipe constants and the
  Python version (the corpus).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import math
import os
import shutil
import sys
import sysconfig
import textwrap
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from core.ml.formats import bounds
from core.ml.formats.runio import UsageError, atomic_write_json, check_flags, emit, provenance, read_json, run_main, say
from core.ml.demo.tiny import CHAT_TEMPLATE, SPECIALS

FORMAT = "specdeck-codemodel-v1"
"""Version of the ``codemodel.json`` layout and of the recipe (part of the reuse key)."""

DEFAULT_SECONDS = 60.0
DEFAULT_VOCAB = 2048
DEFAULT_MAX_BYTES = 4_000_000
"""Corpus cap (training + validation files): ~1.2 M tokens at vocab 2048."""

MAX_FILE_BYTES = 160_000
"""Larger stdlib files are mostly data (``pydoc_data/topics.py``, tables) or outliers."""

SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings"})
VAL_EVERY = 20
"""Every 20th selected file (in hash order) is held out for validation (5 %)."""

SEQ_LEN = 128
BATCH_SIZE = 8
PEAK_LR = 3e-3
CHAT_FRACTION = 0.5
"""Share of training windows drawn from the chat-formatted function examples."""

MODEL_SHAPE = {"hidden_size": 96, "intermediate_size": 288, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 24, "tie_word_embeddings": False}
"""The Qwen3 sizes (see the module docstring); the vocabulary comes from ``--vocab-size``."""

CHAT_CHARS = (80, 600)
"""Functions of this many characters (dedented source) become chat examples."""

VAL_WINDOWS = 32
SAMPLE_PROMPTS = (
    "Write a Python function fizzbuzz(n)",
    "Write a Python function is_prime(n) that returns True if n is a prime number.",
)
SAMPLE_TOKENS = 64
MIN_DISTINCT = 0.3
"""A sample of 16+ tokens with fewer distinct tokens than this is reported as degenerate."""
EOS, PAD = "<|im_end|>", "<|endoftext|>"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json", "codemodel.json")


# ----------------------------------------------------------------------------- corpus


@dataclass
class Corpus:
    """Python source files from the standard library, split into training and validation.

    Attributes:
        root: the stdlib directory the files were read from.
        train: ``(relative path, text)`` of the training files.
        val: ``(relative path, text)`` of the held-out files.
        skipped: counts of files left out, by reason.
    """

    root: Path
    train: list[tuple[str, str]] = field(default_factory=list)
    val: list[tuple[str, str]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    def stats(self) -> dict[str, Any]:
        """File and byte counts, plus a digest of the selected files (identifies the corpus)."""
        digest = hashlib.sha256()
        for rel, text in self.train + self.val:
            digest.update(rel.encode() + b"\0" + text.encode("utf-8", "surrogatepass") + b"\0")
        return {
            "stdlib": str(self.root),
            "python": sys.version.split()[0],
            "train_files": len(self.train),
            "val_files": len(self.val),
            "train_bytes": sum(len(t.encode("utf-8", "surrogatepass")) for _, t in self.train),
            "val_bytes": sum(len(t.encode("utf-8", "surrogatepass")) for _, t in self.val),
            "val_paths": [rel for rel, _ in self.val],
            "skipped": dict(self.skipped),
            "sha256": digest.hexdigest(),
        }


def stdlib_dir() -> Path:
    """The running interpreter's standard library directory.

    Raises:
        UsageError: when it cannot be found (e.g. a zipped stdlib).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if not (root / "os.py").is_file():
        raise UsageError(f"standard library sources not found at {root} (is it zipped or stripped?)")
    return root


def collect_corpus(max_bytes: int = DEFAULT_MAX_BYTES, max_files: int | None = None,
                   root: Path | None = None) -> Corpus:
    """Read stdlib ``.py`` files in a deterministic, library-wide order.

    Args:
        max_bytes: stop adding files once this many bytes are selected.
        max_files: stop after this many files (None: no limit).
        root: the directory to read (default :func:`stdlib_dir`).

    Returns:
        A :class:`Corpus`; every :data:`VAL_EVERY`-th selected file (starting with the first)
        is held out, so there is at least one validation file.

    Raises:
        UsageError: fewer than two usable files.
    """
    root = root or stdlib_dir()
    candidates: list[tuple[str, Path]] = []
    skipped = {"test_or_data_dirs": 0, "empty": 0, "too_large": 0, "not_utf8": 0}
    for dirpath, dirnames, filenames in os.walk(root):
        kept = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("test"))
        skipped["test_or_data_dirs"] += len(dirnames) - len(kept)
        dirnames[:] = kept
        for name in filenames:
            if name.endswith(".py") and not name.startswith("test_"):
                path = Path(dirpath) / name
                candidates.append((path.relative_to(root).as_posix(), path))
    # Hash order: deterministic for a given stdlib, yet spread over all packages.
    candidates.sort(key=lambda c: hashlib.sha256(c[0].encode()).hexdigest())
    corpus = Corpus(root=root, skipped=skipped)
    total = 0
    for rel, path in candidates:
        if (max_files is not None and len(corpus.train) + len(corpus.val) >= max_files) or total >= max_bytes:
            break
        size = path.stat().st_size
        if size == 0 or size > MAX_FILE_BYTES:
            skipped["empty" if size == 0 else "too_large"] += 1
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            skipped["not_utf8"] += 1
            continue
        n = len(corpus.train) + len(corpus.val)
        (corpus.val if n % VAL_EVERY == 0 else corpus.train).append((rel, text))
        total += size
    if not corpus.train or not corpus.val:
        raise UsageError(f"too few usable .py files under {root} (need at least 2, check --max-files)")
    return corpus


def chat_examples(files: Iterable[tuple[str, str]], min_chars: int = CHAT_CHARS[0],
                  max_chars: int = CHAT_CHARS[1]) -> list[list[dict[str, str]]]:
    """Chat conversations "write function X" -> X's source, from module- and class-level functions.

    Args:
        files: ``(relative path, source)`` pairs.
        min_chars / max_chars: keep functions whose dedented source has this many characters.

    Returns:
        Conversations (lists of ``{"role", "content"}``), in file order. Private functions
        (leading underscore) and files that do not parse are skipped. The prompt wording is
        picked from the function name's hash, so it is deterministic.
    """
    out: list[list[dict[str, str]]] = []
    for _, source in files:
        try:
            with warnings.catch_warnings():  # e.g. invalid escape sequences in old modules
                warnings.simplefilter("ignore")
                tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines(keepends=True)  # (ast.get_source_segment re-splits per call: quadratic)
        nodes = list(tree.body)
        nodes += [n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body]
        for node in nodes:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            first = lines[node.lineno - 1]
            if first[:node.col_offset].strip() or node.end_lineno is None:
                continue  # e.g. "class A: def f(): ..." on one line
            code = textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno])).rstrip()
            if not min_chars <= len(code) <= max_chars:
                continue
            args = ast.unparse(node.args)
            doc = (ast.get_docstring(node) or "").strip().split("\n")[0].strip()
            pick = int(hashlib.sha256(node.name.encode()).hexdigest(), 16) % 3
            if pick == 0 and doc:
                prompt = f"Write a Python function {node.name}({args}). {doc}"
            elif pick == 1:
                prompt = f"Implement {node.name}({args}) in Python."
            else:
                prompt = f"Write a Python function {node.name}({args})"
            out.append([{"role": "user", "content": prompt}, {"role": "assistant", "content": code}])
    return out


# ----------------------------------------------------------------------------- tokenizer

SPLIT_PATTERN = r" ?[\p{L}_][\p{L}\p{N}_]*| ?\p{N}+| ?[^\s\p{L}\p{N}_]+|\s+(?!\S)|\s+"
"""GPT-2's pre-tokenizer split with ``_`` counted as a letter, so BPE can learn whole Python
identifiers (``__init__``, ``_name``, ``kwargs``) instead of word / ``_`` / word pieces."""


def train_tokenizer(texts: Sequence[str], vocab_size: int = DEFAULT_VOCAB) -> Any:
    """Train a ByteLevel BPE tokenizer on ``texts`` and wrap it for transformers.

    Args:
        texts: training documents (the stdlib training files).
        vocab_size: target vocabulary size, special tokens included (the trainer may stop
            earlier on a small corpus).

    Returns:
        A ``PreTrainedTokenizerFast`` with the chat template, eos ``<|im_end|>`` (id 2) and pad
        ``<|endoftext|>`` (id 0); no BOS, no automatic special tokens, no space clean-up, so
        decoding inverts encoding exactly.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=None, chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False, model_max_length=2048,
    )


def token_stream(tokenizer: Any, docs: Sequence[str], sep_id: int) -> torch.Tensor:
    """Encode ``docs`` and concatenate them, each followed by ``sep_id``: -> [n_tokens] int64."""
    encs = tokenizer.backend_tokenizer.encode_batch(list(docs), add_special_tokens=False)
    ids: list[int] = []
    for enc in encs:
        ids.extend(enc.ids)
        ids.append(sep_id)
    return torch.tensor(ids, dtype=torch.long)


def render_chats(tokenizer: Any, chats: Sequence[list[dict[str, str]]]) -> list[str]:
    """Chat conversations as text through the tokenizer's own template (train = inference format)."""
    return [tokenizer.apply_chat_template(c, tokenize=False) for c in chats]


# ----------------------------------------------------------------------------- model


def code_model_config(vocab_size: int = DEFAULT_VOCAB, **overrides: Any) -> Any:
    """The tiny code model's ``Qwen3Config`` (see the module docstring for the sizes)."""
    from transformers import Qwen3Config

    fields: dict[str, Any] = dict(
        vocab_size=vocab_size, **MODEL_SHAPE, max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0}, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=SPECIALS.index(EOS), pad_token_id=SPECIALS.index(PAD),
        initializer_range=0.02,
    )
    fields.update(overrides)
    return Qwen3Config(**fields)


def build_code_model(vocab_size: int = DEFAULT_VOCAB, seed: int = 0, **overrides: Any) -> Any:
    """A freshly initialised float32 ``Qwen3ForCausalLM`` (SDPA attention, greedy generation config)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(seed)
    cfg = code_model_config(vocab_size, **overrides)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float()
    model.generation_config = GenerationConfig(
        do_sample=False, eos_token_id=SPECIALS.index(EOS), pad_token_id=SPECIALS.index(PAD), max_new_tokens=256,
    )
    return model


def sample_windows(stream: torch.Tensor, n: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` random windows of ``seq_len`` tokens from ``stream``: -> [n, seq_len]."""
    if stream.numel() <= seq_len:
        reps = seq_len // max(stream.numel(), 1) + 2
        stream = stream.repeat(reps)
    starts = torch.randint(0, stream.numel() - seq_len, (n,), generator=gen)
    return torch.stack([stream[s:s + seq_len] for s in starts.tolist()])


@torch.no_grad()
def eval_loss(model: Any, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean next-token cross-entropy (nats) of ``model`` over ``windows`` [n, S]."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch]
        logits = model(input_ids=x).logits[:, :-1]  # [b, S-1, V]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1), reduction="sum")
        total += float(ce)
        count += x[:, 1:].numel()
    model.train(was_training)
    return total / max(count, 1)


def lr_at(frac: float, peak: float = PEAK_LR, warmup: float = 0.05, floor: float = 0.1) -> float:
    """Learning rate at fraction ``frac`` of the budget: linear warm-up, then cosine to ``floor * peak``."""
    frac = min(max(frac, 0.0), 1.0)
    if frac < warmup:
        return peak * max(frac / warmup, 0.02)
    cos = 0.5 * (1 + math.cos(math.pi * (frac - warmup) / (1 - warmup)))
    return peak * (floor + (1 - floor) * cos)


class ThreadTuner:
    """Switches between 1 and N intra-op threads by measured step time while training.

    On an idle 2-core machine two threads train this model ~1.6x faster than one. When other
    processes hold the cores, two threads wait for each other at every one of the model's
    many small ops; measured here: single steps of 4-5 s instead of 0.1 s (``OMP_WAIT_POLICY=
    PASSIVE`` avoids that, but it must be set before torch is loaded). So training starts with
    one thread, which never stalls, and periodically tries the other setting for
    :attr:`probe_steps` steps: it keeps it if its median step is faster, and gives up at once
    when one step takes more than :attr:`abort_factor` times the current median. After a
    failed try the wait before the next one doubles (up to :attr:`max_hold_s`), so a busy
    machine pays for few slow steps. Only speed changes (float reduction order may differ in
    the last bits).

    Args:
        max_threads: the larger candidate (default: torch's current setting).
        probe_steps: steps timed per setting before comparing.
        hold_s: seconds between tries after a successful one.
        max_hold_s: the longest wait between tries.
        abort_factor: a try stops when one of its steps is this many times slower.
    """

    def __init__(self, max_threads: int | None = None, probe_steps: int = 4, hold_s: float = 10.0,
                 max_hold_s: float = 80.0, abort_factor: float = 2.0) -> None:
        self.many = max_threads or torch.get_num_threads()
        self.probe_steps, self.abort_factor = probe_steps, abort_factor
        self.hold_s, self.max_hold_s = hold_s, max_hold_s
        self.steps_with: dict[int, int] = {}
        """Steps run with each thread count."""
        self._recent: list[float] = []  # step times with the current setting
        self._probe: list[float] | None = None  # step times while trying the other setting
        self._baseline = 0.0
        self._hold, self._next_try = hold_s, 0.0
        torch.set_num_threads(1)

    def step_done(self, dt: float, now: float) -> None:
        """Record one step of ``dt`` seconds that ended at ``now`` (``time.perf_counter``)."""
        cur = torch.get_num_threads()
        self.steps_with[cur] = self.steps_with.get(cur, 0) + 1
        if self.many <= 1:
            return
        if self._probe is None:  # running steadily
            self._recent = (self._recent + [dt])[-self.probe_steps:]
            if now >= self._next_try and len(self._recent) == self.probe_steps:
                self._baseline, self._probe = _median(self._recent), []
                torch.set_num_threads(1 if cur > 1 else self.many)
            return
        self._probe.append(dt)
        too_slow = dt > self.abort_factor * self._baseline
        if not too_slow and len(self._probe) < self.probe_steps:
            return
        if not too_slow and _median(self._probe) < self._baseline:  # keep the new setting
            self._recent, self._hold = self._probe[-self.probe_steps:], self.hold_s
        else:  # go back, and wait longer before the next try
            torch.set_num_threads(1 if cur > 1 else self.many)
            self._recent, self._hold = [], min(2 * self._hold, self.max_hold_s)
        self._probe, self._next_try = None, now + self._hold


def _median(xs: Sequence[float]) -> float:
    return sorted(xs)[len(xs) // 2]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one intra-op thread (evaluation and token-by-token sampling of this
    tiny model are no faster with two, and far slower with two on a busy machine)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@dataclass
class TrainLog:
    """What training did: step count, losses and the loss curve (one point per progress line)."""

    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    curve: list[dict[str, float]] = field(default_factory=list)
    threads: dict[int, int] = field(default_factory=dict)
    """Steps run with each intra-op thread count (see :class:`ThreadTuner`)."""

    @property
    def initial_loss(self) -> float:
        """Loss of the first batch (before any update)."""
        return self.losses[0]

    @property
    def final_loss(self) -> float:
        """Mean training loss over the last 10 % of steps (at least the last 5)."""
        tail = self.losses[-max(5, len(self.losses) // 10):]
        return sum(tail) / len(tail)


def train(model: Any, code: torch.Tensor, chat: torch.Tensor, seconds: float, seed: int = 0,
          batch_size: int = BATCH_SIZE, seq_len: int = SEQ_LEN, peak_lr: float = PEAK_LR,
          chat_fraction: float = CHAT_FRACTION, min_steps: int = 5, max_steps: int | None = None,
          threads: int | None = None) -> TrainLog:
    """Train ``model`` in place on random windows for ``seconds`` of wall time.

    Args:
        model: the causal LM (float32, CPU).
        code: token stream of the training files.
        chat: token stream of the chat examples (may be empty).
        seconds: wall-time budget of the loop (at least ``min_steps`` steps run regardless).
        seed: seeds the window sampler.
        batch_size / seq_len: windows per step and tokens per window.
        peak_lr: learning rate after warm-up.
        chat_fraction: share of each batch's windows taken from ``chat``.
        min_steps: steps to run even if the budget is exhausted earlier.
        max_steps: stop after this many steps; the schedule then follows steps instead of
            time, which makes a run fully deterministic (for experiments and tests).
        threads: fixed intra-op thread count; None tunes it (:class:`ThreadTuner`).

    Returns:
        A :class:`TrainLog`. Progress lines (``task="codemodel"``, unit ``steps``, with the
        estimated total, tokens/s, ETA and the mean loss since the previous line) go to stdout
        about 30 times over the budget.
    """
    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=peak_lr, betas=(0.9, 0.95))
    n_chat = int(round(batch_size * chat_fraction)) if chat.numel() > seq_len else 0
    log = TrainLog()
    model.train()
    every = min(max(seconds / 30, 0.5), 5.0)
    saved_threads = torch.get_num_threads()  # restored on exit
    tuner = ThreadTuner() if threads is None else None
    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    next_emit, since, t_step = t0 + every, [], t0
    try:
        while True:
            elapsed = time.perf_counter() - t0
            if (elapsed >= seconds and log.steps >= min_steps) or (max_steps is not None and log.steps >= max_steps):
                break
            progress = log.steps / max_steps if max_steps else elapsed / seconds
            for g in opt.param_groups:
                g["lr"] = lr_at(progress, peak_lr)
            x = sample_windows(code, batch_size - n_chat, seq_len + 1, gen)  # [b, S+1]
            if n_chat:
                x = torch.cat([x, sample_windows(chat, n_chat, seq_len + 1, gen)])
            logits = model(input_ids=x[:, :-1]).logits  # [b, S, V]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            log.steps += 1
            log.tokens += x[:, 1:].numel()
            log.losses.append(float(loss.detach()))
            since.append(log.losses[-1])
            now = time.perf_counter()
            if tuner is not None:
                tuner.step_done(now - t_step, now)
            t_step = now
            last = (now - t0 >= seconds and log.steps >= min_steps) or (max_steps is not None and log.steps >= max_steps)
            if now >= next_emit or last:  # the last step always reports, so progress ends at done == total
                el = now - t0
                if max_steps:
                    est, eta = max_steps, (max_steps - log.steps) * el / log.steps
                else:
                    est, eta = max(log.steps, round(log.steps * seconds / el)), max(seconds - el, 0.0)
                mean = sum(since) / len(since)
                log.curve.append({"step": log.steps, "t": round(el, 2), "loss": round(mean, 4),
                                  "lr": round(opt.param_groups[0]["lr"], 6), "threads": torch.get_num_threads()})
                emit("progress", task="codemodel", done=log.steps, total=est, unit="steps",
                     tokens_per_s=round(log.tokens / el, 1), eta_s=round(eta, 1), loss=round(mean, 4))
                next_emit, since = now + every, []
    finally:
        if tuner is not None:
            log.threads = dict(tuner.steps_with)
        else:
            log.threads = {torch.get_num_threads(): log.steps}
        torch.set_num_threads(saved_threads)
    log.seconds = time.perf_counter() - t0
    model.eval()
    return log


# ----------------------------------------------------------------------------- samples


def distinct_ratio(tokens: Sequence[int]) -> float:
    """Distinct tokens / tokens (1.0 = no repeats; a model stuck on one token -> 1/len)."""
    return len(set(tokens)) / len(tokens) if tokens else 0.0


def greedy_samples(model: Any, tokenizer: Any, prompts: Sequence[str] = SAMPLE_PROMPTS,
                   max_new_tokens: int = SAMPLE_TOKENS) -> list[dict[str, Any]]:
    """Greedy continuations of chat-formatted ``prompts``, with their distinct-token ratio.

    Returns:
        One dict per prompt: ``prompt``, ``continuation`` (decoded text), ``tokens`` (count),
        ``distinct_ratio`` and ``stopped`` (ended on ``<|im_end|>``).
    """
    from core.ml.decoding.generate import greedy_generate

    eos = tokenizer.convert_tokens_to_ids(EOS)
    rows = []
    for text in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            res = greedy_generate(model, ids, max_new_tokens, stop_ids=[eos])
        toks = [t for t in res.tokens if t != eos]
        rows.append({"prompt": text, "continuation": tokenizer.decode(toks), "tokens": len(res.tokens),
                     "distinct_ratio": round(distinct_ratio(toks), 3), "stopped": bool(res.stopped)})
    return rows


# ----------------------------------------------------------------------------- directory


@dataclass(frozen=True)
class Settings:
    """What a model directory was built with; equal settings mean the directory can be reused."""

    seconds: float | None = DEFAULT_SECONDS
    """Training wall-time budget (None: none, ``max_steps`` alone ends training)."""
    vocab_size: int = DEFAULT_VOCAB
    """BPE vocabulary (special tokens included) and model vocabulary."""
    seed: int = 0
    """Seeds initialisation, window sampling and the validation windows."""
    max_files: int | None = None
    """Corpus cap in files (None: only ``max_bytes`` applies)."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """Corpus cap in bytes."""
    max_steps: int | None = None
    """Stop after this many steps (the schedule then follows steps: a deterministic run)."""

    def key(self) -> dict[str, Any]:
        """The reuse key stored in ``codemodel.json``: these fields plus the recipe constants."""
        seconds = None if self.seconds is None else float(self.seconds)
        return {"format": FORMAT, "seconds": seconds, "vocab_size": self.vocab_size, "seed": self.seed,
                "max_files": self.max_files, "max_bytes": self.max_bytes, "max_steps": self.max_steps,
                "batch_size": BATCH_SIZE, "seq_len": SEQ_LEN, "peak_lr": PEAK_LR, "chat_fraction": CHAT_FRACTION,
                "chat_chars": list(CHAT_CHARS), "model": MODEL_SHAPE, "python": sys.version.split()[0]}


def existing_model(out_dir: Path, settings: Settings) -> dict[str, Any] | None:
    """``codemodel.json`` of ``out_dir`` when the directory is complete and was built with ``settings``."""
    if not all((out_dir / f).is_file() for f in MODEL_FILES):
        return None
    try:
        meta = read_json(out_dir / "codemodel.json", "codemodel.json")
    except UsageError:
        return None
    return meta if isinstance(meta, dict) and meta.get("settings") == settings.key() else None


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    """Move ``tmp`` to ``out_dir``; an existing ``out_dir`` is moved aside first, then deleted."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@dataclass
class Data:
    """Tokenizer and token streams for one build (see :func:`prepare_data`)."""

    tokenizer: Any
    code: torch.Tensor
    """Training files, each followed by ``<|endoftext|>``: [n] int64."""
    chat: torch.Tensor
    """Chat examples from the training files, same layout."""
    val_code: torch.Tensor
    val_chat: torch.Tensor
    stats: dict[str, Any]
    """Corpus statistics for ``codemodel.json``."""


def prepare_data(settings: Settings) -> Data:
    """Collect the corpus, train the tokenizer and encode the code and chat streams."""
    t0 = time.perf_counter()
    corpus = collect_corpus(settings.max_bytes, settings.max_files)
    stats = corpus.stats()
    emit("info", task="codemodel", stage="corpus", files=stats["train_files"] + stats["val_files"],
         bytes=stats["train_bytes"] + stats["val_bytes"])
    train_texts = [t for _, t in corpus.train]
    tok = train_tokenizer(train_texts, settings.vocab_size)
    sep = SPECIALS.index(PAD)
    chats, val_chats = chat_examples(corpus.train), chat_examples(corpus.val)
    data = Data(tokenizer=tok, code=token_stream(tok, train_texts, sep),
                chat=token_stream(tok, render_chats(tok, chats), sep),
                val_code=token_stream(tok, [t for _, t in corpus.val], sep),
                val_chat=token_stream(tok, render_chats(tok, val_chats), sep), stats=stats)
    stats.update(train_tokens=data.code.numel(), val_tokens=data.val_code.numel(), chat_examples=len(chats),
                 chat_tokens=data.chat.numel(), val_chat_examples=len(val_chats),
                 bytes_per_token=round(stats["train_bytes"] / max(data.code.numel(), 1), 3))
    emit("info", task="codemodel", stage="tokenizer", vocab_size=len(tok), train_tokens=data.code.numel(),
         chat_examples=len(chats), bytes_per_token=stats["bytes_per_token"], seconds=round(time.perf_counter() - t0, 2))
    return data


def _r4(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def build_code_model_dir(out_dir: str | Path, settings: Settings = Settings(), force: bool = False,
                         argv: Sequence[str] | None = None,
                         threads: int | None = None) -> tuple[Path, dict[str, Any], bool]:
    """Build (or reuse) the tiny code model directory.

    Args:
        out_dir: the model directory to create.
        settings: corpus caps, vocabulary, seed and training budget.
        force: retrain even when ``out_dir`` already holds a model with these settings.
        argv: the command line, for provenance.
        threads: intra-op threads for training (None: tuned, see :class:`ThreadTuner`); speed
            only, so not part of the reuse key.

    Returns:
        ``(out_dir, metadata, reused)``: the directory, its ``codemodel.json`` content and
        whether an existing directory was reused.

    Raises:
        UsageError: ``out_dir`` is a file, or a non-empty directory without ``codemodel.json``
            (refused, so a typo cannot replace someone's files); too few stdlib files.
    """
    out_dir = Path(out_dir)
    if not force and (meta := existing_model(out_dir, settings)) is not None:
        return out_dir, meta, True
    if out_dir.exists():
        if not out_dir.is_dir() or (any(out_dir.iterdir()) and not (out_dir / "codemodel.json").exists()):
            raise UsageError(f"{out_dir} exists and is not a code model directory; remove it or choose another path")
        say(f"{out_dir}: rebuilding (forced, other settings, or incomplete)")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stdout is JSON lines, stderr is for our messages
    t_start = time.perf_counter()
    s = settings
    data = prepare_data(s)

    model = build_code_model(s.vocab_size, s.seed)
    gen = torch.Generator().manual_seed(s.seed + 1)
    val_windows = sample_windows(data.val_code, VAL_WINDOWS, SEQ_LEN, gen)
    val_chat_windows = sample_windows(data.val_chat, VAL_WINDOWS // 2, SEQ_LEN, gen) if data.val_chat.numel() else None
    with one_thread():
        initial_val = eval_loss(model, val_windows)
    budget = math.inf if s.seconds is None else s.seconds
    log = train(model, data.code, data.chat, budget, s.seed, max_steps=s.max_steps, threads=threads)
    with one_thread():
        val_loss = eval_loss(model, val_windows)
        val_chat_loss = eval_loss(model, val_chat_windows) if val_chat_windows is not None else None
        samples = greedy_samples(model, data.tokenizer)
    degenerate = [x["prompt"] for x in samples if x["tokens"] >= 16 and x["distinct_ratio"] < MIN_DISTINCT]
    if degenerate:
        say(f"warning: greedy samples repeat themselves (distinct-token ratio < {MIN_DISTINCT}) after {log.steps} "
            + ("steps; train longer (a larger --max-steps)" if s.seconds is None else
               f"steps; a slow or busy machine trains less in {s.seconds:g} s, try a larger --seconds "
               "(or --max-steps N: the same model on any machine)"))
    training = {
        "seconds": round(log.seconds, 2), "steps": log.steps, "batch_size": BATCH_SIZE, "seq_len": SEQ_LEN,
        "chat_fraction": CHAT_FRACTION, "peak_lr": PEAK_LR, "tokens_seen": log.tokens,
        "tokens_per_s": round(log.tokens / max(log.seconds, 1e-9), 1), "steps_per_thread_count": log.threads,
        "initial_train_loss": _r4(log.initial_loss), "final_train_loss": _r4(log.final_loss),
        "initial_val_loss": _r4(initial_val), "val_loss": _r4(val_loss), "val_chat_loss": _r4(val_chat_loss),
        "loss_curve": log.curve,
    }
    emit("metric", task="codemodel", **{k: v for k, v in training.items() if k != "loss_curve"},
         min_distinct_ratio=min(x["distinct_ratio"] for x in samples))

    cfg = model.config
    meta = {
        "format": FORMAT,
        "settings": s.key(),
        "corpus": data.stats,
        "tokenizer": {"type": "ByteLevel BPE", "vocab_size": len(data.tokenizer), "split_pattern": SPLIT_PATTERN,
                      "specials": {t: i for i, t in enumerate(SPECIALS)}, "eos_token": EOS, "pad_token": PAD,
                      "chat_template": CHAT_TEMPLATE},
        "model": {"architecture": "Qwen3ForCausalLM", "parameters": sum(p.numel() for p in model.parameters()),
                  "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
                  "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
                  "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
                  "intermediate_size": cfg.intermediate_size, "tie_word_embeddings": bool(cfg.tie_word_embeddings)},
        "training": training,
        "samples": samples,
        "samples_degenerate": bool(degenerate),
        "build_seconds": None,
        "provenance": provenance(argv, seed=s.seed, task="codemodel"),
    }

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        data.tokenizer.save_pretrained(tmp)
        meta["build_seconds"] = round(time.perf_counter() - t_start, 2)
        atomic_write_json(tmp / "codemodel.json", meta)
        _replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir, meta, False


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m core.ml.codemodel",
        description="train a tiny Qwen3 code model on the Python standard library (CPU, offline)")
    p.add_argument("out_dir", help="model directory to write (reused when it already holds these settings)")
    p.add_argument("--seconds", type=float, default=None,
                   help=f"training wall time (default {DEFAULT_SECONDS:g}, or no limit when --max-steps is given)")
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB,
                   help="BPE vocabulary incl. special tokens (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-files", type=int, default=None, help="use at most this many stdlib files")
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES,
                   help="corpus cap in bytes (default %(default)s)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="stop after this many steps; the LR schedule then follows steps, so the model is the "
                        "same on any machine (with --seconds too, whichever comes first)")
    p.add_argument("--threads", type=int, default=0,
                   help="training threads (default 0: switch between 1 and all by measured speed)")
    p.add_argument("--force", action="store_true", help="retrain even if OUT_DIR already holds this model")
    args = p.parse_args(argv)
    if args.seconds is not None and not args.seconds > 0:
        raise UsageError("--seconds must be > 0")
    if not 300 <= args.vocab_size <= 65536:
        raise UsageError("--vocab-size must be in 300..65536")
    if args.max_files is not None and args.max_files < 2:
        raise UsageError("--max-files must be >= 2 (one file is held out for validation)")
    if args.max_bytes < 10_000:
        raise UsageError("--max-bytes must be >= 10000")
    if args.threads < 0:
        raise UsageError("--threads must be >= 0")
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError("--max-steps must be >= 1")
    check_flags(args, seed=bounds.seed64, max_steps=bounds.int64, max_files=bounds.count)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    seconds = args.seconds if args.seconds is not None else (None if args.max_steps else DEFAULT_SECONDS)
    settings = Settings(seconds, args.vocab_size, args.seed, args.max_files, args.max_bytes, args.max_steps)
    full_argv = ["python", "-m", "core.ml.codemodel", *(sys.argv[1:] if argv is None else argv)]
    out, meta, reused = build_code_model_dir(args.out_dir, settings, args.force, full_argv, args.threads or None)
    if reused:
        say(f"{out}: a code model with these settings is already there, reusing it (--force retrains)")
    tr = meta["training"]
    emit("result", task="codemodel", path=str(out.resolve()), reused=reused, steps=tr["steps"],
         final_train_loss=tr["final_train_loss"], val_loss=tr["val_loss"], parameters=meta["model"]["parameters"],
         vocab_size=meta["tokenizer"]["vocab_size"])
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
