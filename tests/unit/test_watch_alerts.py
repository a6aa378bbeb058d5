"""core.actions.watch_eval alerts against the noise: tau over training stored in a real SQLite store,
each eval recorded through the watcher's own code path (per-prompt rows and metrics)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from core.actions.watch_eval.on_console import Watcher
from core.runs.runner import _Context
from core.state.store import Store

RUN = "train-v5-0101-01"
PROMPTS = [f"q{i}" for i in range(8)]
BASE = [2.2, 3.4, 2.9, 3.8, 2.5, 3.1, 2.7, 3.6]  # per-prompt tau at the first eval


@pytest.fixture
def watcher():
    store = Store(":memory:")
    notices = []
    runner = SimpleNamespace(store=store, emit=notices.append, plan=None, poll=0.1, watch=True)
    ctx = _Context(runner, SimpleNamespace(id="train-v5"), None, RUN)  # the runner's verbs
    w = Watcher(ctx, {"host": "eval", "target": "t", "mode": "online"})
    w.notices, w.store = notices, store
    yield w
    store.close()


def evaluate(w: Watcher, step: int, taus: list[float], loss: float) -> None:
    res = {"tau": sum(taus) / len(taus), "mode": "online", "block_size": 16,
           "per_prompt": [{"id": p, "tau": t, "rounds": [round(t)] * 4}
                          for p, t in zip(PROMPTS, taus)]}
    w.store.add_metrics(RUN, [(step, "loss", loss)])
    w.store.watch_add(RUN, "train-v5", step)
    w._record(step, res, None)
    w.store.watch_update(RUN, step, state="done", tau=res["tau"])
    w.alerts_at(step)


def alerts(w):
    return [n.message for n in w.notices if "ALERT" in n.message]


def test_each_tau_point_has_its_interval(watcher):
    evaluate(watcher, 100, BASE, 2.0)
    lo = watcher.store.metric_series(RUN, "tau_ci95_lo")
    hi = watcher.store.metric_series(RUN, "tau_ci95_hi")
    tau = watcher.store.metric_series(RUN, "tau")
    assert [s for s, _ in lo] == [100] and lo[0][1] < tau[0][1] < hi[0][1]
    assert min(BASE) <= lo[0][1] and hi[0][1] <= max(BASE)


def test_a_drop_inside_the_noise_is_not_an_alert(watcher):
    evaluate(watcher, 100, BASE, 2.0)
    # 12 % lower on average, but half the prompts rose: no detectable drop
    noisy = [t + d for t, d in zip(BASE, (-1.6, +0.5, -1.4, +0.4, -1.2, +0.6, -1.3, +0.3))]
    assert sum(noisy) / 8 < 0.9 * sum(BASE) / 8
    evaluate(watcher, 200, noisy, 1.9)
    assert alerts(watcher) == []
    noise = watcher.store.events(kinds=["watch_noise"])
    assert noise and "inside the noise" in noise[0].message


def test_a_real_drop_is_an_alert_with_its_interval(watcher):
    evaluate(watcher, 100, BASE, 2.0)
    evaluate(watcher, 200, [t - 0.5 for t in BASE], 1.9)
    (msg,) = alerts(watcher)
    assert "below the best so far" in msg and "step 200 is worse than step 100 (-0.50" in msg


def test_flat_tau_while_the_loss_falls_is_an_alert(watcher):
    jitter = [(0.02, -0.02, 0.01, 0.0, -0.01, 0.02, -0.02, 0.0),
              (-0.01, 0.02, 0.0, 0.01, -0.02, 0.0, 0.01, -0.01)]
    evaluate(watcher, 100, BASE, 2.0)
    evaluate(watcher, 200, [t + j for t, j in zip(BASE, jitter[0])], 1.5)
    evaluate(watcher, 300, [t + j for t, j in zip(BASE, jitter[1])], 1.0)
    (msg,) = alerts(watcher)
    assert msg.startswith("ALERT train-v5: tau flat at") and "95 % CI" in msg


def test_rising_tau_is_not_flat(watcher):
    evaluate(watcher, 100, BASE, 2.0)
    evaluate(watcher, 200, [t + 0.3 for t in BASE], 1.5)
    evaluate(watcher, 300, [t + 0.6 for t in BASE], 1.0)
    assert alerts(watcher) == []
