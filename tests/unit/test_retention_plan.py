"""Retention as a plan says it: the steps other items name are pinned, a detached watcher gets
``--keep-newest/--keep-best/--pin`` (from ``watch_eval`` or the trainer config's
``train.keep_checkpoints``, which the trainer then no longer applies), a trainer that prunes
itself keeps the named steps, and ``keep_checkpoints`` on a console watcher is refused."""

from __future__ import annotations

import json

import pytest

from core.actions.mlbase import pinned_steps
from core.actions.trainers.specdeck import pin_named_steps, watch_prunes
from core.actions.watch_eval.detached import retention_flags
from core.errors import PlanError
from core.plans.planfile import parse_plan
from tests.conftest import ROOT

WATCH = {"target": "models/target", "cache": "feats/eval", "mode": "offline"}


def plan(tmp_path, watch=None, keep=2):
    (tmp_path / "train").mkdir(exist_ok=True)
    (tmp_path / "train" / "v5.yaml").write_text((ROOT / "plans/train/v5.yaml").read_text())
    params = {"config": "train/v5.yaml",
              "overrides": {"target": "models/target", "data.features": "feats",
                            **({"train.keep_checkpoints": keep} if keep else {})}}
    if watch is not None:
        params["watch_eval"] = watch
    doc = {"name": "p", "hosts": {"gpu": {"local": True, "workdir": str(tmp_path)},
                                  "ev": {"local": True, "workdir": str(tmp_path / "ev")}},
           "items": [
               {"id": "train", "content": "t", "action": {"kind": "train", "host": "gpu",
                                                          "params": params}},
               {"id": "strip", "content": "s", "needs": ["train"], "action": {
                   "kind": "extract_weights", "host": "gpu",
                   "params": {"checkpoint": "item:train@step:400", "out": "d400"}}},
               {"id": "ev", "content": "e", "needs": ["train"], "action": {
                   "kind": "eval", "host": "gpu", "params": {
                       "drafter": "item:train@step_1200", "baseline": "item:train@latest",
                       "target": "models/target", "prompts": "coding"}}},
               {"id": "other", "content": "o", "action": {"kind": "shell", "host": "gpu",
                "params": {"command": "echo item:train@step:7"}}}]}
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps(doc))
    return parse_plan(path.read_text(), str(path), path=path)


def test_the_steps_other_items_name_are_pinned(tmp_path):
    p = plan(tmp_path, WATCH)
    assert pinned_steps(p, "train") == {400, 1200}  # a shell command's text names nothing
    assert pinned_steps(p, "strip") == set()


def test_a_detached_watcher_gets_the_trainer_configs_keep_and_the_pins(tmp_path):
    p = plan(tmp_path, WATCH)
    item = p.item("train")
    spec = item.action.params.watch_eval
    assert [str(a) for a in retention_flags(p, item, spec)] == [
        "--keep-newest", "2", "--keep-best", "1", "--pin", "400", "--pin", "1200"]
    doc = {"train": {"keep_checkpoints": 2}}
    assert watch_prunes(doc, item.action.params, "gpu")  # the trainer keeps all then
    # watch_eval's own keep_checkpoints wins; without either there is no retention
    p = plan(tmp_path, {**WATCH, "keep_checkpoints": 3, "keep_best": 2}, keep=None)
    item = p.item("train")
    assert [str(a) for a in retention_flags(p, item, item.action.params.watch_eval)][:4] == [
        "--keep-newest", "3", "--keep-best", "2"]
    p = plan(tmp_path, WATCH, keep=None)
    item = p.item("train")
    assert retention_flags(p, item, item.action.params.watch_eval) == []


def test_a_trainer_that_prunes_itself_keeps_the_named_steps(tmp_path):
    p = plan(tmp_path, None)
    doc = {"train": {"keep_checkpoints": 2, "keep_steps": [5]}}
    assert not watch_prunes(doc, p.item("train").action.params, "gpu")
    pin_named_steps(doc, p, "train")
    assert doc["train"]["keep_steps"] == [5, 400, 1200]
    doc = {"train": {"keep_checkpoints": None}}
    pin_named_steps(doc, p, "train")
    assert "keep_steps" not in doc["train"]  # keeps all anyway


def test_keep_checkpoints_on_a_console_watcher_is_refused_naming_the_field(tmp_path):
    with pytest.raises(PlanError) as ei:
        plan(tmp_path, {**WATCH, "on": "console", "host": "ev", "keep_checkpoints": 2})
    msgs = [str(i) for i in ei.value.issues]
    assert any("keep_checkpoints is a detached watcher's" in m and "watch_eval" in m
               for m in msgs), msgs
