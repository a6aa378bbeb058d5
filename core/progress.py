"""Human progress lines from the JSON lines that ``core.ml.*`` tasks print."""

from __future__ import annotations

from core.text import json_line


def _eta(s) -> str:
    if not isinstance(s, (int, float)) or not 0 <= s < 1e12:  # NaN, inf, 400 digits: none
        return ""
    s = int(s)
    return f", ETA {s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f", ETA {s // 60}m{s % 60:02d}s"


def describe(line: str) -> str | None:
    """A one-line summary of a progress, metric or training line; None for other lines.

    Lines come from programs on hosts: one with unexpected types or nesting is plain text.
    """
    obj = json_line(line)
    if not isinstance(obj, dict):
        return None
    try:
        return _describe(obj)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
        return None


def _describe(obj: dict) -> str | None:
    if not isinstance(obj, dict):
        return None
    ev = obj.get("event")
    if ev == "progress":
        task = obj.get("task", "")
        done, total, unit = obj.get("done"), obj.get("total"), obj.get("unit", "")
        rate = obj.get("tokens_per_s")
        return (f"{task}: {done}/{total} {unit}".strip()
                + (f", {rate:,.0f} tokens/s" if isinstance(rate, (int, float)) else "")
                + _eta(obj.get("eta_s")))
    if ev == "metric" and "tau" in obj:
        return (f"{obj.get('task', '')} {obj.get('method', '')}: tau {obj['tau']:.3f}"
                + (f" (pooled {obj['tau_pooled']:.3f})" if isinstance(obj.get("tau_pooled"), float) else ""))
    if ev == "checkpoint":
        return f"checkpoint at step {obj.get('step')}: {obj.get('path')}"
    if ev is None and isinstance(obj.get("step"), int) and "loss" in obj:
        parts = [f"step {obj['step']}", f"loss {obj['loss']:.4f}"]
        if isinstance(obj.get("eal"), (int, float)):
            parts.append(f"eal {obj['eal']:.2f}")
        if isinstance(obj.get("tokens_per_s"), (int, float)):
            parts.append(f"{obj['tokens_per_s']:,.0f} tokens/s")
        return ", ".join(parts) + _eta(obj.get("eta_s"))
    return None
