"""Checkpoint retention that knows tau (core.ml.formats.retention): the newest N, the best K
by tau, the pinned ones; nothing deleted before it is evaluated; deletions in each trainer's
layout, links never followed, with the bytes each freed."""

from __future__ import annotations

import os

import pytest

from core.ml.formats import retention
from core.ml.formats.retention import BEST, NEWEST, PINNED, UNEVALUATED, Policy, decide


def test_the_best_tau_survives_keep_newest_two():
    steps = [100, 200, 300, 400, 500]
    taus = {100: 2.1, 200: 3.4, 300: 2.9, 400: 2.5, 500: 2.6}
    d = decide(steps, taus, steps, Policy(newest=2, best=1))
    assert d.keep == {200: (BEST,), 400: (NEWEST,), 500: (NEWEST,)}
    assert d.delete == (100, 300)


def test_pins_are_kept_and_nothing_unevaluated_is_deleted():
    steps = [100, 200, 300, 400, 500, 600]
    taus = {100: 2.0, 200: 1.5, 300: None}  # 300's eval failed: evaluated, no tau
    d = decide(steps, taus, [100, 200, 300], Policy(newest=1, best=1, pins=frozenset({200})))
    assert d.keep == {100: (BEST,), 200: (PINNED,), 400: (UNEVALUATED,), 500: (UNEVALUATED,),
                      600: (NEWEST,)}
    assert d.delete == (300,)


def test_best_k_ties_go_to_the_earlier_step_and_reasons_combine():
    steps = [1, 2, 3, 4]
    taus = {1: 3.0, 2: 3.0, 3: 1.0, 4: 3.5}
    d = decide(steps, taus, steps, Policy(newest=1, best=2, pins=frozenset({4})))
    assert d.keep == {1: (BEST,), 4: (NEWEST, BEST, PINNED)}
    assert d.delete == (2, 3)
    # best 0: tau plays no part
    assert decide(steps, taus, steps, Policy(newest=2, best=0)).delete == (1, 2)
    assert retention.best_steps({1: float("nan"), 2: None, 3: 1.2}, 5) == [3]


def test_a_policy_that_would_delete_the_resume_point_is_refused():
    with pytest.raises(ValueError, match="newest must be >= 1"):
        Policy(newest=0)
    with pytest.raises(ValueError, match="best must be >= 0"):
        Policy(newest=1, best=-1)


def test_apply_deletes_each_layout_counts_bytes_and_never_follows_a_link(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "step_10.pt").write_bytes(b"x" * 1000)                    # specdeck
    forge = out / "run-step20"                                       # SpecForge
    forge.mkdir()
    (forge / "training_state.pt").write_bytes(b"y" * 3000)
    (forge / "sub").mkdir()
    (forge / "sub" / "extra.bin").write_bytes(b"z" * 500)
    outside = tmp_path / "elsewhere"                                 # a link out of the run
    outside.mkdir()
    (outside / "precious.bin").write_bytes(b"p" * 7000)
    (forge / "link").symlink_to(outside)
    spec = out / "3"                                                 # speculators
    spec.mkdir()
    (spec / "model.safetensors").write_bytes(b"w" * 2000)
    (out / "step_40.pt").write_bytes(b"k" * 10)
    names = {10: "step_10.pt", 20: "run-step20", 3: "3", 40: "step_40.pt", 50: "step_50.pt"}
    d = retention.Decision({40: (NEWEST,)}, (3, 10, 20, 50))  # 50 is gone already
    gone = retention.apply(str(out), names, d)
    assert [(g.step, os.path.basename(g.path)) for g in gone] == \
        [(3, "3"), (10, "step_10.pt"), (20, "run-step20")]
    by = {g.step: g.bytes for g in gone}
    assert by[3] == 2000 and by[10] == 1000
    assert by[20] == 3500 + len(str(outside))  # the link counts as itself, not its target
    assert sorted(os.listdir(out)) == ["step_40.pt"]
    assert (outside / "precious.bin").stat().st_size == 7000
