"""The eval action's ``cpu_matmul`` (issue 34): passed on only when set, and an upgrade that adds
it leaves the evals already measured measured (their settings key is unchanged)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from core.actions.eval import Eval, EvalParams
from core.plans.params import parse_params, to_plain
from tests.unit.evalcmd import eval_words


LATER = ("cpu_matmul", "stop", "min_difference", "alpha")
"""Fields added after evals were measured (cpu_matmul, issue 34; the settled stop, issue 45)."""


def _key_before(params: EvalParams) -> str:
    """The settings key as specdeck computed it before those fields existed."""
    plain = {f.name: to_plain(getattr(params, f.name)) for f in dataclasses.fields(params) if f.name not in LATER}
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]


def test_cpu_matmul_reaches_the_command_only_when_set():
    assert "--cpu-matmul" not in eval_words(EvalParams(drafter="d", target="t"))
    words = eval_words(EvalParams(drafter="d", target="t", cpu_matmul="torch"))
    assert words[words.index("--cpu-matmul") + 1] == "torch"


def test_a_bad_value_is_named():
    with pytest.raises(ExceptionGroup) as info:
        parse_params(EvalParams, {"drafter": "d", "target": "t", "cpu_matmul": "fast"})
    [err] = info.value.exceptions
    assert err.path == ("cpu_matmul",) and "'auto'" in err.message and "'torch'" in err.message


def test_the_settings_key_of_a_measured_eval_survives_the_upgrade():
    for params in (EvalParams(drafter="d", target="t"), EvalParams(drafter="d", target="t", tree_budget=64)):
        assert Eval(params).settings_key() == _key_before(params)
        torch_kernels = Eval(dataclasses.replace(params, cpu_matmul="torch")).settings_key()
        assert torch_kernels != _key_before(params)  # other kernels: measured again
