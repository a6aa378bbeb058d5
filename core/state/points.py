"""What a metric point may hold: the bounds every number from a run is checked against.

Steps and values come from programs on hosts (JSON log lines, HF dicts, regex groups,
TensorBoard events, checkpoint file names, result files): any of them can be a 400-digit
number, NaN or infinite. SQLite keeps integers in 64 bits (a larger Python int raises
``OverflowError`` inside the transaction that also stores the log bytes) and a NaN ``REAL``
reads back as NULL, so the store keeps only points whose step is an integer in SQLite's range
and whose value is a finite float; the rest are dropped, and the store says so once per run
and source (:meth:`core.state.store.Store.metric_notice`). Nothing here raises.
"""

from __future__ import annotations

import math

from core.ml.formats.bounds import INT64_MAX as INT_MAX  # SQLite's INTEGER range: signed 64 bits
from core.ml.formats.bounds import INT64_MIN as INT_MIN
from core.ml.formats.bounds import show  # how a message quotes a number (the store's notices use it too)


def step_of(v: object) -> int | None:
    """``v`` as a storable step: an integer (or integral float) in SQLite's range, else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        if not math.isfinite(v) or not v.is_integer():
            return None
        v = int(v)
    if isinstance(v, int) and INT_MIN <= v <= INT_MAX:
        return v
    return None


def value_of(v: object) -> float | None:
    """``v`` as a storable value: a finite float, else None (never raises)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        x = float(v)
    except OverflowError:  # an int beyond a double's range
        return None
    return x if math.isfinite(x) else None


FIGURE_MAX = 1e150
"""Largest magnitude an eval figure (a tau, a round, a share) may have: far above any real
one (tau is at most the block size), and small enough that the statistics' squares and sums
stay finite."""


def figure_of(v: object) -> float | None:
    """``v`` as an eval figure: a finite float of at most :data:`FIGURE_MAX`, else None."""
    x = value_of(v)
    return x if x is not None and abs(x) <= FIGURE_MAX else None


def problem(step: object, name: object, value: object) -> str | None:
    """Why ``(step, name, value)`` cannot be stored, or None when it can."""
    if step_of(step) is None:
        return f"step {show(step)} of {show(name)} is not an integer in SQLite's range"
    if value_of(value) is None:
        return f"value {show(value)} of {show(name)} at step {step} is not a finite number"
    if not isinstance(name, str):
        return f"name {show(name)} is not text"
    return None


def bounded(rows) -> tuple[list[tuple], int, str | None]:
    """The storable points of ``rows`` (``(step, name, value)`` or ``(step, name, value,
    at)``; a non-finite ``at`` becomes None), how many were dropped and why the first was."""
    kept: list[tuple] = []
    dropped, first = 0, None
    finite = math.isfinite
    for row in rows:
        step, name, value = row[0], row[1], row[2]
        if (type(step) is int and INT_MIN <= step <= INT_MAX and type(value) is float
                and finite(value) and type(name) is str and len(row) == 3):
            kept.append(row)  # the common case, checked inline (a log stores 10k lines/s)
            continue
        why = problem(step, name, value)
        if why is not None:
            dropped += 1
            first = first or why
            continue
        point = (step_of(step), name, value_of(value))
        if len(row) > 3:
            point += (value_of(row[3]),)
        kept.append(point)
    return kept, dropped, first


def _numbers(xs: object) -> bool:
    return isinstance(xs, (list, tuple)) and all(figure_of(x) is not None for x in xs)


def eval_row_problem(row) -> str | None:
    """Why an eval row's figures (:class:`core.state.records.EvalRow`) cannot be stored or
    compared, or None: a tau, a round or a per-position share that is not a finite number
    (within :data:`FIGURE_MAX`), or a step out of SQLite's range."""
    where = f"{show(row.drafter)}, prompt {show(row.prompt_id)} (run {row.run_id})"
    if row.tau is not None and figure_of(row.tau) is None:
        return f"{where}: tau {show(row.tau)} is not a finite number (within ±{FIGURE_MAX:g})"
    if row.rounds is not None and not _numbers(row.rounds):
        return f"{where}: its rounds are not all finite numbers"
    if row.per_position is not None and not _numbers(row.per_position):
        return f"{where}: its per-position acceptance is not all finite numbers"
    if row.step is not None and step_of(row.step) is None:
        return f"{where}: step {show(row.step)} is not an integer in SQLite's range"
    return None
