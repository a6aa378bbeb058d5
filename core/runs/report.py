"""The morning report (issue 47 §5): what happened in a campaign while the operator was away.

:func:`build` reads the store (never a host: the report is what specdeck recorded) over a
window ``[since, until]`` and lists, in the order it happened:

* runs started and ended (how: succeeded, failed, stopped, lost... and any other state a run
  ends in, read generically: a run ``preempted`` is a preemption, once the runner has that state);
* checkpoints written (the runs' ``checkpoint`` artefacts) and evaluated (tau over training:
  each checkpoint's eval, with its tau);
* alerts (tau drops, stalls...), with disk and GPU incidents (host telemetry's alerts, a full
  state disk) named as such, and other journal events about checkpoints or preemption;

then tau over training per train run with its best point, and what the campaign cost in the
window and so far (:mod:`core.runs.cost`). Three renderings: plain text for a terminal,
Markdown for a chat message (the notification), JSON for scripts.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from core.errors import InvalidInput
from core.ml.formats import strictjson
from core.plans.plan import Plan
from core.runs import cost
from core.state.store import Store

DISK_ALERTS = ("disk_low", "disk")
GPU_ALERTS = ("gpu_idle", "gpu_memory", "stall", "gpu")
"""Alert kinds (the journal's ``data.alert``) that are a host's disk or GPU incident."""
JOURNAL_INCIDENTS = {"state_disk_full": "disk", "checkpoint_bad": "checkpoint"}
"""Journal kinds, besides alerts, the report lists, and as what."""
KINDS = ("run_started", "run_ended", "preemption", "checkpoint_written", "checkpoint_evaluated",
         "alert", "disk", "gpu", "checkpoint")
"""What an entry can be (JSON's ``kind``)."""
_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """``12h``, ``90m``, ``2d`` (before ``now``) or an ISO time (``2026-12-06T22:00``, UTC
    unless it names a zone) -> a Unix time.

    Raises:
        InvalidInput: neither (exit 2, saying what is taken).
    """
    m = _SINCE.match(text)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    import datetime as dt

    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(f"--since {text!r}: give a duration back from now (12h, 90m, 2d) or a "
                           "time (2026-12-06T22:00, UTC unless it names a zone)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


@dataclass(frozen=True)
class Entry:
    """One thing that happened."""

    at: float
    kind: str
    """One of :data:`KINDS`."""
    text: str
    item: str | None = None
    run: str | None = None
    data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Curve:
    """Tau over training of one train run: its checkpoints' tau, and the best one."""

    item: str
    run: str
    points: tuple[tuple[int, float], ...]
    """``(step, tau)`` in step order, every point the run has (not only the window's)."""
    best: tuple[int, float] | None
    new: int = 0
    """How many of the points came in the window."""


@dataclass(frozen=True)
class Report:
    plan: str
    since: float
    until: float
    entries: tuple[Entry, ...]
    curves: tuple[Curve, ...]
    cost_window: dict
    """What the window's hours of runs cost (``{currency: amount}``)."""
    cost_total: dict
    """What every run cost so far."""
    unpriced: tuple[str, ...] = ()
    """Hosts that ran something and carry no ``price:`` (their runs are not in the costs)."""

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.entries:
            out[e.kind] = out.get(e.kind, 0) + 1
        return out


def _inside(at: float | None, since: float, until: float) -> bool:
    return at is not None and since <= at <= until


def _run_entries(plan: Plan, store: Store, since: float, until: float, items: list[str]
                 ) -> tuple[list[Entry], dict]:
    out: list[Entry] = []
    runs = {i: store.runs_for_item(i) for i in items}
    for item, item_runs in runs.items():
        for r in item_runs:
            where = f" on {r.host}" if r.host else ""
            if _inside(r.started_at, since, until):
                out.append(Entry(r.started_at, "run_started", f"{item} #{r.attempt} started{where}",
                                 item, r.id, {"attempt": r.attempt, "host": r.host}))
            if r.live or not _inside(r.ended_at, since, until):
                continue
            how = (f" (signal {r.signal})" if r.signal else
                   f" (exit {r.exit_code})" if r.exit_code is not None else "")
            took = f" after {_duration(r.ended_at - r.started_at)}" if r.started_at else ""
            tau = (r.result or {}).get("tau") if isinstance(r.result, dict) else None
            said = f", tau {tau:.3f}" if isinstance(tau, (int, float)) else ""
            kind = "preemption" if "preempt" in r.state else "run_ended"
            out.append(Entry(r.ended_at, kind, f"{item} #{r.attempt} {r.state}{how}{took}{said}"
                             + (f": {r.error}" if r.error and r.state != "succeeded" else ""),
                             item, r.id, {"state": r.state, "exit_code": r.exit_code,
                                          "signal": r.signal, "tau": tau}))
    return out, runs


def _checkpoint_entries(store: Store, since: float, until: float, runs: dict) -> list[Entry]:
    out: list[Entry] = []
    for item, item_runs in runs.items():
        for a in store.artefacts(item, kind="checkpoint"):
            if _inside(a.at, since, until):
                out.append(Entry(a.at, "checkpoint_written", f"{item}: checkpoint at step {a.step} "
                                 f"written ({a.path})", item, a.run_id, {"step": a.step, "path": a.path}))
        for r in item_runs:
            for w in store.watch_entries(r.id):
                if w.state in ("done", "failed") and _inside(w.at, since, until):
                    said = (f"tau {w.tau:.3f}" if w.state == "done" and w.tau is not None
                            else f"its eval failed: {w.error or 'no reason recorded'}")
                    out.append(Entry(w.at, "checkpoint_evaluated", f"{item}: checkpoint at step {w.step} "
                                     f"evaluated on {w.host or '?'}: {said}", item, r.id,
                                     {"step": w.step, "tau": w.tau, "state": w.state}))
    return out


def _journal_entries(store: Store, since: float, until: float) -> list[Entry]:
    """Alerts (a host's disk or GPU ones named so), the incidents of :data:`JOURNAL_INCIDENTS`,
    and any journal event about a preemption or a checkpoint (``checkpoint_*``) another part
    journals, read by name."""
    out: list[Entry] = []
    for ev in store.events_between(since, until):
        alert = (ev.data or {}).get("alert") if isinstance(ev.data, dict) else None
        if ev.kind == "alert":
            kind = "disk" if alert in DISK_ALERTS else "gpu" if alert in GPU_ALERTS else "alert"
            if isinstance(alert, str) and "preempt" in alert:
                kind = "preemption"
        elif ev.kind in JOURNAL_INCIDENTS:
            kind = JOURNAL_INCIDENTS[ev.kind]
        elif ev.kind == "run_requeued" or "preempt" in ev.kind:
            kind = "preemption"  # a requeued Slurm job: preempted, its run goes on (run_requeued)
        elif ev.kind.startswith("run_"):
            continue  # a run's start and end: the runs themselves say it (with their times)
        elif ev.kind.startswith(("checkpoint_", "checkpoints_")):
            kind = "checkpoint"  # checkpoints_deleted: what retention deleted and the bytes freed
        else:
            continue
        who = f"{ev.item_id}: " if ev.item_id else (f"{ev.host}: " if ev.host else "")
        out.append(Entry(ev.at, kind, f"{who}{ev.message}", ev.item_id, ev.run_id,
                         {"journal": ev.kind, **({"alert": alert} if alert else {})}))
    return out


def _curves(store: Store, since: float, until: float, runs: dict) -> list[Curve]:
    out: list[Curve] = []
    for item, item_runs in runs.items():
        for r in item_runs:
            pts = store.metric_series(r.id, "tau", with_time=True)
            if not pts:
                continue
            new = sum(1 for _, _, at in pts if _inside(at, since, until))
            if not new and not _inside(r.ended_at, since, until) and not r.live:
                continue
            points = tuple((int(s), float(v)) for s, v, _ in pts if v is not None)
            best = max(points, key=lambda p: (p[1], -p[0])) if points else None
            out.append(Curve(item, r.id, points, best, new))
    return out


def build(plan: Plan, store: Store, since: float, until: float | None = None) -> Report:
    """The report of ``plan``'s campaign between ``since`` and ``until`` (default: now)."""
    until = time.time() if until is None else until
    items = [it.id for it in plan.items]
    entries, runs = _run_entries(plan, store, since, until, items)
    entries += _checkpoint_entries(store, since, until, runs)
    # a preemption the journal tells of a run whose state says it already is one entry
    preempted = {e.run for e in entries if e.kind == "preemption"}
    entries += [e for e in _journal_entries(store, since, until)
                if not (e.kind == "preemption" and e.run in preempted)]
    order = {k: i for i, k in enumerate(KINDS)}
    entries.sort(key=lambda e: (e.at, order.get(e.kind, len(order))))
    window = cost.sheet(plan, runs, until, (since, until))
    total = cost.sheet(plan, runs, until)
    return Report(plan.name, since, until, tuple(entries), tuple(_curves(store, since, until, runs)),
                  window.total, total.total, total.unpriced)


# -- rendering ---------------------------------------------------------------------------
def _duration(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _clock(at: float, since: float, until: float) -> str:
    fmt = "%H:%M:%S" if until - since < 86400 else "%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(at))


def _span(r: Report) -> str:
    return (f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(r.since))} to "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(r.until))} ({_duration(r.until - r.since)})")


LABELS = {"run_started": "started", "run_ended": "ended", "preemption": "PREEMPTED",
          "checkpoint_written": "checkpoint", "checkpoint_evaluated": "tau", "alert": "ALERT",
          "disk": "DISK", "gpu": "GPU", "checkpoint": "checkpoint"}
"""The word each kind of entry is shown with in text and Markdown."""


def _summary(r: Report) -> str:
    c = r.counts()
    parts = [f"{c.get('run_started', 0)} run(s) started", f"{c.get('run_ended', 0)} ended",
             f"{c.get('checkpoint_written', 0)} checkpoint(s) written",
             f"{c.get('checkpoint_evaluated', 0)} evaluated",
             f"{c.get('alert', 0)} alert(s)", f"{c.get('preemption', 0)} preemption(s)",
             f"{c.get('disk', 0) + c.get('gpu', 0)} disk/GPU incident(s)"]
    return ", ".join(parts)


def _curve_line(c: Curve) -> str:
    pts = ", ".join(f"{s}: {v:.3f}" for s, v in c.points)
    best = f"; best {c.best[1]:.3f} at step {c.best[0]}" if c.best else ""
    return f"{c.item}: {pts}{best}" + (f" ({c.new} new)" if c.new else "")


def _cost_lines(r: Report) -> list[str]:
    if not r.cost_total and not r.unpriced:
        return ["no host has a price: (plans/README.md, hosts)"]
    out = [f"in this window {cost.fmt(r.cost_window)}; so far {cost.fmt(r.cost_total)}"]
    if r.unpriced:
        out.append(f"not counted: runs on {', '.join(r.unpriced)} (no price:)")
    return out


def text_lines(r: Report) -> list[tuple[str | None, str]]:
    """The plain text's lines, each with the kind of entry it shows (None for the rest):
    :func:`to_text` joins them, the console's report screen colours them by kind."""
    lines: list[tuple[str | None, str]] = [
        (None, f"specdeck report: plan {r.plan}, {_span(r)}"), (None, _summary(r)), (None, "")]
    if not r.entries:
        lines.append((None, "nothing happened in this window"))
    for e in r.entries:
        lines.append((e.kind, f"{_clock(e.at, r.since, r.until)}  {LABELS[e.kind]:<10}  {e.text}"))
    if r.curves:
        lines += [(None, ""), (None, "tau over training:")] + [(None, f"  {_curve_line(c)}") for c in r.curves]
    lines += [(None, ""), (None, "cost:")] + [(None, f"  {x}") for x in _cost_lines(r)]
    return lines


def to_text(r: Report) -> str:
    """Plain text for a terminal: a summary line, the timeline, tau over training, the cost."""
    return "\n".join(line for _, line in text_lines(r)) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(r: Report) -> str:
    """Markdown for a chat message: a heading, the summary, the timeline as a list."""
    lines = [f"**specdeck report: {_md(r.plan)}**, {_span(r)}", "", _summary(r), ""]
    if not r.entries:
        lines.append("_nothing happened in this window_")
    for e in r.entries:
        lines.append(f"- `{_clock(e.at, r.since, r.until)}` **{LABELS[e.kind]}** {_md(e.text)}")
    if r.curves:
        lines += ["", "**tau over training**", ""] + [f"- {_md(_curve_line(c))}" for c in r.curves]
    lines += ["", "**cost**", ""] + [f"- {_md(x)}" for x in _cost_lines(r)]
    return "\n".join(lines) + "\n"


def to_json(r: Report) -> str:
    """``{"plan", "since", "until", "counts", "entries": [{"at", "kind", "text", "item", "run",
    "data"}], "tau_over_training": [{"item", "run", "points", "best", "new"}], "cost":
    {"window", "total", "unpriced_hosts"}}``."""
    doc: dict[str, Any] = {
        "plan": r.plan, "since": r.since, "until": r.until, "counts": r.counts(),
        "entries": [asdict(e) for e in r.entries],
        "tau_over_training": [{"item": c.item, "run": c.run, "points": [list(p) for p in c.points],
                               "best": list(c.best) if c.best else None, "new": c.new} for c in r.curves],
        "cost": {"window": r.cost_window, "total": r.cost_total, "unpriced_hosts": list(r.unpriced)}}
    return strictjson.dumps(doc, indent=2)
