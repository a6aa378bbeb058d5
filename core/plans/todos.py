"""todowrite interop: a todo list (``[{content, status, priority}]``) to plan YAML and back,
and a plan as Markdown. Todo files are untrusted input: bounded, checked, clear errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from core.errors import InvalidInput
from core.plans.plan import PRIORITIES, Plan
from core.text import sanitize, short

# -- todowrite interop --------------------------------------------------------------------
_TODO_IN = {"completed": "done", "done": "done", "pending": "pending",
            "in_progress": "in_progress", "failed": "failed", "stopped": "stopped",
            "skipped": "skipped",
            "cancelled": "skipped"}
_TODO_OUT = {"done": "completed"}


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", text.lower()).strip("-")
    if len(s) > 40:  # cut at a word boundary, not inside a word
        cut = s[:41].rfind("-")
        s = s[:cut] if cut >= 12 else s[:40]
    return s.rstrip("-") or "item"


MAX_TODOS_BYTES = 8 << 20
MAX_TODO_TEXT = 4000


def load_todos(path: str | Path) -> Any:
    """Read a todowrite JSON file (untrusted): bounded size and depth, UTF-8, clear errors."""
    from core.text import MAX_JSON_DEPTH

    from core.text import read_bounded

    src = Path(path)
    raw = read_bounded(src, MAX_TODOS_BYTES, "todo list (JSON file)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{src}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    depth = 0
    for ch in text if text.count("[") + text.count("{") > MAX_JSON_DEPTH else "":
        if ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise InvalidInput(f"{src}: JSON nested more than {MAX_JSON_DEPTH} levels deep; "
                                   "a todo list is a flat list of objects")
        elif ch in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidInput(f"{src}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except (ValueError, RecursionError) as e:
        raise InvalidInput(f"{src}: invalid JSON: {e}") from None


def todos_to_plan_yaml(todos: Any, name: str, source: str = "<todos>") -> str:
    """A todowrite JSON list (``[{content, status, priority}]``) -> plan YAML text."""
    return plan_yaml(todos_to_plan(todos, name, source))


def todos_to_plan(todos: Any, name: str, source: str = "<todos>") -> dict:
    """A todowrite JSON list (``[{content, status, priority}]``) -> the plan's values."""
    if not isinstance(todos, list):
        raise InvalidInput(f"{source}: expected a JSON list of {{content, status, priority}}")
    items = []
    used: set[str] = set()
    next_n: dict[str, int] = {}
    """Per base id, the suffix to try next: each entry costs O(1), not O(its duplicates)."""
    given: dict[str, str] = {}
    """A todo's own id -> the item id it became (needs name todos by their ids)."""
    for i, t in enumerate(todos):
        where = f"{source}: entry #{i + 1}"
        if not isinstance(t, dict):
            raise InvalidInput(f"{where}: expected an object with content, status, priority")
        unknown = set(t) - {"content", "status", "priority", "id", "activeForm", "needs"}
        if unknown:
            raise InvalidInput(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        content = t.get("content")
        if not isinstance(content, str) or not content.strip():
            raise InvalidInput(f"{where}: field 'content' must be a non-empty string")
        if len(content) > MAX_TODO_TEXT:
            raise InvalidInput(f"{where}: field 'content' is {len(content)} characters; "
                               f"{MAX_TODO_TEXT} at most")
        # Terminal controls and escape sequences never reach the plan (nor a terminal).
        content = sanitize(content, max_len=MAX_TODO_TEXT).strip() or "item"
        status = t.get("status", "pending")
        if not isinstance(status, str) or status not in _TODO_IN:
            raise InvalidInput(f"{where}: field 'status' must be one of "
                               f"{', '.join(sorted(_TODO_IN))}, got {short(status)}")
        prio = t.get("priority", "medium")
        if not isinstance(prio, str) or prio not in PRIORITIES:
            raise InvalidInput(f"{where}: field 'priority' must be one of "
                               f"{', '.join(PRIORITIES)}, got {short(prio)}")
        tid = t.get("id")
        if tid is not None and not isinstance(tid, (str, int)) or isinstance(tid, bool):
            raise InvalidInput(f"{where}: field 'id' must be a string or a number")
        base = _slug(str(tid)) if tid is not None else _slug(content)
        iid, n = base, next_n.get(base, 2)
        while iid in used:
            iid, n = f"{base}-{n}", n + 1
        next_n[base] = n
        used.add(iid)
        if t.get("id") is not None:
            given[str(t["id"])] = iid
        needs = t.get("needs", [])
        if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
            raise InvalidInput(f"{where}: field 'needs' must be a list of ids")
        items.append({"id": iid, "content": content, "priority": prio,
                      "status": _TODO_IN[status], **({"needs": list(needs)} if needs else {})})
    for i, it in enumerate(items):
        for n in it.get("needs", []):
            if n not in given:
                raise InvalidInput(f"{source}: entry #{i + 1}: needs {n!r}, which no entry's "
                                   "id is")
        if "needs" in it:
            it["needs"] = [given[n] for n in it["needs"]]
    return {"name": _slug(name), "hosts": {}, "vars": {}, "items": items}


def plan_yaml(doc: dict) -> str:
    """Plan values (strings, lists and mappings, as :func:`todos_to_plan` builds them) as
    YAML text.

    Written as an event stream straight to the C emitter (``yaml.CSafeDumper``; the Python
    one where libyaml is missing): PyYAML's representer, pure Python even in front of the C
    emitter, took 40 of the 60 s a 100,000-item import spent. A string is written plain
    when it would read back as that string, else double-quoted (the emitter escapes it)."""
    from yaml.events import (DocumentEndEvent, DocumentStartEvent, MappingEndEvent,
                             MappingStartEvent, ScalarEvent, SequenceEndEvent,
                             SequenceStartEvent, StreamEndEvent, StreamStartEvent)

    resolver = yaml.resolver.Resolver()
    scalars: dict[str, ScalarEvent] = {}  # one event per distinct string (keys, statuses)

    def scalar(x) -> ScalarEvent:
        s = str(x)
        ev = scalars.get(s)
        if ev is None:
            plain = (s == s.strip() and "\n" not in s and ": " not in s and " #" not in s
                     and len(s) < 200 and resolver.resolve(yaml.ScalarNode, s, (True, False))
                     == "tag:yaml.org,2002:str")
            ev = ScalarEvent(None, None, (True, True), s, style=None if plain else '"')
            if len(s) < 64:
                scalars[s] = ev
        return ev

    def value(x, out: list, flow: bool) -> None:
        if isinstance(x, dict):
            out.append(MappingStartEvent(None, None, True, flow_style=flow))
            for k, v in x.items():
                out.append(scalar(k))
                value(v, out, flow or k in ("hosts", "vars", "needs"))
            out.append(MappingEndEvent())
        elif isinstance(x, list):
            out.append(SequenceStartEvent(None, None, True, flow_style=flow and bool(x)))
            for v in x:
                value(v, out, flow)
            out.append(SequenceEndEvent())
        else:
            out.append(scalar(x))

    def stream():
        yield StreamStartEvent()
        yield DocumentStartEvent(explicit=False)
        yield MappingStartEvent(None, None, True, flow_style=False)
        for k, v in doc.items():
            yield scalar(k)
            if k != "items" or not isinstance(v, list):
                out: list = []
                value(v, out, k in ("hosts", "vars"))
                yield from out
                continue
            yield SequenceStartEvent(None, None, True, flow_style=False)
            for it in v:  # the items, one at a time (a flat loop: 100,000 of them)
                out = []
                value(it, out, False)
                yield from out
            yield SequenceEndEvent()
        yield MappingEndEvent()
        yield DocumentEndEvent(explicit=False)
        yield StreamEndEvent()

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.emit(stream(), Dumper=dumper, allow_unicode=True, width=100)


def plan_to_todos(plan: Plan, statuses: dict[str, str]) -> list[dict]:
    """The plan's current state as a todowrite list (done is written as ``completed``)."""
    out = []
    for it in plan.items:
        st = statuses.get(it.id, it.status or "pending")
        out.append({"content": it.content, "status": _TODO_OUT.get(st, st),
                    "priority": it.priority, "id": it.id,
                    **({"needs": list(it.needs)} if it.needs else {})})
    return out


def plan_to_markdown(plan: Plan, statuses: dict[str, str]) -> str:
    """The plan's state as a Markdown checklist (ids and needs kept)."""
    lines = [f"# {plan.name}", ""]
    for it in plan.items:
        st = statuses.get(it.id, it.status or "pending")
        extra = [f"`{it.id}`", it.priority] + ([st] if st not in ("pending", "done") else [])
        for word, ids in (("needs", it.needs), ("after", it.after)):
            if ids:
                extra.append(f"{word} " + ", ".join(f"`{n}`" for n in ids))
        lines.append(f"- [{'x' if st == 'done' else ' '}] {it.content} ({'; '.join(extra)})")
    return "\n".join(lines) + "\n"


__all__ = ["load_todos", "todos_to_plan", "plan_yaml", "todos_to_plan_yaml", "plan_to_todos", "plan_to_markdown"]
