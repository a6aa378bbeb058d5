"""Checkpoints are read when whole, and what a trainer leaves beside them never fails its run
(issue 42 §3, §7), over real folders on a real local host: a speculators epoch dir saved in two
halves with a pause, a link loop, a FIFO, a safetensors header that claims more bytes than the
file has.

* :mod:`core.ml.formats.layouts` names each bad entry by its file, and lists a host's output dir with
  ``find`` exactly as it lists a local one;
* the train action records another trainer's checkpoint only once it is whole (the console's
  scan) and ``finish`` records the good ones, names the bad ones and does not fail the run;
* the console watcher records a failed read only once the checkpoint has stayed unchanged for
  ``settle_s``, and reads a checkpoint that changed since its failed read again."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import time
from pathlib import Path

from core.actions.watch_eval.on_console import Watcher
from core.capsules.jobs import Outcome
from core.ml.formats import layouts
from core.runs.runner import Runner, _Context
from tests.unit.test_train_external import train_runner

RUN = "r1"
SETTLE = 0.5


def weights(n: int = 4096, claim: int | None = None) -> bytes:
    """A real safetensors file: one U8 tensor of ``n`` bytes, its header saying ``claim``."""
    size = n if claim is None else claim
    head = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    return struct.pack("<Q", len(head)) + head + bytes(i % 251 for i in range(n))


def truncated(path: Path, blob: bytes, has: int) -> str:
    """What the header check says of ``path`` holding ``has`` bytes of a file ``blob`` claims
    the size of."""
    n = struct.unpack("<Q", blob[:8])[0]
    want = 8 + n + json.loads(blob[8:8 + n])["w"]["data_offsets"][1]
    return f"{path}: truncated (header says {want} bytes, file has {has})"


def epoch_dir(out: Path, epoch: int, blob: bytes | None = None) -> Path:
    """A speculators epoch dir as its ``save_pretrained`` leaves it."""
    d = out / str(epoch)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"speculators_model_type": "dflash"}))
    (d / "model.safetensors").write_bytes(weights() if blob is None else blob)
    return d


def hostile(out: Path) -> None:
    """Good epochs 0 and 1 (1 marked saved by its trainer's pointer, its val_metrics.json a
    FIFO); epoch 2's header claims twice the bytes its file has; epoch 4's weights are a link
    to themselves; run.yaml and checkpoint_best are link loops; ``loop`` links to itself."""
    epoch_dir(out, 0)
    epoch_dir(out, 1)
    os.symlink("1", out / "epoch1_end")
    os.mkfifo(out / "1" / "val_metrics.json")
    epoch_dir(out, 2, weights(claim=8192))
    d = epoch_dir(out, 4)
    (d / "model.safetensors").unlink()
    os.symlink("model.safetensors", d / "model.safetensors")
    for name in ("run.yaml", "checkpoint_best", "loop"):
        os.symlink(name, out / name)


def test_each_bad_entry_is_named_by_its_file_and_find_lists_what_python_does(tmp_path):
    out = tmp_path / "ckpts"
    hostile(out)
    os.mkfifo(out / "step_7.pt")  # specdeck's layout: a FIFO, which a load would wait on forever
    (out / "step_9.pt").mkdir()
    res = subprocess.run(["bash", "-c", layouts.find_command(str(out))], capture_output=True,
                         text=True, timeout=60)
    found, local = layouts.parse_find(res.stdout), layouts.list_local(str(out))

    def shape(rows):
        return sorted((r.path, r.kind, r.size, r.target) for r in rows)

    assert shape(found) == shape(local)
    assert ("4/model.safetensors", "l", len("model.safetensors"), "model.safetensors") in shape(local)
    got = {e.checkpoint.step: e for e in layouts.local_entries(str(out))}
    assert sorted(got) == [0, 1, 2, 4, 7, 9]
    assert [got[s].complete for s in (0, 1)] == [False, True]  # epoch1_end: its trainer's mark
    problems = {s: layouts.content_problem(e) for s, e in got.items()}
    assert problems[0] is None and problems[1] is None
    lying = weights(claim=8192)
    assert problems[2] == truncated(out / "2/model.safetensors", lying, len(lying))
    assert problems[4] == f"{out}/4/model.safetensors: is a symbolic link, not a regular file"
    assert problems[7] == f"{out}/step_7.pt: is a FIFO, not a regular file"
    assert problems[9] == f"{out}/step_9.pt: is a directory, not a regular file"
    # the other rules keep their readings: a trainer limits the layout, pointers are no checkpoints
    assert [e.checkpoint.step for e in layouts.local_entries(str(out), "specdeck")] == [7, 9]
    assert layouts.scan_dir(str(out), "speculators") == [
        layouts.Checkpoint(s, str(out / str(s)), "speculators") for s in (0, 1, 2)]


def test_a_save_that_stalls_half_way_is_not_whole_until_the_rest_is_written(tmp_path):
    out = tmp_path / "ckpts"
    blob = weights(1 << 16)
    d = epoch_dir(out, 3, blob[: len(blob) // 2])
    steady = layouts.Steady(SETTLE)

    def look() -> tuple[bool, str | None]:
        (e,) = layouts.local_entries(str(out), "speculators")
        return steady.steady(e.checkpoint.path, e.state), layouts.content_problem(e)

    half = truncated(d / "model.safetensors", blob, len(blob) // 2)
    assert look() == (False, half)  # just seen: not steady yet
    time.sleep(SETTLE + 0.1)
    assert look() == (True, half)  # unchanged for the settle time, yet its header says not whole
    with open(d / "model.safetensors", "ab") as f:
        f.write(blob[len(blob) // 2:])
    assert look() == (False, None)  # changed: it must stay unchanged for the settle time again
    time.sleep(SETTLE + 0.1)
    assert look() == (True, None)


def _runner(tmp_path: Path, watch: dict | None = None) -> Runner:
    """A speculators train item writing to ``box/ckpts``, with its run ``r1`` recorded."""
    params = {"trainer": "speculators", "command": "true", "out": "ckpts"}
    if watch is not None:
        params["watch_eval"] = {"on": "console", "host": "box", "target": "models/t",
                                "settle_s": SETTLE, **watch}
    runner = train_runner(tmp_path, params)
    assert runner.store.claim_run(RUN, "train", "train", "box", owner=runner.owner) is not None
    return runner


async def _context(runner: Runner) -> _Context:
    item = runner.plan.item("train")
    return _Context(runner, item, await runner.host("box"), RUN)


def test_finish_records_the_good_checkpoints_names_the_bad_and_the_run_succeeds(tmp_path):
    runner = _runner(tmp_path)
    out = tmp_path / "box" / "ckpts"
    hostile(out)

    async def go():
        ctx = await _context(runner)
        action = runner.action(ctx.item)
        try:
            return await action.finish(ctx, Outcome("succeeded", 0, capsule=str(tmp_path / "cap"),
                                                    run_id=RUN))
        finally:
            await runner.close()

    result = asyncio.run(asyncio.wait_for(go(), 60))  # the FIFOs are never opened
    assert result["checkpoints"] == [0, 1] and result["out"] == str(out)
    assert [(a.step, a.path) for a in runner.store.artefacts("train", "checkpoint")] == \
        [(0, str(out / "0")), (1, str(out / "1"))]
    lying = weights(claim=8192)
    named = sorted(e.message for e in runner.store.events(kinds=["checkpoint_bad"]))
    assert named == [truncated(out / "2/model.safetensors", lying, len(lying))
                     + ": skipped, not a checkpoint to read",
                     f"{out}/4/model.safetensors: is a symbolic link, not a regular file: "
                     "skipped, not a checkpoint to read"]
    assert runner.store.run(RUN).config is None  # run.yaml, a link loop, is not read


def test_the_console_records_a_stalled_save_only_once_it_is_whole(tmp_path):
    runner = _runner(tmp_path, {"mode": "online"})
    out = tmp_path / "box" / "ckpts"
    blob = weights(1 << 16)

    async def go():
        ctx = await _context(runner)
        action = runner.action(ctx.item)
        action.SCAN_S = 0.05
        ended = asyncio.Event()
        scan = asyncio.create_task(action._scan_checkpoints(ctx, ctx.host, runner.store.run(RUN),
                                                            ended))
        d = epoch_dir(out, 3, blob[: len(blob) // 2])
        await asyncio.sleep(4 * SETTLE)  # stalled far longer than the settle time
        before = runner.store.artefacts("train", "checkpoint")
        with open(d / "model.safetensors", "ab") as f:
            f.write(blob[len(blob) // 2:])
        deadline = time.monotonic() + 20
        while not runner.store.artefacts("train", "checkpoint") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        whole = (d / "model.safetensors").stat().st_size
        ended.set()
        await scan
        await runner.close()
        return before, whole

    before, whole = asyncio.run(asyncio.wait_for(go(), 60))
    assert before == []  # never recorded half-written
    (art,) = runner.store.artefacts("train", "checkpoint")
    assert (art.step, art.path, art.data["layout"]) == (3, str(out / "3"), "speculators")
    assert whole == len(blob)


def test_a_failed_read_is_recorded_once_unchanged_and_read_again_when_it_changed(tmp_path):
    # the eval cannot run (no feature cache on the eval host): a real failure, every time
    runner = _runner(tmp_path, {"mode": "offline", "cache": "feats", "backfill": True})
    out = tmp_path / "box" / "ckpts"
    for epoch in (3, 4):
        epoch_dir(out, epoch)
    events: list[tuple[str, int]] = []

    async def go():
        ctx = await _context(runner)
        for epoch in (3, 4):
            assert ctx.record_artefact("checkpoint", str(out / str(epoch)), epoch,
                                       data={"layout": "speculators"})
        watcher = Watcher(ctx, runner.plan.item("train").action.params.watch_eval, poll=0.05)
        done = asyncio.Event()
        done.set()
        task = asyncio.create_task(watcher.run(done))
        while 3 not in watcher.failing:
            await asyncio.sleep(0.01)
        failed_at = time.monotonic()
        assert runner.store.watch_entries(RUN)[0].state == "running"  # not recorded yet
        (out / "3" / "model.safetensors").write_bytes(weights(8192))  # the save went on
        await task
        for e in runner.store.events(kinds=["watch_retry", "watch_failed"]):
            events.append((e.kind, int(e.message.split("step ")[1].split()[0])))
        await runner.close()
        return time.monotonic() - failed_at

    took = asyncio.run(asyncio.wait_for(go(), 60))
    entries = {e.step: e for e in runner.store.watch_entries(RUN)}
    assert {s: e.state for s, e in entries.items()} == {3: "failed", 4: "failed"}
    assert all("no extract manifest" in e.error for e in entries.values())
    # step 3 changed after its failed read: read again, and only that read's failure recorded
    assert events.count(("watch_retry", 3)) == 1 and events.count(("watch_failed", 3)) == 1
    assert events.index(("watch_retry", 3)) < events.index(("watch_failed", 3))
    assert ("watch_retry", 4) not in events and events.count(("watch_failed", 4)) == 1
    assert took >= 2 * SETTLE  # settled again, then unchanged for the settle time after its read


def test_the_console_copies_only_the_regular_files_of_an_epoch_dir_to_the_eval_host(tmp_path):
    from core.hosts.local import LocalHost

    runner = _runner(tmp_path, {"mode": "online"})
    d = epoch_dir(tmp_path / "box" / "ckpts", 3)
    os.mkfifo(d / "val_metrics.json")  # reading it would wait forever for a writer
    os.symlink("config.json", d / "extra.json")
    ev = LocalHost("ev", workdir=str(tmp_path / "ev"))

    async def go():
        ctx = await _context(runner)
        assert ctx.record_artefact("checkpoint", str(d), 3, data={"layout": "speculators"})
        (art,) = ctx.artefacts(kind="checkpoint")
        watcher = Watcher(ctx, runner.plan.item("train").action.params.watch_eval)
        try:
            return await watcher._fetch(art, ctx.host, ev, str(tmp_path / "ev" / "cap"))
        finally:
            await runner.close()

    local, config = asyncio.run(asyncio.wait_for(go(), 60))
    copied = sorted(n for n in os.listdir(local) if not n.endswith(".sha256"))  # relay's own
    assert config is None and copied == ["config.json", "model.safetensors"]
    assert (Path(local) / "model.safetensors").read_bytes() == weights()
