"""``python -m core.ml.parity RESULT.json RESULT.json [...]``: one drafter measured several ways, pairwise.

Pure Python (no torch), like :mod:`core.ml.compare`, whose pairing it reuses.

The issue-32 parity report: the same drafter on the same prompts measured offline, online in
process, in process under an engine's rule (``eval --engine-rule``) and through the engine
(``eval --engine``). For every pair of results it says whether they are equal, prompt by prompt
in tokens and round by round where both give rounds, and, when they differ, the likely cause:

* a setting that differs (``rule``: the attention each side ran; ``dtype``; ``EOS set``;
  ``chat template``; ``mode``: offline counts the trajectory over the cached greedy answer;
  ``target``, ``prompts``, ``block size``, ``max new tokens``);
* ``tokenizer``: the same prompt reached the two sides as a different number of ids;
* ``EOS round`` (../shared/docs/engine-llama-cpp.md §4b): the tokens are equal and only the last
  round of a prompt that stopped at EOS differs;
* ``unexplained``: every setting equal and the rounds still differ: look for a bug.

stdout: one ``metric`` line per pair, then ``{"event": "result", ...}`` with ``--out``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from itertools import combinations
from typing import Any

from core.ml.compare import compare_results, load_result, parity_identity, side_name
from core.ml.runio import UsageError, atomic_write_json, emit, run_main

CAUSES = {"attention": "rule", "dtype": "dtype", "eos_set": "EOS set", "template": "chat template", "mode": "mode",
          "target": "target", "prompts_sha256": "prompts", "block_size": "block size",
          "max_new_tokens": "max new tokens", "accounting": "accounting"}
"""compare's setting fields, named as the report names the cause."""


def name_of(result: dict[str, Any]) -> str:
    """``offline``, ``specdeck``, ``specdeck under llama.cpp's rule`` or ``llama.cpp@REV``."""
    return "offline" if result.get("mode") == "offline" else side_name(result)


def pair_report(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Whether results ``a`` and ``b`` are equal, per prompt, and the likely causes when not."""
    cmp = compare_results(a, b, allow_mismatch=True)
    rows_a = {str(r["id"]): r for r in a["per_prompt"]}
    rows_b = {str(r["id"]): r for r in b["per_prompt"]}
    differ = [m["field"] for m in cmp["mismatches"]]
    pa, pb = parity_identity(a), parity_identity(b)  # compared here even when neither side is an engine
    differ += [k for k in pa if pa[k] != pb[k] and k not in differ]
    if "offline" in (a.get("mode"), b.get("mode")):
        differ = [k for k in differ if k != "eos_set"]  # offline stops where the cached answer did
    prompts, causes = [], [CAUSES[k] for k in differ if k in CAUSES]
    for pid in (p for p in rows_a if p in rows_b):
        ra, rb = rows_a[pid], rows_b[pid]
        tokens_equal = ra.get("tokens") == rb.get("tokens")
        rounds_a, rounds_b = ra.get("rounds") or [], rb.get("rounds") or []
        first = next((i for i, (x, y) in enumerate(zip(rounds_a, rounds_b)) if x != y), None)
        if first is None and len(rounds_a) != len(rounds_b):
            first = min(len(rounds_a), len(rounds_b))
        row = {"id": pid, "tokens_equal": tokens_equal, "rounds_equal": first is None, "first_round_differing": first}
        if ra.get("prompt_len") is not None and rb.get("prompt_len") is not None and ra["prompt_len"] != rb["prompt_len"]:
            row["cause"] = "tokenizer"
        elif (first is not None and tokens_equal and (ra.get("stopped") or rb.get("stopped"))
              and first == min(len(rounds_a), len(rounds_b)) - 1):
            row["cause"] = "EOS round"
        prompts.append(row)
    for extra in ("tokenizer", "EOS round"):
        if any(r.get("cause") == extra for r in prompts):
            causes.append(extra)
    equal = bool(prompts) and all(r["tokens_equal"] and r["rounds_equal"] for r in prompts)
    if not equal and not causes:
        causes = ["unexplained"]
    return {"a": name_of(a), "b": name_of(b), "equal": equal, "likely_causes": [] if equal else causes,
            "settings_differ": differ,
            "prompts_tokens_equal": sum(r["tokens_equal"] for r in prompts),
            "prompts_rounds_equal": sum(r["rounds_equal"] for r in prompts), "num_prompts": len(prompts),
            "tau": {"a": cmp["overall"]["ours"]["tau"], "b": cmp["overall"]["baseline"]["tau"]},
            "per_prompt": prompts}


def parity(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every pair of ``results`` (at least two)."""
    if len(results) < 2:
        raise UsageError("parity needs at least two results of the same drafter")
    return {"sides": [name_of(r) for r in results],
            "pairs": [pair_report(a, b) for a, b in combinations(results, 2)]}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.parity", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="result.json files of one drafter (offline, online, --engine-rule, "
                   "--engine)")
    p.add_argument("--out", help="write the report JSON here (atomic)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = parity([load_result(r) for r in args.results])
    for pr in report["pairs"]:
        emit("metric", task="parity", **{k: v for k, v in pr.items() if k != "per_prompt"})
    if args.out:  # written atomically, then named
        emit("result", task="parity", path=str(atomic_write_json(args.out, report).resolve()))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
