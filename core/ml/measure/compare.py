"""Compare two eval result files (ours vs a baseline): per-prompt and overall tau.

Pure Python (no torch): the headless core and ``specdeck compare`` use it on a laptop.

    python -m core.ml.compare OURS.json BASELINE.json [--section chain|ddtree|all_anchor]
                              [--out FILE] [--allow-mismatch]

Two results are comparable only when they measured the same thing: same mode
(online/offline), method (chain, or DDTree with the same budget), block size, max new tokens,
target (config fingerprint), prompts (same ids and same prompts-file hash), round accounting
(docs/evaluation.md §1: results of older versions are ``legacy``) and chat template / thinking. Otherwise
:func:`compare_results` raises :class:`ComparisonError` (the CLI exits 2), unless
``allow_mismatch`` is set, in which case the differences are listed under ``mismatches`` and
``ok`` is false; tau is then compared over the prompts both files share.

When either result was measured through an engine (``eval --engine``, a top-level ``engine``),
the two are a parity pair: each side is named (``sides``: ``specdeck``, ``specdeck under
llama.cpp's rule`` or ``llama.cpp@0c1e570``), the settings an engine can silently differ in are
compared too (:data:`PARITY_SETTINGS`: dtype, the attention each side ran, the EOS set), and
every prompt says whether the tokens and the rounds are equal, round for round (``parity``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.ml.formats import resultfile
from core.ml.measure import harness
from core.ml.measure import tau as taulib
from core.ml.formats.runio import UsageError, atomic_write_json, emit, read_json, run_main, say

SECTIONS = ("chain", "ddtree", "all_anchor")
PARITY_SETTINGS = ("dtype", "attention", "eos_set")
"""Compared only for a pair with an engine side: the weights' dtype, the per-layer attention each
side ran (an engine applies its own rule, core.ml.engines.rules) and the token ids generation ends at."""


def side_name(result: dict[str, Any]) -> str:
    """Who measured a result: the engine (``llama.cpp@0c1e570``) or specdeck, under its own
    rule or an engine's (``eval --engine-rule``: another attention, or another end of generation)."""
    engine = result.get("engine")
    if isinstance(engine, dict):
        rev = engine.get("revision") or engine.get("version")
        return f"{engine.get('name')}@{rev}" if rev else str(engine.get("name"))
    rule = (result.get("drafter") or {}).get("engine_rule")
    ruled = isinstance(rule, dict) and (rule.get("changed") or rule.get("end_of_generation") not in (None, taulib.SHRINK))
    return f"specdeck under {rule['engine']}'s rule" if ruled else "specdeck"


def end_of_generation(result: dict[str, Any]) -> str:
    """How a result's last rounds ran (:func:`core.ml.measure.tau.end_block`): its ``end_of_generation``;
    a result written before it was recorded: llama.cpp's server's through that engine (its rounds
    were its full blocks' drafts capped at the tokens left, which counts the same), else the
    reference's."""
    recorded = result.get("end_of_generation")
    if isinstance(recorded, str):
        return recorded
    engine = result.get("engine")
    return taulib.FULL_BLOCK if isinstance(engine, dict) and engine.get("name") == "llama.cpp" else taulib.SHRINK


def _attention(result: dict[str, Any]) -> list[Any] | None:
    layers = ((result.get("drafter") or {}).get("attention") or {}).get("layers")
    return [(x.get("causal"), x.get("window")) for x in layers] if isinstance(layers, list) else None


def _eos_set(result: dict[str, Any]) -> list[int] | None:
    engine = result.get("engine")
    if isinstance(engine, dict) and isinstance(engine.get("eos"), dict):
        return engine["eos"].get("engine")
    stops = result.get("stop_token_ids")
    return sorted(stops) if isinstance(stops, list) else None


def parity_identity(result: dict[str, Any]) -> dict[str, Any]:
    """The :data:`PARITY_SETTINGS` of a result."""
    return {"dtype": result.get("dtype"), "attention": _attention(result), "eos_set": _eos_set(result)}


class ComparisonError(ValueError):
    """The two results measured different things; ``mismatches`` lists how."""

    def __init__(self, mismatches: list[dict[str, Any]]) -> None:
        self.mismatches = mismatches
        text = "; ".join(f"{m['field']}: ours={m['ours']!r} baseline={m['baseline']!r}" for m in mismatches)
        super().__init__(f"results are not comparable ({text})")


def load_result(path: str | Path) -> dict[str, Any]:
    """Read a result.json written by ``core.ml.eval``.

    Raises:
        UsageError: the file is missing, not JSON, not an eval result, or holds what no eval
            writes (:func:`core.ml.formats.resultfile.problem`: the prompt and the field named).
    """
    data = read_json(path, what="result file")
    if not isinstance(data, dict) or "per_prompt" not in data:
        raise UsageError(f"{path} is not a core.ml.eval result (no 'per_prompt')")
    why = resultfile.problem(data)
    if why:
        raise UsageError(f"result file {path}: {why}")
    return data


def section_of(result: dict[str, Any], section: str) -> dict[str, Any]:
    """The figures of one method inside a result: ``chain`` is the top level.

    Raises:
        UsageError: the result has no such section (e.g. no DDTree run).
    """
    if section == "chain":
        return result
    sub = result.get(section)
    if not isinstance(sub, dict) or "per_prompt" not in sub:
        raise UsageError(f"result has no '{section}' section (run eval with the matching option)")
    return sub


def _identity(result: dict[str, Any], sec: dict[str, Any], section: str) -> dict[str, Any]:
    target = result.get("target") or {}
    prompts = result.get("prompts") or {}
    return {
        "mode": result.get("mode"),
        "section": section,
        "tree_budget": sec.get("budget") if section == "ddtree" else None,
        "block_size": result.get("block_size"),
        "max_new_tokens": result.get("max_new_tokens"),
        "temperature": float(result.get("temperature", 0)),
        "top_p": float(result.get("top_p", 1.0)),
        "top_k": int(result.get("top_k", 0)),
        "target": target.get("fingerprint") or target.get("path"),
        "prompts_sha256": prompts.get("sha256"),
        "accounting": result.get("accounting") or taulib.LEGACY,
        "template": result.get("template"),
    }


def compare_results(
    ours: dict[str, Any],
    baseline: dict[str, Any],
    section: str = "chain",
    allow_mismatch: bool = False,
) -> dict[str, Any]:
    """Per-prompt and overall tau of ``ours`` against ``baseline``.

    Args:
        ours: our result.json content.
        baseline: the baseline result.json content.
        section: ``chain`` (top level), ``ddtree`` or ``all_anchor``.
        allow_mismatch: flag instead of refusing results that measured different things.

    Returns:
        dict with ``ok``, ``section``, ``mismatches``, ``overall`` (macro ``tau`` and
        ``tau_pooled`` of both over the shared prompts, ``delta`` = ours - baseline and
        ``ratio`` = ours / baseline, likewise ``delta_pooled``/``ratio_pooled``),
        ``warnings`` (non-blocking notes),
        ``per_prompt`` (``id, ours, baseline, delta, ratio``), ``only_in_ours``,
        ``only_in_baseline`` and the tau ``definition``.

    Raises:
        ComparisonError: when they differ in mode, method, block size, max new tokens,
            target or prompts and ``allow_mismatch`` is false.
    """
    if section not in SECTIONS:
        raise UsageError(f"unknown section {section!r}; choose one of {', '.join(SECTIONS)}")
    sec_o, sec_b = section_of(ours, section), section_of(baseline, section)
    id_o, id_b = _identity(ours, sec_o, section), _identity(baseline, sec_b, section)
    engine_pair = isinstance(ours.get("engine"), dict) or isinstance(baseline.get("engine"), dict)
    if engine_pair:
        id_o, id_b = {**id_o, **parity_identity(ours)}, {**id_b, **parity_identity(baseline)}
    mismatches = [
        {"field": k, "ours": id_o[k], "baseline": id_b[k]} for k in id_o if id_o[k] != id_b[k]
    ]
    rows_o, rows_b = _by_prompt(sec_o["per_prompt"]), _by_prompt(sec_b["per_prompt"])
    only_o = sorted(set(rows_o) - set(rows_b))
    only_b = sorted(set(rows_b) - set(rows_o))
    if only_o or only_b:
        mismatches.append({"field": "prompt_ids", "ours": only_o, "baseline": only_b})
    if mismatches and not allow_mismatch:
        raise ComparisonError(mismatches)

    common = [i for i in rows_o if i in rows_b]
    per_prompt = []
    for pid in common:
        to, tb = _prompt_tau(rows_o[pid]), _prompt_tau(rows_b[pid])
        row = {"id": pid, "ours": to, "baseline": tb, **_delta_ratio(to, tb)}
        if engine_pair:
            ro, rb = rows_o[pid][0], rows_b[pid][0]
            both = ro.get("rounds") is not None and rb.get("rounds") is not None  # a client's rows have none
            row.update(tokens_equal=ro.get("tokens") == rb.get("tokens"),
                       rounds_equal=ro["rounds"] == rb["rounds"] if both else None,
                       first_round_differing=_first_difference(ro["rounds"], rb["rounds"]) if both else None)
        per_prompt.append(row)
    macro_o, macro_b = _macro([rows_o[i] for i in common]), _macro([rows_b[i] for i in common])
    pooled_o, pooled_b = _pooled([r for i in common for r in rows_o[i]]), _pooled([r for i in common for r in rows_b[i]])
    overall = {
        "ours": {"tau": macro_o, "tau_pooled": pooled_o},
        "baseline": {"tau": macro_b, "tau_pooled": pooled_b},
        **_delta_ratio(macro_o, macro_b),
        **{f"{k}_pooled": v for k, v in _delta_ratio(pooled_o, pooled_b).items()},
        "num_prompts": len(common),
    }
    warnings = []
    if ours.get("definition") != baseline.get("definition"):
        warnings.append("the two results state different tau definitions")
    if ours.get("drafter", {}).get("fingerprint") and (
        ours.get("drafter", {}).get("fingerprint") == baseline.get("drafter", {}).get("fingerprint")
    ):
        warnings.append("both results used the same drafter weights")
    parity = None
    if engine_pair:
        parity = {"num_prompts": len(per_prompt), "tokens_equal": sum(r["tokens_equal"] for r in per_prompt),
                  "rounds_equal": sum(r["rounds_equal"] is True for r in per_prompt),
                  "rounds_compared": sum(r["rounds_equal"] is not None for r in per_prompt)}
        parity["equal"] = (len(per_prompt) > 0 and parity["tokens_equal"] == len(per_prompt)
                           and parity["rounds_equal"] == parity["rounds_compared"])
    overall["ours"]["tau_token_weighted"] = _token_weighted([r for i in common for r in rows_o[i]])
    overall["baseline"]["tau_token_weighted"] = _token_weighted([r for i in common for r in rows_b[i]])
    return {
        "ok": not mismatches,
        "sides": {"ours": side_name(ours), "baseline": side_name(baseline)},
        "measured": {"ours": measured(ours, section), "baseline": measured(baseline, section)},
        "aggregations": {"tau": "per-request mean", "tau_pooled": "pooled",
                         "tau_token_weighted": "token-weighted"},
        **({"parity": parity} if parity else {}),
        "section": section,
        "mismatches": mismatches,
        "warnings": warnings,
        "overall": overall,
        "per_prompt": per_prompt,
        "only_in_ours": only_o,
        "only_in_baseline": only_b,
        "definition": "delta = ours - baseline; ratio = ours / baseline; " + taulib.DEFINITION,
    }


def measured(result: dict[str, Any], section: str = "chain") -> dict[str, Any]:
    """How a result was measured (docs/evaluation.md §1): harness, decoding, block size, prompt set, digest."""
    prompts = result.get("prompts") or {}
    return {"harness": harness.of_result(result, section if section == "all_anchor" else None),
            "decoding": harness.decoding(result), "block_size": result.get("block_size"),
            "prompt_set": (prompts.get("set") or {}).get("name"), "prompt_digest": harness.digest(prompts.get("sha256"))}


def _token_weighted(rows: list[dict[str, Any]]) -> float | None:
    """Token-weighted tau of generation rows: each row's tau weighted by the tokens its rounds committed."""
    pairs = [(sum(r["rounds"]), _row_tau(r)) for r in rows if isinstance(r.get("rounds"), list)]
    if len(pairs) != len(rows):
        return None
    den = sum(c for c, t in pairs if t is not None)
    return sum(c * t for c, t in pairs if t is not None) / den if den else None


def _first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first round where two round lists differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _by_prompt(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each prompt's rows: one, or one per sample of a sampled eval (docs/evaluation.md §2, "Sampling")."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(str(r["id"]), []).append(r)
    return out


def _prompt_tau(rows: list[dict[str, Any]]) -> float | None:
    """A prompt's tau: its row's, or the mean over its samples' (prompts stay the unit)."""
    return _mean([r.get("tau") for r in rows])


def _macro(prompts: list[list[dict[str, Any]]]) -> float | None:
    """Mean over prompts (with rounds) of each prompt's mean over its samples of their round means."""
    taus = [t for t in (_mean([_row_tau(r) for r in rows]) for rows in prompts) if t is not None]
    return sum(taus) / len(taus) if taus else None


def _row_tau(row: dict[str, Any]) -> float | None:
    """A row's mean over its rounds; a row with no per-round sequence (an engine's, from
    core.ml.engine_clients: ``rounds`` null) has its counted ``tau``."""
    return row.get("tau") if row.get("rounds") is None and "num_rounds" in row else taulib.mean_tau(row.get("rounds") or [])


def _pooled(rows: list[dict[str, Any]]) -> float | None:
    """Committed tokens over rounds, pooled over rows: from their rounds, or from the counts a
    row without a per-round sequence carries (``committed_tokens``, ``num_rounds``)."""
    committed = rounds = 0
    for r in rows:
        if r.get("rounds") is None and "num_rounds" in r:
            committed, rounds = committed + int(r.get("committed_tokens") or 0), rounds + int(r["num_rounds"] or 0)
        else:
            committed, rounds = committed + taulib.committed_tokens(r.get("rounds") or []), rounds + len(r.get("rounds") or [])
    return committed / rounds if rounds else None


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _delta_ratio(ours: float | None, base: float | None) -> dict[str, float | None]:
    if ours is None or base is None:
        return {"delta": None, "ratio": None}
    return {"delta": ours - base, "ratio": ours / base if base else None}


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("ours", help="our result.json")
    p.add_argument("baseline", help="the baseline result.json")
    p.add_argument("--section", default="chain", choices=SECTIONS, help="which figures to compare")
    p.add_argument("--out", help="write the comparison JSON here (atomic)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare anyway when mode/block size/target/prompts differ (flagged)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ours, base = load_result(args.ours), load_result(args.baseline)
    try:
        cmp = compare_results(ours, base, section=args.section, allow_mismatch=args.allow_mismatch)
    except ComparisonError as exc:
        raise UsageError(f"{exc}; pass --allow-mismatch to compare anyway") from exc
    for row in cmp["per_prompt"]:
        emit("metric", task="compare", **row)
    o = cmp["overall"]
    emit("metric", task="compare", id="overall", ours=o["ours"]["tau"], baseline=o["baseline"]["tau"],
         delta=o["delta"], ratio=o["ratio"], ok=cmp["ok"], ours_side=cmp["sides"]["ours"],
         baseline_side=cmp["sides"]["baseline"], ours_measured=cmp["measured"]["ours"],
         baseline_measured=cmp["measured"]["baseline"], **({"parity": cmp["parity"]} if "parity" in cmp else {}))
    for m in cmp["mismatches"]:
        say(f"warning: {m['field']} differs: ours={m['ours']!r} baseline={m['baseline']!r}")
    mo, mb = cmp["measured"]["ours"], cmp["measured"]["baseline"]
    across = [what for key, what in (("harness", "harnesses"), ("decoding", "decodings"),
                                     ("prompt_digest", "prompt sets")) if mo[key] != mb[key]]
    if across:  # the figures above pair them anyway: said, never silently
        say(f"warning: a comparison across {' and '.join(across)}: ours {mo['harness']}, {mo['decoding']}, prompts "
            f"{mo['prompt_digest']}; baseline {mb['harness']}, {mb['decoding']}, prompts {mb['prompt_digest']}")
    for w in cmp["warnings"]:
        say(f"warning: {w}")
    if args.out:  # written atomically, then named
        emit("result", task="compare", path=str(atomic_write_json(args.out, cmp).resolve()))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
