"""Pure-Python metrics (core.ml.measure.tau) and result comparison (core.ml.compare), hand-computed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from core.ml.measure import tau as T
from core.ml.measure.compare import ComparisonError, compare_results, main as compare_main
from core.ml.formats.runio import run_main

# Two prompts, block size 4. Prompt a: rounds 4, 1, 2 (tau 7/3); prompt b: rounds 3, 3 (tau 3).
ROUNDS = [[4, 1, 2], [3, 3]]


def test_streak_counts_leading_matches_only():
    assert T.streak([5, 6, 7], [5, 6, 7]) == 3
    assert T.streak([5, 9, 7], [5, 6, 7]) == 1  # a later match does not count
    assert T.streak([9, 6], [5, 6]) == 0
    assert T.streak([5, 6, 7], [5, 6]) == 2  # labels cut short truncate the streak
    assert T.streak([], [1]) == 0


def test_macro_vs_pooled_hand_computed():
    assert T.mean_tau([4, 1, 2]) == pytest.approx(7 / 3)
    assert T.macro_tau(ROUNDS) == pytest.approx((7 / 3 + 3) / 2)  # 2.6667
    assert T.pooled_tau(ROUNDS) == pytest.approx(13 / 5)  # 2.6
    assert T.committed_tokens([4, 1, 2]) == 7
    assert T.macro_tau([[], [2]]) == 2  # prompts without rounds are skipped
    assert T.pooled_tau([]) is None


def test_position_counts_and_histogram_hand_computed():
    rounds = [4, 1, 2, 3, 3]  # streaks 3, 0, 1, 2, 2
    assert T.position_counts(rounds, 4) == [4, 3, 1]  # s>=1: 4 rounds, s>=2: 3, s>=3: 1
    assert T.histogram(rounds, 4) == [1, 1, 2, 1]
    with pytest.raises(ValueError):
        T.histogram([5], 4)
    with pytest.raises(ValueError):
        T.position_counts([0], 4)


def test_summarize_identity_pooled_equals_one_plus_sum_p():
    s = T.summarize(ROUNDS, 4)
    assert s["per_position_counts"] == [4, 3, 1]
    assert s["per_position_acceptance"] == pytest.approx([0.8, 0.6, 0.2])
    assert s["tau_pooled"] == pytest.approx(1 + sum(s["per_position_acceptance"]))
    assert s["histogram"] == {"1": 1, "2": 1, "3": 2, "4": 1}
    assert (s["num_rounds"], s["num_prompts"], s["committed_tokens"]) == (5, 2, 13)


def test_trajectory_walks_streaks():
    streaks = {10: 2, 11: 0, 12: 0, 13: 1, 14: 5, 15: 0}
    anchors, rounds = T.trajectory(streaks, 10, 16)
    assert anchors == [10, 13]  # 10 + 2 + 1 = 13; at 13 only 2 tokens are left: 14 and 15
    assert rounds == [3, 2]
    assert sum(rounds) == 16 - 10 - 1  # the anchor's own token at 10 was committed before any round
    assert T.trajectory(lambda a: 0, 3, 6) == ([3, 4], [1, 1])
    assert T.trajectory({10: 9}, 10, 16) == ([10], [5])  # capped at the tokens left
    assert T.trajectory({10: 3}, 10, 11) == ([], [])  # max_new_tokens 1: the prefill's token is all


def test_a_round_commits_as_the_reference_counts():
    assert T.committed([5, 6, 7], 10) == (3, False)
    assert T.committed([5, 6, 7], 2) == (2, False)  # capped at what is left before max_new_tokens
    assert T.committed([5, 2, 7], 10, {2}) == (2, True)  # cut after the stop token, which counts
    assert T.committed([2, 6], 1, {2}) == (1, True)
    assert T.committed([5, 6, 2], 2, {2}) == (2, False)  # the stop lies past the cap: not reached


def test_end_rules_give_the_drafters_block_and_the_drafts_verified():
    # the reference: the last blocks shrink to the tokens left + 1, every draft of them verified
    assert [T.end_block(T.SHRINK, 8, left) for left in (1, 2, 6, 7, 8, 30)] == \
        [(2, 1), (3, 2), (7, 6), (8, 7), (8, 7), (8, 7)]
    # llama.cpp's server: always a full block, the draft cut to n_remaining - 1; one left: no draft
    assert [T.end_block(T.FULL_BLOCK, 8, left) for left in (1, 2, 6, 7, 8, 30)] == \
        [(8, 0), (8, 1), (8, 5), (8, 6), (8, 7), (8, 7)]
    assert T.end_block(T.SHRINK, 1, 5) == (1, 0) == T.end_block(T.FULL_BLOCK, 1, 5)  # B = 1: plain decoding
    # with the same drafts both commit the same count: min(streak + 1, left) against streak' + 1
    for left in range(1, 12):
        for streak in range(0, 8):
            _, n_shrink = T.end_block(T.SHRINK, 8, left)
            _, n_full = T.end_block(T.FULL_BLOCK, 8, left)
            assert T.committed([0] * (min(streak, n_shrink) + 1), left)[0] == min(streak, n_full) + 1
    with pytest.raises(ValueError, match="unknown end-of-generation rule 'trim'"):
        T.end_block("trim", 8, 3)


def test_the_definition_says_how_the_last_blocks_ran():
    for sampled in (False, True):
        for offline in (False, True):
            text = T.definition(sampled, offline)
            assert text == (T.SAMPLED_DEFINITION if sampled else T.DEFINITION) + \
                (" " + T.OFFLINE_DEFINITION if offline else "")
            full = T.definition(sampled, offline, T.FULL_BLOCK)
            assert "shrink" not in full and "shrunk" not in full and full != text
            assert "llama.cpp's server" in full and "end_of_generation 'full-block'" in full
    with pytest.raises(ValueError, match="unknown end-of-generation rule"):
        T.definition(last_blocks="trim")


def test_legacy_rounds_are_recounted_from_the_output_length():
    # legacy: 3 tokens after a stop were counted, then one more round ran after max_new_tokens
    assert T.recount([4, 4, 3], 6) == [4, 1]  # 1 prefill token + 5 committed = 6 tokens
    assert T.recount([8, 8, 1], 17) == [8, 8]  # the extra round at exactly max_new_tokens goes
    assert T.recount([3, 2], 6) == [3, 2]  # already consistent: unchanged
    assert T.recount([5], 1) == []


def _result(rounds, mode="online", block=4, ids=("a", "b"), sha="s1", fp="t1"):
    per = [{"id": i, "tau": T.mean_tau(r), "rounds": r, "tokens": []} for i, r in zip(ids, rounds)]
    return {"kind": "specdeck-eval-v1", "definition": T.DEFINITION, "mode": mode, "block_size": block,
            "max_new_tokens": 64, "target": {"fingerprint": fp}, "prompts": {"sha256": sha},
            "per_prompt": per, "tau": T.macro_tau(rounds), "drafter": {"fingerprint": "d"}}


def test_compare_per_prompt_and_overall():
    ours, base = _result([[4, 1, 2], [3, 3]]), _result([[2, 2], [1, 1, 2]])
    cmp = compare_results(ours, base)
    assert cmp["ok"] and not cmp["mismatches"]
    a = cmp["per_prompt"][0]
    assert (a["id"], a["ours"], a["baseline"]) == ("a", pytest.approx(7 / 3), 2.0)
    assert a["delta"] == pytest.approx(1 / 3) and a["ratio"] == pytest.approx(7 / 6)
    o = cmp["overall"]
    assert o["ours"]["tau"] == pytest.approx(8 / 3) and o["baseline"]["tau"] == pytest.approx((2 + 4 / 3) / 2)
    assert o["delta"] == pytest.approx(8 / 3 - 5 / 3) and o["ratio"] == pytest.approx(8 / 5)
    assert o["ours"]["tau_pooled"] == pytest.approx(13 / 5) and o["baseline"]["tau_pooled"] == pytest.approx(8 / 5)


@pytest.mark.parametrize("change", [
    {"mode": "offline"}, {"block": 8}, {"fp": "other-target"}, {"sha": "other-prompts"}, {"ids": ("a", "c")},
])
def test_compare_refuses_or_flags_mismatches(change):
    ours = _result([[4, 1, 2], [3, 3]])
    base = _result([[2, 2], [1, 1, 2]], **change)
    with pytest.raises(ComparisonError):
        compare_results(ours, base)
    flagged = compare_results(ours, base, allow_mismatch=True)
    assert not flagged["ok"] and flagged["mismatches"]


def test_compare_cli_exit_codes(tmp_path, capsys):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(_result([[4, 1, 2], [3, 3]])))
    b.write_text(json.dumps(_result([[2, 2], [1, 1, 2]])))
    c.write_text(json.dumps(_result([[2, 2], [1, 1, 2]], block=8)))
    assert run_main(compare_main, [str(a), str(b), "--out", str(tmp_path / "cmp.json")]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[-1] == {"event": "result", "task": "compare", "path": str((tmp_path / "cmp.json").resolve())}
    assert all("event" in x for x in lines)
    assert run_main(compare_main, [str(a), str(c)]) == 2
    assert "block_size" in capsys.readouterr().err
    assert run_main(compare_main, [str(a), str(tmp_path / "missing.json")]) == 2


def test_pure_modules_do_not_import_torch():
    code = ("import sys, core.ml, core.ml.measure.tau, core.ml.compare, core.ml.formats.runio, core.ml.formats.drafter_config;"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
