"""Tiny-model factories and device parametrisation for the ``core.ml`` tests.

Everything is built from config in code (``core.ml.tiny``); nothing is downloaded
(``HF_HUB_OFFLINE=1``). Every test under tests/ml gets the ``ml`` marker. Tests that take the
``device`` fixture run on CPU and, when CUDA is available, again on CUDA (``gpu`` marker);
otherwise the CUDA case is skipped with the reason stated.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.shared import build_once

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

try:  # the pure-Python tests (tau, compare) also run where torch is absent
    import torch  # one thread per process: OMP_NUM_THREADS from tests/tiers.py
except ImportError:  # pragma: no cover
    torch = None

CUDA = bool(torch is not None and torch.cuda.is_available())
NO_CUDA_REASON = "CUDA not available on this machine: the CUDA path (device placement, dtype) runs only where torch.cuda.is_available()"
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason=NO_CUDA_REASON)]),
]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.ml)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Run on CPU, and on CUDA when available (float32 everywhere unless a test says otherwise)."""
    return request.param


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module: thousands of tiny forwards run fastest so, and never spin
    on a loaded machine (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    if torch is None:  # pragma: no cover
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny():
    """The ``core.ml.tiny`` module (imports torch and transformers)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from core.ml.demo import tiny as mod

    return mod


@pytest.fixture(scope="session")
def qwen3_target(tiny):
    """Tiny random Qwen3 target (4 layers, H 64, vocab 320), float32 CPU."""
    return tiny.build_tiny_target("qwen3", seed=0)


@pytest.fixture(scope="session")
def qwen35_target(tiny):
    """Tiny random hybrid Qwen3.5 target (3 linear-attention layers + 1 full attention)."""
    return tiny.build_tiny_target("qwen3_5", seed=0)


@pytest.fixture(scope="session", params=["qwen3", "qwen3_5"])
def any_target(request, qwen3_target, qwen35_target):
    """Both tiny target architectures."""
    return qwen3_target if request.param == "qwen3" else qwen35_target


FIT_SEEDS = (100, 101, 102)  # the fitted drafters memorise these prompts' continuations


def _fit(tiny, target):
    cfg = tiny.tiny_drafter_config(target.config, block_size=8)
    d = tiny.build_tiny_drafter(cfg, seed=1, std=0.05)
    prompts = [tiny.fit_prompt(torch.Generator().manual_seed(s)) for s in FIT_SEEDS]
    return tiny.fit_tiny_drafter(d, target, steps=60, num_seqs=len(prompts), gen_tokens=48, seed=0, prompts=prompts)


def _fitted_once(tiny, target, name: str, tmp_path_factory):
    """``_fit`` once per test run (the first xdist worker to ask fits and saves it, float32,
    exactly; every other worker loads that folder): the fit is the costliest fixture here."""
    from core.ml.models.drafter import load_drafter, save_drafter

    folder = build_once(tmp_path_factory, f"fitted-drafter-{name}",
                        lambda out: save_drafter(_fit(tiny, target), out))
    return load_drafter(folder).eval()


@pytest.fixture(scope="session")
def fitted_drafter(tiny, qwen3_target, tmp_path_factory):
    """A tiny drafter (B = 8) fitted to the Qwen3 target on FIT_SEEDS prompts: partial acceptance."""
    return _fitted_once(tiny, qwen3_target, "qwen3", tmp_path_factory)


@pytest.fixture(scope="session")
def fitted_drafter35(tiny, qwen35_target, tmp_path_factory):
    """A tiny drafter (B = 8) fitted to the hybrid Qwen3.5 target on FIT_SEEDS prompts."""
    return _fitted_once(tiny, qwen35_target, "qwen3_5", tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_dirs(tiny, tmp_path_factory, qwen3_target, fitted_drafter):
    """On-disk tiny Qwen3 target (with tokenizer), the fitted drafter, and a prompts file with
    two text prompts and two input_ids prompts (FIT_SEEDS[:2], where tau > 1)."""
    import json

    from core.ml.models.drafter import save_drafter

    root = tmp_path_factory.mktemp("tiny")
    qwen3_target.save_pretrained(root / "target")
    tiny.tiny_tokenizer().save_pretrained(root / "target")
    save_drafter(fitted_drafter, root / "drafter")
    rows = [{"id": "t0", "prompt": tiny.CORPUS[0]}, {"id": "t1", "prompt": tiny.CORPUS[1]}]
    rows += [{"id": f"fit{s}", "input_ids": tiny.fit_prompt(torch.Generator().manual_seed(s))} for s in FIT_SEEDS[:2]]
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"root": root, "target": root / "target", "drafter": root / "drafter", "prompts": prompts}


@pytest.fixture(scope="session")
def make_prompt(tiny):
    """``make_prompt(seed, length=8)``: a deterministic random prompt of ordinary token ids."""

    def make(seed: int, length: int = 8) -> list[int]:
        return tiny.fit_prompt(torch.Generator().manual_seed(seed), length)

    return make


@pytest.fixture(scope="session")
def oracle():
    """The :class:`OracleProposer` class."""
    return OracleProposer


class OracleProposer:
    """Test proposer that knows the target's greedy sequence.

    At each draft slot the true token gets the top logit with probability ``p_correct``;
    otherwise it gets the second-highest (a random decoy is top), so chains break and a DDTree
    with enough budget can still find it. Exercises partial acceptance and cache rollback.
    """

    def __init__(self, sequence: list[int], vocab: int, p_correct: float = 1.0, seed: int = 0) -> None:
        self.seq, self.vocab, self.p, self.seed = sequence, vocab, p_correct, seed
        self.reset()

    def reset(self) -> None:
        self.gen = torch.Generator().manual_seed(self.seed)

    def propose(self, block, start, new_feats):
        n = len(block) - 1
        logits = torch.randn(n, self.vocab, generator=self.gen) * 0.1
        for k in range(1, n + 1):
            pos = start + k
            if pos >= len(self.seq):
                continue
            y = self.seq[pos]
            if torch.rand((), generator=self.gen).item() < self.p:
                logits[k - 1, y] = 10.0
            else:
                decoy = (y + 1 + int(torch.randint(self.vocab - 1, (), generator=self.gen))) % self.vocab
                logits[k - 1, decoy], logits[k - 1, y] = 10.0, 8.0
        return logits
