"""``python -m core.ml.parity RESULT.json RESULT.json [...]``: one drafter measured several ways, pairwise.

Pure Python (no torch), like :mod:`core.ml.compare`, whose pairing it reuses.

The issue-32 parity report: the same drafter on the same prompts measured offline, online in
process, in process under an engine's rule (``eval --engine-rule``) and through the engine
(``eval --engine``). For every pair of results it first checks that both measured the same
drafter (:func:`same_drafter`: the weights' sha256 each result records; for a result without
one, the drafter's path, size and mtime as recorded, and the report says so), then says
whether they are equal, prompt by prompt in tokens and round by round where both give rounds,
and, when they differ, the likely cause:

* ``different drafters``: the weights differ, so the pair is never equal and its difference is
  no parity finding (the exit status is then :data:`DIFFERENT_DRAFTERS`);
* a setting that differs (``rule``: the attention each side ran; ``dtype``; ``EOS set``;
  ``chat template``; ``mode``: offline counts the trajectory over the cached greedy answer;
  ``target``, ``prompts``, ``block size``, ``max new tokens``);
* ``tokenizer``: the same prompt reached the two sides as a different number of ids;
* ``EOS round`` (../shared/docs/engine-llama-cpp.md §4b): the tokens are equal and only the last
  round of a prompt that stopped at EOS differs;
* ``end of generation``: the two sides ran the last rounds differently (``end_of_generation``:
  the reference shrinks the last blocks, llama.cpp's server drafts full blocks and cuts the
  draft, :func:`core.ml.measure.tau.end_block`), the tokens are equal and the first round that differs
  starts with fewer than B - 1 tokens left, where the two first draft otherwise;
* ``unexplained``: every setting equal and the rounds still differ: look for a bug.

Each side is labelled by who measured it (``specdeck``, ``specdeck under llama.cpp's rule``,
``llama.cpp@0c1e570``, ``offline``); where two sides share a harness, by ``NAME (harness)``, NAME
being the result file here and the plan item in ``specdeck parity``, so no two labels are alike.

stdout: one ``metric`` line per pair, then ``{"event": "result", ...}`` with ``--out``. Exit
status 0, 2 bad input (a file that is no result, one file given twice, fewer than two), 4
(:data:`DIFFERENT_DRAFTERS`) some pair measured different drafters (the report is printed and
written all the same).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from itertools import combinations
from typing import Any

from core.ml.measure.compare import compare_results, end_of_generation, load_result, parity_identity, side_name
from core.ml.formats.runio import UsageError, atomic_write_json, emit, run_main, say

DIFFERENT_DRAFTERS = 4
"""The exit status when a pair of results measured different drafters (``specdeck parity``'s too:
console/cli/exit_codes.py): not bad input, a finding, but never "parity holds"."""

CAUSES = {"attention": "rule", "dtype": "dtype", "eos_set": "EOS set", "template": "chat template", "mode": "mode",
          "target": "target", "prompts_sha256": "prompts", "block_size": "block size",
          "max_new_tokens": "max new tokens", "accounting": "accounting"}
"""compare's setting fields, named as the report names the cause."""


def name_of(result: dict[str, Any]) -> str:
    """``offline``, ``specdeck``, ``specdeck under llama.cpp's rule`` or ``llama.cpp@REV``."""
    return "offline" if result.get("mode") == "offline" else side_name(result)


def drafter_identity(result: dict[str, Any]) -> dict[str, Any]:
    """What a result records of the drafter it measured: ``sha256`` (``drafter.weights.sha256``,
    else the 16-digit ``drafter.fingerprint`` older results carry), ``path``, ``bytes`` and
    ``mtime_ns``; None for each one it does not record (a result of an engine's server records no
    drafter)."""
    drafter = result.get("drafter") if isinstance(result.get("drafter"), dict) else {}
    weights = drafter.get("weights") if isinstance(drafter.get("weights"), dict) else {}
    digest = weights.get("sha256") or drafter.get("fingerprint")
    return {"sha256": digest if isinstance(digest, str) and digest else None, "path": drafter.get("path"),
            "bytes": weights.get("bytes"), "mtime_ns": weights.get("mtime_ns")}


FALLBACK = {"path": "path", "bytes": "size", "mtime_ns": "mtime"}
"""The fields compared when a result records no weights digest, as the report names them."""


def same_drafter(a: dict[str, Any], b: dict[str, Any], labels: tuple[str, str] = ("a", "b")) -> dict[str, Any]:
    """Whether results ``a`` and ``b`` (named ``labels`` in the note) measured the same drafter,
    and on what that rests.

    Returns ``{"same", "by", "a", "b", "note"}``: ``same`` True, False, or None when a result
    records nothing to tell (then the rounds alone decide, and ``note`` says so); ``by``
    ``weights sha256`` when both record the digest (a 16-digit fingerprint is compared with the
    other's first 16 digits), else the recorded ``path``, ``size`` and ``mtime`` that both give
    (``note`` says a digest was missing: equal paths are the same file only if nobody rewrote
    it between the runs); ``a``/``b`` what was compared.
    """
    ia, ib = drafter_identity(a), drafter_identity(b)
    if ia["sha256"] and ib["sha256"]:
        n = 16 if min(len(ia["sha256"]), len(ib["sha256"])) <= 16 else None
        return {"same": ia["sha256"][:n] == ib["sha256"][:n], "by": "weights sha256",
                "a": ia["sha256"], "b": ib["sha256"], "note": None}
    fields = [k for k in FALLBACK if ia[k] is not None and ib[k] is not None]
    lacking = [label for label, i in zip(labels, (ia, ib)) if not i["sha256"]]
    lacks = f"{' and '.join(lacking)} record{'s' if len(lacking) == 1 else ''} no weights digest"
    if "path" not in fields:
        return {"same": None, "by": None, "a": None, "b": None,
                "note": f"{lacks} and no drafter path: not checked that {labels[0]} and {labels[1]} measured "
                        "one drafter"}
    return {"same": all(ia[k] == ib[k] for k in fields), "by": ", ".join(FALLBACK[k] for k in fields),
            "a": {k: ia[k] for k in fields}, "b": {k: ib[k] for k in fields},
            "note": f"{lacks} (a result of an older eval): the drafters are compared by "
                    f"{', '.join(FALLBACK[k] for k in fields)} as recorded"}


def in_last_blocks(result: dict[str, Any], rounds: Sequence[int], first: int) -> bool:
    """Whether round ``first`` of ``rounds`` starts where the two end rules draft otherwise: fewer
    than ``B - 1`` tokens left before ``max_new_tokens`` (the prefill's token and the rounds before
    it committed). False when the result records no block size or token limit."""
    block, max_new = result.get("block_size"), result.get("max_new_tokens")
    if not isinstance(block, int) or not isinstance(max_new, int):
        return False
    left = max_new - 1 - sum(rounds[:first])
    return left <= block - 2


def pair_report(a: dict[str, Any], b: dict[str, Any], labels: tuple[str, str] | None = None) -> dict[str, Any]:
    """Whether results ``a`` and ``b`` measured the same drafter and are equal, per prompt, and
    the likely causes when not; ``labels`` name the two sides (default: who measured each)."""
    label_a, label_b = labels or (name_of(a), name_of(b))
    drafter = same_drafter(a, b, (label_a, label_b))
    cmp = compare_results(a, b, allow_mismatch=True)
    rows_a = {str(r["id"]): r for r in a["per_prompt"]}
    rows_b = {str(r["id"]): r for r in b["per_prompt"]}
    differ = [m["field"] for m in cmp["mismatches"]]
    pa, pb = parity_identity(a), parity_identity(b)  # compared here even when neither side is an engine
    differ += [k for k in pa if pa[k] != pb[k] and k not in differ]
    if "offline" in (a.get("mode"), b.get("mode")):
        differ = [k for k in differ if k != "eos_set"]  # offline stops where the cached answer did
    prompts, causes = [], [CAUSES[k] for k in differ if k in CAUSES]
    ends_differ = end_of_generation(a) != end_of_generation(b)
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
        elif first is not None and tokens_equal and ends_differ and in_last_blocks(a, rounds_a, first):
            row["cause"] = "end of generation"
        prompts.append(row)
    for extra in ("tokenizer", "EOS round", "end of generation"):
        if any(r.get("cause") == extra for r in prompts):
            causes.append(extra)
    if drafter["same"] is False:  # no setting or bug explains two drafters' rounds differing: the weights do
        causes.insert(0, "different drafters")
    equal = (drafter["same"] is not False and bool(prompts)
             and all(r["tokens_equal"] and r["rounds_equal"] for r in prompts))
    if not equal and not causes:
        causes = ["unexplained"]
    return {"a": label_a, "b": label_b, "equal": equal, "likely_causes": [] if equal else causes,
            "same_drafter": drafter["same"], "drafter": drafter, "settings_differ": differ,
            "prompts_tokens_equal": sum(r["tokens_equal"] for r in prompts),
            "prompts_rounds_equal": sum(r["rounds_equal"] for r in prompts), "num_prompts": len(prompts),
            "tau": {"a": cmp["overall"]["ours"]["tau"], "b": cmp["overall"]["baseline"]["tau"]},
            "per_prompt": prompts}


def labels_of(sides: Sequence[str], names: Sequence[str]) -> list[str]:
    """Each side's label: who measured it, or ``NAME (who)`` where two sides share a harness
    (two items through llama.cpp, two in-process evals), so no two labels read alike."""
    return [side if sides.count(side) == 1 else f"{name} ({side})" for side, name in zip(sides, names)]


def parity(results: Sequence[dict[str, Any]], labels: Sequence[str] | None = None) -> dict[str, Any]:
    """Every pair of ``results`` (at least two), each side named by its label in ``labels``
    (default: :func:`labels_of` with the results' positions, ``#1``...).

    Raises:
        UsageError: fewer than two results, or two labels alike.
    """
    if len(results) < 2:
        raise UsageError("parity needs at least two results of the same drafter")
    sides = [name_of(r) for r in results]
    labels = list(labels) if labels is not None else labels_of(sides, [f"#{n}" for n in range(1, len(results) + 1)])
    twice = next((x for x in labels if labels.count(x) > 1), None)
    if twice is not None:
        raise UsageError(f"{twice!r} is given twice: parity compares different results of one drafter")
    pairs = [pair_report(results[i], results[j], (labels[i], labels[j]))
             for i, j in combinations(range(len(results)), 2)]
    return {"sides": sides, "labels": labels, "pairs": pairs,
            "different_drafters": [[p["a"], p["b"]] for p in pairs if p["same_drafter"] is False]}


def different_drafters_line(report: dict[str, Any]) -> str | None:
    """The one line that says which sides measured different drafters (None when none did)."""
    pairs = [p for p in report["pairs"] if p["same_drafter"] is False]
    if not pairs:
        return None
    said = "; ".join(f"{p['a']} and {p['b']} ({p['drafter']['by']}: {_short(p['drafter']['a'])} vs "
                     f"{_short(p['drafter']['b'])})" for p in pairs)
    return f"different drafters: {said}; parity compares one drafter measured several ways"


def _short(x: Any) -> str:
    if isinstance(x, str):
        return x[:16]
    return ", ".join(f"{k} {v}" for k, v in x.items()) if isinstance(x, dict) else str(x)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.parity", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="result.json files of one drafter (offline, online, --engine-rule, "
                   "--engine)")
    p.add_argument("--out", help="write the report JSON here (atomic)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    results = [load_result(r) for r in args.results]
    report = parity(results, labels_of([name_of(r) for r in results], args.results))
    for pr in report["pairs"]:
        emit("metric", task="parity", **{k: v for k, v in pr.items() if k != "per_prompt"})
    if args.out:  # written atomically, then named
        emit("result", task="parity", path=str(atomic_write_json(args.out, report).resolve()))
    line = different_drafters_line(report)
    if line:
        say(f"parity: {line}: give results of one drafter (python -m core.ml.compare A B compares two drafters)")
    return DIFFERENT_DRAFTERS if line else 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
