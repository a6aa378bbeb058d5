"""Class 5 (issue 28): a detached watcher's results are untrusted files. Each
``results/step_N.json`` in the watcher's capsule is read on its own, only as a regular file
(never through a link, never a FIFO or a device), bounded and schema-checked; a bad one is
that step's failure, with its reason stored, and the later steps are ingested. Step numbers
past SQLite's int64 are left out, said once. A watcher that cannot start is marked failed
with the reason and nothing waits for it. Real store files, real local hosts, the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.actions.watch_eval import detached as watch_detached
from core.plans.planfile import parse_plan
from core.runs.runner import Runner, _Context
from core.state.store import Store
from tests.fault.conftest import cli, rows

WATCH = {"target": "models/target", "cache": "feats", "max_prompts": 1}


def _plan(root: Path) -> Path:
    wd = root / "wd"
    wd.mkdir(parents=True, exist_ok=True)
    p = root / "t.yaml"
    p.write_text(json.dumps({
        "name": "wr", "hosts": {"gpu": {"local": True, "workdir": str(wd)}},
        "items": [{"id": "train", "content": "train with a tau watcher",
                   "action": {"kind": "train", "host": "gpu", "params": {
                       "command": "true", "out": "out", "watch_eval": WATCH}}}]}))
    return p


def _setup(root: Path, *, ended: bool = True) -> tuple[Path, Path, str, Path]:
    """A plan, its state file with an ended train run whose watcher is live, and the
    watcher's results dir (what the watcher would have written into)."""
    plan = _plan(root)
    db = root / "s.db"
    store = Store(db)
    run_id = "train-0101-000000-abcd"
    cap = root / "wd" / ".specdeck" / "runs" / run_id
    cap.mkdir(parents=True)
    store.claim_run(run_id, "train", "train", "gpu", owner="test")
    store.update_run(run_id, state="running", capsule=str(cap))
    if ended:
        store.end_run(run_id, "succeeded", exit_code=0)
    wcap = root / "wd" / ".specdeck" / "runs" / f"{run_id}-watch"
    (wcap / "results").mkdir(parents=True)
    (wcap / "pid").write_text("1 0\n")  # the watcher ended while no specdeck looked
    (wcap / "exit").write_text("exit 0\n")
    store.watcher_claim(run_id, "train", "gpu", str(wcap), str(root / "wd" / "out"))
    store.watcher_update(run_id, state="watching")
    store.close()
    return plan, db, run_id, wcap / "results"


def good(step: int, tau: float = 2.5) -> dict:
    return {"step": step, "state": "done", "seconds": 1.0,
            "result": {"tau": tau, "mode": "offline", "per_prompt": [
                {"id": "p0", "tau": tau, "rounds": [2, 3]}]}}


BAD = {
    "not-json": b"{\"state\": \"done\", ",
    "binary": b"\x00\xff\xfe\x13garbage",
    "empty": b"",
    "a-list": b"[1, 2, 3]",
    "deep": b"[" * 100000 + b"]" * 100000,
    "nan-tau": json.dumps(good(0, float("nan"))).encode(),
    "inf-tau": b'{"state": "done", "result": {"tau": Infinity}}',
    "huge-tau": b'{"state": "done", "result": {"tau": 1' + b"0" * 400 + b"}}",
    "string-tau": b'{"state": "done", "result": {"tau": "2.5"}}',
    "no-result": b'{"state": "done"}',
    "bad-per-prompt": b'{"state": "done", "result": {"tau": 2.0, "per_prompt": [7]}}',
    "bad-state": b'{"state": {"x": 1}}',
    "wrong-step": json.dumps(good(999999)).encode(),
    "bool-tau": b'{"state": "done", "result": {"tau": true}}',
}


def _place(results: Path, step: int, kind: str, target: Path) -> None:
    f = results / f"step_{step}.json"
    if kind == "link":
        target.write_text(json.dumps(good(step)))
        f.symlink_to(target)  # outside the capsule: never followed
    elif kind == "fifo":
        os.mkfifo(f)  # nobody writes it: opening it would hang
    elif kind == "directory":
        f.mkdir()
    elif kind == "too-big":
        with open(f, "wb") as fh:
            fh.truncate(64 << 20)
    elif kind == "device":
        f.symlink_to("/dev/zero")
    else:
        f.write_bytes(BAD[kind])


def _ingest(plan: Path, db: Path, run_id: str) -> list[int]:
    async def go():
        store = Store(db)
        runner = Runner(parse_plan(plan.read_text(), str(plan), path=plan), store, poll=0.05)
        item = runner.plan.item("train")
        try:
            return await asyncio.wait_for(watch_detached.ingest(
                _Context(runner, item, None, run_id), runner.action(item).params.watch_eval), 120)
        finally:
            await runner.close()
            store.close()
    return asyncio.run(go())


def _entries(db: Path, run_id: str) -> dict[int, tuple[str, float | None, str | None]]:
    return {s: (state, tau, err) for s, state, tau, err in rows(
        db, "SELECT step, state, tau, error FROM watch_evals WHERE run_id = ?", [run_id])}


KINDS = sorted(BAD) + ["link", "fifo", "directory", "too-big", "device"]


@pytest.mark.parametrize("kind", KINDS)
def test_fault_bad_result_is_that_steps_failure_later_steps_go_on(tmp_path, kind):
    plan, db, run_id, results = _setup(tmp_path)
    (results / "step_10.json").write_text(json.dumps(good(10, 2.0)))
    _place(results, 20, kind, tmp_path / "elsewhere.json")
    (results / "step_30.json").write_text(json.dumps(good(30, 3.0)))
    before = {p.name: (p.lstat().st_size, p.lstat().st_mtime) for p in results.iterdir()}
    assert sorted(_ingest(plan, db, run_id)) == [10, 20, 30]
    got = _entries(db, run_id)
    assert got[10][:2] == ("done", 2.0) and got[30][:2] == ("done", 3.0)
    state, tau, err = got[20]
    assert state == "failed" and tau is None and "result file step_20.json" in err, got[20]
    taus = rows(db, "SELECT step, value FROM metrics WHERE run_id = ? AND name = 'tau' "
                    "ORDER BY step", [run_id])
    assert taus == [(10, 2.0), (30, 3.0)]
    notes = [m for (m,) in rows(db, "SELECT message FROM events WHERE kind = 'watch_failed'")]
    assert len(notes) == 1 and "step 20" in notes[0]
    assert {p.name: (p.lstat().st_size, p.lstat().st_mtime) for p in results.iterdir()} \
        == before  # files untouched
    # a second look stores nothing twice
    assert _ingest(plan, db, run_id) == []


@pytest.mark.parametrize("digits", [20, 64, 240])  # 255 bytes: the longest name
def test_fault_huge_step_names_are_bounded_to_int64(tmp_path, digits):
    plan, db, run_id, results = _setup(tmp_path)
    (results / f"step_{'9' * digits}.json").write_text(json.dumps(good(1)))
    (results / "step_-5.json").write_text(json.dumps(good(1)))
    (results / "step_\u0661\u0662.json").write_text(json.dumps(good(1)))
    (results / f"step_{(1 << 63) - 1}.json").write_text(json.dumps(good((1 << 63) - 1)))
    (results / "step_40.json").write_text(json.dumps(good(40)))
    assert sorted(_ingest(plan, db, run_id)) == [40, (1 << 63) - 1]
    assert _ingest(plan, db, run_id) == []
    noise = rows(db, "SELECT message FROM events WHERE kind = 'watch_bad_name'")
    assert len(noise) == 3, noise  # one notice per unusable name, not one per look


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(
                         st.sampled_from(["state", "result", "tau", "per_prompt", "id", "step",
                                          "baseline", "error", "rounds", "ddtree"]), c,
                         max_size=4), max_leaves=12)
_content = st.one_of(
    _json.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda t, pp: json.dumps({"state": "done", "result": {
        "tau": t, "per_prompt": pp}}).encode(), st.floats() | st.integers(), _json),
    st.binary(max_size=64),
    st.integers(1, 2000).map(lambda n: b"[" * n + b"]" * n))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(contents=st.lists(_content, min_size=1, max_size=4))
def test_fault_hypothesis_result_files_never_break_ingest(contents):
    root = Path(tempfile.mkdtemp(prefix="wr-"))
    try:
        plan, db, run_id, results = _setup(root)
        steps = [10 * (i + 1) for i in range(len(contents))]
        for step, raw in zip(steps, contents):
            (results / f"step_{step}.json").write_bytes(raw)
        last = steps[-1] + 10
        (results / f"step_{last}.json").write_text(json.dumps(good(last, 4.0)))
        assert sorted(_ingest(plan, db, run_id)) == steps + [last]
        got = _entries(db, run_id)
        assert got[last][:2] == ("done", 4.0)  # a later good step is always ingested
        for step in steps:
            state, tau, err = got[step]
            assert state in ("done", "failed")
            if state == "done":
                assert isinstance(tau, float) and tau == tau and abs(tau) != float("inf")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_fault_cli_status_and_attach_ingest_hostile_results(tmp_path):
    """Through the real CLI (status reconciles, attach follows the watcher to its end):
    no traceback, the good steps stored, the bad ones failed with their reason."""
    plan, db, run_id, results = _setup(tmp_path)
    (results / "step_10.json").write_text(json.dumps(good(10, 2.0)))
    _place(results, 20, "fifo", tmp_path / "x")
    _place(results, 30, "deep", tmp_path / "x")
    (results / f"step_{'7' * 30}.json").write_text(json.dumps(good(1)))
    (results / "step_40.json").write_text(json.dumps(good(40, 3.0)))
    res = cli("--state", db, "status", plan, timeout=120)
    assert res.returncode == 0, res.stderr
    got = _entries(db, run_id)
    assert {s: v[0] for s, v in got.items()} == {10: "done", 20: "failed", 30: "failed",
                                                 40: "done"}
    assert "FIFO" in got[20][2] and "nested" in got[30][2]


def test_fault_watcher_that_cannot_start_is_failed_and_nothing_waits(tmp_path):
    """The watcher's capsule cannot be written (a file where its directory goes): the
    watcher is marked failed with the reason; the train run ends as it would without it."""
    plan = _plan(tmp_path)
    wd = tmp_path / "wd"
    (wd / "models" / "target").mkdir(parents=True)
    (wd / "models" / "target" / "config.json").write_text("{}")
    (wd / "feats").mkdir()
    (wd / "feats" / "manifest.json").write_text("{}")
    (wd / ".specdeck" / "runs").mkdir(parents=True)
    doc = json.loads(plan.read_text())
    doc["items"][0]["action"]["params"]["command"] = "echo training; sleep 1; echo done"
    plan.write_text(json.dumps(doc))
    db = tmp_path / "s.db"

    async def go():
        store = Store(db)
        runner = Runner(parse_plan(plan.read_text(), str(plan), path=plan), store, poll=0.05)
        real = watch_detached.capsule_id

        def blocked(run_id):  # plant a plain file where the watcher's capsule goes
            cid = real(run_id)
            (wd / ".specdeck" / "runs" / cid).write_text("not a directory")
            return cid
        watch_detached.capsule_id = blocked
        try:
            return await asyncio.wait_for(runner.run_items(["train"]), 120), store
        finally:
            watch_detached.capsule_id = real
            await runner.close()

    summary, store = asyncio.run(go())
    store = Store(db)
    run = store.latest_run("train")
    assert summary.done == ("train",) and run.state == "succeeded", summary
    w = store.watcher(run.id)
    assert w.state == "failed" and "could not start" in (w.error or ""), w
    assert store.log_bytes(run.id).decode().splitlines() == ["training", "done"]
    store.close()
