"""The detached watcher's tau drop told from the host (``Watch.tau_alert``): one notification at
a real JSON webhook on 127.0.0.1, sent by ``python -m core.ml.notify`` in a process of its own,
once however often the step is recorded (a restarted watcher), none for a dip inside
``--drop-pct`` or when its dir is not armed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from core.ml.tasks.watcher import Watch, build_parser
from core.ml.tasks.notify import describe_target
from tests.webhook import Webhook, wait_for

REPO = Path(__file__).resolve().parents[3]
SECRET = "wtok-81c2d"


def rec(step: int, tau: float) -> dict:
    return {"step": step, "state": "done", "result": {"tau": tau}, "seconds": 1.0,
            "cpu_seconds": 1.0, "max_rss_bytes": 1}


def watch(tmp_path: Path, *extra: str) -> Watch:
    args = build_parser().parse_args(["--ckpt-dir", str(tmp_path / "ckpts"), "--target",
                                      str(tmp_path / "target"), "--out", str(tmp_path / "w"),
                                      "--where", "kpro6", *extra])
    return Watch(args)


def arm(out: Path, url: str) -> None:
    (out / "notify.json").write_text(json.dumps({
        "plan": "camp", "item": "train-v5", "host": "kpro6", "run": "r1",
        "events": ["tau_drop"], "target": describe_target(url), "backoff_s": 0.2,
        "patience_s": 10}))
    fd = os.open(out / "notify.url", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, url.encode())
    os.close(fd)


def test_a_tau_drop_is_told_once_from_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the notifier process imports this checkout
    hook = Webhook()
    try:
        w = watch(tmp_path, "--drop-pct", "10")
        arm(w.out, f"json://127.0.0.1:{hook.port}/h/{SECRET}")
        w.record(rec(20, 3.0))
        w.record(rec(40, 2.9))  # 3 % below the best: inside --drop-pct
        w.record(rec(60, 2.0))  # 33 % below: an alert
        wait_for(lambda: hook.got, 20, "the tau drop's message")
        w.record(rec(60, 2.0))  # recorded again (a restarted watcher): not sent again
        time.sleep(1.5)
        assert len(hook.got) == 1
        msg = hook.got[0][1]["message"]
        for word in ("camp", "train-v5", "kpro6", "step 60", "33% below", "3.000 at step 20"):
            assert word in msg, (word, msg)
        assert json.loads((w.out / "notify.tau_drop@60").read_text())["state"] == "sent"
        assert not (w.out / "notify.tau_drop@40").exists()
        assert SECRET not in (w.out / "notify.log").read_text()
    finally:
        hook.close()


def test_an_unarmed_watcher_sends_nothing(tmp_path):
    w = watch(tmp_path, "--drop-pct", "10")  # no notify.json: the plan asks for no tau_drop
    w.record(rec(20, 3.0))
    w.record(rec(60, 1.0))
    assert not list(w.out.glob("notify*"))
