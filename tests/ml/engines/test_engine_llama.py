"""The llama.cpp engine leg, measured (issue 32 §3): ``python -m core.ml.eval --engine llama.cpp``.

A real ``llama-server`` (built by scripts/bootstrap --test through scripts/build-llama-server, the
llama.cpp vendored in llama-cpp-python 0.3.36) serves a tiny Qwen3 target and a drafter fitted
by specdeck, float32, converted by the engine's own converter. On the same prompts:

* a full-attention drafter: specdeck in process and the engine give the same tokens and the
  same acceptance in every round; the trace, ``timings`` and ``/metrics`` agree (the driver
  refuses otherwise) and ``compare`` calls the pair equal;
* a sliding-window drafter with no causal key: llama.cpp runs its sliding layer non-causal, so
  specdeck under llama.cpp's rule (``--engine-rule llama.cpp``) equals the engine round for
  round, specdeck's own rule does not, and the lint names the causality rule as the cause;
* at every max_new_tokens 1..40 (one server, many requests) specdeck under llama.cpp's rule,
  whose end of generation is the server's (a full block, the draft cut to the tokens left - 1),
  equals the engine round for round; the reference's end (the last blocks shrunk) does not
  always;
* no llama-server outlives its eval, and bad engine input exits 2 with nothing written.

Skipped only where no binary is built (CI builds it).
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")

from core.ml.tasks import eval as eval_mod
from core.ml.measure.compare import compare_results  # noqa: E402
from core.ml.engines.lint import lint  # noqa: E402
from core.ml.engines.llama import committed_rounds, find_binary, mrope_sections, server_processes  # noqa: E402
from core.ml.formats.runio import run_main  # noqa: E402

BINARY = find_binary()
needs_server = [pytest.mark.engine, pytest.mark.slow, pytest.mark.skipif(
    BINARY is None or not BINARY.is_file(),
    reason="no llama-server built: scripts/bootstrap --test builds it with scripts/build-llama-server "
           "(~7 min, into ~/.cache/specdeck/llama.cpp); CI has it")]
MAX_NEW = 40


SHARP = {"initializer_range": 0.2, "eos_token_id": [0, 2]}
"""The tiny target's settings for parity: logits far from ties (at the default 0.02 a random target's
argmax flips on float noise between torch and ggml), and the EOS set llama.cpp reads from its
vocabulary (<|endoftext|> and <|im_end|>), so both sides stop at the same ids."""


def _pair(tiny, root, arch="qwen3", **kw):
    """A tiny target and a drafter fitted to it by specdeck (B = 8), and 4 prompts."""
    target, drafter = tiny.make_tiny_pair(root, arch, seed=0, block_size=8, fit_steps=80, target_overrides=SHARP,
                                          **kw)
    return target, drafter, tiny.write_tiny_prompts(root / "prompts.jsonl", n_text=3)


def _eval(target, drafter, prompts, out, *extra) -> dict:
    if "--engine" in extra:  # named: the tests' HOME is a temporary one, without the build cache
        extra = (*extra, "--engine-bin", str(BINARY))
    argv = ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts), "--out", str(out),
            "--max-new-tokens", str(MAX_NEW), "--dtype", "float32", *extra]
    assert run_main(eval_mod.main, argv) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def fitted(tiny, tmp_path_factory):
    """The tiny target, the full-attention drafter fitted to it, and the prompts (built once)."""
    return _pair(tiny, tmp_path_factory.mktemp("engine-full"))


@pytest.fixture(scope="module")
def full(fitted):
    target, drafter, prompts = fitted
    root = target.parent
    before = set(server_processes(BINARY))
    eng = _eval(target, drafter, prompts, root / "engine/result.json", "--engine", "llama.cpp")
    return {"own": _eval(target, drafter, prompts, root / "own/result.json"), "engine": eng,
            "left": set(server_processes(BINARY)) - before}


def _rounds(res):
    return {p["id"]: p["rounds"] for p in res["per_prompt"]}


def _tokens(res):
    return {p["id"]: p["tokens"] for p in res["per_prompt"]}


def test_committed_rounds_count_the_engine_answer_as_specdeck_counts_its_own():
    # first token from the prefill; rounds of a+1 capped at max_new and cut after a stop token
    assert committed_rounds([5, 6, 7, 8, 9, 10], [3, 2], 4, []) == ([5, 6, 7, 8], [3], False)
    assert committed_rounds([5, 6, 7, 8, 9, 10], [3, 2], 6, []) == ([5, 6, 7, 8, 9, 10], [3, 2], False)
    assert committed_rounds([5, 6, 2, 8, 9], [4], 9, [2]) == ([5, 6, 2], [2], True)
    assert committed_rounds([5, 6, 7], [], 3, []) == ([5, 6, 7], [1, 1], False)  # past the drafts: one a step
    assert committed_rounds([2, 6], [1], 5, [2]) == ([2], [], True)


@pytest.mark.usefixtures("tiny")
class TestEngine:
    pytestmark = needs_server

    def test_full_attention_drafter_tokens_and_every_round_equal_in_process_and_engine(self, full):
        own, eng = full["own"], full["engine"]
        assert _tokens(eng) == _tokens(own)
        assert _rounds(eng) == _rounds(own)
        assert eng["tau"] == own["tau"] and eng["num_rounds"] == own["num_rounds"] > len(own["per_prompt"])
        assert any(r > 1 for rounds in _rounds(eng).values() for r in rounds), "no draft was ever accepted"
        # per request: the raw trace rounds agree with timings and the /metrics deltas (the driver checks it too)
        for p in eng["per_prompt"]:
            raw = p["engine"]
            assert sum(r - 1 for r in raw["rounds"]) == raw["draft_n_accepted"] == \
                raw["metrics_delta"]["spec_decode_num_accepted_tokens_total"]
            # asked for exactly max_new_tokens, the engine's rounds are the result's; a last token it
            # decoded alone (one left: no draft, no trace line) is a round of 1 in the result
            assert (p["rounds"][:len(raw["rounds"])] == raw["rounds"]
                    and p["rounds"][len(raw["rounds"]):] in ([], [1])) or p["stopped"]
        cmp = compare_results(eng, own, allow_mismatch=True)
        assert cmp["sides"]["ours"].startswith("llama.cpp@") and cmp["sides"]["baseline"] == "specdeck"
        assert cmp["parity"]["equal"] and cmp["overall"]["delta"] == 0

    def test_engine_provenance_names_revision_binary_and_both_eos_sets(self, full):
        e = full["engine"]["engine"]
        # asked for exactly max_new_tokens: the engine's own end of generation was measured
        assert {p["engine"]["n_predict"] for p in full["engine"]["per_prompt"]} == {MAX_NEW}
        assert full["engine"]["end_of_generation"] == "full-block" and full["own"]["end_of_generation"] == "shrink"
        assert e["name"] == "llama.cpp" and e["revision"].startswith("0c1e570")
        assert len(e["binary_sha256"]) == 64 and e["spec_draft_n_max"] == 7
        assert e["eos"] == {"specdeck": [0, 2], "engine": [0, 2], "equal": True}
        assert full["own"]["stop_token_ids"] == [0, 2]
        assert e["target"]["outtype"] == e["drafter"]["outtype"] == "f32"
        prov = full["engine"]["provenance"]
        assert prov["engine"]["binary_sha256"] == e["binary_sha256"] and prov["eos"] == e["eos"]
        # the server listened on loopback only and is gone with the run
        assert e["command"][e["command"].index("--host") + 1] == "127.0.0.1"
        assert not full["left"] and not os.path.exists(f"/proc/{e['pid']}")

    @pytest.mark.parametrize("k", [2, 4])
    def test_draft_length_prediction_holds_on_the_engine_at_a_shorter_draft(self, fitted, full, tmp_path, k):
        """Issue 45 §3: tokens per round at draft length k, predicted from the full-block run's
        rounds (E = mean of min(tau_round, k + 1), bootstrap over prompts), against llama-server
        run with --spec-draft-n-max k on the same prompts."""
        from core.ml.measure.draftlen import advise, tokens_per_round

        base = full["engine"]
        target, drafter, prompts = fitted
        short = _eval(target, drafter, prompts, tmp_path / "short/result.json", "--engine", "llama.cpp",
                      "--block-size", str(k + 1))
        assert short["engine"]["spec_draft_n_max"] == k
        row = advise([p["rounds"] for p in base["per_prompt"]], 8)["rows"][k - 1]
        measured = tokens_per_round([p["rounds"] for p in short["per_prompt"]], k)
        lo, hi = row["tokens_per_round_ci"]
        assert lo <= measured <= hi, (k, measured, row)
        assert max(r for p in short["per_prompt"] for r in p["rounds"]) <= k + 1

    def test_sliding_drafter_engine_rule_equals_the_engine_own_rule_differs_and_lint_says_why(self, tiny,
                                                                                               tmp_path):
        target, drafter, prompts = _pair(tiny, tmp_path, num_layers=2, sliding_window=3)
        eng = _eval(target, drafter, prompts, tmp_path / "engine/result.json", "--engine", "llama.cpp")
        ruled = _eval(target, drafter, prompts, tmp_path / "ruled/result.json", "--engine-rule", "llama.cpp")
        own = _eval(target, drafter, prompts, tmp_path / "own/result.json")
        assert _tokens(eng) == _tokens(ruled) == _tokens(own)
        assert _rounds(eng) == _rounds(ruled)
        assert _rounds(own) != _rounds(eng)
        assert [x["causal"] for x in eng["drafter"]["attention"]["layers"]] == [False, False]
        cmp = compare_results(eng, own, allow_mismatch=True)
        assert {m["field"] for m in cmp["mismatches"]} >= {"attention"} and not cmp["parity"]["equal"]
        assert compare_results(eng, ruled, allow_mismatch=True)["parity"]["equal"]
        why = [f for name, f in lint(drafter).differences() if name == "llama.cpp" and f.field == "attention"]
        assert why and "causality from" in why[0].message and "bidirectional" in why[0].message

    @pytest.mark.usefixtures("one_thread")  # thousands of tiny forwards beside a 2-thread server on 2 CPUs
    def test_engine_and_its_rule_agree_round_for_round_at_every_max_new_tokens(self, fitted, tmp_path):
        """One llama-server; every prompt at every max_new_tokens 1..40, as llama-server's answer is
        counted by eval --engine (n_predict = max_new_tokens) and as specdeck runs the chain in
        process under --engine-rule llama.cpp (core.ml.measure.tau.FULL_BLOCK)."""
        import torch

        from core.ml.measure import tau
        from core.ml.models.drafter import load_drafter
        from core.ml.engines.llama import LlamaServer, check_reply, converter_tree, gguf_of
        from core.ml.engines.served import use_engine_rule
        from core.ml.decoding.generate import DFlashProposer, chain_generate
        from core.ml.measure.prompts import encode, read_prompts
        from core.ml.models.target import TargetRunner, load_target, load_tokenizer, stop_token_ids

        target_dir, drafter_dir, prompts_file = fitted
        tree = converter_tree(BINARY)
        t_gguf, _ = gguf_of(None, str(target_dir), "target", "f32", tmp_path, tree, str(target_dir))
        d_gguf, _ = gguf_of(None, str(drafter_dir), "drafter", "f32", tmp_path, tree, str(target_dir))
        target = load_target(target_dir, "cpu", torch.float32)
        tokenizer = load_tokenizer(target_dir)
        stops = stop_token_ids(target, tokenizer)
        vocab = target.config.get_text_config().vocab_size
        ruled, own = load_drafter(drafter_dir, dtype=torch.float32), load_drafter(drafter_dir, dtype=torch.float32)
        assert use_engine_rule(ruled, str(drafter_dir), "llama.cpp")["end_of_generation"] == tau.FULL_BLOCK
        runner = TargetRunner(target, ruled.target_layer_ids)
        prompts = [(p.id, encode(p, tokenizer, vocab)) for p in read_prompts(prompts_file)]
        differ, reference_differs, cut = [], 0, 0
        with LlamaServer(BINARY, t_gguf, d_gguf, 7, 2, 4096, tmp_path) as server:
            for pid, ids in prompts:
                for n in range(1, MAX_NEW + 1):
                    reply = server.complete(pid, ids, n)
                    check_reply(pid, reply)
                    tokens, rounds, _ = committed_rounds(reply.tokens, [a + 1 for a in reply.accepted], n, stops)
                    # the engine never drafts past what is left: its answer is n tokens or fewer, every round counted
                    assert len(reply.tokens) <= n and tokens == reply.tokens[:len(tokens)]
                    lefts = [n - 1 - sum(rounds[:i]) for i in range(len(reply.drafted))]
                    assert all(d == min(7, left - 1) for d, left in zip(reply.drafted, lefts)), (pid, n)
                    cut += any(d < 7 for d in reply.drafted)
                    mine = chain_generate(DFlashProposer(ruled, target), runner, ids, n, 8, ruled.mask_token_id,
                                          stops, last_blocks=tau.FULL_BLOCK)
                    if (mine.tokens, mine.rounds) != (tokens, rounds):
                        differ.append((pid, n, mine.rounds, rounds))
                    ref = chain_generate(DFlashProposer(own, target), runner, ids, n, 8, own.mask_token_id, stops)
                    reference_differs += (ref.tokens, ref.rounds) != (tokens, rounds)
        assert not differ, f"specdeck under llama.cpp's rule and the engine differ (prompt, n, rule, engine): {differ}"
        assert cut > MAX_NEW, "the engine never cut a draft: the end of generation was not exercised"
        # the reference shrinks its last blocks, so on some lengths its last round drafts otherwise
        assert reference_differs > 0, "the two end rules never differed on this model: the sweep shows nothing"

    def test_hybrid_qwen35_target_tokens_and_rounds_equal(self, tiny, tmp_path):
        # a gated-delta-net target: the engine rolls its recurrent state back through checkpoints;
        # the converter needs --no-mtp and stated M-RoPE sections (the driver supplies both)
        target, drafter, prompts = _pair(tiny, tmp_path, arch="qwen3_5")
        eng = _eval(target, drafter, prompts, tmp_path / "engine/result.json", "--engine", "llama.cpp")
        own = _eval(target, drafter, prompts, tmp_path / "own/result.json")
        assert _tokens(eng) == _tokens(own)
        assert _rounds(eng) == _rounds(own)


def test_mrope_sections_split_the_rotary_pairs_like_qwens_default():
    assert mrope_sections(64) == [11, 11, 10] and mrope_sections(4) == [1, 1, 0]


@pytest.mark.parametrize("flags, field", [
    (["--ignore-eos"], "--ignore-eos"),
    (["--tree-budget", "4"], "--tree-budget"),
    (["--engine-rule", "llama.cpp"], "--engine-rule"),
    (["--engine-threads", "0"], "--engine-threads"),
    (["--engine-bin", "/nonexistent/llama-server"], "--engine-bin"),
    (["--engine-target", "/nonexistent/t.gguf"], "--engine-target"),
    (["--block-size", "9"], "--block-size"),
    (["--engine-start-timeout", "0"], "--engine-start-timeout"),
    (["--engine-start-timeout", "nan"], "--engine-start-timeout"),
])
def test_bad_engine_input_exits_2_naming_the_field_and_writes_nothing(tiny, tmp_path, capsys, flags, field):
    target = tiny.save_tiny_target(tmp_path / "target", "qwen3")
    drafter = tiny.save_tiny_drafter(tmp_path / "drafter", tiny.tiny_target_config("qwen3"), block_size=8)
    prompts = tiny.write_tiny_prompts(tmp_path / "p.jsonl", n_text=1)
    out = tmp_path / "run/result.json"
    binary = [] if field == "--engine-bin" else ["--engine-bin", "/bin/true"]
    argv = ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts), "--out", str(out),
            "--engine", "llama.cpp", *binary, *flags]
    assert run_main(eval_mod.main, argv) == 2
    assert field in capsys.readouterr().err
    assert not out.parent.exists()
