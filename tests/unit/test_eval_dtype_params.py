"""The eval action and watch_eval pass the target dtype and the memory cap to core.ml.eval."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from core.actions.eval import EvalParams
from core.actions.watch_eval.params import validate_watch
from tests.unit.evalcmd import eval_words


def test_dtype_and_max_memory_reach_the_command():
    words = eval_words(EvalParams(drafter="d", target="models/t", dtype="bfloat16", max_memory="60G"))
    assert words[words.index("--dtype") + 1] == "bfloat16"
    assert words[words.index("--max-memory") + 1] == "60G"
    words = eval_words(EvalParams(drafter="d", target="models/t"))
    assert words[words.index("--dtype") + 1] == "auto" and "--max-memory" not in words


def test_bad_max_memory_is_named():
    errs = EvalParams(drafter="d", target="t", max_memory="plenty").validate()
    assert [(path, "not a size" in msg) for path, msg in errs] == [(("max_memory",), True)]
    assert EvalParams(drafter="d", target="t", max_memory="1.5GiB").validate() == []


def test_watch_eval_validates_dtype_and_max_memory():
    plan = SimpleNamespace(hosts={"ct129": object()}, dir=Path("."))
    base = {"host": "ct129", "target": "models/t", "mode": "online"}
    assert validate_watch({**base, "dtype": "bfloat16", "max_memory": "60G"}, plan, None) == []
    errs = dict(validate_watch({**base, "dtype": "fp8", "max_memory": "much"}, plan, None))
    assert "auto keeps the checkpoint" in errs[("dtype",)] and "not a size" in errs[("max_memory",)]
