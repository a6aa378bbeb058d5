"""The eval action's ``stop: settled`` params (issue 45 §2): validated as core.ml.eval --stop settled
validates them, passed to it, and keyed only when set (evals measured before stay measured)."""

from __future__ import annotations

from core.actions.eval import Eval, EvalParams
from tests.unit.evalcmd import eval_words


def test_settled_params_reach_the_command_with_the_baseline_paired():
    words = eval_words(EvalParams(drafter="d", target="t", baseline="b", stop="settled", min_difference=0.25,
                                  alpha=0.01, limit=200))
    got = {k: words[words.index(k) + 1] for k in ("--baseline-drafter", "--baseline-out", "--baseline-label",
                                                  "--stop", "--min-difference", "--alpha", "--limit")}
    assert got == {"--baseline-drafter": "/home/op/b", "--baseline-out": "baseline/result.json",
                   "--baseline-label": "baseline", "--stop": "settled", "--min-difference": "0.25",
                   "--alpha": "0.01", "--limit": "200"}
    assert "--stop" not in eval_words(EvalParams(drafter="d", target="t", baseline="b"))  # the command as before


def test_what_a_settled_stop_refuses_is_named_at_validate():
    def errs(**kw):
        return [path for path, _ in EvalParams(drafter="d", target="t", **kw).validate()]

    ok = {"baseline": "b", "stop": "settled", "min_difference": 0.25}
    assert errs(**ok) == []
    assert errs(**{**ok, "baseline": None}) == [("baseline",)]
    assert errs(**{**ok, "min_difference": None}) == [("min_difference",)]
    assert errs(**{**ok, "min_difference": 0.0}) == [("min_difference",)]
    assert errs(**{**ok, "alpha": 1.5}) == [("alpha",)]
    assert errs(**{**ok, "tree_budget": 16}) == [("tree_budget",)]
    assert errs(**{**ok, "mode": "offline", "cache": "c"}) == [("mode",)]
    assert errs(**{**ok, "temperature": 0.7, "samples": 4}) == [("samples",)]
    assert errs(**{**ok, "engine": "llama.cpp"}) == [("engine",)]
    assert errs(min_difference=0.25) == [("min_difference",)]  # without stop: settled it would do nothing


def test_the_settings_key_moves_only_when_settled_is_set():
    plain = Eval(EvalParams(drafter="d", target="t", baseline="b")).settings_key()
    assert plain == Eval(EvalParams(drafter="d", target="t", baseline="b", alpha=0.05)).settings_key()
    assert plain != Eval(EvalParams(drafter="d", target="t", baseline="b", stop="settled",
                                    min_difference=0.25)).settings_key()
