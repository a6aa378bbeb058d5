"""What an eval's result.json may hold, checked once wherever one is read (issue 42 §7).

``core.ml.eval`` writes result.json, but the file that comes back may have been edited by a
person or written by another tool: a tau that is a string, rounds that are negative or larger
than the block, a prompt row that is not an object, a count of 10**30. The readers (the eval
action's ``finish``, which stores its rows; ``specdeck parity`` through
:meth:`core.session.Session.eval_result`; ``python -m core.ml.compare`` and ``core.ml.parity``
through :func:`core.ml.measure.compare.load_result`; the detached tau watcher's result files) all call
:func:`problem`, which names the first thing wrong: the section, the prompt and the field. Each
reader turns it into its own refusal (exit 2 for the commands), so a hostile file never becomes
an internal error or a figure.

Only the fields specdeck reads are checked; others are left as they are. Pure Python.
"""

from __future__ import annotations

from typing import Any

from core.ml.formats import bounds

SECTIONS = ("ddtree", "all_anchor")
"""Sections beside the top-level (chain) figures, each with its own ``per_prompt``."""

MAX_ROWS = 1_000_000
"""Most per-prompt rows a section may have (a real set has 8 to a few thousand)."""

TAU_MAX = float(bounds.COUNT_MAX)
"""Largest tau a result may state: tau is at most the block size, itself a count."""

_COUNTS = {"prompt_len": 0, "sample": 0, "num_rounds": 0, "committed_tokens": 0, "target_forwards": 0,
           "target_tokens": 0, "drafter_forwards": 0}
"""A row's count fields and their lowest value."""


def problem(res: Any) -> str | None:
    """What is wrong with a result.json's content (the first thing found), or None."""
    if not isinstance(res, dict):
        return f"holds {type(res).__name__}, not an object"
    why = _settings(res)
    if why:
        return why
    block = res.get("block_size") if bounds.is_int(res.get("block_size")) else bounds.COUNT_MAX
    for name in (None, *SECTIONS):
        sec = res if name is None else res.get(name)
        if name is not None and sec is None:
            continue
        where = "" if name is None else f"{name}: "
        if not isinstance(sec, dict):
            return f"'{name}' is {bounds.show(sec)}, not an object"
        rows = sec.get("per_prompt")
        if not isinstance(rows, list) or len(rows) > MAX_ROWS:
            return f"{where}'per_prompt' is {_kind(rows)}, not a list of at most {MAX_ROWS:,} prompt rows"
        for k in ("tau", "tau_pooled"):
            why = _figure(sec.get(k))
            if why:
                return f"{where}'{k}' {why}"
        if name == "ddtree" and sec.get("budget") is not None and bounds.count(sec["budget"]):
            return f"ddtree: 'budget' {bounds.count(sec['budget'])}"
        for i, row in enumerate(rows):
            why = _row(row, block)
            if why:
                label = f"prompt {bounds.show(row.get('id'))} " if isinstance(row, dict) else ""
                return f"{where}{label}(per_prompt[{i}]): {why}"
    return None


def _settings(res: dict[str, Any]) -> str | None:
    """The top-level settings the readers compare and show."""
    checks = {"block_size": bounds.count, "max_new_tokens": bounds.count, "samples": bounds.count,
              "top_k": lambda v: bounds.count(v, 0), "seed": bounds.seed64, "temperature": bounds.finite,
              "top_p": bounds.finite}
    for key, check in checks.items():
        if res.get(key) is not None and check(res[key]):
            return f"'{key}' {check(res[key])}"
    for key in ("mode", "definition", "accounting", "dtype", "method", "kind", "harness"):
        if res.get(key) is not None and not isinstance(res[key], str):
            return f"'{key}' is {bounds.show(res[key])}, not text"
    for key in ("target", "prompts", "drafter", "engine", "template", "sequential"):
        if res.get(key) is not None and not isinstance(res[key], dict):
            return f"'{key}' is {_kind(res[key])}, not an object"
    stops = res.get("stop_token_ids")
    if stops is not None and (not isinstance(stops, list) or any(bounds.count(t, 0) for t in stops)):
        return "'stop_token_ids' is not a list of token ids (integers >= 0)"
    return None


def _row(row: Any, block: int) -> str | None:
    """One per-prompt row: its id, figures, rounds, tokens and counts."""
    if not isinstance(row, dict):
        return f"is {_kind(row)}, not an object"
    if not (isinstance(row.get("id"), str) or bounds.is_int(row.get("id"))):
        return f"'id' is {bounds.show(row.get('id'))}, not text or an integer"
    why = _figure(row.get("tau"))
    if why:
        return f"'tau' {why}"
    rounds = row.get("rounds")
    if rounds is not None:
        if not isinstance(rounds, list):
            return f"'rounds' is {_kind(rounds)}, not a list"
        bad = next((r for r in rounds if bounds.count(r, 0, block)), None)
        if bad is not None:
            return (f"'rounds' holds {bounds.show(bad)}: a round commits an integer number of tokens "
                    f"from 0 to the block size ({block})")
    tokens = row.get("tokens")
    if tokens is not None and (not isinstance(tokens, list) or any(bounds.count(t, 0) for t in tokens)):
        return "'tokens' is not a list of token ids (integers >= 0)"
    for key, low in _COUNTS.items():
        if row.get(key) is not None and bounds.count(row[key], low, bounds.INT64_MAX):
            return f"'{key}' {bounds.count(row[key], low, bounds.INT64_MAX)}"
    if row.get("seed") is not None and bounds.seed64(row["seed"]):
        return f"'seed' {bounds.seed64(row['seed'])}"
    if row.get("stopped") is not None and not isinstance(row["stopped"], bool):
        return f"'stopped' is {bounds.show(row['stopped'])}, not true or false"
    shares = row.get("per_position_acceptance")
    if shares is not None and (not isinstance(shares, list) or any(_share(x) for x in shares)):
        return "'per_position_acceptance' is not a list of shares (numbers from 0 to 1)"
    return None


def _figure(v: Any) -> str | None:
    """A tau (null allowed: a prompt without rounds): a finite number from 0 to :data:`TAU_MAX`."""
    if v is None or (bounds.finite(v) is None and 0 <= v <= TAU_MAX):
        return None
    return f"is {bounds.show(v)}, not a number from 0 to {TAU_MAX:g}"


def _share(v: Any) -> bool:
    return bounds.finite(v) is not None or not 0 <= v <= 1


def _kind(v: Any) -> str:
    return "null" if v is None else f"a {type(v).__name__}" if isinstance(v, (dict, list)) else bounds.show(v)
