"""Strict JSON: every JSON file and output specdeck writes parses anywhere (issue 42 §7).

Python's ``json`` writes ``NaN``, ``Infinity`` and ``-Infinity`` for non-finite floats, which
are not JSON (RFC 8259): ``jq``, JavaScript's ``JSON.parse``, Go and Rust refuse the whole
document. A tau over no rounds, a ratio to a baseline of 0, a loss that diverged or a value
copied from a hostile result file can be non-finite, so every writer goes through
:func:`dumps`, with one convention (docs/evaluation.md, "Strict JSON"):

* a number that is not finite is written as ``null``;
* a document whose top is an object says where and what it was in ``non_finite``: a map from
  each place's JSON pointer (RFC 6901, ``/overall/0/pct_macro``) to ``"NaN"``, ``"Infinity"``
  or ``"-Infinity"``. A document with every number finite has no such key, so its text is what
  ``json.dumps`` always wrote.

``allow_nan=False`` then makes sure no such token is left. Pure Python (the laptop side, the
hosts' ``python -m core.ml.*`` tasks and the store all use it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

NON_FINITE = "non_finite"
"""The top-level key that lists the non-finite numbers written as null."""


def dumps(obj: Any, *, default: Callable[[Any], Any] | None = None, **kw: Any) -> str:
    """``json.dumps(obj, **kw)`` as strict JSON: non-finite numbers as null, listed under
    :data:`NON_FINITE` when the top is an object. ``default`` converts what JSON has no type
    for (a numpy or torch scalar) before its value is checked.

    Raises:
        TypeError: a value neither JSON nor ``default`` can convert (as ``json.dumps``).
    """
    where: dict[str, str] = {}
    clean = finite(obj, where, default)
    if where and isinstance(clean, dict):
        clean = {**clean, NON_FINITE: where}
    return json.dumps(clean, allow_nan=False, **kw)


def finite(obj: Any, where: dict[str, str] | None = None, default: Callable[[Any], Any] | None = None,
           path: str = "") -> Any:
    """``obj`` with each non-finite float replaced by None (a copy where one was; the same
    object otherwise), recording each one's JSON pointer and kind in ``where``."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        if where is not None:
            where[path] = "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
        return None
    if obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, dict):
        return {k: finite(v, where, default, f"{path}/{_escape(k)}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v, where, default, f"{path}/{i}") for i, v in enumerate(obj)]
    if default is not None:
        return finite(default(obj), where, default, path)
    return obj  # json.dumps raises its TypeError for it


def _escape(key: object) -> str:
    """A key as a JSON pointer token (RFC 6901: ``~`` is ``~0``, ``/`` is ``~1``)."""
    return str(key).replace("~", "~0").replace("/", "~1")
