"""Every tau says how it was measured (issue 45 §1): harness, decoding, block size and prompt digest in
each output of core.tau.table; the three aggregations by name; tau split by domain with an interval
each; a verdict across harnesses or decodings says so. Hand-computed numbers."""

from __future__ import annotations

import csv
import io
import json

import pytest

from core.actions.eval import eval_rows
from core.ml.measure import harness
from core.state.records import EvalRow
from core.tau.table import build_comparison, to_csv, to_json, to_markdown, token_weighted

SHA = "3f9a2c1b7e00aa" + "0" * 50
S = {"mode": "online", "block_size": 4, "tree_budget": None, "target": "qwen3-8b", "prompts": SHA}


def row(drafter, prompt, rounds, *, role="drafter", settings=None, domain=None):
    st = dict(settings or S)
    if domain:
        st["domain"] = domain
    return EvalRow(item_id="eval", run_id="r1", drafter=drafter, role=role, prompt_id=prompt,
                   tau=sum(rounds) / len(rounds), rounds=rounds, per_position=None, settings=st, step=None)


def test_token_weighted_is_neither_the_per_request_mean_nor_pooled():
    """p1 rounds [4, 4] (tau 4, 8 tokens), p2 rounds [1, 1, 1, 1] (tau 1, 4 tokens):
    per-request mean (4 + 1) / 2 = 2.5; token-weighted (8*4 + 4*1) / 12 = 3.0; pooled 12 / 6 = 2.0."""
    rows = [row("v5", "p1", [4, 4]), row("v5", "p2", [1, 1, 1, 1])]
    assert token_weighted(rows) == pytest.approx(3.0)
    o = build_comparison(rows).overall_of("v5")
    assert (o.macro, o.token_weighted, o.pooled) == (pytest.approx(2.5), pytest.approx(3.0), pytest.approx(2.0))
    md = to_markdown(build_comparison(rows + [row("b", "p1", [2, 2], role="baseline"),
                                              row("b", "p2", [2, 2], role="baseline")]))
    for name in ("per-request mean", "token-weighted", "pooled"):
        assert name in md
    table = list(csv.DictReader(io.StringIO(to_csv(build_comparison(rows)))))
    tw = [r for r in table if r["scope"] == "token_weighted"][0]
    assert tw["tau"] == "3.0000" and tw["aggregation"] == "token-weighted"
    assert {r["aggregation"] for r in table if r["scope"] in ("macro", "pooled")} == {"per-request mean", "pooled"}


def test_each_output_names_harness_decoding_block_and_prompt_digest():
    sampled = {**S, "temperature": 0.7, "top_p": 0.95, "top_k": 20}
    rows = [row("v5", "p1", [3, 3]), row("v5", "p2", [2]), row("v4", "p1", [2], settings=sampled)]
    c = build_comparison(rows)
    assert c.drafter("v5").measured == {"harness": "in-process online", "decoding": "greedy", "block_size": 4,
                                        "prompt_set": None, "prompt_digest": "3f9a2c1b7e00"}
    assert c.drafter("v4").measured["decoding"] == "T 0.7, top-p 0.95, top-k 20"
    md = to_markdown(c)
    assert "- v5: in-process online, greedy, B 4, prompts 3f9a2c1b7e00" in md
    assert "- v4: in-process online, T 0.7, top-p 0.95, top-k 20, B 4, prompts 3f9a2c1b7e00" in md
    data = json.loads(to_json(c))
    assert data["drafters"][0]["measured"]["harness"] == "in-process online"
    assert set(data["aggregations"]) == {"per-request mean", "token-weighted", "pooled"}
    table = list(csv.DictReader(io.StringIO(to_csv(c))))
    assert {(r["drafter"], r["harness"], r["decoding"], r["block_size"], r["prompt_digest"]) for r in table} == {
        ("v5", "in-process online", "greedy", "4", "3f9a2c1b7e00"),
        ("v4", "in-process online", "T 0.7, top-p 0.95, top-k 20", "4", "3f9a2c1b7e00")}


def test_a_verdict_across_harnesses_or_decodings_says_so():
    """A pair through two harnesses (in process vs llama.cpp's server) is computed, and its verdict line
    says it is across harnesses; greedy vs sampled says across decodings."""
    engine = {**S, "harness": "engine llama.cpp b1234"}
    sampled = {**S, "temperature": 0.7}
    rows = ([row("v5", f"p{i}", [3, 4]) for i in range(8)] + [row("v5 @llama.cpp", f"p{i}", [2, 2], settings=engine)
                                                              for i in range(8)]
            + [row("v5 T", f"p{i}", [2, 3], settings=sampled) for i in range(8)])
    c = build_comparison(rows, [("v5", "v5 @llama.cpp"), ("v5", "v5 T")])
    across, decoding = c.pairs
    assert across.mismatch == ("harness",)
    assert across.verdict_text.startswith("⚠ settings differ (harness in-process online≠engine llama.cpp b1234), "
                                          "not comparable: a verdict across harnesses: v5 is better")
    assert decoding.verdict_text.startswith("⚠ settings differ (temperature None≠0.7), not comparable: "
                                            "a verdict across decodings:")
    assert "Measured:\n- v5: in-process online" in to_markdown(c)


def test_harness_of_results_and_of_rows_stored_before_it_was_recorded():
    assert harness.of_result({"mode": "online"}) == "in-process online"
    assert harness.of_result({"mode": "offline"}) == "offline trajectory"
    assert harness.of_result({"mode": "offline"}, "all_anchor") == "offline all-anchor"
    assert harness.of_result({"mode": "online", "drafter": {"engine_rule": {"engine": "vllm"}}}) == \
        "in-process online under vllm's rule"
    assert harness.of_result({"engine": {"name": "llama.cpp", "version": "version: 6500 (0c1e570)",
                                         "binary_sha256": "x"}}) == "engine llama.cpp 6500 (0c1e570)"
    assert harness.of_result({"engine": {"name": "vllm", "version": "0.11.0", "url": "http://h:8000"}}) == \
        "client of a vllm 0.11.0 server"
    assert harness.of_settings({"mode": "online", "engine": "llama.cpp@0c1e570"}) == "engine llama.cpp 0c1e570"
    assert harness.of_settings({"mode": "offline"}) == "offline trajectory"
    assert harness.decoding({"temperature": 0}) == "greedy" and harness.decoding({}) == "greedy"


def test_a_result_with_domains_splits_the_table_with_an_interval_per_domain():
    """result.json's prompts.domains reach the rows (eval_rows), and the table splits by them."""
    res = {"mode": "online", "block_size": 4, "accounting": "dflash-0.1.0", "prompts": {
        "sha256": SHA, "domains": {f"m{i}": "math" for i in range(4)} | {f"c{i}": "code" for i in range(4)}},
        "per_prompt": [{"id": f"m{i}", "tau": 3.0 + i / 4, "rounds": [3, 3 + (i > 1)]} for i in range(4)]
        + [{"id": f"c{i}", "tau": 1.5, "rounds": [1, 2]} for i in range(4)]}
    rows = eval_rows("r1", "eval", res, "v5", "drafter", None)
    assert {r.settings.get("domain") for r in rows} == {"math", "code"}
    assert rows[0].settings["harness"] == "in-process online"
    c = build_comparison(rows)
    assert [d.label for d in c.drafters] == ["v5"]  # the domain splits the table, never the entry
    by = {f.domain: f for f in c.by_domain}
    assert by["math"].prompts == 4 and by["code"].prompts == 4
    assert by["code"].macro == pytest.approx(1.5) and by["code"].pooled == pytest.approx(1.5)
    assert by["math"].macro_ci95 is not None and by["math"].macro_ci95[0] <= by["math"].macro <= by["math"].macro_ci95[1]
    md = to_markdown(c)
    assert "| v5 | math | 4 |" in md and "| v5 | code | 4 | 1.500 |" in md
    assert any(r["scope"] == "domain" and r["prompt_id"] == "code" for r in csv.DictReader(io.StringIO(to_csv(c))))
    assert build_comparison([row("v5", "p1", [2])]).by_domain == ()  # no domain: no split


def test_a_prompts_file_s_domains_are_recorded_and_a_bad_one_is_refused(tmp_path):
    from core.ml.formats.runio import UsageError
    from core.ml.measure.prompts import describe, read_prompts

    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "x", "domain": "math"}\n{"id": "b", "turns": ["y", "z"], "domain": "prose"}\n'
                    '{"id": "c", "prompt": "w"}\n')
    got = describe(path, read_prompts(path))
    assert got["domains"] == {"a": "math", "b#1": "prose", "b#2": "prose"}
    path.write_text('{"id": "a", "prompt": "x", "domain": 3}\n')
    with pytest.raises(UsageError, match=r"p.jsonl:1: domain must be a non-empty string"):
        read_prompts(path)


def test_two_result_files_compared_name_how_each_was_measured():
    """core.ml.compare (two result.json files): each side's harness, decoding and digest, and the
    token-weighted tau beside the per-request mean and pooled."""
    from core.ml.measure.compare import compare_results

    def res(**kw):
        return {"mode": "online", "block_size": 4, "accounting": "dflash-0.1.0", "prompts": {"sha256": SHA},
                "per_prompt": [{"id": "p1", "tau": 4.0, "rounds": [4, 4]}, {"id": "p2", "tau": 1.0, "rounds": [1] * 4}],
                **kw}

    cmp = compare_results(res(), res(engine={"name": "llama.cpp", "version": "b6500", "binary_sha256": "x"}),
                          allow_mismatch=True)
    assert cmp["measured"]["ours"] == {"harness": "in-process online", "decoding": "greedy", "block_size": 4,
                                       "prompt_set": None, "prompt_digest": "3f9a2c1b7e00"}
    assert cmp["measured"]["baseline"]["harness"] == "engine llama.cpp b6500"
    assert cmp["overall"]["ours"]["tau_token_weighted"] == pytest.approx(3.0)
    assert cmp["overall"]["ours"]["tau"] == pytest.approx(2.5) and cmp["overall"]["ours"]["tau_pooled"] == pytest.approx(2.0)
    assert cmp["aggregations"]["tau_token_weighted"] == "token-weighted"


def test_a_settled_stop_s_own_verdict_reaches_compare():
    from core.tau.table import verdict_lines

    seq = {"text": "v5 is better than v4: settled after 17 of 200 prompts", "verdict": "better"}
    res = {"mode": "online", "block_size": 4, "accounting": "dflash-0.1.0", "prompts": {"sha256": SHA},
           "sequential": seq, "per_prompt": [{"id": "p1", "tau": 3.0, "rounds": [3, 3]}]}
    rows = eval_rows("r1", "eval", res, "v5", "drafter", None) + eval_rows("r1", "eval", res, "v4", "baseline", None)
    lines = verdict_lines(build_comparison(rows))
    assert lines.count("v5 is better than v4: settled after 17 of 200 prompts (settled stop, anytime-valid)") == 1
