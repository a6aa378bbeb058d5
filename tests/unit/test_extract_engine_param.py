"""The extract_hidden action's ``engine`` (issue 49): ``--engine llama.cpp`` reaches the command
only when set, and a value other than the two is refused by name."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

import pytest

from core.actions.extract_hidden import ExtractHidden, ExtractHiddenParams
from core.plans.params import parse_params


class _Host:
    name = "ct129"

    def path(self, p):
        return f"/home/op/{p}"


def _words(params: ExtractHiddenParams) -> list[str]:
    """The words of the command the action launches on a host whose workdir is /home/op."""
    run = SimpleNamespace(id="r1", config={"python": "/opt/venv/bin/python", "prompts": "/home/op/p.jsonl"})
    ctx = SimpleNamespace(host=_Host(), run_id="r1", runs=lambda: [run])
    return shlex.split(ExtractHidden(params).command(ctx).command)


def test_engine_reaches_the_command_only_when_set():
    base = dict(target="t", out="features", layers=[0, 2])
    assert "--engine" not in _words(ExtractHiddenParams(**base))
    words = _words(ExtractHiddenParams(**base, engine="llama.cpp"))
    assert words[words.index("--engine") + 1] == "llama.cpp"
    assert words[words.index("--target") + 1] == "/home/op/t"


def test_a_bad_engine_is_named():
    with pytest.raises(ExceptionGroup) as info:
        parse_params(ExtractHiddenParams, {"target": "t", "out": "o", "layers": [0], "engine": "vllm"})
    [err] = info.value.exceptions
    assert err.path == ("engine",) and "'llama.cpp'" in err.message
