"""``python -m core.ml.watcher``: tau at every checkpoint of a train run, on the host, detached.

    python -m core.ml.watcher --ckpt-dir DIR --target DIR [--cache DIR] [--mode offline|online]
        [--trainer specdeck|specforge|speculators] [--drafter-config CONFIG.json]
        [--prompts FILE] [--limit N] [--block-size B] [--max-new-tokens N] [--dtype D]
        [--device cpu|cuda[:i]] [--max-memory SIZE] [--baseline DIR] [--every N]
        [--temperature T [--top-p P] [--top-k K] [--seed S] [--samples N]]
        [--after STEP] [--train-capsule DIR] [--where NAME] [--poll S] [--settle S] [--out DIR]

specdeck starts it in a run capsule (``core.capsules.jobs``) beside a train run whose item has a
detached ``watch_eval`` (``core.actions.watch_eval``), so it keeps going while no specdeck runs. It:

* discovers every checkpoint in ``--ckpt-dir`` as it lands, in any of the layouts of
  :mod:`core.ml.formats.layouts` (``--trainer`` limits it to one): ``core.ml.train``'s ``step_N.pt``,
  SpecForge's ``{run_id}-step{N}/training_state.pt``, speculators' ``{epoch}/`` drafter dirs,
  oldest first, at most one per ``--every`` steps. A checkpoint is read once it is whole: its
  trainer marked it complete, or nothing about it (its files, their sizes and mtimes) changed
  for ``--settle`` seconds (default 30: a slow disk's pause inside one save must not pass for
  its end);
* checks what can be checked before a load (a speculators dir's config and safetensors
  headers against the files' sizes), then strips a torch checkpoint (``core.ml.strip``, with
  ``--drafter-config`` when the checkpoint carries no drafter config, as SpecForge's does
  not; a speculators dir needs no strip) and evaluates it (``core.ml.eval``: offline from the
  feature cache, which loads only the target's embedding and head; or online) on
  ``--device``, in this process (torch is imported once);
* writes one result per step, atomically (temp file + rename), to ``OUT/step_<N>.json``:
  ``{"step", "state": "done" | "failed", "result" (core.ml.eval's result.json),
  "baseline" (the first step only, with --baseline), "error", "checkpoint", "seconds",
  "max_rss_bytes"}``. A failed read is recorded only once the checkpoint has stayed unchanged
  for ``--settle`` seconds since the read began; one that changes meanwhile (a save that had
  stalled goes on) is read again once whole, and nothing is recorded for the failed read. A
  bad entry (a FIFO named ``step_N.pt``, a link loop for its weights, a header lying about the
  file's size) is thus one failed step naming the file, and the next checkpoint follows;
* keeps ``status.json`` (``state``, ``current``, ``last_step``, ``queue``, ``done``,
  ``failed``, ``settling``: checkpoints not yet whole, or whose failed read is watched) up to
  date and logs progress, errors and resource use as JSON lines on stdout;
* exits 0 once the train run has ended (``--train-capsule``'s ``exit`` file, its processes
  gone from this host, or a ``train_ended`` file specdeck writes into the watcher's own
  directory) and every checkpoint it left is evaluated. A ``stop`` file in its directory (or
  SIGTERM) ends it after the current eval.

It refuses to start (exit 2, naming what is missing and where) when the target, its
embedding/head or the feature cache are not on this host, or when ``core.ml.eval`` would refuse
its sampling settings (``--temperature`` > 0 offline, say); they go to every eval it runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import InvalidInput
from core.text import human
from core.ml.formats import bounds, layouts, retention
from core.ml.models import sampling
from core.ml.formats.runio import (UsageError, atomic_write_json, check_flags, check_generation_args, emit, read_json, run_main,
                           say)

RESULTS = "results"
FINAL_LOOK_S = 2.0
"""Once the train run has ended and every checkpoint is evaluated, the output dir is listed
once more this long after (at most ``--settle``): a network disk may show the last save late."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.watcher",
                                description="evaluate each checkpoint of a train run as it lands")
    p.add_argument("--ckpt-dir", required=True, help="the trainer's output dir (core.ml.formats.layouts)")
    p.add_argument("--trainer", choices=layouts.TRAINERS,
                   help="only this trainer's checkpoint layout (default: any)")
    p.add_argument("--drafter-config", help="the drafter config.json for checkpoints that carry "
                   "none (SpecForge's)")
    p.add_argument("--target", required=True, help="the target model dir on this host")
    p.add_argument("--cache", help="offline mode: the feature cache (core.ml.extract) on this host")
    p.add_argument("--mode", choices=["offline", "online"], default="offline")
    p.add_argument("--prompts", help="prompts JSONL (offline: default the cache's own)")
    p.add_argument("--limit", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-memory")
    p.add_argument("--baseline", help="a reference drafter dir, evaluated once (with the first step)")
    sampling.add_arguments(p)  # passed to every eval (core.ml.eval's), the baseline's too
    p.add_argument("--every", type=int, help="at most one eval per N steps (default: every checkpoint)")
    p.add_argument("--after", type=int, help="only checkpoints after this step (a resumed run: "
                   "the earlier run's are evaluated already)")
    p.add_argument("--train-capsule", help="the train run's capsule dir (its exit file ends the watch)")
    p.add_argument("--where", default="this host", help="the host's name, for messages")
    p.add_argument("--out", default=".", help="the watcher's own dir (results/, status.json, stop)")
    p.add_argument("--drop-pct", type=float, help="tau more than this %% below the best so far: "
                   "a tau_drop alert, sent from here when specdeck armed this dir (notify.json "
                   "naming tau_drop, notify.url: core.ml.notify)")
    p.add_argument("--keep-newest", type=int, help="retention (core.ml.formats.retention): keep "
                   "the newest N checkpoints, the --keep-best best by tau and the --pin ones; "
                   "delete the others once evaluated (default: delete none)")
    p.add_argument("--keep-best", type=int, default=1, help="with --keep-newest: keep the best K "
                   "by tau (default 1)")
    p.add_argument("--pin", type=int, action="append", default=[], help="with --keep-newest: "
                   "a step never deleted (another item names it); repeatable")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between looks for checkpoints")
    p.add_argument("--settle", type=float, default=layouts.SETTLE_S,
                   help="seconds a checkpoint its trainer does not mark complete must stay "
                   "unchanged (files, sizes, mtimes) before it is read, and a failed read's "
                   f"checkpoint before the failure is recorded (default {layouts.SETTLE_S:g})")
    return p


def preflight(args: argparse.Namespace) -> str | None:
    """What this host lacks for the evals (or what in the sampling settings every eval would
    refuse), said so the operator knows what to do; or None."""
    from core.ml.tasks.eval import validate_sampling

    target = Path(args.target)
    try:  # refused once here, not once per checkpoint (core.ml.eval refuses the same)
        validate_sampling(argparse.Namespace(**vars(args), tree_budget=None))
        check_generation_args(args)
        check_flags(args, block_size=bounds.count, every=lambda v: bounds.count(v, 1, bounds.INT64_MAX),
                    after=lambda v: bounds.count(v, 0, bounds.INT64_MAX), poll=bounds.seconds,
                    keep_newest=lambda v: bounds.count(v, 1, bounds.INT64_MAX),
                    keep_best=lambda v: bounds.count(v, 0, bounds.INT64_MAX),
                    settle=bounds.seconds)
        bad_pin = next((p for p in args.pin if bounds.count(p, 0, bounds.INT64_MAX)), None)
        if bad_pin is not None:
            raise UsageError(f"--pin {bounds.count(bad_pin, 0, bounds.INT64_MAX)}")
    except UsageError as exc:
        return f"{args.where}: {exc}"
    if not (target / "config.json").is_file():
        return (f"{args.where}: no target at {target} (no config.json): put the target there "
                "(a relay item) or point watch_eval.target at it")
    bad = unreadable_configs(args)
    if bad:
        return bad
    if args.mode == "offline":
        from core.ml.formats.weights import embed_head_names

        try:
            embed_head_names(target)
        except (OSError, ValueError, KeyError) as exc:
            return f"{args.where}: the target at {target} has no readable embedding/LM head: {exc}"
        if not args.cache or not (Path(args.cache) / "manifest.json").is_file():
            return (f"{args.where}: no feature cache at {args.cache} (no manifest.json): extract "
                    "it there (an extract_hidden item on this host) or relay it (a relay item), "
                    "then start the watcher again (rerun the train item or `specdeck attach`)")
    elif not args.prompts or not Path(args.prompts).is_file():
        return f"{args.where}: no prompts file at {args.prompts}"
    if args.drafter_config and not Path(args.drafter_config).exists():
        return (f"{args.where}: no drafter config at {args.drafter_config}: the checkpoints carry "
                "none, put it there (the trainer config's draft model config)")
    if args.baseline and not (Path(args.baseline) / "config.json").is_file():
        return f"{args.where}: no baseline drafter at {args.baseline} (no config.json)"
    return None


def unreadable_configs(args: argparse.Namespace) -> str | None:
    """What is wrong with the config files every eval would read (the target's, the
    ``--drafter-config`` and the baseline drafter's, its weights too), said once here by file
    and key, not once per checkpoint; or None."""
    from core.ml.formats.drafter_config import DFlashConfig, check_drafter_dir, read_target_config

    try:
        read_target_config(args.target)
        if args.drafter_config and Path(args.drafter_config).exists():
            DFlashConfig.from_file(args.drafter_config)
        if args.baseline and (Path(args.baseline) / "config.json").is_file():
            check_drafter_dir(args.baseline, args.target)
    except InvalidInput as exc:  # InvalidFile: the file and the key
        return f"{args.where}: {exc}"
    return None


class Watch:
    """The loop; its state is in ``out`` so that a restart carries on where it stopped."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        self.results = self.out / RESULTS
        self.results.mkdir(parents=True, exist_ok=True)
        self.stop_requested = False
        self.current: int | None = None
        self.started = time.time()
        self.steady = layouts.Steady(args.settle)
        self.failing: dict[int, tuple[dict[str, Any], tuple, float]] = {}
        """Failed reads not recorded yet: step -> (its record, the checkpoint's state when
        the read began, when it began)."""

    # -- what is there ----------------------------------------------------------------
    def entries(self) -> dict[int, layouts.Entry]:
        """The checkpoints in the output dir now, by step (a step listed twice: the first)."""
        out: dict[int, layouts.Entry] = {}
        for e in layouts.local_entries(self.args.ckpt_dir, self.args.trainer, after=self.args.after):
            out.setdefault(e.checkpoint.step, e)
        return out

    def landed(self) -> list[tuple[int, layouts.Entry]]:
        """Checkpoints that are whole (module doc): marked complete by their trainer, or
        unchanged for ``settle`` s; a failed read being watched is not one."""
        return [(step, e) for step, e in self.entries().items() if step not in self.failing
                and (e.complete or self.steady.steady(e.checkpoint.path, e.state))]

    def written(self) -> dict[int, str]:
        """Steps with a result file, and its state."""
        out = {}
        for f in self.results.glob("step_*.json"):
            try:
                out[int(f.stem.split("_")[1])] = read_json(f).get("state", "?")
            except (ValueError, OSError, UsageError):
                continue
        return out

    def queue(self) -> list[tuple[int, layouts.Entry]]:
        """Landed checkpoints still to evaluate, oldest first (``every`` respected)."""
        written = self.written()
        last = max(written, default=None)
        out = []
        for step, entry in self.landed():
            if step in written:
                continue
            if self.args.every and last is not None and step - last < self.args.every:
                continue
            out.append((step, entry))
            last = step if last is None else max(step, last)
        return out

    def settling(self) -> list[int]:
        """Steps not evaluated yet that are not whole yet, or whose failed read is watched."""
        written = self.written()
        ready = {s for s, _ in self.landed()}
        return sorted({s for s in self.entries() if s not in written and s not in ready}
                      | set(self.failing))

    def settle_failures(self) -> None:
        """Each failed read being watched: recorded once its checkpoint has stayed unchanged
        for ``settle`` s since the read began; read again (once whole) when it changed."""
        if not self.failing:
            return
        now = self.entries()
        for step, (rec, state, began) in list(self.failing.items()):
            entry = now.get(step)
            if entry is not None and entry.state != state:
                del self.failing[step]
                self.steady.forget(entry.checkpoint.path)
                emit("progress", task="watch", step=step, phase="changed",
                     checkpoint=entry.checkpoint.path)
                say(f"step {step}: its checkpoint changed after a failed read ({rec.get('error')}); "
                    "it is read again once whole")
            elif entry is None or time.monotonic() - began >= self.args.settle:
                del self.failing[step]
                if entry is None:
                    rec["error"] = f"{rec.get('error')} (the checkpoint is gone since)"
                self.record(rec)

    def train_ended(self) -> str | None:
        """Why the train run is over, or None while it may still write checkpoints."""
        if (self.out / "train_ended").exists():
            return "specdeck saw the train run end"
        cap = self.args.train_capsule
        if not cap:
            return None
        cap = Path(cap)
        if (cap / "exit").is_file():
            return f"train run {(cap / 'exit').read_text().strip()}"
        pid_file = cap / "pid"
        if not pid_file.is_file():
            return None
        words = pid_file.read_text().split()
        try:
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            return None
        if len(words) < 5 or words[2] != boot:
            return None  # another host's (or another boot's) processes: cannot tell from here
        for pid, start in ((words[0], words[1]), (words[3], words[4])):
            if _ticks(pid) == start:
                return None
        if (cap / "exit").is_file():
            return f"train run {(cap / 'exit').read_text().strip()}"
        return "the train run's processes are gone (no exit status)"

    def write_status(self, state: str, **extra: Any) -> None:
        written = self.written()
        atomic_write_json(self.out / "status.json", {
            "state": state, "pid": os.getpid(), "current": self.current,
            "last_step": max((s for s, v in written.items() if v == "done"), default=None),
            "done": sorted(s for s, v in written.items() if v == "done"),
            "failed": sorted(s for s, v in written.items() if v == "failed"),
            "queue": [s for s, _ in self.queue()], "settling": self.settling(),
            **self.retention_status(),
            "started_at": self.started,
            "updated_at": time.time(), **extra})

    def retention_status(self) -> dict[str, Any]:
        """status.json's ``deleted`` steps and ``freed_bytes`` (with --keep-newest only)."""
        if self.args.keep_newest is None:
            return {}
        log = self.retention_log()
        return {"deleted": [d.get("step") for d in log["deleted"]],
                "freed_bytes": log.get("freed_bytes", 0)}

    # -- one eval ---------------------------------------------------------------------
    def evaluate(self, step: int, entry: layouts.Entry) -> dict[str, Any]:
        from core.ml.tasks import eval as ml_eval
        from core.ml.tasks import strip as ml_strip

        ckpt = Path(entry.checkpoint.path)
        work = self.out / "work" / f"step_{step}"
        t0, c0 = time.time(), time.process_time()
        rec: dict[str, Any] = {"step": step, "checkpoint": str(ckpt)}
        emit("progress", task="watch", step=step, phase="strip", checkpoint=str(ckpt))
        try:
            problem = layouts.content_problem(entry)
            if problem:  # not a checkpoint to load as it is now: named, never opened
                raise UsageError(problem)
            drafter = ckpt
            if entry.checkpoint.needs_strip:  # a torch checkpoint; a speculators epoch dir is a drafter
                drafter = work / "drafter"
                cfg = ["--config", self.args.drafter_config] if self.args.drafter_config else []
                _call(ml_strip.main, [str(ckpt), str(drafter), *cfg])
            common = ["--target", self.args.target, "--mode", self.args.mode,
                      "--max-new-tokens", str(self.args.max_new_tokens), "--dtype", self.args.dtype,
                      "--device", self.args.device, "--prompts", self.prompts()]
            for flag, val in (("--cache", self.args.cache), ("--limit", self.args.limit),
                              ("--block-size", self.args.block_size),
                              ("--max-memory", self.args.max_memory)):
                if val is not None:
                    common += [flag, str(val)]
            common += [str(v) for v in sampling.cli_flags(self.args)]
            emit("progress", task="watch", step=step, phase="eval")
            _call(ml_eval.main, ["--drafter", str(drafter), "--out",
                                 str(work / "result.json"), *common])
            rec["result"] = read_json(work / "result.json", "eval result")
            if self.args.baseline and not (self.results / "baseline.done").exists():
                _call(ml_eval.main, ["--drafter", self.args.baseline, "--out",
                                     str(work / "baseline.json"), *common])
                rec["baseline"] = read_json(work / "baseline.json", "baseline result")
            rec["state"] = "done"
        except Exception as exc:  # noqa: BLE001 - one bad checkpoint must not end the watch
            rec["state"] = "failed"
            rec["error"] = str(exc) if isinstance(exc, (UsageError, InvalidInput)) \
                else f"{type(exc).__name__}: {exc}"
        rec["seconds"] = round(time.time() - t0, 3)
        rec["cpu_seconds"] = round(time.process_time() - c0, 3)
        rec["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return rec

    def prompts(self) -> str:
        if self.args.prompts:
            return self.args.prompts
        man = read_json(Path(self.args.cache) / "manifest.json", "cache manifest")
        return man["prompts"]["file"]

    def record(self, rec: dict[str, Any]) -> None:
        step = rec["step"]
        atomic_write_json(self.results / f"step_{step}.json", rec)  # the one the ingest reads
        if "baseline" in rec:
            (self.results / "baseline.done").write_text(f"{step}\n")
        tau = (rec.get("result") or {}).get("tau")
        emit("watch", step=step, state=rec["state"], tau=tau, error=rec.get("error"),
             seconds=rec["seconds"], cpu_seconds=rec["cpu_seconds"],
             max_rss_bytes=rec["max_rss_bytes"])
        import shutil

        shutil.rmtree(self.out / "work" / f"step_{step}", ignore_errors=True)
        if rec["state"] == "done" and tau is not None:
            self.tau_alert(step, float(tau))
        self.retain()

    # -- retention ----------------------------------------------------------------------
    def retain(self) -> list[retention.Deleted]:
        """Delete the checkpoints ``--keep-newest``/``--keep-best``/``--pin`` let go, once
        evaluated (core.ml.formats.retention); each deletion logged and kept in
        ``retention.json`` (and its sum in status.json) with the bytes it freed."""
        if self.args.keep_newest is None:
            return []
        entries = self.entries()
        written = self.written()
        results = {}
        for step in written:
            try:
                results[step] = read_json(self.results / f"step_{step}.json")
            except (OSError, UsageError):
                continue
        taus = {s: (r.get("result") or {}).get("tau") for s, r in results.items()
                if r.get("state") == "done"}
        last = max(written, default=None)
        # a step ``--every`` passed over (older than the newest result, never written) is
        # as evaluated as it will ever be
        skipped = {s for s in entries if last is not None and s < last and s not in written
                   and s not in self.failing}
        pins = set(self.args.pin)
        pointed = layouts.best_step(self.args.ckpt_dir, self.args.trainer)
        if pointed is not None:
            pins.add(pointed)  # a trainer's best pointer (``@best``) never dangles
        policy = retention.Policy(self.args.keep_newest, self.args.keep_best, frozenset(pins))
        decision = retention.decide(entries, taus, set(written) | skipped, policy)
        gone = retention.apply(self.args.ckpt_dir, {s: e.name for s, e in entries.items()},
                               decision)
        if not gone:
            return gone
        log = self.retention_log()
        log["deleted"] += [{"step": d.step, "path": d.path, "bytes": d.bytes, "tau": taus.get(d.step),
                            "at": time.time()} for d in gone]
        log["freed_bytes"] = sum(d["bytes"] for d in log["deleted"])
        log["kept"] = {str(s): list(w) for s, w in decision.keep.items()}
        log["policy"] = {"newest": policy.newest, "best": policy.best, "pins": sorted(pins)}
        atomic_write_json(self.out / "retention.json", log)
        freed = sum(d.bytes for d in gone)
        emit("retention", deleted=[{"step": d.step, "path": d.path, "bytes": d.bytes} for d in gone],
             freed_bytes=freed, kept=log["kept"])
        kept = ", ".join(f"{s} ({'+'.join(w)})" for s, w in sorted(decision.keep.items()))
        say(f"retention: deleted {', '.join(f'step {d.step} ({human(d.bytes)})' for d in gone)}: "
            f"freed {human(freed)} ({human(log['freed_bytes'])} in all); kept {kept}")
        return gone

    def retention_log(self) -> dict[str, Any]:
        try:
            log = read_json(self.out / "retention.json")
        except (OSError, UsageError):
            log = {}
        log.setdefault("deleted", [])
        return log

    def tau_alert(self, step: int, tau: float) -> None:
        """A tau drop (``--drop-pct`` below the best earlier step) told from here, in a
        process of its own (a target down never slows the evals), once (core.ml.notify)."""
        cfg_path = self.out / "notify.json"
        if self.args.drop_pct is None or not cfg_path.exists():
            return
        try:
            cfg = read_json(cfg_path, "notify.json")
        except UsageError:
            return
        if "tau_drop" not in cfg.get("events", ()):
            return
        earlier = []
        for f in self.results.glob("step_*.json"):
            try:
                r = read_json(f)
                s = int(f.stem.split("_")[1])
            except (ValueError, OSError, UsageError):
                continue
            t = (r.get("result") or {}).get("tau") if r.get("state") == "done" else None
            if s < step and isinstance(t, (int, float)):
                earlier.append((float(t), s))
        if not earlier:
            return
        best, best_step = max(earlier)
        if not (best > 0 and tau < best * (1 - self.args.drop_pct / 100)):
            return
        import subprocess

        title = f"specdeck: {cfg.get('plan')}/{cfg.get('item')} tau drop"
        body = (f"plan {cfg.get('plan')}, item {cfg.get('item')}, host {self.args.where}: tau "
                f"{tau:.3f} at step {step} is {100 * (1 - tau / best):.0f}% below the best "
                f"so far ({best:.3f} at step {best_step})")
        with open(self.out / "notify.log", "ab") as log:
            subprocess.Popen([sys.executable, "-m", "core.ml.notify", "event",
                              str(self.out.resolve()), f"tau_drop@{step}", "--title", title,
                              "--body", body],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True)
        emit("alert", kind="tau_drop", step=step, tau=tau, best=best, best_step=best_step)

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> int:
        say(f"watching {self.args.ckpt_dir} on {self.args.where} ({self.args.mode}, "
            f"device {self.args.device})")
        ended_why, looked_again = None, False
        while True:
            if self.stop_requested or (self.out / "stop").exists():
                self.write_status("stopped")
                say("stop requested: watcher ends")
                return 0
            ended_why = ended_why or self.train_ended()
            self.settle_failures()
            todo = self.queue()
            if todo:
                step, entry = todo[0]
                began = time.monotonic()
                self.current = step
                self.write_status("evaluating")
                rec = self.evaluate(step, entry)
                if rec["state"] == "failed":  # recorded once the checkpoint stayed unchanged
                    self.failing[step] = (rec, entry.state, began)
                    emit("progress", task="watch", step=step, phase="failed", error=rec.get("error"))
                else:
                    self.record(rec)
                self.current = None
                self.write_status("watching")
                continue
            if ended_why and not self.settling():
                if not looked_again:  # the last checkpoint's files may show late (a network disk)
                    looked_again = True
                    self._sleep(min(self.args.settle, FINAL_LOOK_S))
                    continue
                self.write_status("ended", reason=ended_why)
                say(f"{ended_why}; every checkpoint is evaluated: watcher ends")
                return 0
            self.write_status("watching")
            self._sleep(self.args.poll)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.stop_requested:
            time.sleep(0.1)


def _ticks(pid: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _call(main, argv: list[str]) -> None:
    """Run a ``core.ml`` task's main in this process; its refusals become exceptions."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        raise UsageError(f"{main.__module__} {' '.join(argv)}: bad arguments ({exc.code})") from None
    if rc not in (0, None):
        raise RuntimeError(f"{main.__module__} exited {rc}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    missing = preflight(args)
    if missing:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(args.out) / "status.json", {"state": "failed", "error": missing,
                                                           "updated_at": time.time()})
        raise UsageError(missing)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    watch = Watch(args)

    def on_term(signum, frame):  # after the current eval
        watch.stop_requested = True

    signal.signal(signal.SIGTERM, on_term)
    return watch.run()


if __name__ == "__main__":
    raise SystemExit(run_main(main))
