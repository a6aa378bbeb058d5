"""How a tau was measured, in words every output shares (docs/evaluation.md §1, "How it was measured").

The same drafter scores about one tau apart in two harnesses, so each result names its harness
(result.json ``harness``, written by ``core.ml.eval`` and ``core.ml.engine_clients``; derived here
for results written before), its decoding and its prompt set's digest. Pure Python.

Harnesses: ``in-process online`` (specdeck's chain, docs/evaluation.md §2; ``... under ENGINE's
rule`` with ``--engine-rule``), ``offline trajectory`` and ``offline all-anchor`` (§4), ``engine
NAME VERSION`` (measured through a server specdeck started, ``--engine``) and ``client of a NAME
VERSION server`` (a server the operator runs, ``core.ml.engine_clients``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ONLINE = "in-process online"
TRAJECTORY = "offline trajectory"
ALL_ANCHOR = "offline all-anchor"

AGGREGATIONS = {
    "per-request mean": "the mean over prompts of each prompt's tau (its committed tokens over its rounds); "
                        "what z-lab and DDTree report, specdeck's 'tau' (macro)",
    "token-weighted": "each prompt's tau weighted by the tokens its rounds committed: sum(tokens * tau) / "
                      "sum(tokens), so long answers count for more",
    "pooled": "all committed tokens over all rounds, every prompt together (vLLM's 1 + accepted / drafts)",
}
"""The three aggregations of tau, by the names every output uses (docs/evaluation.md §1)."""


def _version(engine: Mapping[str, Any]) -> str:
    v = engine.get("version") or engine.get("revision") or "version unknown"
    return str(v).removeprefix("version: ").strip()


def of_result(res: Mapping[str, Any], section: str | None = None) -> str:
    """The harness of a result.json (``section``: ``all_anchor`` for that section's figures)."""
    if isinstance(res.get("harness"), str) and section is None:
        return res["harness"]
    engine = res.get("engine")
    if isinstance(engine, Mapping) and engine.get("name"):
        if engine.get("url") is not None:  # core.ml.engine_clients: a server the operator runs
            return f"client of a {engine['name']} {_version(engine)} server"
        return f"engine {engine['name']} {_version(engine)}"
    if res.get("mode") == "offline":
        return ALL_ANCHOR if section == "all_anchor" else TRAJECTORY
    rule = (res.get("drafter") or {}).get("engine_rule") if isinstance(res.get("drafter"), Mapping) else None
    if isinstance(rule, Mapping) and rule.get("engine"):
        return f"{ONLINE} under {rule['engine']}'s rule"
    return ONLINE


def of_settings(s: Mapping[str, Any]) -> str:
    """The harness of stored eval rows' settings (rows stored before ``harness`` was: derived from
    ``mode``, ``engine`` and ``engine_rule`` as :func:`of_result` derives it)."""
    if isinstance(s.get("harness"), str):
        return s["harness"]
    if s.get("engine"):
        name, _, rev = str(s["engine"]).partition("@")
        return f"engine {name} {rev if rev not in ('', 'None') else 'version unknown'}"
    if s.get("mode") == "offline":
        return TRAJECTORY
    if s.get("engine_rule"):
        return f"{ONLINE} under {str(s['engine_rule']).partition('@')[0]}'s rule"
    return ONLINE


def decoding(s: Mapping[str, Any]) -> str:
    """``greedy``, or ``T 0.7, top-p 0.95, top-k 20`` (the filters only where they filter)."""
    t = s.get("temperature")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or t == 0:
        return "greedy"
    parts = [f"T {t:g}"]
    p, k = s.get("top_p"), s.get("top_k")
    if isinstance(p, (int, float)) and p != 1:
        parts.append(f"top-p {p:g}")
    if isinstance(k, (int, float)) and k:
        parts.append(f"top-k {k:g}")
    return ", ".join(parts)


def digest(sha256: Any) -> str:
    """A prompt set's digest as shown: the first 12 hex digits of its sha256 (``?`` when unknown)."""
    return str(sha256)[:12] if isinstance(sha256, str) and sha256 else "?"


__all__ = ["ONLINE", "TRAJECTORY", "ALL_ANCHOR", "AGGREGATIONS", "of_result", "of_settings", "decoding", "digest"]
