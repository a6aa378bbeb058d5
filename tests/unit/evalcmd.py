"""The ``core.ml.eval`` command line an eval action builds, as words, for the unit tests that
check what its params pass on (dtype, memory cap, sampling) without a host."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

from core.actions.eval import Eval, EvalParams


class _Host:
    name = "ct129"

    def path(self, p):
        return f"/home/op/{p}"


def eval_words(params: EvalParams) -> list[str]:
    """The words of the command ``Eval(params)`` launches on a host whose workdir is /home/op."""
    found = {"python": "/opt/venv/bin/python", "prompts": "/home/op/prompts.jsonl"}
    return shlex.split(Eval(params)._eval_cmd(SimpleNamespace(host=_Host()), found, "drafter", "out.json", "v5"))
