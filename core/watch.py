"""Tau over training: ``watch_eval`` on a train item (see issue 10).

Validation lives here so plans can already declare it; the watcher itself evaluates each new
checkpoint of a live train run on the named host.
"""

from __future__ import annotations

KEYS = {"every", "host", "target", "prompts", "baseline", "mode", "max_prompts", "cache",
        "block_size", "max_new_tokens", "alerts"}


def validate_watch(spec, plan, item) -> list[tuple[tuple, str]]:
    out: list[tuple[tuple, str]] = []
    if not isinstance(spec, dict):
        return [((), "watch_eval must be a mapping")]
    for k in spec:
        if k not in KEYS:
            out.append(((k,), f"unknown key {k!r} (known: {', '.join(sorted(KEYS))})"))
    host = spec.get("host")
    if host not in plan.hosts:
        out.append((("host",), f"unknown host {host!r}"))
    if not isinstance(spec.get("target"), str):
        out.append((("target",), "target: the target model dir on the eval host is required"))
    every = spec.get("every", "checkpoint")
    if not (every == "checkpoint" or (isinstance(every, int) and every > 0)):
        out.append((("every",), "every: a number of steps or 'checkpoint'"))
    if spec.get("mode", "offline") not in ("offline", "online"):
        out.append((("mode",), "mode: offline or online"))
    if spec.get("mode", "offline") == "offline" and not spec.get("cache"):
        out.append((("cache",), "offline mode needs cache: the extract_hidden dir on the eval host"))
    return out
