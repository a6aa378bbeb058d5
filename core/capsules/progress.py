"""Human text for the JSON lines that ``core.ml.*`` tasks (and trainers) print: one formatter
for every face, so the CLI's progress line and the console's log pane say the same thing.

:func:`describe` is the one-line summary of a progress, metric, checkpoint or training line
(``codemodel: 35/600 steps, 6,933 tokens/s, ETA 1m23s``; ``v5 ddtree-16: tau 3.218``): the
CLI prints it as each run's progress. :func:`record_text` is what the log pane shows of any
JSON object line: that same summary, then the record's other fields as ``name value`` pairs
(``· loss 2.341``; nested records flattened to ``layers[0].type full``, never a Python repr),
so nothing a line carries is hidden and no figure reads as ``tokens_per_s 1.17e+04``.

Lines come from programs on hosts: a line with unexpected types or nesting gives no summary
(and its pairs as found); nothing here raises on what a line holds.
"""

from __future__ import annotations

import json

from core.text import json_line

SEP = " · "
"""Between the summary and each other field of a record (the log pane's pairs)."""


def _eta(s) -> str:
    if not isinstance(s, (int, float)) or not 0 <= s < 1e12:  # NaN, inf, 400 digits: none
        return ""
    s = int(s)
    return f", ETA {s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f", ETA {s // 60}m{s % 60:02d}s"


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def describe(line: str) -> str | None:
    """A one-line summary of a progress, metric or training line; None for other lines.

    Lines come from programs on hosts: one with unexpected types or nesting is plain text.
    """
    obj = json_line(line)
    if not isinstance(obj, dict):
        return None
    got = summary(obj)
    return got[0] if got else None


def summary(obj: dict) -> tuple[str, frozenset[str]] | None:
    """``obj``'s one-line summary and the fields it says (the rest are for
    :func:`record_text`'s pairs); None when ``obj`` is no record this module knows."""
    try:
        return _summary(obj)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
        return None


def _method(obj: dict) -> str:
    """``chain``, or ``ddtree-16`` (with its budget: the row label ``compare`` shows)."""
    method, budget = obj.get("method", ""), obj.get("budget")
    if method == "ddtree" and isinstance(budget, int) and not isinstance(budget, bool):
        return f"ddtree-{budget}"
    return str(method)


def _summary(obj: dict) -> tuple[str, frozenset[str]] | None:
    ev = obj.get("event")
    label = obj.get("label") if isinstance(obj.get("label"), str) and obj.get("label") else None
    if ev == "progress":
        # a task measuring several drafters one after the other names which one this is
        task = f"{obj.get('task', '')} {label}" if label else obj.get("task", "")
        done, total, unit = obj.get("done"), obj.get("total"), obj.get("unit", "")
        rate = obj.get("tokens_per_s")
        text = (f"{task}: {done}/{total} {unit}".strip()
                + (f", {rate:,.0f} tokens/s" if _is_number(rate) else "")
                + _eta(obj.get("eta_s")))
        return text, frozenset({"event", "task", "label", "done", "total", "unit",
                                "tokens_per_s", "eta_s"})
    if ev == "metric" and "tau" in obj:
        who = label or obj.get("task", "")
        pooled = obj.get("tau_pooled")
        text = (" ".join(x for x in (who, _method(obj)) if x) + f": tau {obj['tau']:.3f}"
                + (f" (pooled {pooled:.3f})" if isinstance(pooled, float) else ""))
        return text, frozenset({"event", "task", "label", "method", "budget", "tau",
                                "tau_pooled"})
    if ev == "checkpoint":
        return (f"checkpoint at step {obj.get('step')}: {obj.get('path')}",
                frozenset({"event", "step", "path"}))
    if ev is None and isinstance(obj.get("step"), int) and "loss" in obj:
        parts = [f"step {obj['step']}", f"loss {obj['loss']:.4f}"]
        if _is_number(obj.get("eal")):
            parts.append(f"eal {obj['eal']:.2f}")
        if _is_number(obj.get("tokens_per_s")):
            parts.append(f"{obj['tokens_per_s']:,.0f} tokens/s")
        return (", ".join(parts) + _eta(obj.get("eta_s")),
                frozenset({"step", "loss", "eal", "tokens_per_s", "eta_s"}))
    return None


def record_text(line: str) -> str | None:
    """What a person reads of a JSON object line: :func:`summary` (when the record has one),
    then every other field as ``name value`` pairs, joined by :data:`SEP`; None when
    ``line`` is not a JSON object."""
    obj = json_line(line)
    if not isinstance(obj, dict):
        return None
    got = summary(obj)
    if got is None:
        return SEP.join(pairs(obj))
    text, said = got
    return SEP.join([text, *pairs({k: v for k, v in obj.items() if k not in said})])


def number(v) -> str:
    """A JSON scalar as a reader expects it: ``true``, ``null``, 4 significant digits, and
    no exponent below a trillion (``11,700``, not ``1.17e+04``)."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if not isinstance(v, float):
        return str(v)
    if 1e4 <= abs(v) < 1e12:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def pairs(rec: dict, prefix: str = "") -> list[str]:
    """``name value`` for each field of ``rec`` (nested records flattened, see :func:`_value`)."""
    out = []
    for k, v in rec.items():
        out += _value(f"{prefix}{k}", v)
    return out


def _value(name: str, v) -> list[str]:
    """``name value`` pairs of one JSON value: a record or a list holding records is
    flattened (``layers[0].type full``), a list of scalars stays one pair."""
    if isinstance(v, dict):
        return pairs(v, f"{name}.") if v else [f"{name} {{}}"]
    if isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
        return [p for i, x in enumerate(v) for p in _value(f"{name}[{i}]", x)]
    if isinstance(v, list):
        return [f"{name} " + " ".join(number(x) for x in v)]
    return [f"{name} {number(v)}"]
