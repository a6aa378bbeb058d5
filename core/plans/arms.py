"""A campaign's arms: one template of items run once per arm, each arm changing a few params.

An ablation trains, strips, relays and evaluates the same drafter several times, each time
with one knob changed. Written out by hand that is the same four items copied per arm, and
the copies drift. A plan declares the arms once, and marks the items that are run per arm::

    arms:
      against: v4                       # compare --arms: each arm against this drafter
      each:                             # arm name -> {template item: the params it changes}
        noise: {train: {overrides: {noise.target: fc_input}}}
        taps:  {train: {overrides: {fc_layers: taps}}}
    items:
      - id: features                    # a shared item: runs once
        ...
      - id: train
        arms: all                       # a template: train[noise], train[taps]
        needs: [features]
        action: {kind: train, host: gpu, params: {config: train/v4.yaml, out: runs/${arm}}}

The shape follows what GitHub Actions' ``strategy.matrix`` and Ansible's ``loop`` taught
their users: the values vary in one place (the matrix, the loop's list), the job or task is
written once and refers to them (``${arm}``, as ``${{ matrix.x }}`` / ``{{ item }}`` do),
and each expanded copy is named after what varies (``train[noise]``, as Actions names a
matrix job ``build (3.11)``). Unlike a matrix, arms are listed, not crossed: an ablation
changes one knob per arm, and a cross product of knobs is rarely what anyone can afford to
train.

What expansion does, before anything else reads the items (:func:`expand`, called by
:mod:`core.plans.planfile`):

* a template item (``arms: all`` or ``arms: [a, b]``) becomes one item per arm, id
  ``TEMPLATE[ARM]``, ``${arm}`` replaced by the arm's name in its strings, and the arm's
  params for it merged over its ``action.params`` (mappings key by key);
* a template's ``needs``/``after`` naming another template means that template's item of the
  same arm (an arm's items need their own predecessors only); a shared item naming a
  template needs every arm's;
* every position (file:line:col) stays the one written: an expanded item's problems point
  at its template, a param an arm set at the arm, and an arm that changes a param its
  template's action does not have is refused there, naming the arm and the item.

Adding an arm adds items with new ids, so nothing that ran is touched; removing one removes
its items from the plan and leaves their runs and results in the store (``compare`` reads
every stored result).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from core.text import did_you_mean, short

ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}\Z")
"""An arm's name: it becomes part of item ids (``train[noise]``), run ids and paths."""
ARM_ITEM = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,63})\[([A-Za-z0-9][A-Za-z0-9_.-]{0,31})\]\Z")
"""An expanded item's id, ``TEMPLATE[ARM]``: only expansion makes one."""
_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
ARM_REF = "${arm}"
"""Replaced by the arm's name in a template's strings."""
ALL = "all"
MAX_EXPANDED = 20_000
"""Most items expansion may make (arms x template items): an ablation has a handful of arms,
and a plan that would expand to more is refused before a copy is made."""


@dataclass(frozen=True)
class Arm:
    """One arm: its name and the params it changes, per template item."""

    name: str
    changes: dict
    """``{template id: {param: value}}`` as written (only params the template's action has)."""

    @property
    def knob(self) -> tuple[str, ...]:
        """What the arm changes, one ``key=value`` per leaf (a trainer override's dotted key
        as written; the template named when the arm changes more than one), e.g.
        ``("noise.target=fc_input",)``; ``()`` for an arm that changes nothing (a control)."""
        out: list[str] = []
        many = len(self.changes) > 1
        for tid, params in self.changes.items():
            for key, value in _leaves(params, ()):
                shown = ".".join(k for k in key if k != "overrides") or key[-1]
                where = f"{tid}: " if many else ""
                text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                out.append(f"{where}{shown}={text}")
        return tuple(out)


@dataclass(frozen=True)
class ArmSet:
    """A plan's ``arms:`` block."""

    arms: tuple[Arm, ...]
    against: str | None = None
    """The drafter label (as ``compare`` prints it) every arm is compared with
    (``compare --arms``); None: give it there."""
    templates: tuple[str, ...] = ()
    """The template items' ids, in file order."""

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arms)


ARM_STATES = ("failed", "stopped", "in_progress", "pending", "skipped", "done")
"""How an arm's items' statuses sum up: the first of these any of them has (an arm is done
when every item is)."""


def arm_state(statuses: list[str]) -> str:
    """An arm's state from its items' statuses: ``failed`` if any failed, ``stopped``,
    ``in_progress``, ``pending``, ``skipped`` likewise, ``done`` when all are."""
    for s in ARM_STATES:
        if s in statuses:
            return s
    return "pending"


def _leaves(d: Any, prefix: tuple) -> list[tuple[tuple, Any]]:
    if isinstance(d, dict) and d:
        return [leaf for k, v in d.items() for leaf in _leaves(v, prefix + (str(k),))]
    return [(prefix, d)]


def _merge(base: Any, over: Any) -> Any:
    """``over`` over ``base``: mappings merged key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base.get(k), v)
        return out
    return copy.deepcopy(over)


def _substitute(value: Any, arm: str) -> Any:
    if isinstance(value, str):
        return value.replace(ARM_REF, arm)
    if isinstance(value, list):
        return [_substitute(x, arm) for x in value]
    if isinstance(value, dict):
        return {k: _substitute(x, arm) for k, x in value.items()}
    return value


def arm_labels(plan) -> list[tuple[str, str, tuple]]:
    """``(arm, the label its eval item gives its drafter, its knob)`` per arm of ``plan`` (a
    :class:`core.plans.plan.Plan` with arms); an arm without an eval item is left out."""
    out = []
    for arm in plan.arms.arms:
        evals = [it for it in plan.arm_items(arm.name) if it.action and it.action.kind == "eval"]
        if evals:
            params = evals[0].action.params
            out.append((arm.name, params.label or params.drafter, arm.knob))
    return out


Error = Callable[..., None]
"""``error(path, message, item=..., field_path=..., key=...)``: the plan validator's."""


def expand(loc, error: Error, fields_of: Callable[[Any], list[str] | None]
           ) -> tuple[ArmSet | None, dict[int, tuple[str, str]]]:
    """Expand ``loc.data``'s template items (``loc.data`` becomes a copy with the expanded
    items; their positions move with them).

    Args:
        loc: the plan's located values (``data``, ``key_marks``, ``value_marks``).
        error: reports a problem at a path of the file as written.
        fields_of: an action kind -> its params' names (None: no such kind).

    Returns:
        The arms (None when the plan declares none) and, for each expanded item's new index
        in ``items``, ``(template id, arm name)``.
    """
    data = loc.data
    items = data.get("items") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None, {}
    raw = data.get("arms")
    if raw is None and not any(isinstance(it, dict) and "arms" in it for it in items):
        return None, {}
    # expanded on a copy: values built in memory (an import) stay as their caller made them
    loc.data = data = {**data, "items": copy.deepcopy(items)}
    items = data["items"]
    templates = {i: it for i, it in enumerate(items) if isinstance(it, dict) and "arms" in it}
    if raw is None:
        for i, it in templates.items():
            error(("items", i, "arms"), "arms: makes this item a template run once per arm, "
                  "but the plan declares no arms (add a top-level arms: {each: {NAME: {}}})",
                  item=_label(it, i), field_path=("arms",), key=True)
            del it["arms"]
        return None, {}
    arms = _parse_block(raw, error)
    if arms is None:  # reported
        return _unexpanded(items, templates)
    names = [a.name for a in arms.arms]
    subsets: dict[str, list[str]] = {}
    for i, it in templates.items():
        tid = it.get("id")
        if not isinstance(tid, str) or not _SLUG.match(tid):
            continue  # its id is reported as an id problem
        subsets[tid] = _subset(it.pop("arms"), names, ("items", i, "arms"), tid, error)
    for i, it in templates.items():
        it.pop("arms", None)
    made = sum(len(s) for s in subsets.values())
    if made > MAX_EXPANDED:
        error(("arms", "each"), f"{len(names)} arms x {len(subsets)} template items would make "
              f"{made:,} items; a plan's arms make at most {MAX_EXPANDED:,}",
              field_path=("arms", "each"))
        return _unexpanded(items, templates)
    arms = _checked_changes(arms, items, subsets, error, fields_of)
    origins = _rewrite(loc, items, arms, subsets)
    return ArmSet(arms.arms, arms.against, tuple(subsets)), origins


def _unexpanded(items: list, templates: dict[int, dict]) -> tuple[None, dict]:
    """Arms refused (and reported): each template is read once, as if for an arm named
    ``arm``, so its other problems are reported and ``${arm}`` is not one of them."""
    for i, it in templates.items():
        it.pop("arms", None)
        items[i] = {k: v if k in ("id", "needs", "after") else _substitute(v, "arm")
                    for k, v in it.items()}
    return None, {}


def _label(it: dict, i: int) -> str:
    iid = it.get("id")
    return iid if isinstance(iid, str) and iid else f"#{i + 1}"


def _parse_block(raw: Any, error: Error) -> ArmSet | None:
    for k in raw if isinstance(raw, dict) else ():
        if k not in ("against", "each"):
            error(("arms", k), f"arms: unknown key {k!r} (known: against, each)"
                  + did_you_mean(str(k), ("against", "each")), field_path=("arms", k), key=True)
    if not isinstance(raw, dict) or not isinstance(raw.get("each"), dict) or not raw["each"]:
        error(("arms",), "arms: a mapping {against: LABEL, each: {ARM: {TEMPLATE_ITEM: "
              "{PARAM: VALUE}}}} with at least one arm", field_path=("arms",))
        return None
    against = raw.get("against")
    if against is not None and (not isinstance(against, str) or not against.strip()):
        error(("arms", "against"), f"arms.against: the drafter label each arm is compared "
              f"with (compare --arms), got {short(against)}", field_path=("arms", "against"))
        against = None
    out = []
    for name, changes in raw["each"].items():
        p = ("arms", "each", name)
        if not isinstance(name, str) or not ARM_NAME.match(name):
            error(p, f"arm name {name!r} must be a slug (letters, digits, _ . -; 32 at most): "
                  "it becomes part of item ids", field_path=p, key=True)
            continue
        if changes is None:
            changes = {}
        if not isinstance(changes, dict) or not all(isinstance(v, dict) for v in
                                                     changes.values()):
            error(p, f"arm {name!r}: a mapping {{TEMPLATE_ITEM: {{PARAM: VALUE}}}} (the params "
                  f"it changes), got {short(changes)}", item=None, field_path=p)
            continue
        out.append(Arm(name, changes))
    return ArmSet(tuple(out), against)


def _subset(raw: Any, names: list[str], path: tuple, tid: str, error: Error) -> list[str]:
    """A template's ``arms:``: ``all`` or a list of arm names."""
    if raw == ALL:
        return list(names)
    if not isinstance(raw, list) or not raw or not all(isinstance(x, str) for x in raw):
        error(path, f"arms: `all` or a list of arm names (declared: {', '.join(names)}), got "
              f"{short(raw)}", item=tid, field_path=("arms",))
        return []
    out = []
    for j, n in enumerate(raw):
        if n not in names:
            error(path + (j,), f"unknown arm {n!r} (declared: {', '.join(names)})"
                  + did_you_mean(n, names), item=tid, field_path=("arms",))
        elif n not in out:
            out.append(n)
    return [n for n in names if n in out]


def _checked_changes(arms: ArmSet, items: list, subsets: dict[str, list[str]], error: Error,
                     fields_of: Callable[[Any], list[str] | None]) -> ArmSet:
    """Each arm's changes, keeping only those naming a template it applies to and a param
    that template's action has; every other one is reported at the arm, naming both."""
    by_id = {it.get("id"): it for it in items if isinstance(it, dict)}
    out = []
    for arm in arms.arms:
        kept: dict = {}
        for tid, params in arm.changes.items():
            p = ("arms", "each", arm.name, tid)
            if tid not in subsets:
                error(p, f"arm {arm.name!r} changes item {tid!r}, which is no template (give "
                      f"it arms: all; templates: {', '.join(subsets) or 'none'})"
                      + did_you_mean(str(tid), subsets), field_path=p, key=True)
                continue
            if arm.name not in subsets[tid]:
                error(p, f"arm {arm.name!r} changes item {tid!r}, whose arms: leaves it out",
                      item=f"{tid}[{arm.name}]", field_path=p, key=True)
                continue
            action = by_id[tid].get("action")
            kind = action.get("kind") if isinstance(action, dict) else None
            known = fields_of(kind) if kind is not None else None
            if known is None:
                error(p, f"arm {arm.name!r} changes params of item {tid!r}, which has no "
                      "action with params", item=f"{tid}[{arm.name}]", field_path=p, key=True)
                continue
            good = {}
            for k, v in params.items():
                if k in known:
                    good[k] = v
                    continue
                error(p + (k,), f"arm {arm.name!r}, item {tid!r}: unknown param {k!r} of a "
                      f"{kind} action (known: {', '.join(sorted(known))})"
                      + did_you_mean(str(k), known), item=f"{tid}[{arm.name}]",
                      field_path=("action", "params", k), key=True)
            if good:
                kept[tid] = good
        out.append(Arm(arm.name, kept))
    return ArmSet(tuple(out), arms.against)


def _rewrite(loc, items: list, arms: ArmSet, subsets: dict[str, list[str]]
             ) -> dict[int, tuple[str, str]]:
    """Replace ``items`` by the expanded list and move every item position to its new index
    (a param an arm set: the arm's position)."""
    new: list = []
    moved: list[tuple[int, int, str | None]] = []  # (old index, new index, arm)
    origins: dict[int, tuple[str, str]] = {}

    def each(deps: Any, arm: str | None) -> Any:
        if isinstance(deps, str):
            deps = [deps]
        if not isinstance(deps, list):
            return deps
        out = []
        for d in deps:
            if d in subsets and arm is not None:
                out.append(f"{d}[{arm}]" if arm in subsets[d] else d)
            elif d in subsets:
                out += [f"{d}[{a}]" for a in subsets[d]]
            else:
                out.append(d)
        return out

    for i, it in enumerate(items):
        tid = it.get("id") if isinstance(it, dict) else None
        if tid not in subsets:
            if isinstance(it, dict):
                for key in ("needs", "after"):
                    if key in it:
                        it[key] = each(it[key], None)
            moved.append((i, len(new), None))
            new.append(it)
            continue
        for arm in subsets[tid]:
            copy_ = {k: (v if k in ("needs", "after") else _substitute(copy.deepcopy(v), arm))
                     for k, v in it.items()}
            copy_["id"] = f"{tid}[{arm}]"
            for key in ("needs", "after"):
                if key in copy_:
                    copy_[key] = each(copy_[key], arm)
            change = arms.arm(arm).changes.get(tid)
            if change and isinstance(copy_.get("action"), dict):
                params = copy_["action"].get("params")
                copy_["action"]["params"] = _merge(params if isinstance(params, dict) else {},
                                                   change)
            origins[len(new)] = (tid, arm)
            moved.append((i, len(new), arm))
            new.append(copy_)
    items[:] = new
    for marks in (loc.key_marks, loc.value_marks):
        by_item: dict[int, list] = {}
        by_arm: dict[tuple, list] = {}
        kept = {}
        for p, m in marks.items():
            if len(p) > 1 and p[0] == "items":
                by_item.setdefault(p[1], []).append((p[2:], m))
            else:
                kept[p] = m
                if len(p) > 4 and p[:2] == ("arms", "each"):
                    by_arm.setdefault(p[2:4], []).append((p[4:], m))
        for old, j, arm in moved:
            for rest, m in by_item.get(old, ()):
                kept[("items", j) + rest] = m
            if arm is not None:
                for rest, m in by_arm.get((arm, origins[j][0]), ()):
                    kept[("items", j, "action", "params") + rest] = m
        marks.clear()
        marks.update(kept)
    return origins


__all__ = ["Arm", "ArmSet", "arm_labels", "arm_state", "expand", "ARM_ITEM", "ARM_NAME"]
