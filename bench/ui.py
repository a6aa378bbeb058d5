"""Console responsiveness: time to first frame on a big store, frame gaps under a log flood.

    python bench/ui.py [--items 200] [--runs 2000] [--points 1000000] [--rate 10000]
                       [--seconds 5] [--repeat 3] [--flood-repeat 3] [--no-relay]
                       [--ssh-relay] [--dir DIR] [--keep]

1. **First frame.** Builds a plan of ``--items`` items on a local host and a state file with
   ``--runs`` runs (logs, a journal, statuses), ``--points`` metric points (spread over the
   training items' runs) and a tau comparison (10 drafters + a baseline x 80 prompts). Then,
   ``--repeat`` times, starts a fresh ``python`` that imports the console, opens the store and
   runs the app headless at 120x40: *first frame* is the wall time from spawning it to
   Textual's ``Ready`` (the first frame composited); *loaded* is until the selected item's
   detail, log and curves and the tau table have arrived. Goal: first frame < 1.5 s.
2. **Flood.** In this process, the app runs a real local shell item that prints ``--rate``
   lines/s (one in 50 a JSON metrics record) for ``--seconds`` s, shown live in the log pane,
   while a 60 Hz timer in the app records when it gets to run. The *worst frame gap* is the
   longest interval between two ticks while lines arrive (the longest the UI could not paint
   or take a key); frames are also counted and timed (the screen's compositor refresh: render
and output). When
   this build has the ``relay`` action, a local relay at full speed runs at the same time.
   The same ticker's worst gap over a few idle seconds first is printed as a baseline
   (what the machine's scheduler alone costs). Goal: worst gap < 100 ms. ``--ssh-relay``
   adds one flood per relay data path with the relay between two real sshd hosts on
   loopback (whose sshd processes then share this machine's CPUs with the console).

Prints one JSON line per measurement and a summary with the goals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FLOOD_PY = r"""
import json, sys, time
rate, seconds = int(sys.argv[1]), float(sys.argv[2])
per_tick, tick = max(1, rate // 100), 0.01
pad = "x" * 40
n, t0 = 0, time.monotonic()
while time.monotonic() - t0 < seconds:
    out = []
    for _ in range(per_tick):
        n += 1
        if n % 50 == 0:
            out.append(json.dumps({"step": n, "loss": 1.0 + 1.0 / n, "lr": 1e-4}))
        else:
            out.append(f"step {n} tokens/s 12345.6 eta 01:02:03 {pad}")
    sys.stdout.write("\n".join(out) + "\n")
    sys.stdout.flush()
    due = t0 + (n / rate)
    delay = due - time.monotonic()
    if delay > 0:
        time.sleep(delay)
print(f"done {n} lines")
"""


def log(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


# -- the dataset ---------------------------------------------------------------------------
def build_dataset(root: Path, items: int, runs: int, points: int) -> tuple[Path, Path]:
    from core.state.records import EvalRow
    from core.state.store import Store

    plan_path, db = root / "big.yaml", root / "big.db"
    marker = root / "built.json"
    want = {"items": items, "runs": runs, "points": points}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return plan_path, db
    for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        p.unlink(missing_ok=True)
    n_train = max(1, items // 10)
    lines = ["name: big", "hosts:", f"  here: {{local: true, workdir: {root}/here}}", "items:"]
    ids = []
    for i in range(items):
        kind = "train" if i < n_train else ("eval" if i < 2 * n_train else "step")
        iid = f"{kind}-{i:03d}"
        ids.append(iid)
        lines.append(f"  - id: {iid}")
        lines.append(f"    content: {kind} item {i} of the big bench plan")
        lines.append(f"    priority: {('high', 'medium', 'low')[i % 3]}")
        if i % 7 and i > 0:
            lines.append(f"    needs: [{ids[i - 1]}]")
        if i % 13 == 12:
            continue  # a manual item
        lines.append(f"    action: {{kind: shell, host: here, params: {{command: \"echo {iid}\"}}}}")
    plan_path.write_text("\n".join(lines) + "\n")

    t0 = time.perf_counter()
    store = Store(db)
    per_item = max(1, runs // items)
    train_runs: list[str] = []
    t = 1_767_225_600.0
    with store.atomic():
        for i, iid in enumerate(ids):
            for a in range(1, per_item + 1):
                rid = f"{iid}-{a:02d}"
                store.claim_run(rid, iid, "shell", "here", owner="bench:1:1")
                store.update_run(rid, state="running", pid=1, started_at=t,
                                 capsule=f"/nonexistent/{rid}")
                store.append_log(rid, 0, "".join(f"{iid} attempt {a} line {k}\n"
                                                 for k in range(20)).encode())
                state = "failed" if a == per_item and i % 5 == 0 else "succeeded"
                store.end_run(rid, state, exit_code=0 if state == "succeeded" else 1)
                t += 60
                if i < n_train:
                    train_runs.append(rid)
            store.set_status(iid, "failed" if i % 5 == 0 else "done")
    names = ["loss", "lr", "acc[0]", "acc[1]", "acc[2]"]
    steps = max(1, points // (len(train_runs) * len(names)))
    for rid in train_runs:
        rows = []
        for s in range(steps):
            loss = 4 * math.exp(-s / (steps / 4)) + 1
            rows += [(s, "loss", loss), (s, "lr", 1e-4), (s, "acc[0]", 0.5), (s, "acc[1]", 0.4),
                     (s, "acc[2]", 0.3)]
        store.add_metrics(rid, rows)
    settings = {"mode": "online", "block_size": 8, "tree_budget": None, "target": "t",
                "prompts": "p80"}
    evals = []
    for d in range(11):
        role, name = ("baseline", "base") if d == 0 else ("drafter", f"d{d}")
        for p in range(80):
            rounds = [1 + (p * 7 + d * 3 + k) % 8 for k in range(200)]
            pp = [sum(1 for r in rounds if r - 1 >= k) / len(rounds) for k in range(1, 8)]
            evals.append(EvalRow(run_id=f"eval-{d:03d}-01", item_id=f"eval-{d:03d}",
                                 drafter=name, role=role, prompt_id=f"p{p:02d}",
                                 tau=sum(rounds) / len(rounds), rounds=rounds,
                                 per_position=pp, settings=settings))
    store.add_eval_results(evals)
    total = store.db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
    nruns = store.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    store.close()
    log({"dataset": str(root), "items": items, "runs": nruns, "metric_points": total,
         "eval_rows": len(evals), "build_s": round(time.perf_counter() - t0, 1)})
    marker.write_text(json.dumps(want))
    return plan_path, db


# -- 1. first frame (child process) ---------------------------------------------------------
def child_first_frame(plan_path: str, db: str, out: str) -> None:
    t_start = time.time()
    from console import messages as m
    from console.app import SpecdeckApp
    from console.bridge import EventBridge
    from core.plans.planfile import load_plan
    from core.session import Session
    from core.state.store import Store

    t_imported = time.time()
    marks: dict[str, float] = {}
    wanted = {m.ItemDetailLoaded: "detail", m.LogLoaded: "log", m.MetricsLoaded: "metrics",
              m.TauLoaded: "tau"}

    class Probe(SpecdeckApp):
        """The console, noting when the first frame is up and when the data has arrived."""

        def on_ready(self) -> None:
            marks.setdefault("ready", time.time())

        def post_message(self, message) -> bool:
            name = wanted.get(type(message))
            if name and name not in marks:
                marks[name] = time.time()
                if all(v in marks for v in wanted.values()):
                    self.call_after_refresh(self._shown)
            return super().post_message(message)

        def _shown(self) -> None:
            marks["shown"] = time.time()
            self.exit()

    plan = load_plan(plan_path)
    store = Store(db)
    bridge = EventBridge()
    app = Probe(Session.open(plan, store=store, emit=bridge), bridge, gpu_every=0)
    t_built = time.time()
    app.run(headless=True, size=(120, 40))
    store.close()
    Path(out).write_text(json.dumps({"start": t_start, "imported": t_imported,
                                     "built": t_built, **marks}))


def first_frame(plan_path: Path, db: Path, repeat: int) -> list[dict]:
    out = []
    for i in range(repeat):
        res = db.parent / f"ff{i}.json"
        res.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        t0 = time.time()
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child-first-frame",
                        str(plan_path), str(db), str(res)], cwd=REPO, env=env, check=True,
                       timeout=120, stdin=subprocess.DEVNULL)
        r = json.loads(res.read_text())
        rec = {"measure": "first_frame", "try": i + 1,
               "first_frame_s": round(r["ready"] - t0, 3),
               "loaded_s": round(r["shown"] - t0, 3),
               "imports_s": round(r["imported"] - t0, 3),
               "store_plan_app_s": round(r["built"] - r["imported"], 3)}
        log(rec)
        out.append(rec)
    return out


# -- 2. flood -------------------------------------------------------------------------------
async def flood(root: Path, rate: int, seconds: float, *, relay: bool = True,
                ssh: tuple[str, str] | None = None) -> dict:
    from console import messages as m
    from console.app import make_app
    from console.widgets.plan_list import PlanPane
    from core.actions import registry
    from core.plans.planfile import load_plan
    from core.state.store import Store

    here = root / "flood-host"
    here.mkdir(parents=True, exist_ok=True)
    (here / "flood.py").write_text(FLOOD_PY)
    relay = relay and "relay" in registry.kinds()
    text = ["name: flood", "hosts:", f"  a: {{local: true, workdir: {here}}}",
            f"  b: {{local: true, workdir: {root}/flood-dst}}", "items:",
            "  - id: flood", "    content: print lines fast",
            f"    action: {{kind: shell, host: a, params: {{command: \"{sys.executable} -u "
            f"flood.py {rate} {seconds}\"}}}}"]
    if relay:
        blob = here / "blob.bin"
        if not blob.exists() or blob.stat().st_size != 512 << 20:
            with open(blob, "wb") as f:
                for _ in range(512):
                    f.write(os.urandom(1 << 20))
        shutil.rmtree(root / "flood-dst", ignore_errors=True)
        src, dst = "a", "b"
        if ssh:  # two real sshd hosts on loopback; the relay goes through this console
            text[3:3] = [f"  sa: {{ssh: {ssh[0]}, workdir: {here}}}",
                         f"  sb: {{ssh: {ssh[1]}, workdir: {root}/flood-dst}}"]
            src, dst = "sa", "sb"
        text += ["  - id: relay", f"    content: relay 512 MiB {src} -> {dst} at full speed",
                 f"    action: {{kind: relay, params: {{src: \"{src}:blob.bin\", "
                 f"dst: \"{dst}:blob.bin\"}}}}"]
    (root / "flood.yaml").write_text("\n".join(text) + "\n")
    plan = load_plan(root / "flood.yaml")
    db = root / "flood.db"
    for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        p.unlink(missing_ok=True)
    store = Store(db)
    app = make_app(plan, store, gpu_every=0)
    ticks: list[float] = []
    frames: list[tuple[float, float]] = []
    window: dict[str, float] = {}
    seen: list = []

    def hook(msg) -> None:
        if isinstance(msg, m.RunStarted) and msg.item_id == "flood":
            window["start"] = time.perf_counter()
        elif isinstance(msg, m.RunEnded) and msg.item_id == "flood":
            window["end"] = time.perf_counter()
        elif isinstance(msg, m.LogLinesArrived):
            seen.append((time.perf_counter(), len(msg.lines)))

    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        screen = app.screen
        refresh = screen._compositor_refresh  # noqa: SLF001 - timing each frame's render

        def timed_refresh(*args, **kw):
            t = time.perf_counter()
            try:
                return refresh(*args, **kw)
            finally:
                frames.append((t, time.perf_counter() - t))

        screen._compositor_refresh = timed_refresh  # noqa: SLF001
        app.set_interval(1 / 60, lambda: ticks.append(time.perf_counter()))
        app.query_one(PlanPane).select("flood")
        await pilot.pause()
        await app.workers.wait_for_complete()
        # Baseline: the same ticker while nothing streams (scheduler noise of this machine).
        idle_from = time.perf_counter()
        idle_done = asyncio.Event()
        app.set_timer(min(seconds, 3.0), idle_done.set)
        await idle_done.wait()
        idle_to = time.perf_counter()
        if relay:
            app.start_item("relay", False)  # r + y, without moving the cursor
        await pilot.press("r", "y")  # run the selected item, confirming
        await app.workers.wait_for_complete()
        await pilot.pause()
        lines_shown = app.query_one("#log").line_count
    stored = store.db.execute("SELECT SUM(log_lines) FROM runs WHERE item_id = 'flood'"
                              ).fetchone()[0]
    relay_state = None
    if relay:
        r = store.latest_run("relay")
        relay_state = r and r.state
        if r and r.state == "succeeded" and r.ended_at and r.started_at:
            mbs = (512 << 20) / max(r.ended_at - r.started_at, 1e-6) / 1e6
            relay_state = f"succeeded, 512 MiB at {mbs:.0f} MB/s alongside the flood"
    store.close()
    idle = [t for t in ticks if idle_from <= t <= idle_to]
    idle_gaps = [b - a for a, b in zip(idle, idle[1:])]
    t0, t1 = window["start"], window["end"]
    inside = [t for t in ticks if t0 <= t <= t1]
    gaps = [b - a for a, b in zip(inside, inside[1:])]
    fr = [d for t, d in frames if t0 <= t <= t1]
    return {"measure": "flood", "rate_lines_s": rate, "seconds": seconds,
            "lines_stored": stored, "achieved_lines_s": round(stored / (t1 - t0)),
            "batches": len(seen), "log_lines_kept": lines_shown,
            "worst_frame_gap_ms": round(1000 * max(gaps), 1) if gaps else None,
            "p99_frame_gap_ms": round(1000 * sorted(gaps)[int(0.99 * (len(gaps) - 1))], 1)
            if gaps else None,
            "idle_worst_gap_ms": round(1000 * max(idle_gaps), 1) if idle_gaps else None,
            "frames": len(fr), "worst_frame_render_ms": round(1000 * max(fr), 1) if fr else None,
            "relay": relay_state or ("not in this build" if relay is None else "not run")}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-first-frame":
        child_first_frame(*sys.argv[2:5])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="dataset folder (reused when it matches)")
    ap.add_argument("--keep", action="store_true", help="keep the dataset folder")
    ap.add_argument("--no-relay", action="store_true", help="flood without a relay alongside")
    ap.add_argument("--flood-repeat", type=int, default=3, help="floods to run (median reported)")
    ap.add_argument("--ssh-relay", action="store_true",
                    help="also one flood per relay data path with the relay between two real "
                         "sshd hosts (ssh client path, then the asyncssh fallback)")
    args = ap.parse_args()
    log({"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]})
    root = Path(args.dir or tempfile.mkdtemp(prefix="specdeck-bench-ui-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        plan_path, db = build_dataset(root, args.items, args.runs, args.points)
        ff = first_frame(plan_path, db, args.repeat)
        floods = []
        for i in range(args.flood_repeat):
            floods.append(asyncio.run(flood(root, args.rate, args.seconds,
                                            relay=not args.no_relay)))
            log({**floods[-1], "try": i + 1})
        if args.ssh_relay and not args.no_relay:
            sys.path.insert(0, str(REPO / "bench"))
            from _sshd import sshd_hosts

            with sshd_hosts(2) as (servers, _tmp):
                for path in ("bulk", "asyncssh"):
                    os.environ["SPECDECK_RELAY_PATH"] = path
                    rec = asyncio.run(flood(root, args.rate, args.seconds,
                                            ssh=(servers[0].alias, servers[1].alias)))
                    os.environ.pop("SPECDECK_RELAY_PATH")
                    log({**rec, "relay_over": f"ssh ({path} path)"})
                    print(f"ssh relay ({path} path) alongside the flood: worst frame gap "
                          f"{rec['worst_frame_gap_ms']} ms, p99 {rec['p99_frame_gap_ms']} ms; "
                          f"relay: {rec['relay']}", flush=True)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    worst_ff = max(r["first_frame_s"] for r in ff)
    med_ff = statistics.median(r["first_frame_s"] for r in ff)
    med_loaded = statistics.median(r["loaded_s"] for r in ff)
    fl = sorted(floods, key=lambda r: r["worst_frame_gap_ms"] or 1e9)[len(floods) // 2]
    gap = fl["worst_frame_gap_ms"]
    gaps = [r["worst_frame_gap_ms"] for r in floods]
    ok_ff, ok_gap = worst_ff < 1.5, gap is not None and gap < 100
    print(f"\nfirst frame: median {med_ff:.2f} s, worst {worst_ff:.2f} s "
          f"(goal < 1.5 s: {'ok' if ok_ff else 'MISSED'}); everything loaded: median "
          f"{med_loaded:.2f} s")
    print(f"flood (median of {len(floods)} by worst gap; all worst gaps {gaps} ms): "
          f"{fl['achieved_lines_s']} lines/s for {args.seconds:g} s in {fl['batches']} "
          f"batches; worst frame gap {gap} ms, p99 {fl['p99_frame_gap_ms']} ms "
          f"(goal < 100 ms: {'ok' if ok_gap else 'MISSED'}); idle baseline {fl['idle_worst_gap_ms']} "
          f"ms; {fl['frames']} frames, worst render {fl['worst_frame_render_ms']} ms; relay: "
          f"{fl['relay']}")
    return 0 if ok_ff and ok_gap else 1


if __name__ == "__main__":
    sys.exit(main())
