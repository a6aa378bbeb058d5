"""The tau comparison table: eval results of drafters against a baseline, per prompt and overall.

Pure Python (no torch, no Textual): the console's tau pane uses it, and so will a
``specdeck compare`` command. Input rows are what :meth:`core.store.Store.eval_results`
returns: one row per (eval run, drafter, prompt) with ``tau``, the per-round acceptance
lengths ``rounds``, the per-position acceptance rates ``per_position`` and the ``settings``
the figures were measured under.

Definitions (the same as :mod:`core.ml.tau`):

* a round's acceptance length is accepted draft tokens + 1 (the target's bonus token);
* a prompt's **tau** is the row's ``tau`` (the mean over its rounds; computed from
  ``rounds`` when the row has no ``tau``);
* **macro** tau is the mean over prompts of the prompt taus;
* **pooled** tau is the total committed tokens (sum of every round's acceptance length) over
  the total number of rounds, pooled over prompts (None when a row has no ``rounds``);
* **per-position acceptance** of a drafter is the rate at each draft position pooled over
  rounds: each prompt's rates weighted by its number of rounds.

Decisions:

* **Entries, not labels.** Rows are grouped by (drafter label, role, compared settings).
  A label that was measured under two settings becomes two entries (the second one named
  with the keys that differ), so figures measured differently are never averaged together.
  A drafter evaluated at a checkpoint ``step`` is labelled ``drafter@step``.
* **Which baseline.** Each drafter entry is compared with the baseline entry whose compared
  settings (:data:`COMPARED_SETTINGS`) are identical. When none is, the closest one is used
  and the entry is *flagged* with the keys that differ (``mismatch``); the renderers and the
  console show the flag next to every figure of that entry.
* **Overall against a baseline is over shared prompts.** A drafter's overall macro/pooled tau
  and the baseline's figures it is compared with are computed over the prompts both have;
  the drafter's prompts the baseline lacks are listed in ``unmatched``. Without a baseline the
  overall is over all the drafter's prompts.
* **Repeats.** When an entry has two rows for one prompt (an eval run again), the later row
  (store order) wins and a warning says so.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

COMPARED_SETTINGS = ("mode", "block_size", "tree_budget", "target", "prompts")
"""Settings that must be equal for two rows' figures to be comparable."""


@dataclass(frozen=True)
class Drafter:
    """One compared entry: a drafter (or baseline) measured under one set of settings."""

    label: str
    """Unique within a comparison (``drafter@step``, plus differing settings if needed)."""
    name: str
    """The drafter label as the eval rows give it."""
    role: str
    """``drafter`` or ``baseline``."""
    step: int | None
    settings: dict
    run_ids: tuple[str, ...]
    baseline: str | None
    """The label of the baseline entry this one is compared with (None for baselines, or
    when the results hold no baseline)."""
    mismatch: tuple[str, ...] = ()
    """Compared settings keys whose values differ from the baseline's (empty: comparable)."""
    mismatch_values: dict = field(default_factory=dict)
    """``{key: [this entry's value, the baseline's value]}`` for each key in ``mismatch``."""
    per_position: tuple[float, ...] = ()
    """Acceptance rate per draft position (k = 1..), pooled over rounds."""


@dataclass(frozen=True)
class Cell:
    """One prompt x drafter figure."""

    prompt_id: str
    drafter: str
    role: str
    tau: float | None
    baseline_tau: float | None
    delta: float | None
    """``tau - baseline_tau``."""
    pct_of_baseline: float | None
    """``100 * tau / baseline_tau``."""
    rounds: int | None
    """Number of rounds measured (None when the row has no ``rounds``)."""
    mismatch: tuple[str, ...] = ()


@dataclass(frozen=True)
class Overall:
    """A drafter's figures over prompts (see the module docstring for which prompts)."""

    drafter: str
    role: str
    prompts: int
    macro: float | None
    pooled: float | None
    baseline_macro: float | None = None
    baseline_pooled: float | None = None
    delta_macro: float | None = None
    pct_macro: float | None = None
    delta_pooled: float | None = None
    pct_pooled: float | None = None
    mismatch: tuple[str, ...] = ()
    unmatched: tuple[str, ...] = ()
    """The drafter's prompts that the baseline has no figure for (left out of the overall)."""


@dataclass(frozen=True)
class Comparison:
    """The whole comparison; build it with :func:`build_comparison`."""

    drafters: tuple[Drafter, ...]
    cells: tuple[Cell, ...]
    overall: tuple[Overall, ...]
    prompts: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    def drafter(self, label: str) -> Drafter:
        for d in self.drafters:
            if d.label == label:
                return d
        raise KeyError(label)

    def overall_of(self, label: str) -> Overall:
        for o in self.overall:
            if o.drafter == label:
                return o
        raise KeyError(label)

    def cell(self, prompt_id: str, label: str) -> Cell | None:
        for c in self.cells:
            if c.prompt_id == prompt_id and c.drafter == label:
                return c
        return None

    @property
    def per_position(self) -> dict[str, tuple[float, ...]]:
        return {d.label: d.per_position for d in self.drafters}

    @property
    def flagged(self) -> dict[str, tuple[str, ...]]:
        """``{label: differing keys}`` for every entry not comparable with its baseline."""
        return {d.label: d.mismatch for d in self.drafters if d.mismatch}


# -- building ----------------------------------------------------------------------------
def _key_of(settings: Mapping | None) -> tuple:
    s = settings or {}
    return tuple(json.dumps(s.get(k), sort_keys=True, default=str) for k in COMPARED_SETTINGS)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    """(delta, % of baseline) of ``a`` against ``b``."""
    if a is None or b is None:
        return None, None
    return a - b, (100.0 * a / b if b else None)


def _prompt_tau(row: Mapping) -> float | None:
    if row.get("tau") is not None:
        return float(row["tau"])
    rounds = row.get("rounds")
    return _mean([float(r) for r in rounds]) if rounds else None


def _macro(rows: Iterable[Mapping]) -> float | None:
    taus = [t for t in (_prompt_tau(r) for r in rows) if t is not None]
    return _mean(taus)


def _pooled(rows: Sequence[Mapping]) -> float | None:
    total = n = 0
    for r in rows:
        rounds = r.get("rounds")
        if rounds is None:
            return None
        total += sum(int(x) for x in rounds)
        n += len(rounds)
    return total / n if n else None


def _per_position(rows: Iterable[Mapping]) -> tuple[float, ...]:
    num: list[float] = []
    den: list[float] = []
    for r in rows:
        pp = r.get("per_position") or []
        rounds = r.get("rounds")
        w = float(len(rounds)) if rounds is not None else 1.0
        for k, p in enumerate(pp):
            if k >= len(num):
                num.append(0.0)
                den.append(0.0)
            num[k] += float(p) * w
            den[k] += w
    return tuple(n / d if d else 0.0 for n, d in zip(num, den))


@dataclass
class _Entry:
    name: str
    role: str
    step: int | None
    settings: dict
    skey: tuple
    rows: dict[str, dict] = field(default_factory=dict)
    """prompt id -> row (the latest one)."""
    run_ids: list[str] = field(default_factory=list)
    label: str = ""


def _differing(a: Mapping, b: Mapping) -> tuple[str, ...]:
    return tuple(k for k in COMPARED_SETTINGS
                 if _key_of({k: a.get(k)}) != _key_of({k: b.get(k)}))


def build_comparison(rows: Iterable[Mapping[str, Any]]) -> Comparison:
    """Compare every drafter in ``rows`` with its baseline, per prompt and overall.

    Args:
        rows: eval result rows (``Store.eval_results()``): ``drafter``, ``role``
            (``drafter``/``baseline``), ``prompt_id``, ``tau``, ``rounds``,
            ``per_position``, ``settings``, ``step``, ``run_id``.

    Returns:
        The comparison; entries keep the order in which they first appear.
    """
    entries: dict[tuple, _Entry] = {}
    warnings: list[str] = []
    prompts: list[str] = []
    for r in rows:
        settings = dict(r.get("settings") or {})
        role = r.get("role") or "drafter"
        step = r.get("step")
        name = str(r.get("drafter") or "?")
        key = (name, role, step, _key_of(settings))
        e = entries.get(key)
        if e is None:
            e = entries[key] = _Entry(name, role, step, settings, key[3])
        pid = str(r.get("prompt_id"))
        if pid in e.rows:
            warnings.append(f"{name}: prompt {pid} measured again (run {r.get('run_id')}); "
                            "the later figure is used")
        e.rows[pid] = dict(r)
        if r.get("run_id") and r["run_id"] not in e.run_ids:
            e.run_ids.append(r["run_id"])
        if pid not in prompts:
            prompts.append(pid)

    _label_entries(list(entries.values()))
    baselines = [e for e in entries.values() if e.role == "baseline"]

    drafters: list[Drafter] = []
    cells: list[Cell] = []
    overall: list[Overall] = []
    for e in entries.values():
        base, mismatch = _pick_baseline(e, baselines, warnings)
        mvalues = {k: [e.settings.get(k), base.settings.get(k)] for k in mismatch} if base else {}
        drafters.append(Drafter(
            label=e.label, name=e.name, role=e.role, step=e.step, settings=e.settings,
            run_ids=tuple(e.run_ids), baseline=base.label if base else None, mismatch=mismatch,
            mismatch_values=mvalues, per_position=_per_position(e.rows.values())))
        for pid in prompts:
            row = e.rows.get(pid)
            if row is None:
                continue
            tau = _prompt_tau(row)
            btau = _prompt_tau(base.rows[pid]) if base and pid in base.rows else None
            delta, pct = _ratio(tau, btau)
            rounds = row.get("rounds")
            cells.append(Cell(pid, e.label, e.role, tau, btau, delta, pct,
                              len(rounds) if rounds is not None else None, mismatch))
        overall.append(_overall(e, base, mismatch))
    return Comparison(tuple(drafters), tuple(cells), tuple(overall), tuple(prompts),
                      tuple(warnings))


def _label_entries(entries: list[_Entry]) -> None:
    by_base: dict[tuple, list[_Entry]] = {}
    for e in entries:
        base = e.name if e.step is None else f"{e.name}@{e.step}"
        e.label = base
        by_base.setdefault((base, e.role), []).append(e)
    for (base, _), group in by_base.items():
        first = group[0]
        for e in group[1:]:
            diff = _differing(e.settings, first.settings)
            e.label = f"{base} [" + ", ".join(f"{k}={e.settings.get(k)}" for k in diff) + "]"
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.label] = counts.get(e.label, 0) + 1
    for e in entries:  # a drafter and a baseline under one label: name the baseline so
        if counts[e.label] > 1 and e.role == "baseline":
            e.label = f"{e.label} (baseline)"
    seen: dict[str, int] = {}
    for e in entries:  # anything still ambiguous gets a number
        n = seen.get(e.label, 0)
        seen[e.label] = n + 1
        if n:
            e.label = f"{e.label} #{n + 1}"


def _pick_baseline(e: _Entry, baselines: list[_Entry], warnings: list[str]
                   ) -> tuple[_Entry | None, tuple[str, ...]]:
    if e.role == "baseline" or not baselines:
        return None, ()
    same = [b for b in baselines if b.skey == e.skey]
    if same:
        if len(same) > 1:
            warnings.append(f"{e.label}: {len(same)} baselines match its settings; "
                            f"compared with {same[0].label}")
        return same[0], ()
    best = min(baselines, key=lambda b: len(_differing(e.settings, b.settings)))
    return best, _differing(e.settings, best.settings)


def _overall(e: _Entry, base: _Entry | None, mismatch: tuple[str, ...]) -> Overall:
    if base is None:
        rows = list(e.rows.values())
        return Overall(e.label, e.role, len(rows), _macro(rows), _pooled(rows),
                       mismatch=mismatch)
    shared = [p for p in e.rows if p in base.rows]
    unmatched = tuple(p for p in e.rows if p not in base.rows)
    mine = [e.rows[p] for p in shared]
    theirs = [base.rows[p] for p in shared]
    macro, pooled = _macro(mine), _pooled(mine)
    bmacro, bpooled = _macro(theirs), _pooled(theirs)
    dm, pm = _ratio(macro, bmacro)
    dp, pp = _ratio(pooled, bpooled)
    return Overall(e.label, e.role, len(shared), macro, pooled, bmacro, bpooled, dm, pm, dp, pp,
                   mismatch, unmatched)


# -- rendering ---------------------------------------------------------------------------
def to_dict(c: Comparison) -> dict:
    """Plain JSON-able values."""
    return {"compared_settings": list(COMPARED_SETTINGS), "prompts": list(c.prompts),
            "drafters": [asdict(d) for d in c.drafters], "cells": [asdict(x) for x in c.cells],
            "overall": [asdict(o) for o in c.overall], "warnings": list(c.warnings)}


def to_json(c: Comparison, *, indent: int | None = 2) -> str:
    return json.dumps(to_dict(c), indent=indent, default=str)


def _num(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def to_csv(c: Comparison) -> str:
    """One row per prompt x drafter (``scope`` = ``prompt``), then two per drafter for the
    overall figures (``scope`` = ``macro`` and ``pooled``)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["scope", "prompt_id", "drafter", "role", "tau", "baseline_tau", "delta",
                "pct_of_baseline", "rounds", "mismatch"])
    for x in c.cells:
        w.writerow(["prompt", x.prompt_id, x.drafter, x.role, _num(x.tau), _num(x.baseline_tau),
                    _num(x.delta), _num(x.pct_of_baseline, 2),
                    "" if x.rounds is None else x.rounds, ";".join(x.mismatch)])
    for o in c.overall:
        miss = ";".join(o.mismatch)
        w.writerow(["macro", "", o.drafter, o.role, _num(o.macro), _num(o.baseline_macro),
                    _num(o.delta_macro), _num(o.pct_macro, 2), "", miss])
        w.writerow(["pooled", "", o.drafter, o.role, _num(o.pooled), _num(o.baseline_pooled),
                    _num(o.delta_pooled), _num(o.pct_pooled, 2), "", miss])
    return buf.getvalue()


def fmt_tau(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def fmt_delta(x: float | None) -> str:
    return "–" if x is None else f"{x:+.3f}"


def fmt_pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}%"


def mismatch_note(d: Drafter) -> str:
    """``"⚠ block_size 8≠16 vs baseline"``, or ``""`` when comparable."""
    if not d.mismatch:
        return ""
    parts = [f"{k} {v[0]}≠{v[1]}" for k, v in d.mismatch_values.items()]
    return "⚠ " + ", ".join(parts) + f" vs {d.baseline}"


def to_markdown(c: Comparison) -> str:
    """Three tables (per prompt, overall, per-position acceptance) and the flags."""
    by_label = {d.label: d for d in c.drafters}
    out = ["| prompt | drafter | tau | baseline | Δ | % of baseline | |",
           "|---|---|---:|---:|---:|---:|---|"]
    for x in c.cells:
        flag = "⚠ " + ", ".join(x.mismatch) if x.mismatch else ""
        name = x.drafter + (" (baseline)" if x.role == "baseline" else "")
        out.append(f"| {x.prompt_id} | {name} | {fmt_tau(x.tau)} | {fmt_tau(x.baseline_tau)} | "
                   f"{fmt_delta(x.delta)} | {fmt_pct(x.pct_of_baseline)} | {flag} |")
    out += ["", "| drafter | prompts | macro tau | Δ | % of baseline | pooled tau | Δ | "
                "% of baseline | |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for o in c.overall:
        name = o.drafter + (" (baseline)" if o.role == "baseline" else "")
        note = mismatch_note(by_label[o.drafter])
        if o.unmatched:
            note = (note + "; " if note else "") + f"no baseline for {', '.join(o.unmatched)}"
        out.append(f"| {name} | {o.prompts} | {fmt_tau(o.macro)} | {fmt_delta(o.delta_macro)} | "
                   f"{fmt_pct(o.pct_macro)} | {fmt_tau(o.pooled)} | {fmt_delta(o.delta_pooled)} | "
                   f"{fmt_pct(o.pct_pooled)} | {note} |")
    width = max((len(d.per_position) for d in c.drafters), default=0)
    if width:
        out += ["", "| drafter | " + " | ".join(f"p{k}" for k in range(1, width + 1)) + " |",
                "|---|" + "---:|" * width]
        for d in c.drafters:
            vals = [f"{p:.3f}" for p in d.per_position] + [""] * (width - len(d.per_position))
            out.append(f"| {d.label} | " + " | ".join(vals) + " |")
    if c.warnings:
        out += [""] + [f"- {w}" for w in c.warnings]
    return "\n".join(out) + "\n"


__all__ = ["COMPARED_SETTINGS", "Comparison", "Drafter", "Cell", "Overall", "build_comparison",
           "to_dict", "to_json", "to_csv", "to_markdown", "mismatch_note", "fmt_tau", "fmt_delta",
           "fmt_pct"]
