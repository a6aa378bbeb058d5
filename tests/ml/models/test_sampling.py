"""Sampled speculative decoding is lossless, as a distribution (docs/evaluation.md §2, "Sampling").

* one step: a draft drawn from q is accepted with probability sum_x min(p(x), q(x)) (the closed
  form), and the committed token (the draft, or the residual's correction) is distributed as p;
* whole sequences: on a tiny target with a vocabulary of 4, the sequences chain speculative
  decoding commits (prefill token, rejections, corrections, bonus tokens, shrinking last blocks)
  are distributed exactly as the target's own sampling, computed by enumerating every sequence;
  with drafters that differ from the target (peaked logits on the wrong tokens, and a DFlash-2
  drafter whose q is its selector's over 2 of the 4 tokens). A chi-square test decides, and the
  classic mistake (the correction drawn from p instead of the residual) fails the same test, so
  it has power;
* the same seed gives the same rounds and tokens; another seed other ones.
"""

from __future__ import annotations

import math
from collections import Counter
from statistics import NormalDist

import pytest

torch = pytest.importorskip("torch")

from core.ml.models import sampling_torch as sampler
from core.ml.decoding.generate import DFlashProposer, chain_generate  # noqa: E402
from core.ml.models.sampling import Sampling, sample_seed  # noqa: E402
from core.ml.models.target import TargetRunner  # noqa: E402

V, B, N_NEW = 4, 3, 4
PROMPT = [1, 2, 0]
SAMPLING = Sampling(0.8, top_p=1.0, top_k=3)
pytestmark = pytest.mark.usefixtures("one_thread")


def chi2_p(observed: dict, expected: dict, n: int) -> float:
    """Chi-square goodness of fit of ``observed`` counts against ``expected`` probabilities (cells
    expected under 5 pooled into one), p-value by the Wilson-Hilferty normal approximation."""
    big = [c for c in expected if expected[c] * n >= 5]
    small = [c for c in expected if expected[c] * n < 5]
    stat = sum((observed.get(c, 0) - n * expected[c]) ** 2 / (n * expected[c]) for c in big)
    cells = len(big)
    if small:
        e = n * sum(expected[c] for c in small)
        o = sum(observed.get(c, 0) for c in small)
        stat += (o - e) ** 2 / e if e > 0 else 0.0
        cells += 1
    k = cells - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 1 - NormalDist().cdf(z)


# -- one step ------------------------------------------------------------------------------
@pytest.mark.parametrize("setting", [Sampling(1.0), Sampling(0.7, top_p=0.8), Sampling(1.3, top_k=4)])
def test_one_step_acceptance_is_the_closed_form_and_the_token_is_distributed_as_p(setting):
    g = torch.Generator().manual_seed(3)
    p = sampler.probs(torch.randn(2, 6, generator=g), setting)  # p[0]: at the draft's slot, p[1]: after it
    q = sampler.probs(torch.randn(1, 6, generator=g), Sampling(1.0))  # a drafter unlike the target
    want = sampler.acceptance_probability(p[0], q[0])
    assert 0.2 < want < 0.9  # neither almost always nor almost never: the test can see a wrong rate
    gen = sampler.generator(1)
    n, accepted, tokens = 10000, 0, Counter()
    for _ in range(n):
        x = int(sampler.draw(q[0], gen))
        n_acc, nxt = sampler.accept([x], q, p, gen)
        accepted += n_acc
        tokens[x if n_acc else nxt] += 1
    rate, sd = accepted / n, math.sqrt(want * (1 - want) / n)
    assert abs(rate - want) < 4 * sd, f"acceptance {rate:.4f}, closed form {want:.4f}"
    expected = {t: float(p[0, t]) for t in range(6) if float(p[0, t]) > 0}
    assert set(tokens) <= set(expected), "a token the target's filter removed was committed"
    assert chi2_p(tokens, expected, n) > 1e-3


def test_filters_keep_what_the_reference_keeps():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    assert (sampler.probs(logits, Sampling(1.0, top_k=2))[0, 2:] == 0).all()
    p = sampler.probs(logits, Sampling(1.0, top_p=0.7))  # softmax: 0.64, 0.23, ...: two tokens reach 0.7
    assert (p[0, :2] > 0).all() and (p[0, 2:] == 0).all() and torch.isclose(p.sum(), torch.tensor(1.0))
    assert (sampler.probs(logits, Sampling(1.0, top_p=0.5))[0, 1:] == 0).all()  # the first alone reaches it
    assert Sampling(0.0, top_p=0.9).problem() and Sampling(-1.0).problem() and Sampling(1.0, top_p=0).problem()
    assert Sampling(0.7, 0.9, 20).problem() is None


# -- whole sequences ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_target(tiny):
    """A tiny Qwen3 with a vocabulary of 4 (2 layers), logits spread enough that every sequence counts."""
    return tiny.build_tiny_target("qwen3", seed=3, vocab_size=V, num_hidden_layers=2, initializer_range=0.15,
                                  eos_token_id=None, pad_token_id=None)


def target_distribution(target, sampling: Sampling) -> dict[tuple[int, ...], float]:
    """Every N_NEW-token continuation of PROMPT and its probability under the target's own sampling."""
    out = {(): 1.0}
    with torch.no_grad():
        for _ in range(N_NEW):
            prefixes = list(out)
            ids = torch.tensor([PROMPT + list(s) for s in prefixes])
            dist = sampler.probs(target(ids).logits[:, -1], sampling)
            out = {s + (t,): out[s] * float(dist[i, t]) for i, s in enumerate(prefixes) for t in range(V)
                   if float(dist[i, t]) > 0}
    return out


class WrongDrafter:
    """Proposes peaked logits on a token that depends on the position only: a q unlike the target's p."""

    def reset(self) -> None:
        pass

    def propose(self, block, start, new_feats):
        logits = torch.zeros(len(block) - 1, V)
        for j in range(len(block) - 1):
            logits[j, (start + j) % V] = 2.5
        return logits


@pytest.fixture(scope="module")
def dflash2(tiny, small_target):
    """A DFlash-2 drafter on the small target: its selector draws among 2 of the 4 tokens."""
    cfg = tiny.tiny_drafter_config(small_target.config, block_size=B, target_layer_ids=(0, 1), mask_token_id=3)
    return tiny.dflash2_from(tiny.build_tiny_drafter(cfg, seed=2, std=0.3), rank=4, top_k=2, seed=5, codebook_std=1.0)


def generate_many(target, proposer, layer_ids, n: int) -> Counter:
    runner = TargetRunner(target, layer_ids)
    seen = Counter()
    for seed in range(n):
        r = chain_generate(proposer, runner, PROMPT, N_NEW, B, 3, (), SAMPLING, seed)
        assert sum(r.rounds) == N_NEW - 1 and len(r.tokens) == N_NEW
        seen[tuple(r.tokens)] += 1
    return seen


@pytest.mark.parametrize("drafter", ["wrong-logits", "dflash2"])
def test_sequences_are_distributed_as_the_targets_own_sampling(small_target, dflash2, drafter, monkeypatch):
    want = target_distribution(small_target, SAMPLING)
    assert len(want) == 3 ** N_NEW  # top_k 3 of 4: every sequence of kept tokens, and only those
    if drafter == "dflash2":
        proposer, taps = DFlashProposer(dflash2, small_target), dflash2.target_layer_ids
    else:
        proposer, taps = WrongDrafter(), None
    n = 1200
    seen = generate_many(small_target, proposer, taps, n)
    assert set(seen) <= set(want), "a sequence the target's own sampling cannot produce"
    assert chi2_p(seen, want, n) > 1e-3
    if drafter == "wrong-logits":  # the test has power: drawing the correction from p is caught
        monkeypatch.setattr(sampler, "residual", lambda p, q: p)
        assert chi2_p(generate_many(small_target, proposer, taps, n // 2), want, n // 2) < 1e-3


def test_the_dflash2_q_is_the_selectors_and_differs_from_its_logits(small_target, dflash2):
    """The selector draws among its candidates: q is 0 outside them, and it is not the tempered logits."""
    runner = TargetRunner(small_target, dflash2.target_layer_ids)
    _, feats = runner.prefill(PROMPT)
    prop = DFlashProposer(dflash2, small_target)
    tokens, q = prop.sample([1, 3, 3], len(PROMPT), feats, SAMPLING, sampler.generator(0))
    assert q.shape == (B - 1, V) and torch.allclose(q.sum(-1), torch.ones(B - 1))
    assert ((q > 0).sum(-1) <= 2).all() and all(q[j, t] > 0 for j, t in enumerate(tokens))
    prop.reset()
    logits = prop.propose([1, 3, 3], len(PROMPT), feats)
    assert not torch.allclose(q, sampler.probs(logits, SAMPLING), atol=1e-3)
    runner.close()


# -- seeds ----------------------------------------------------------------------------------
def test_the_same_seed_gives_the_same_rounds(qwen3_target, fitted_drafter, make_prompt):
    runner = TargetRunner(qwen3_target, fitted_drafter.target_layer_ids)
    proposer = DFlashProposer(fitted_drafter, qwen3_target)
    prompt, setting = make_prompt(100), Sampling(0.7, top_p=0.95)

    def run(seed):
        r = chain_generate(proposer, runner, prompt, 32, 8, 3, (), setting, seed)
        return r.rounds, r.tokens

    first = run(11)
    assert run(11) == first
    others = [run(s) for s in (12, 13, 14)]
    assert any(o[1] != first[1] for o in others)  # the seed matters: sampled, not greedy
    assert max(r for o in [first, *others] for r in o[0]) > 1  # drafts are accepted at T 0.7
    greedy = chain_generate(proposer, runner, prompt, 32, 8, 3)
    assert chain_generate(proposer, runner, prompt, 32, 8, 3, (), Sampling(0.0), 99).tokens == greedy.tokens


def test_seeds_differ_per_prompt_and_sample():
    seeds = {sample_seed(0, pid, k) for pid in ("a", "b") for k in range(3)}
    assert len(seeds) == 6 and all(0 <= s < 2 ** 63 for s in seeds)
    assert sample_seed(0, "a", 1) == sample_seed(0, "a", 1) != sample_seed(1, "a", 1)


# -- python -m core.ml.eval ------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("sampled-eval")
    target, drafter = tiny.make_tiny_pair(root, fit_steps=0)
    return target, drafter, tiny.write_tiny_prompts(root / "prompts.jsonl", n_text=2)


def run_eval(pair, out, *args):
    from core.ml.tasks.eval import main
    from core.ml.formats.runio import run_main

    target, drafter, prompts = pair
    return run_main(main, ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
                           "--out", str(out), "--max-new-tokens", "8", *args])


def test_a_sampled_eval_records_its_settings_and_each_rows_seed(pair, tmp_path):
    import json

    assert run_eval(pair, tmp_path / "a.json", "--temperature", "0.7", "--top-k", "50", "--samples", "2",
                    "--seed", "4") == 0
    res = json.loads((tmp_path / "a.json").read_text())
    assert (res["temperature"], res["top_p"], res["top_k"], res["seed"], res["samples"]) == (0.7, 1.0, 50, 4, 2)
    assert "min(1, p/q)" in res["definition"]
    assert (res["num_prompts"], res["num_generations"]) == (len(res["per_prompt"]) // 2, len(res["per_prompt"]))
    rows = res["per_prompt"]
    ids = list(dict.fromkeys(r["id"] for r in rows))
    assert [(r["id"], r["sample"]) for r in rows] == [(i, k) for k in range(2) for i in ids]
    assert all(r["seed"] == sample_seed(4, r["id"], r["sample"]) for r in rows)
    assert run_eval(pair, tmp_path / "b.json", "--temperature", "0.7", "--top-k", "50", "--samples", "2",
                    "--seed", "4") == 0
    again = json.loads((tmp_path / "b.json").read_text())["per_prompt"]
    assert [(r["rounds"], r["tokens"]) for r in again] == [(r["rounds"], r["tokens"]) for r in rows]
    assert run_eval(pair, tmp_path / "g.json") == 0
    greedy = json.loads((tmp_path / "g.json").read_text())
    assert (greedy["temperature"], greedy["samples"]) == (0.0, 1)
    assert all(r["sample"] == 0 and r["seed"] is None for r in greedy["per_prompt"])
    assert [r["tokens"] for r in greedy["per_prompt"]] != [r["tokens"] for r in rows[:len(ids)]]


@pytest.mark.parametrize("case", ["tree", "offline", "greedy-samples", "greedy-top-p", "top-p-range", "negative-t"])
def test_what_sampling_refuses_exits_2_before_loading(pair, tmp_path, capsys, case):
    args = {"tree": ["--temperature", "0.7", "--tree-budget", "4"],
            "offline": ["--temperature", "0.7", "--mode", "offline", "--cache", str(tmp_path)],
            "greedy-samples": ["--samples", "3"], "greedy-top-p": ["--top-p", "0.9"],
            "top-p-range": ["--temperature", "1", "--top-p", "1.5"], "negative-t": ["--temperature", "-0.1"]}[case]
    assert run_eval(pair, tmp_path / "r.json", *args) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: --") and not (tmp_path / "r.json").exists()
    if case == "tree":
        assert "DDTree" in err and "lossless" in err
    if case == "offline":
        assert "--mode online" in err
