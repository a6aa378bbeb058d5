"""Requirement strings and version comparison, small enough to need no ``packaging``.

Covers what plans write: ``name``, ``name==1.2.*``, ``name>=1.2,<2``, ``name~=1.4``,
``name[extra]>=1``. Local versions (``2.13.0+cpu``) compare by their public part, except
with ``==`` that names a local part (then the local parts too, as PEP 440 normalizes them:
a specdeck's ``0.1.0+code.<hash>``, core.selfwheel).
"""

from __future__ import annotations

import re

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*$")
_CLAUSE = re.compile(r"^(==|!=|>=|<=|~=|>|<)\s*([0-9A-Za-z.*+!_-]+)$")


def parse_requirement(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``"torch>=2.4,<3"`` -> ``("torch", [(">=", "2.4"), ("<", "3")])``; ValueError if bad."""
    m = _REQ.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a requirement (name[extras] and version clauses)")
    name, _, rest = m.groups()
    clauses = []
    for part in filter(None, (p.strip() for p in rest.split(","))):
        c = _CLAUSE.match(part)
        if not c:
            raise ValueError(f"{text!r}: cannot read version clause {part!r}")
        clauses.append((c.group(1), c.group(2)))
    return normalize(name), clauses


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _key(v: str) -> tuple:
    public = v.split("+", 1)[0]
    nums = []
    for part in public.split("."):
        m = re.match(r"(\d+)(.*)", part)
        if not m:
            nums.append((-1, part))
            continue
        nums.append((int(m.group(1)), m.group(2)))
    # a pre-release suffix (rc1, a2, dev0) sorts before the plain release
    key = [(n, 0 if s else 1, s) for n, s in nums]
    return tuple(key + [(0, 1, "")] * (8 - len(key)))  # 2.0 == 2.0.0


def _local(v: str) -> tuple:
    """A version's local label as PEP 440 compares it (``+code.0123`` is ``+code.123``:
    ``.``, ``-`` and ``_`` alike, digits as numbers, letters in any case)."""
    local = v.partition("+")[2]
    return tuple(int(p) if p.isdigit() else p.lower() for p in re.split(r"[._-]", local) if p)


def satisfies(version: str, clauses: list[tuple[str, str]]) -> bool:
    for op, want in clauses:
        if op in ("==", "!=") and want.endswith(".*"):
            prefix = want[:-2].split(".")
            ok = version.split("+")[0].split(".")[:len(prefix)] == prefix
            ok = ok if op == "==" else not ok
        elif op in ("==", "!="):
            same = _key(version) == _key(want) and (
                "+" not in want or _local(version) == _local(want))
            ok = same if op == "==" else not same
        elif op == "~=":
            parts = want.split(".")
            upper = parts[:-1]
            ok = _key(version) >= _key(want) and version.split("+")[0].split(".")[:len(upper)] == upper
        else:
            a, b = _key(version), _key(want)
            ok = {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]
        if not ok:
            return False
    return True
