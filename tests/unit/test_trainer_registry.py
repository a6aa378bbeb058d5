"""A fourth trainer, defined here and nowhere else: its own layout (``snap-N/weights.stub``),
its own log keys (``stub_loss``, ``stub_acc``), its own stop grace. Registering it
(:func:`core.actions.trainers.register`) is the one touch; then a plan naming it validates,
the train action launches it through the object on a real local host, and its metrics and
checkpoints land in the store under the curves' names and in its layout."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from core.actions import trainers
from core.actions.train import Train, TrainParams
from core.actions.trainers.registry import Trainer, register
from core.errors import PlanError
from core.ml.formats import layouts
from core.plans.params import parse_params
from core.plans.planfile import parse_plan
from core.runs.runner import Runner
from core.state.store import Store

STUB = """\
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for step in (10, 20):
    print(json.dumps({"step": step, "stub_loss": 1.0 / step, "stub_acc": step / 40}), flush=True)
    snap = out / f"snap-{step}"
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "weights.stub").write_bytes(b"w" * step)
(out / "snap-99").mkdir()  # a save cut short: no weights file, no checkpoint
"""
"""The stub trainer: JSON-lines metrics in its own keys, checkpoint dirs in its own layout."""


class Stub(Trainer):
    name = "stub"
    layout = layouts.Layout("stub", re.compile(r"^snap-(?P<step>\d{1,18})$"), "weights.stub",
                            "snap-*")
    config_what = "stub YAML"
    out_key = "out"
    metric_names: ClassVar[dict[str, str]] = {"stub_loss": "loss", "stub_acc": "accuracy"}
    stop_grace_s = 7.0

    def module_words(self, out, recorded):
        return ["-c", STUB, out]


@pytest.fixture
def stub():
    """The stub registered for one test (and its layout with it), then gone again."""
    register(Stub)
    try:
        yield trainers.get("stub")
    finally:
        trainers.TRAINERS.pop("stub", None)
        layouts.LAYOUTS.pop("stub", None)


def plan_text(tmp_path, trainer: str) -> str:
    return json.dumps({
        "name": "fourth", "hosts": {"box": {"local": True, "workdir": str(tmp_path / "box"),
                                            "python": sys.executable}},
        "items": [{"id": "train", "content": "train", "action": {
            "kind": "train", "host": "box",
            "params": {"trainer": trainer, "config": "stub.yaml", "out": "runs/stub"}}}]},
        indent=1)


def test_unregistered_it_is_refused_with_did_you_mean_and_the_line(tmp_path):
    with pytest.raises(PlanError) as ei:
        parse_plan(plan_text(tmp_path, "stubb"), "p.yaml")
    msg = str(ei.value)
    assert re.search(r"^p\.yaml:\d+:\d+: .*'action\.params\.trainer': unknown trainer 'stubb' "
                     r"\(known: specdeck, specforge, speculators\)$", msg, re.M), msg
    assert "did you mean 'specforge'" in str(
        pytest.raises(ExceptionGroup, parse_params, TrainParams,
                      {"trainer": "specforj", "command": "x", "out": "o"}).value.exceptions[0])


def test_registered_its_object_is_what_the_train_action_asks(stub, tmp_path):
    (tmp_path / "stub.yaml").write_text("lr: 0.1\n")
    plan = parse_plan(plan_text(tmp_path, "stub"), "p.yaml", path=tmp_path / "p.yaml")
    assert plan.item("train").action.params.trainer == "stub"
    assert "stub" in trainers.names() and layouts.LAYOUTS["stub"] is Stub.layout
    with pytest.raises(ExceptionGroup) as ei:
        parse_params(TrainParams, {"trainer": "stub", "config": "stub.yaml"})
    assert [str(e) for e in ei.value.exceptions] == [
        "set out: the stub run's output dir on the host (its out; its attempts share it and "
        "resume from it)"]
    action = Train(plan.item("train").action.params)
    assert action.trainer is stub
    assert action.stop_grace(1.0) == 7.0
    assert action.metrics_regex().parse(b'{"step": 3, "stub_loss": 0.5}') == [(3, "loss", 0.5)]
    assert layouts.parse_entry("snap-4", "stub") == ("stub", 4, "snap-4/weights.stub")
    assert layouts.parse_entry("snap-4", "specforge") is None


def test_it_runs_through_the_train_action_and_its_layout_finds_its_checkpoints(stub, tmp_path):
    (tmp_path / "stub.yaml").write_text("lr: 0.1\n")
    (tmp_path / "box").mkdir()
    plan = parse_plan(plan_text(tmp_path, "stub"), "p.yaml", path=tmp_path / "p.yaml")
    store = Store(tmp_path / "s.db")

    async def go():
        runner = Runner(plan, store, poll=0.05)
        try:
            return await runner.run_item(plan.item("train"))
        finally:
            await runner.close()

    assert asyncio.run(asyncio.wait_for(go(), 60)) == "done"
    run = store.latest_run("train")
    out = str(tmp_path / "box/runs/stub")
    # launched through the object: its module words, its config uploaded beside them
    assert run.config["trainer"] == "stub" and run.config["out_dir"] == out
    assert run.config["config"] == {"lr": 0.1}
    cmd = (Path(run.capsule) / "cmd.sh").read_text()
    assert shlex.join([sys.executable, "-u", "-c", STUB, out]) in cmd, cmd  # (its newlines:
    # shell syntax, so not exec'd: core.actions.train.exec_form)
    assert (Path(run.capsule) / "train.yaml").read_text() == "lr: 0.1\n"
    # its metrics under the curves' names, read through its metric names
    assert store.metric_series(run.id, "loss") == [(10, 0.1), (20, 0.05)]
    assert [v for _, v in store.metric_series(run.id, "accuracy")] == [0.25, 0.5]
    assert store.metric_series(run.id, "stub_loss") == []
    # its checkpoints, found in its layout (snap-99 has no weights file: none)
    arts = store.artefacts("train", kind="checkpoint")
    assert [(a.step, a.path) for a in arts] == [
        (s, f"{out}/snap-{s}/weights.stub") for s in (10, 20)]
    assert all(a.data["layout"] == "stub" for a in arts)
    assert run.result["checkpoints"] == [10, 20]
    assert layouts.out_dir_of(arts[0].path, "stub") == out
    assert [c.step for c in layouts.scan_dir(out, "stub")] == [10, 20]
    assert layouts.scan_dir(out, "specforge") == []  # no other layout reads it so
