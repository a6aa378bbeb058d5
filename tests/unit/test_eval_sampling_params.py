"""The eval action's sampling params: validated as core.ml.eval validates them, and passed to it."""

from __future__ import annotations

from core.actions.eval import EvalParams
from tests.unit.evalcmd import eval_words


def test_sampling_params_reach_the_command_and_greedy_passes_none():
    words = eval_words(EvalParams(drafter="d", target="t", temperature=0.7, top_p=0.95, top_k=20, seed=3, samples=8))
    got = {k: words[words.index(k) + 1] for k in ("--temperature", "--top-p", "--top-k", "--seed", "--samples")}
    assert got == {"--temperature": "0.7", "--top-p": "0.95", "--top-k": "20", "--seed": "3", "--samples": "8"}
    assert "--temperature" not in eval_words(EvalParams(drafter="d", target="t"))  # greedy: the command as before


def test_what_sampling_refuses_is_named_at_validate():
    def errs(**kw):
        return [path for path, _ in EvalParams(drafter="d", target="t", **kw).validate()]

    assert errs(temperature=0.7, samples=8) == []
    assert errs(temperature=0.7, tree_budget=16) == [("tree_budget",)]
    assert errs(temperature=0.7, mode="offline", cache="c") == [("mode",)]
    assert errs(samples=4) == [("samples",)]
    assert errs(top_p=0.9) == [("top_p",)]
    assert errs(temperature=-1.0) == [("temperature",)]
    assert errs(temperature=0.7, top_k=-1) == [("top_k",)]
