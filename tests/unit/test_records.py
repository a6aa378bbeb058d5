"""The store hands out frozen records (never its rows): JSON columns decoded, a misspelt
field an AttributeError where it is misspelt, and nothing a reader can change in place."""

from __future__ import annotations

import dataclasses

import pytest

from core.state.records import Artefact, EvalRow, Run
from core.state.store import Store


def test_runs_are_frozen_records_with_json_decoded():
    s = Store(":memory:")
    run = s.claim_run("r1", "train", "train", "gpu", owner="me")
    assert isinstance(run, Run) and run.live and (run.attempt, run.log_offset) == (1, 0)
    s.update_run("r1", config={"lr": 3e-4}, adopt='{"how": "pid", "pid": 7}')
    s.end_run("r1", "succeeded", exit_code=0, result={"checkpoints": [10, 20]})
    run = s.run("r1")
    assert not run.live and run.result == {"checkpoints": [10, 20]}
    assert run.config == {"lr": 3e-4} and run.adopt == {"how": "pid", "pid": 7}
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.state = "running"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        run.exitcode  # noqa: B018 - a misspelt field fails where it is read
    assert s.latest_runs() == {"train": run} and s.runs_for_item("train") == [run]


def test_artefacts_and_eval_rows_round_trip():
    s = Store(":memory:")
    s.claim_run("r1", "ev", "eval", "gpu", owner="me")
    assert s.add_artefact("r1", "ev", "checkpoint", "/o/step_10.pt", 10, {"bytes": 5})
    assert not s.add_artefact("r1", "ev", "checkpoint", "/o/step_10.pt", 10)  # once
    (art,) = s.artefacts("ev", "checkpoint")
    assert isinstance(art, Artefact) and (art.path, art.step, art.data) == (
        "/o/step_10.pt", 10, {"bytes": 5})
    row = EvalRow("r1", "ev", "v5", "drafter", "p1", 3.5, [4, 3], [0.9, 0.5],
                  {"block_size": 16}, 10)
    s.add_eval_results([row])
    (got,) = s.eval_results("ev")
    assert got.at is not None and got.id == 1
    assert dataclasses.replace(got, at=None, id=None) == row
