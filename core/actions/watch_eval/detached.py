"""The detached watch_eval watcher, specdeck's side: start it, ingest what it wrote, stop it.

A train item whose ``watch_eval`` runs ``on: train`` (the default for offline mode) or
``on: eval`` gets, when its run starts or is adopted, a watcher (``python -m core.ml.watcher``)
in a run capsule ``<train run id>-watch`` on that host. It evaluates every checkpoint as it
lands and writes one result file per step into the capsule, whether or not a specdeck runs.

specdeck ingests those files (:func:`ingest`) on start, attach and reconcile and while it
follows the run: each step is stored once (:meth:`core.state.store.Store.watch_ingest`, one
transaction per step, so two specdecks or a kill -9 between looks cannot store a step twice
or lose one), in the shapes the console-driven :class:`.watcher.Watcher` uses (metrics
``tau``... and eval rows ``<item>@<step>``), alerts are evaluated at each new step over the
curve up to it, and steps evaluated while no specdeck looked are summarised in the journal
(``watch_meanwhile``). The watcher's state, last step and queue are in the ``watchers`` table
for ``status --json`` and the item pane (:func:`.status.status_of`).

Every function gets the train run's :class:`~core.actions.base.ActionContext` (its
``run_id`` the train run's) and reads and records through its tau verbs.
"""

from __future__ import annotations

import asyncio
import json
import math
import posixpath
import re
import shlex
import time
from typing import TYPE_CHECKING, Any

from core.capsules import jobs
from core.actions.watch_eval.params import WatchEvalParams, parse_watch
from core.actions.watch_eval.on_console import Watcher
from core.errors import HostUnreachable
from core.hosts.base import HostState
from core.state.records import Run, TauWatcher
from core.text import MAX_JSON_DEPTH, short, too_deep

if TYPE_CHECKING:
    from core.actions.base import ActionContext
    from core.hosts.base import Host

ENDED = ("ended", "stopped", "failed", "lost")


def capsule_id(run_id: str) -> str:
    return f"{run_id}-watch"


def detached(spec, train_host: str) -> bool:
    return spec is not None and parse_watch(spec).placement(train_host) in ("train", "eval")


async def command(ctx: "ActionContext", spec: WatchEvalParams, run: Run, ckpt_dir: str,
                  host: "Host") -> "jobs.Launch":
    from core.actions.base import Launch
    from core.actions.mlbase import host_python, prompts_on_host, py_module
    from core.ml.models import sampling

    py = await host_python(host)
    args = ["--ckpt-dir", ckpt_dir, "--target", host.path(spec.target), "--mode", spec.mode,
            "--max-new-tokens", spec.max_new_tokens, "--dtype", spec.dtype,
            "--device", spec.device, "--where", host.name, "--out", ".",
            "--poll", max(1.0, ctx.poll * 10), "--settle", spec.settle_s]
    if spec.mode == "offline":
        args += ["--cache", host.path(spec.cache)]
    else:
        ppath, _ = await prompts_on_host(host, ctx.plan, spec.prompts, upload=True)
        args += ["--prompts", ppath]
    if run.capsule and (host.name == run.host or spec.fetch == "direct"):
        args += ["--train-capsule", run.capsule]  # its exit file, read by path
    for flag, val in (("--limit", spec.max_prompts), ("--block-size", spec.block_size),
                      ("--max-memory", spec.max_memory),
                      ("--every", spec.every if isinstance(spec.every, int) else None),
                      ("--baseline", host.path(spec.baseline) if spec.baseline else None)):
        if val is not None:
            args += [flag, val]
    args += sampling.cli_flags(spec)  # every eval it runs samples so (core.ml.watcher)
    if "tau_drop" in getattr(ctx.plan, "notify", ()):
        args += ["--drop-pct", spec.alerts.drop_pct]
    args += retention_flags(ctx.plan, ctx.item, spec)
    launched = getattr(run, "config", None)
    launched = launched if isinstance(launched, dict) else {}
    from core.actions.trainers import TRAINERS
    from core.ml.formats.layouts import TRAINERS as HOST_LAYOUTS, out_dir_of

    trainer = TRAINERS.get(launched.get("trainer") or item_trainer(ctx.item))
    # a trainer that prints no checkpoint lines: only its layout (adopted too), where the
    # host's watcher knows it (core.ml.formats.layouts)
    if trainer is not None and not trainer.prints_checkpoints \
            and trainer.layout.name in HOST_LAYOUTS:
        args += ["--trainer", trainer.layout.name]
        if launched.get("drafter_config"):  # SpecForge's checkpoints carry none
            args += ["--drafter-config", launched["drafter_config"]]

    earlier = [a.step for a in ctx.artefacts(kind="checkpoint")
               if a.run_id != run.id and a.step is not None
               and out_dir_of(a.path, (a.data or {}).get("layout", "specdeck")
                              if isinstance(a.data, dict) else "specdeck") == ckpt_dir.rstrip("/")]
    if earlier:  # a resumed run writes on in the same dir: its earlier steps are not its own
        args += ["--after", max(earlier)]
    cap = jobs.capsule_path(host, capsule_id(run.id))
    return Launch(py_module(py, "core.ml.watcher", *args), env={"PYTHONUNBUFFERED": "1"},
                  cwd=cap)


def trainer_keep(plan, item) -> int | None:
    """``train.keep_checkpoints`` of a specdeck-trainer item's config (with its overrides):
    with a detached watcher it is the watcher's to apply (:func:`retention_flags`)."""
    from core.actions.fit import load_train_doc

    params = getattr(getattr(item, "action", None), "params", None)
    if item_trainer(item) not in (None, "specdeck") or not getattr(params, "config", None):
        return None
    train = (load_train_doc(plan, params) or {}).get("train")
    keep = train.get("keep_checkpoints") if isinstance(train, dict) else None
    return keep if isinstance(keep, int) and not isinstance(keep, bool) else None


def retention_flags(plan, item, spec: WatchEvalParams) -> list:
    """The watcher's ``--keep-newest/--keep-best/--pin`` (core.ml.formats.retention):
    ``watch_eval.keep_checkpoints``, else the trainer config's; each step another item names
    pinned. None of them when neither says how many to keep."""
    from core.actions.mlbase import pinned_steps

    keep = spec.keep_checkpoints if spec.keep_checkpoints is not None else trainer_keep(plan, item)
    if keep is None:
        return []
    args: list = ["--keep-newest", keep, "--keep-best", spec.keep_best]
    for step in sorted(pinned_steps(plan, item.id)):
        args += ["--pin", step]
    return args


def item_trainer(item) -> str | None:
    """The ``trainer:`` a train item names (None: not said, or not a train item's params)."""
    action = getattr(item, "action", None)
    return getattr(getattr(action, "params", None), "trainer", None)


async def missing_inputs(ctx: "ActionContext", spec) -> str | None:
    """What the detached watcher's host lacks (the target, the feature cache, the baseline),
    said with what to do; None when all is there. Checked before the train run launches."""
    spec = parse_watch(spec)
    where = spec.eval_host(ctx.item.action.host)
    host = await ctx.connected(where)
    need = [(spec.target, "config.json", "target",
             "relay it there or point watch_eval.target at it")]
    if spec.mode == "offline":
        need.append((spec.cache, "manifest.json", "feature cache",
                     f"relay it there once (a relay item) or extract it on {where} "
                     "(an extract_hidden item), and make this item need it"))
    if spec.baseline:
        need.append((spec.baseline, "config.json", "baseline drafter",
                     "relay it there or drop watch_eval.baseline"))
    for path, marker, what, todo in need:
        full = host.path(path)
        if await host.stat(posixpath.join(full, marker)) is None:
            return (f"watch_eval: {where} has no {what} at {full} (no {marker}): {todo}; the "
                    f"tau watcher runs on {where}")
    return None


CLAIM_S = 60.0
"""A watcher claimed as starting this recently is another specdeck's to start."""


async def ensure_started(ctx: "ActionContext", run: Run, spec, ckpt_dir: str | None, *,
                         mine: bool = False) -> TauWatcher | None:
    """Start the run's watcher unless it was started (by this or another specdeck: the
    store's claim decides; ``mine``: this process just claimed it)."""
    spec = parse_watch(spec)
    item = ctx.item
    where = spec.eval_host(item.action.host)
    known = ctx.tau_watcher()
    if known is not None and known.state == "starting" and not mine \
            and time.time() - (known.at or 0) < CLAIM_S:
        return known  # claimed a moment ago by another specdeck, which is starting it
    if known is None:
        if not ckpt_dir:
            ctx.notice(f"{item.id}: watch_eval: the run's checkpoint dir is unknown (an "
                       "adopted run: set the train item's out:)", "error")
            return None
        host = await ctx.connected(where)
        cap = jobs.capsule_path(host, capsule_id(run.id))
        if not ctx.claim_tau_watcher(where, cap, ckpt_dir):
            known = ctx.tau_watcher()
    if known is not None and known.state != "starting":
        return known
    row = known or ctx.tau_watcher()
    host = await ctx.connected(where)
    st = await jobs.inspect(host, row.capsule)
    if st.state in ("missing", "nopid"):
        try:
            launch = await command(ctx, spec, run, row.ckpt_dir, host)
            if "tau_drop" in getattr(ctx.plan, "notify", ()):  # told from the host itself
                await ctx.arm_notify(host, row.capsule, ("tau_drop",))
            info = await jobs.start(host, capsule_id(run.id), launch)
        except Exception as e:  # noqa: BLE001 - a full disk, an unwritable capsule...
            if isinstance(e, HostUnreachable) and host.status.state is not HostState.CONNECTED:
                raise  # the host went away: the watcher is started once it is back
            # marked failed with the reason: nothing waits for a watcher that never ran,
            # and the train run ends as it would without it
            from core.faults import describe_fault

            why = f"the tau watcher could not start on {where}: {describe_fault(e)}"
            ctx.mark_tau_watcher("failed", why)
            ctx.journal("watch_ended", f"watcher failed: {why}", host=where)
            raise
        ctx.journal("watch_started", f"watcher started on {where} (pid {info.pid}): "
                    f"tau at each checkpoint of {row.ckpt_dir}", host=where)
        ctx.notice(f"{item.id}: tau watcher started on {where} ({spec.mode}, {spec.device})")
    ctx.mark_tau_watcher("watching")
    return ctx.tau_watcher()


RESULT_MAX = 8 << 20
"""Largest result file read (a real one is a few KB per prompt set); larger: that step fails."""
READ_S = 20.0
"""How long reading one of the watcher's files may take (a stuck filesystem: that step fails)."""
INT64 = (1 << 63) - 1
_RESULT = re.compile(r"step_([0-9]{1,19})\.json")  # ASCII digits; more cannot be an int64
_KINDS = {"l": "a symbolic link", "p": "a FIFO", "c": "a device", "b": "a device",
          "s": "a socket", "d": "a directory"}


class BadResult(Exception):
    """A watcher's file that is not what the watcher writes: that step's failure."""


async def _listing(host: "Host", results: str) -> dict[str, tuple[str, int]]:
    """``{name: (type letter, size)}`` of the results dir, never following a link (a link
    in place of the dir lists nothing)."""
    res = await host.run(f"find {shlex.quote(results)} -mindepth 1 -maxdepth 1 -name 'step_*' "
                         "-printf '%y %s %f\\n' 2>/dev/null", timeout=READ_S)
    out = {}
    for line in res.stdout.splitlines():
        w = line.split(" ", 2)
        if len(w) == 3 and w[1].isascii() and w[1].isdigit():
            out[w[2]] = (w[0], int(w[1]))
    return out


async def read_untrusted(host: "Host", path: str, *, kind: str = "f", size: int = 0,
                         limit: int = RESULT_MAX) -> str:
    """A file the watcher wrote, read only when it is a regular file (never through a link,
    never a FIFO or a device: checked again just before the read), at most ``limit`` bytes,
    within :data:`READ_S`. Raises BadResult saying why not."""
    if kind != "f":
        raise BadResult(f"is {_KINDS.get(kind, 'not a regular file')}, not a regular file; "
                        "not read")
    if size > limit:
        raise BadResult(f"is {size:,} bytes (at most {limit:,}); not read")
    q = shlex.quote(path)
    try:
        res = await host.run(f"f={q}; if [ -L \"$f\" ] || [ ! -f \"$f\" ]; then echo no; "
                             f"else echo ok; timeout {int(READ_S)} head -c {limit + 1} -- \"$f\"; "
                             "fi", timeout=READ_S + 5)
    except asyncio.TimeoutError:
        raise BadResult(f"could not be read within {READ_S:.0f} s") from None
    head, _, body = res.stdout.partition("\n")
    if head != "ok":
        raise BadResult("is not a regular file (replaced meanwhile?); not read")
    if len(body) > limit:
        raise BadResult(f"is larger than {limit:,} bytes; not read")
    return body


def _parse(text: str) -> Any:
    if too_deep(text):
        raise BadResult(f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise BadResult(f"is not JSON ({str(e)[:120]})") from None


def _number(v: Any, what: str, *, optional: bool = False) -> None:
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or abs(v) > 1e12:
        raise BadResult(f"{what} is {short(v, 40)}, not a finite number")


def _check_eval(res: Any, what: str) -> None:
    """An eval's result.json as the watcher embeds it (the fields the store reads)."""
    if not isinstance(res, dict):
        raise BadResult(f"{what} is {short(res, 40)}, not an object")
    _number(res.get("tau"), f"{what}.tau")
    _number(res.get("tau_pooled"), f"{what}.tau_pooled", optional=True)
    acc = res.get("per_position_acceptance")
    if acc is not None:
        if not isinstance(acc, list) or len(acc) > 4096:
            raise BadResult(f"{what}.per_position_acceptance is not a list of numbers")
        for k, v in enumerate(acc):
            _number(v, f"{what}.per_position_acceptance[{k}]")
    for sec, name in ((res, what), (res.get("ddtree"), f"{what}.ddtree")):
        if sec is None:
            continue
        if not isinstance(sec, dict):
            raise BadResult(f"{name} is not an object")
        pp = sec.get("per_prompt")
        if pp is None:
            continue
        if not isinstance(pp, list) or len(pp) > 1_000_000:
            raise BadResult(f"{name}.per_prompt is not a list")
        for k, p in enumerate(pp):
            if not isinstance(p, dict) or not isinstance(p.get("id"), (str, int)) \
                    or isinstance(p.get("id"), bool):
                raise BadResult(f"{name}.per_prompt[{k}] is not an object with an id")
            _number(p.get("tau"), f"{name}.per_prompt[{k}].tau", optional=True)
            for key in ("rounds", "per_position_acceptance"):
                if p.get(key) is not None and not isinstance(p[key], list):
                    raise BadResult(f"{name}.per_prompt[{k}].{key} is not a list")


def check_result(rec: Any, step: int) -> None:
    """A result file's schema (types, what the store reads); raises BadResult."""
    if not isinstance(rec, dict):
        raise BadResult(f"holds {type(rec).__name__}, not an object")
    state = rec.get("state")
    if state not in ("done", "failed"):
        raise BadResult(f"state is {short(state, 40)}, not done or failed")
    if "step" in rec and (rec["step"] != step or isinstance(rec["step"], bool)):
        raise BadResult(f"its step is {short(rec['step'], 40)}, its name says {step}")
    if rec.get("error") is not None and not isinstance(rec["error"], str):
        raise BadResult("error is not text")
    if state == "done":
        _check_eval(rec.get("result"), "result")
        if rec.get("baseline") is not None:
            _check_eval(rec["baseline"], "baseline")


async def ingest(ctx: "ActionContext", spec, *, away: bool = False) -> list[int]:
    """Store every result the watcher wrote that is not stored yet; update its state.
    ``away``: these were evaluated while no specdeck looked (journal them as such).

    Each result file is untrusted (it is a file on a host): read on its own, only as a
    regular file of the capsule, bounded, schema-checked; a bad one is that step's failure
    (its reason stored) and the later steps go on."""
    w = ctx.tau_watcher()
    if w is None:
        return []
    item, run_id = ctx.item, ctx.run_id
    host = await ctx.connected(w.host)
    results = posixpath.join(w.capsule, "results")
    have = {e.step for e in ctx.watch_entries() if e.state in ("done", "failed", "skipped")}
    listing = await _listing(host, results)
    steps: dict[int, str] = {}
    noted = None
    for name in listing:
        m = _RESULT.fullmatch(name)
        if m and int(m.group(1)) <= INT64:
            steps[int(m.group(1))] = name
            continue
        if noted is None:  # said once per name (another look, another specdeck)
            noted = {e.data.get("name") for e in ctx.journaled("watch_bad_name")
                     if isinstance(e.data, dict)}
        if name.endswith(".json") and name not in noted:
            noted.add(name)
            ctx.journal("watch_bad_name", f"watcher result {short(name, 80)} ignored: not "
                        f"step_N.json with N a step (a whole number up to {INT64})",
                        host=w.host, data={"name": name[:300]})
    watcher = Watcher(ctx, spec)
    watcher.host_sends = ("tau_drop",)  # the host told its drops (tau_alert in core.ml.watcher)
    new: list[tuple[int, dict]] = []
    for step in sorted(s for s in steps if s not in have):
        name = steps[step]
        try:
            kind, size = listing[name]
            rec = _parse(await read_untrusted(host, posixpath.join(results, name), kind=kind,
                                              size=size))
            check_result(rec, step)
            stored = None
            if rec["state"] == "done":
                metrics, rows = watcher.result_rows(step, rec["result"], rec.get("baseline"))
                stored = ctx.record_watch_result(step, state="done",
                                                 tau=float(rec["result"]["tau"]),
                                                 host=w.host, capsule=w.capsule,
                                                 metrics=metrics, eval_rows=rows)
        except BadResult as e:
            rec = {"state": "failed", "error": f"result file {name}: {e}"}
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
            rec = {"state": "failed", "error": f"result file {name}: cannot be stored "
                                               f"({type(e).__name__}: {short(str(e), 120)})"}
        if rec["state"] != "done":
            err = rec.get("error") or "the watcher recorded no result"
            rec = {**rec, "error": err}
            stored = ctx.record_watch_result(step, state="failed", error=str(err)[:2000],
                                             host=w.host, capsule=w.capsule)
            if stored:
                ctx.journal("watch_failed", f"tau eval of step {step} failed: {err}",
                            host=w.host)
        if stored:
            new.append((step, rec))
    for step, rec in new:
        if rec.get("state") == "done":
            watcher.alerts_at(step)  # over the curve as it was at that step
            if not away:
                tau = rec["result"]["tau"]
                ctx.notice(f"{item.id}: tau {tau:.3f} at step {step} "
                           f"({watcher.mode}, on {w.host}, detached)")
        else:
            ctx.notice(f"{item.id}: tau eval of step {step} failed: {rec.get('error')}",
                       "error")
    if new and away:
        done = [(s, r["result"]["tau"]) for s, r in new if r.get("state") == "done"]
        failed = [s for s, r in new if r.get("state") != "done"]
        msg = (f"evaluated while specdeck was away: "
               + (f"tau at steps {', '.join(str(s) for s, _ in done)} "
                  f"({done[0][1]:.3f} -> {done[-1][1]:.3f})" if done else "no tau")
               + (f"; failed at steps {', '.join(map(str, failed))}" if failed else ""))
        ctx.journal("watch_meanwhile", msg, host=w.host,
                    data={"done": [s for s, _ in done], "failed": failed})
        ctx.notice(f"meanwhile: {item.id}: {msg}")
    await _refresh(ctx, w, host)
    return [s for s, _ in new]


DELETED = "checkpoints_deleted"
"""The journal kind of the checkpoints a watcher's retention deleted (``status`` sums it)."""


async def journal_deletions(ctx: "ActionContext", w: TauWatcher, host: "Host",
                            said: Any) -> None:
    """Journal (once each) the checkpoints the watcher's retention deleted, as its
    ``retention.json`` lists them, with the bytes each freed (core.ml.formats.retention);
    read only when its status.json says (``said``: its ``deleted``) a step not journaled yet."""
    known = {s for e in ctx.journaled(DELETED) if isinstance(e.data, dict)
             for s in e.data.get("steps", ())}
    if not isinstance(said, list) or not {s for s in said if _step_of(s) is not None} - known:
        return
    path = posixpath.join(w.capsule, "retention.json")
    listing = await _listing_of(host, path)
    if listing is None:
        return
    try:
        doc = _parse(await read_untrusted(host, path, kind=listing[0], size=listing[1],
                                          limit=1 << 22))
    except BadResult as e:
        ctx.journal("watch_bad_name", f"retention.json ignored: {e}", host=w.host,
                    data={"name": "retention.json"})
        return
    rows = doc.get("deleted") if isinstance(doc, dict) else None
    fresh = [(d["step"], d["bytes"]) for d in (rows if isinstance(rows, list) else [])
             if isinstance(d, dict) and _step_of(d.get("step")) is not None
             and _step_of(d.get("bytes")) is not None and d["step"] not in known]
    if not fresh:
        return
    from core.text import human

    freed = sum(b for _, b in fresh)
    kept = doc.get("kept") if isinstance(doc.get("kept"), dict) else {}
    why = ", ".join(f"{short(str(s), 20)} ({short('+'.join(map(str, r)), 40)})"
                    for s, r in list(kept.items())[:20] if isinstance(r, list))
    ctx.journal(DELETED, f"deleted checkpoints {', '.join(f'step {s} ({human(b)})' for s, b in fresh)}"
                f": freed {human(freed)}" + (f"; kept {why}" if why else ""), host=w.host,
                data={"steps": [s for s, _ in fresh], "bytes": [b for _, b in fresh],
                      "freed_bytes": freed})


def _step_of(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT64 else None


async def _refresh(ctx: "ActionContext", w: TauWatcher, host: "Host") -> None:
    """The watcher's state from its status.json and its capsule."""
    path = posixpath.join(w.capsule, "status.json")
    listing = await _listing_of(host, path)
    try:
        doc = _parse(await read_untrusted(host, path, kind=listing[0], size=listing[1],
                                          limit=1 << 20)) if listing else {}
    except BadResult:
        doc = {}
    await journal_deletions(ctx, w, host, doc.get("deleted") if isinstance(doc, dict) else None)
    doc = _status_fields(doc)
    st = await jobs.inspect(host, w.capsule)
    if st.state in ("missing", "nopid") and w.state not in ENDED:
        # no process in its capsule: never started (after a bound), or gone since
        if w.state != "starting":
            st = jobs.CapsuleState("lost")
        elif time.time() - (w.started_at or w.at or 0) > START_BOUND_S:
            st = jobs.CapsuleState("ended", 97)  # claimed, never started: nothing waits
            doc.setdefault("error", f"the watcher did not start within {START_BOUND_S:.0f} "
                           f"s (its capsule {w.capsule} on {w.host} has no process)")
            doc["state"] = "failed"
    state = doc.get("state") or w.state
    if st.state == "ended":
        state = state if state in ("ended", "stopped", "failed") else (
            "ended" if st.exit_code == 0 else "failed")
    elif st.state == "lost":
        state = "lost"
    elif state in ENDED and st.state == "running":  # said so, its process is exiting
        state = "ending"
    err = doc.get("error") or (w.error if state in ENDED else None)
    if st.state == "ended" and st.signal and state == "failed":
        err = f"watcher killed by signal {st.signal}"
    elif state == "lost":
        err = "watcher gone (no exit status: the host rebooted, or it was killed with its wrapper)"
    elif state == "failed" and not err:
        err = f"watcher exited {st.exit_code}"
    ctx.record_tau_watcher_status(state, current=doc.get("current"),
                                  last_step=doc.get("last_step", w.last_step),
                                  queue=doc.get("queue", []), error=err)
    if state in ENDED and w.state not in ENDED:
        ctx.journal("watch_ended", f"watcher {state}" + (f": {err}" if err else ""),
                    host=w.host)
        if state in ("failed", "lost"):
            ctx.notice(f"{w.item_id}: tau watcher on {w.host} {state}"
                       + (f": {err}" if err else "") + f" (its log: {w.capsule}/log)", "error")


START_BOUND_S = 120.0
"""A watcher claimed this long ago whose capsule holds no process never started: failed."""


async def _listing_of(host: "Host", path: str) -> tuple[str, int] | None:
    """(type letter, size) of ``path`` itself (a link is not followed), None if missing."""
    res = await host.run(f"find {shlex.quote(path)} -maxdepth 0 -printf '%y %s\\n' "
                         "2>/dev/null", timeout=READ_S)
    w = res.stdout.split()
    return (w[0], int(w[1])) if len(w) == 2 and w[1].isascii() and w[1].isdigit() else None


def _status_fields(doc: Any) -> dict:
    """status.json's fields with the types the store keeps (anything else dropped)."""
    if not isinstance(doc, dict):
        return {}
    def step(v):
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT64 \
            else None
    out: dict[str, Any] = {}
    if isinstance(doc.get("state"), str) and len(doc["state"]) <= 40:
        out["state"] = doc["state"]
    if isinstance(doc.get("error"), str):
        out["error"] = doc["error"][:2000]
    for k in ("current", "last_step"):
        if step(doc.get(k)) is not None:
            out[k] = doc[k]
    q = doc.get("queue")
    if isinstance(q, list):
        out["queue"] = [x for x in q[:10000] if step(x) is not None]
    return out


MAX_RESTARTS = 3


def _killed(w: TauWatcher | None) -> bool:
    """Killed from outside (a signal, or gone with no exit status), not failed by itself."""
    return w is not None and (w.state == "lost" or (
        w.state == "failed" and "killed by signal" in (w.error or "")))


async def restart(ctx: "ActionContext", spec) -> bool:
    """Start a watcher that was killed (OOM, a reboot) again in its capsule: it carries on
    from its result files. At most MAX_RESTARTS times per run; False when not restarted."""
    if len(ctx.journaled("watch_restarted")) >= MAX_RESTARTS:
        return False
    w = ctx.tau_watcher()
    if not ctx.take_tau_watcher((w.state,), "starting"):
        return True  # another specdeck is restarting it
    host = await ctx.connected(w.host)
    q = shlex.quote(w.capsule)
    await host.run(f"rm -f {q}/exit {q}/pid {q}/status.json", check=True)
    ctx.journal("watch_restarted", f"watcher restarted ({w.error})", host=w.host)
    ctx.notice(f"{ctx.item.id}: tau watcher on {w.host}: {w.error}; started again (it "
               "carries on from its results)", "warning")
    await ensure_started(ctx, _this_run(ctx), spec, w.ckpt_dir, mine=True)
    return True


def _this_run(ctx: "ActionContext") -> Run | None:
    return next((r for r in ctx.runs() if r.id == ctx.run_id), None)


async def mark_train_ended(ctx: "ActionContext") -> None:
    """Tell the watcher the train run is over: it evaluates what is left, then exits."""
    w = ctx.tau_watcher()
    if w is None or w.state in ENDED:
        return
    host = await ctx.connected(w.host)
    await host.write_file(posixpath.join(w.capsule, "train_ended"), b"")


async def request_stop(ctx: "ActionContext") -> bool:
    """Ask the run's watcher to end after its current eval (a ``stop`` file)."""
    w = ctx.tau_watcher()
    if w is None or w.state in ENDED:
        return False
    host = await ctx.connected(w.host)
    await host.write_file(posixpath.join(w.capsule, "stop"), b"")
    ctx.journal("watch_stop_requested", "watcher stop requested (after the current eval)",
                host=w.host)
    return True


async def follow(ctx: "ActionContext", spec, train_done: asyncio.Event, *,
                 wait: bool = True, every: float = 1.0) -> None:
    """Ingest while the train run goes on; once it has ended, tell the watcher and (``wait``)
    ingest until the watcher has ended too."""
    first = True
    while True:
        ended = train_done.is_set()
        await ingest(ctx, spec, away=first)
        first = False
        w = ctx.tau_watcher()
        if _killed(w) and await restart(ctx, spec):
            continue
        if w is None or w.state in ENDED:
            if w is not None:
                await ingest(ctx, spec)  # what it wrote last
            return
        if ended:
            await mark_train_ended(ctx)
            if not wait:
                return
        try:
            await asyncio.wait_for(train_done.wait() if not ended else asyncio.sleep(every),
                                   every)
        except asyncio.TimeoutError:
            pass


async def reconcile(ctx: "ActionContext", spec, *, wait: bool = False,
                    hosts: "frozenset[str] | None" = None) -> None:
    """The item's watchers still live whose train run has ended (specdeck was away at its
    end): ingest what they wrote, tell them the run is over, and (``wait``) wait until
    they end. ``ctx``: the item's (no run); each watcher is followed in its run's."""
    watchers = ctx.live_tau_watchers()
    runs = {r.id: r for r in ctx.runs()} if watchers else {}
    for w in watchers:
        run = runs.get(w.run_id)
        if run is None or run.live:
            continue  # its train run's follower handles it
        if hosts is not None and w.host not in hosts:
            continue
        done = asyncio.Event()
        done.set()
        try:
            await follow(ctx.for_run(w.run_id), spec, done, wait=wait)
        except Exception as e:  # noqa: BLE001 - a watcher's trouble never breaks reconcile
            from core.faults import describe_fault

            ctx.notice(f"tau watcher: {describe_fault(e)}", "warning")
