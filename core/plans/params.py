"""Typed action parameters: frozen dataclasses validated from plain YAML values.

Chosen once for the whole project (style.md practice 7): every action kind declares
``Params`` as a frozen dataclass; :func:`parse_params` builds it from the plan's mapping,
rejecting unknown keys, missing required fields and wrong types, and reports each problem
with the dotted field path so the plan loader can point at file:line:col.

Field metadata understood here:
    ``shell=True``: the string is shell text; ``${vars}`` spliced into it are quoted.
    ``doc="..."``: one line for ``plans/README.md`` and ``specdeck kinds``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from core.ml.formats import bounds


class ParamError(Exception):
    """One problem with one field. ``path`` is a tuple of keys/indices under ``params``."""

    def __init__(self, path: tuple, message: str, *, bound: bool = False):
        super().__init__(message)
        self.path = path
        self.message = message
        self.bound = bound
        """The value has the right type but is out of the range a run can hold (a union
        reports this rather than its types)."""


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return {str: "string", int: "integer", float: "number", bool: "true/false",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(tp, value: Any, path: tuple, errors: list[ParamError]) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        errors.append(ParamError(path, f"must be one of {_type_name(tp)}, got {value!r}"))
        return None
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        nested = [a for a in args if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and len(nested) == 1:  # its own fields' errors, by path
            return _coerce(nested[0], value, path, errors)
        bounded: list[ParamError] = []
        for a in args:
            if a is type(None):
                continue
            sub: list[ParamError] = []
            out = _coerce(a, value, path, sub)
            if not sub:
                return out
            bounded += [e for e in sub if e.bound]
        errors.append(bounded[0] if bounded else
                      ParamError(path, f"must be {_type_name(tp)}, got {_show(value)}"))
        return None
    if origin is list or tp is list:
        (inner,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            errors.append(ParamError(path, f"must be a list, got {_show(value)}"))
            return None
        return tuple(_coerce(inner, v, path + (i,), errors) for i, v in enumerate(value))
    if origin is dict or tp is dict:
        kt, vt = typing.get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            errors.append(ParamError(path, f"must be a mapping, got {_show(value)}"))
            return None
        return {str(k): _coerce(vt, v, path + (k,), errors) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            errors.append(ParamError(path, f"must be a mapping, got {_show(value)}"))
            return None
        return _build(tp, value, path, errors)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return _bounded(bounds.int64, value, path, errors)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _bounded(bounds.finite, value, path, errors, float)
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    else:  # pragma: no cover - a params model using an unsupported type is a programming error
        raise TypeError(f"unsupported params type {tp!r}")
    errors.append(ParamError(path, f"must be {_type_name(tp)}, got {_show(value)}"))
    return None


def _bounded(check, value: Any, path: tuple, errors: list[ParamError], kind=None) -> Any:
    """``value`` when ``check`` (a :mod:`core.ml.formats.bounds` validator) passes it, else None and the
    error: every number a plan gives is one the run can hold (an int within 64 bits, a finite
    float); what a field further bounds its ``validate`` says."""
    why = check(value)
    if why:
        errors.append(ParamError(path, why, bound=True))
        return None
    return kind(value) if kind else value


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return _type_name(type(value))
    return f"{value!r}"


def _build(cls, data: dict, path: tuple, errors: list[ParamError]):
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    if True in data and "on" in fields and "on" not in data:  # YAML 1.1 reads a bare on: as true
        data = {("on" if k is True else k): v for k, v in data.items()}
    kwargs = {}
    for key in data:
        if key not in fields:
            known = ", ".join(sorted(fields))
            errors.append(ParamError(path + (key,), f"unknown field {key!r} (known: {known})"))
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _coerce(hints[name], data[name], path + (name,), errors)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            errors.append(ParamError(path + (name,), f"required field {name!r} is missing"))
    if errors:
        return None
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        for fpath, msg in validate():
            errors.append(ParamError(path + tuple(fpath), msg))
    return obj


def parse_params(cls, data: Any) -> Any:
    """Build ``cls`` from ``data`` or raise a list of :class:`ParamError` as ``ExceptionGroup``.

    A params class may define ``validate(self) -> list[(path_tuple, message)]`` for
    cross-field rules; its problems are reported like type errors.
    """
    errors: list[ParamError] = []
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ExceptionGroup("params", [ParamError((), f"must be a mapping, got {_show(data)}")])
    obj = _build(cls, data, (), errors)
    if errors:
        raise ExceptionGroup("params", errors)
    return obj


def shell_fields(cls) -> set[str]:
    """Names of the fields whose strings are shell text (``metadata={'shell': True}``)."""
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("shell")}


def to_plain(obj: Any) -> Any:
    """A params object back to plain JSON-able values (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def counts(obj: Any, **lowest: int) -> list[tuple[tuple, str]]:
    """The problems of ``obj``'s count fields, given as ``name=lowest``: each must be an integer
    from its lowest to :data:`core.ml.formats.bounds.COUNT_MAX` (tokens, prompts, nodes, threads: what
    the run indexes with int32); a null field (unset) has none."""
    return problems(*((name, bounds.count(getattr(obj, name), low))
                      for name, low in lowest.items() if getattr(obj, name) is not None))


def problems(*checks: tuple[str | tuple, str | None]) -> list[tuple[tuple, str]]:
    """The ``(field path, message)`` list a ``validate`` or ``validate_plan`` hook returns,
    from ``(field, message or None)`` checks: a check that found nothing gives None and is
    dropped. One list of rules per hook, instead of each hook repeating ``if err:
    out.append(((field,), err))``; a plain field name stands for the one-key path."""
    return [((f,) if isinstance(f, str) else tuple(f), m) for f, m in checks if m]
