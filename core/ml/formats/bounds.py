"""The numbers a run can use, checked at the type the run uses them (issue 42 §6).

A number that ``specdeck validate`` accepts (a plan's params, a trainer config) or that a
``python -m core.ml.*`` command line parses must not fail the run on the machine's own limits
halfway through: ``torch.manual_seed`` raises on a seed past 64 bits, float32 logits divided
by a temperature of 1e-45 are infinite (softmax then NaN), a learning rate of 1e39 is infinite
in a float32 parameter update, and a token count of 10**20 runs until the memory is gone.
Both sides check their values with the validators below, so one bound holds wherever the
value is read: the plan params (:mod:`core.actions.eval`, :mod:`core.actions.watch_eval`,
:mod:`core.actions.extract_hidden`, :mod:`core.plans.params` for every number), the trainer config
(:mod:`core.ml.train.config`) and the ml command lines (:func:`core.ml.formats.runio.check_flags`).

Each validator returns None when the value is usable, else what is wrong with it, starting
with the value, in words a plan error or a ``--flag`` message can carry as they are.

Pure Python (no torch): the plan checks on a laptop import it.
"""

from __future__ import annotations

import math

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
"""A 64-bit signed integer: torch's int64 tensors and ``manual_seed``, SQLite's INTEGER."""

COUNT_MAX = (1 << 31) - 1
"""Most tokens, prompts, samples or nodes a run is asked for: sequence lengths and offsets are
int32 in the attention kernels (FlashAttention's ``cu_seqlens``), and no model has more positions."""

FLOAT32_MAX = 3.4028234663852886e38
"""Largest finite float32: a float the run computes with in float32 must not exceed it."""

FLOAT32_TINY = 1.1754943508222875e-38
"""Smallest normal float32: a smaller magnitude is subnormal or 0 there (1/x is infinite)."""

TEMPERATURE_MIN, TEMPERATURE_MAX = 1e-4, 1e4
"""A temperature's range (0, greedy, aside): float32 logits divided by a smaller one overflow
towards infinity (and sample what greedy decoding picks), and past the larger one every
token is about equally likely."""

SECONDS_MAX = 1e9
"""Longest wait a run is given (31 years): the platform's timers overflow past about 9e9 s."""


def show(v: object) -> str:
    """A value as a message quotes it: short, whatever its size."""
    if isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
        return f"a {'negative ' if v < 0 else ''}number of over 19 digits"
    try:
        text = repr(v)
    except Exception:  # noqa: BLE001 - a repr of hostile content (int digit limit)
        text = f"a {type(v).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def is_int(v: object) -> bool:
    """An integer that is not a bool (YAML's ``true`` is not a count)."""
    return isinstance(v, int) and not isinstance(v, bool)


def int64(v: object) -> str | None:
    """An integer within 64 bits (what every int a run stores or hands torch must be)."""
    if is_int(v) and INT64_MIN <= v <= INT64_MAX:
        return None
    return f"{show(v)}: must be an integer within 64 bits (-2**63 .. 2**63-1)"


def seed64(v: object) -> str | None:
    """A seed ``torch.manual_seed`` and every generator takes: an integer within 64 bits."""
    if int64(v) is None:
        return None
    return f"{show(v)}: a seed must be an integer within 64 bits (-2**63 .. 2**63-1), as torch.manual_seed takes"


def count(v: object, low: int = 1, high: int = COUNT_MAX) -> str | None:
    """An integer from ``low`` to ``high`` (a number of tokens, prompts, samples...)."""
    if is_int(v) and low <= v <= high:
        return None
    return f"{show(v)}: must be an integer >= {low} and <= {high}"


def finite(v: object) -> str | None:
    """A number that is neither NaN nor infinite (a float the run keeps in float64)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            if math.isfinite(float(v)):
                return None
        except OverflowError:  # an int past a double's range
            pass
    return f"{show(v)}: must be a finite number"


def float32(v: object) -> str | None:
    """A number float32 holds as itself: 0, or a magnitude from 1.2e-38 to 3.4e38 (a smaller
    one is 0 or subnormal there, a larger one infinite)."""
    why = finite(v)
    if why:
        return why
    x = abs(float(v))
    if x == 0 or FLOAT32_TINY <= x <= FLOAT32_MAX:
        return None
    return (f"{show(v)}: the run computes in float32, which holds 0 or magnitudes from "
            f"{FLOAT32_TINY:.1e} to {FLOAT32_MAX:.1e}; this one {'overflows' if x > 1 else 'underflows'} there")


def temperature(v: object, *, greedy: bool = True) -> str | None:
    """A sampling or distillation temperature: 0 (greedy, where ``greedy``) or from
    :data:`TEMPERATURE_MIN` to :data:`TEMPERATURE_MAX`."""
    why = finite(v)
    if why is None and (TEMPERATURE_MIN <= float(v) <= TEMPERATURE_MAX or (greedy and v == 0)):
        return None
    zero = "0 (greedy) or " if greedy else ""
    return (f"{show(v)}: must be {zero}from {TEMPERATURE_MIN:g} to {TEMPERATURE_MAX:g} (float32 logits "
            f"divided by a smaller temperature overflow{', use 0 for greedy' if greedy else ''}; "
            "a larger one samples every token alike)")


def seconds(v: object) -> str | None:
    """A wait in seconds: from 0 to :data:`SECONDS_MAX`."""
    why = finite(v)
    if why is None and 0 <= float(v) <= SECONDS_MAX:
        return None
    return f"{show(v)}: must be a number of seconds from 0 to {SECONDS_MAX:g}"
