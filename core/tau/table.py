"""The tau comparison table: eval results of drafters against a baseline, per prompt and overall.

Pure Python (no torch, no Textual): the console's tau pane uses it, and so will a
``specdeck compare`` command. Input rows are what :meth:`core.state.store.Store.eval_results`
returns: one row per (eval run, drafter, prompt) with ``tau``, the per-round acceptance
lengths ``rounds``, the per-position acceptance rates ``per_position`` and the ``settings``
the figures were measured under.

Definitions (the same as :mod:`core.ml.measure.tau`):

* a round's acceptance length is the tokens it commits: accepted draft tokens + 1 (the
  target's bonus token), capped and cut as the reference counts (docs/evaluation.md §1);
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
* **Samples nested in prompts.** A sampled eval (temperature > 0) measures each prompt several
  times, one row per seed (settings ``sample``: its index). Prompts stay the unit: a prompt's
  tau is the mean of its samples' taus, its rounds are all its samples' rounds, and every
  interval, the paired test and the verdict are over prompts (a drafter and its baseline paired
  by prompt), so a verdict at T 0.7 means what it means at T 0: the seeds only make each
  prompt's figure less noisy. ``temperature``, ``top_p`` and ``top_k`` are compared settings.
* **Repeats.** When an entry has two rows for one prompt and sample (an eval run again), the
  later row (store order) wins and a warning says so.
* **One drafter, one entry.** Rows record the sha256 of the weights they measured (settings
  ``weights``). Entries with the same weights, role and compared settings are one drafter
  (a checkpoint evaluated by tau over training, ``train-v5@120``, and by an eval item, ``v5``):
  one entry under the name not bound to a step, the others its ``aliases``
  (``v5 = train-v5@120`` in the tables).
* **The decision first.** A plan's ``decide:`` names the pairs the operator is deciding
  (``decide=``); they are compared like ``pairs`` and lead every list of verdicts.
* **Uncertainty** (:mod:`core.tau.stats`): every overall figure has a seeded 95 % bootstrap
  interval over prompts (``macro_ci95``; ``pooled_ci95`` resamples prompts, then rounds
  within them) and the number of ``rounds`` behind it. A drafter with a baseline, and each
  pair named with ``pairs=[(a, b)]``, gets a *paired* comparison over the prompts both have:
  the mean per-prompt difference of tau, the sign-flip permutation test's ``p_value``, the
  interval that inverts that test (``delta_macro_ci95``: the differences it does not reject,
  so it excludes 0 exactly when p < 0.05; none under 6 prompts) and a ``verdict``
  (``better``, ``worse``, ``no_detectable_difference``) with ``verdict_text`` in words. A
  pair whose settings differ is computed but flagged: its text starts with ``⚠ settings
  differ``.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from core.tau import stats
from core.ml.formats import strictjson
from core.ml.measure import harness
from core.state.points import eval_row_problem
from core.state.records import EvalRow

COMPARED_SETTINGS = ("mode", "block_size", "tree_budget", "target", "prompts", "dtype", "accounting", "template",
                     "temperature", "top_p", "top_k", "harness")
"""Settings that must be equal for two rows' figures to be comparable. ``accounting`` is how
rounds were counted (``dflash-0.1.0``, the reference's, or ``legacy`` for results of older
specdeck versions that could not be recounted, :func:`core.actions.eval.eval_rows`);
``template`` whether the chat template ran, with thinking on or off; ``temperature``,
``top_p``, ``top_k`` how tokens were drawn (temperature 0: greedy); ``harness`` what measured it
(:mod:`core.ml.measure.harness`: in-process online, offline trajectory, an engine, a client of a
server; rows stored before it was recorded: derived from ``mode`` and ``engine``)."""

SAMPLING_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0.0}
"""What rows stored before the sampling settings were recorded were measured at (greedy), so
they stay comparable with greedy rows that record them; numbers compare as numbers (0 == 0.0)."""


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
    measured: dict = field(default_factory=dict)
    """How its figures were measured (:func:`measured`): harness, decoding, block size, prompt
    set and its digest."""
    aliases: tuple[str, ...] = ()
    """The other labels the same weights were measured under with the same settings (e.g.
    ``train-v5@120`` for ``v5``: a checkpoint evaluated by tau over training and by an eval
    item): one drafter, one entry (:func:`shown_label` names it with all of them)."""


def shown_label(d: Drafter) -> str:
    """``v5 = train-v5@120``: the label and its aliases (the label alone when it has none)."""
    return " = ".join((d.label, *d.aliases))


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
    samples: int = 1
    """How many samples (seeds) the prompt's ``tau`` averages."""


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
    macro_ci95: tuple[float, float] | None = None
    """95 % bootstrap interval of ``macro`` over prompts (None under 2 prompts)."""
    pooled_ci95: tuple[float, float] | None = None
    """95 % interval of ``pooled`` (prompts, then rounds within prompts, resampled)."""
    rounds: int | None = None
    """Rounds behind the figures (None when a row has no ``rounds``)."""
    delta_macro_ci95: tuple[float, float] | None = None
    """95 % interval of the mean per-prompt difference with the baseline, inverting the test
    behind ``p_value`` (:attr:`core.tau.stats.Paired.ci95`): it excludes 0 exactly when the
    verdict is ``better`` or ``worse``."""
    p_value: float | None = None
    test: str | None = None
    """The paired test behind ``p_value`` (:data:`core.tau.stats.TEST`)."""
    verdict: str | None = None
    """``better``, ``worse`` or ``no_detectable_difference`` against the baseline."""
    verdict_text: str | None = None
    prompts_needed: int | None = None
    """About how many prompts would detect :data:`core.tau.stats.DETECT` (no difference found)."""
    samples: int = 1
    """The most samples (seeds) any of its prompts averages (1: one measurement per prompt)."""
    token_weighted: float | None = None
    """Token-weighted tau over the same prompts as ``macro`` (:func:`token_weighted`)."""


@dataclass(frozen=True)
class Pair:
    """A named pair ``a`` vs ``b`` on the prompts both have (``compare --pair A B``).

    ``macro``, ``pooled``, their intervals and ``rounds`` are ``a``'s over those prompts;
    ``b_*`` are ``b``'s; the delta and the verdict are ``a - b``."""

    a: str
    b: str
    prompts: int
    macro: float | None
    pooled: float | None
    macro_ci95: tuple[float, float] | None
    pooled_ci95: tuple[float, float] | None
    rounds: int | None
    b_macro: float | None
    b_pooled: float | None
    b_macro_ci95: tuple[float, float] | None
    b_pooled_ci95: tuple[float, float] | None
    b_rounds: int | None
    delta_macro: float | None
    delta_macro_ci95: tuple[float, float] | None
    delta_pooled: float | None
    p_value: float | None
    test: str
    verdict: str
    verdict_text: str
    prompts_needed: int | None = None
    mismatch: tuple[str, ...] = ()
    mismatch_values: dict = field(default_factory=dict)
    """``{key: [a's value, b's value]}`` for each key in ``mismatch``."""
    unmatched: tuple[str, ...] = ()
    """Prompts only one of the two has (left out)."""


@dataclass(frozen=True)
class Comparison:
    """The whole comparison; build it with :func:`build_comparison`."""

    drafters: tuple[Drafter, ...]
    cells: tuple[Cell, ...]
    overall: tuple[Overall, ...]
    prompts: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    pairs: tuple[Pair, ...] = ()
    left_out: tuple[str, ...] = ()
    """Rows whose figures are not finite numbers (a NaN or infinite tau...), each named with
    why: left out of every figure (also listed in ``warnings``)."""
    by_domain: tuple[DomainFigures, ...] = ()
    """Each entry's figures per domain, for entries whose prompts name one (else empty)."""
    decisions: int = 0
    """How many of ``pairs`` (the first ones) are the decision (a plan's ``decide:``)."""
    target_warnings: tuple[str, ...] = ()
    """Each verdict (a drafter against its baseline, a pair) whose two sides were measured
    against targets that differ (:func:`target_differences`; also listed in ``warnings``)."""

    def drafter(self, label: str) -> Drafter:
        for d in self.drafters:
            if d.label == label:
                return d
        raise KeyError(label)

    @property
    def decision(self) -> tuple[Pair, ...]:
        """The pairs the plan says are the decision (``decide:``), in its order."""
        return self.pairs[:self.decisions]

    @property
    def deciding(self) -> list[str]:
        """The labels of the decision's drafters, in the order its pairs name them."""
        out: list[str] = []
        for p in self.decision:
            out += [x for x in (p.a, p.b) if x not in out]
        return out

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
def _setting(s: Mapping, key: str):
    """A compared setting's value, as compared (:data:`SAMPLING_DEFAULTS`; a harness derived)."""
    if key == "harness":
        return harness.of_settings(s)
    v = s.get(key)
    if key not in SAMPLING_DEFAULTS:
        return v
    if v is None:
        return SAMPLING_DEFAULTS[key]
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def _key_of(settings: Mapping | None) -> tuple:
    s = settings or {}
    return tuple(json.dumps(_setting(s, k), sort_keys=True, default=str) for k in COMPARED_SETTINGS)


def sample_of(row: EvalRow) -> int:
    """The row's sample index among its prompt's samples (0 for a greedy row)."""
    k = (row.settings or {}).get("sample")
    return k if isinstance(k, int) and not isinstance(k, bool) else 0


PER_ROW_SETTINGS = ("sample", "domain")
"""Row settings that tell a prompt's rows apart rather than describe the entry (``domain``: the
prompt's, which splits the table by domain, :class:`DomainFigures`)."""


def measured(settings: Mapping | None) -> dict:
    """How an entry was measured, as every output names it: ``harness``, ``decoding`` (greedy or
    T, top-p, top-k), ``block_size``, ``prompt_set`` (a described set's name) and ``prompt_digest``
    (the prompts file's sha256, first 12 hex digits)."""
    s = settings or {}
    return {"harness": harness.of_settings(s), "decoding": harness.decoding(s), "block_size": s.get("block_size"),
            "prompt_set": s.get("prompt_set"), "prompt_digest": harness.digest(s.get("prompts"))}


def measured_note(d: "Drafter") -> str:
    """``in-process online, greedy, B 16, prompts 3f9a2c1b7e00`` (the prompt set's name first when known)."""
    m = d.measured or measured(d.settings)
    where = f"{m['prompt_set']} " if m.get("prompt_set") else ""
    return f"{m['harness']}, {m['decoding']}, B {m['block_size']}, prompts {where}{m['prompt_digest']}"


def token_weighted(rows: Sequence[EvalRow]) -> float | None:
    """Token-weighted tau: each prompt's tau weighted by the tokens its rounds committed
    (``sum(tokens_i * tau_i) / sum(tokens_i)``); None when a row has no rounds."""
    num = den = 0.0
    for r in rows:
        if r.rounds is None:
            return None
        tokens = float(sum(int(x) for x in r.rounds))
        t = _prompt_tau(r)
        if t is None:
            continue
        num += tokens * t
        den += tokens
    return num / den if den else None


@dataclass(frozen=True)
class DomainFigures:
    """One entry's figures on the prompts of one domain (a prompt set's ``domain`` or source)."""

    drafter: str
    domain: str
    prompts: int
    macro: float | None
    """Per-request mean tau over the domain's prompts."""
    macro_ci95: tuple[float, float] | None
    token_weighted: float | None
    pooled: float | None
    rounds: int | None


def sampling_note(d: "Drafter") -> str:
    """How the entry's tokens were drawn: ``"T 0"`` (greedy), ``"T 0.7, top-p 0.95, 20 seeds"``."""
    s = d.settings or {}
    t = _setting(s, "temperature")
    if not isinstance(t, float) or t == 0:
        return "T 0"
    parts = [f"T {t:g}"]
    if _setting(s, "top_p") != 1.0:
        parts.append(f"top-p {s.get('top_p'):g}")
    if _setting(s, "top_k") not in (0.0, None):
        parts.append(f"top-k {s.get('top_k')}")
    n = s.get("samples")
    if isinstance(n, int) and n > 1:
        parts.append(f"{n} seeds per prompt")
    return ", ".join(parts)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    """(delta, % of baseline) of ``a`` against ``b``."""
    if a is None or b is None:
        return None, None
    return a - b, (100.0 * a / b if b else None)


def _prompt_tau(row: EvalRow) -> float | None:
    if row.tau is not None:
        return float(row.tau)
    rounds = row.rounds
    return _mean([float(r) for r in rounds]) if rounds else None


def _pooled(rows: Sequence[EvalRow]) -> float | None:
    total = n = 0
    for r in rows:
        rounds = r.rounds
        if rounds is None:
            return None
        total += sum(int(x) for x in rounds)
        n += len(rounds)
    return total / n if n else None


def _row_per_position(row: EvalRow) -> list[float]:
    """The row's p_k; from its rounds when it has none (p_k = share of rounds whose
    acceptance length is above k, k = 1 .. block size - 1)."""
    if row.per_position:
        return list(row.per_position)
    rounds = row.rounds
    if not rounds:
        return []
    bs = (row.settings or {}).get("block_size")
    bs = bs if isinstance(bs, int) and not isinstance(bs, bool) else max(int(x) for x in rounds)
    bs = min(bs, MAX_BLOCK)  # a result file's claim: bounded
    return [sum(1 for x in rounds if int(x) > k) / len(rounds) for k in range(1, bs)]


MAX_BLOCK = 4096
"""Most acceptance positions a row's p_k is derived for (real block sizes are 8-32)."""


def _per_position(rows: Iterable[EvalRow]) -> tuple[float, ...]:
    num: list[float] = []
    den: list[float] = []
    for r in rows:
        pp = _row_per_position(r)
        rounds = r.rounds
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
    rows: dict[str, EvalRow] = field(default_factory=dict)
    """prompt id -> the prompt's row: its one row, or its samples nested (:func:`_nested`)."""
    samples: dict[str, dict[int, EvalRow]] = field(default_factory=dict)
    """prompt id -> sample index -> row (the latest one)."""
    run_ids: list[str] = field(default_factory=list)
    label: str = ""
    aliases: list[str] = field(default_factory=list)

    def nsamples(self, pids: Iterable[str] | None = None) -> int:
        return max((len(self.samples[p]) for p in (self.samples if pids is None else pids)), default=1)


def _nested(rows: Mapping[int, EvalRow]) -> EvalRow:
    """One prompt's figure from its samples: tau the mean of theirs, rounds all of theirs,
    per-position rates pooled over those rounds. A single row is itself."""
    if len(rows) == 1:
        return next(iter(rows.values()))
    ordered = [rows[k] for k in sorted(rows)]
    taus = [t for t in map(_prompt_tau, ordered) if t is not None]
    groups = [r.rounds for r in ordered]
    rounds = [x for g in groups for x in g] if all(g is not None for g in groups) else None
    return replace(ordered[0], tau=_mean(taus), rounds=rounds, per_position=list(_per_position(ordered)) or None)


def _differing(a: Mapping, b: Mapping) -> tuple[str, ...]:
    return tuple(k for k in COMPARED_SETTINGS
                 if json.dumps(_setting(a, k), sort_keys=True, default=str)
                 != json.dumps(_setting(b, k), sort_keys=True, default=str))


def build_comparison(rows: Iterable[EvalRow],
                     pairs: Sequence[tuple[str, str]] = (), *, seed: int = stats.SEED,
                     detect: float = stats.DETECT,
                     decide: Sequence[tuple[str, str]] = ()) -> Comparison:
    """Compare every drafter in ``rows`` with its baseline, per prompt and overall.

    Args:
        rows: eval result rows (``Store.eval_results()``): ``drafter``, ``role``
            (``drafter``/``baseline``), ``prompt_id``, ``tau``, ``rounds``,
            ``per_position``, ``settings``, ``step``, ``run_id``.
        pairs: ``(a, b)`` entry labels to compare with each other as well. Each also pairs
            their siblings measured another way (``a ddtree-16`` with ``b ddtree-16``).
        seed: the bootstrap's and the permutation test's seed.
        detect: the tau difference the "how many prompts" estimates are for.
        decide: the pairs that are the decision (a plan's ``decide:``): compared like
            ``pairs`` and put first; a pair not measured yet is left out with a warning.

    Raises:
        InvalidInput: a label in ``pairs`` names no entry.

    Returns:
        The comparison; entries keep the order in which they first appear. Entries of one
        drafter (the same weights sha256, role and compared settings) are one entry, under
        the label of the one not bound to a step (else the first), the others its
        ``aliases``; either name finds it in ``pairs`` and ``decide``.
    """
    entries: dict[tuple, _Entry] = {}
    warnings: list[str] = []
    prompts: list[str] = []
    left_out: list[str] = []
    for r in rows:
        why = eval_row_problem(r)
        if why:
            left_out.append(f"left out: {why}")
            continue
        settings = {k: v for k, v in (r.settings or {}).items() if k not in PER_ROW_SETTINGS}
        role = r.role or "drafter"
        step = r.step
        name = str(r.drafter or "?")
        key = (name, role, step, _key_of(settings))
        e = entries.get(key)
        if e is None:
            e = entries[key] = _Entry(name, role, step, settings, key[3])
        pid, k = str(r.prompt_id), sample_of(r)
        mine = e.samples.setdefault(pid, {})
        if k in mine:
            which = f"prompt {pid}" + (f" sample {k}" if k or len(mine) > 1 else "")
            warnings.append(f"{name}: {which} measured again (run {r.run_id}); "
                            "the later figure is used")
        mine[k] = r
        if r.run_id and r.run_id not in e.run_ids:
            e.run_ids.append(r.run_id)
        if pid not in prompts:
            prompts.append(pid)

    for e in entries.values():
        e.rows = {pid: _nested(by_sample) for pid, by_sample in e.samples.items()}
    _label_entries(list(entries.values()))
    kept = _merge_same_weights(list(entries.values()), warnings)
    entries = {k: e for k, e in entries.items() if e in kept}
    baselines = [e for e in entries.values() if e.role == "baseline"]

    drafters: list[Drafter] = []
    cells: list[Cell] = []
    overall: list[Overall] = []
    for e in entries.values():
        base, mismatch = _pick_baseline(e, baselines, warnings)
        mvalues = {k: [_shown(e.settings, k), _shown(base.settings, k)] for k in mismatch} if base else {}
        drafters.append(Drafter(
            label=e.label, name=e.name, role=e.role, step=e.step, settings=e.settings,
            run_ids=tuple(e.run_ids), baseline=base.label if base else None, mismatch=mismatch,
            mismatch_values=mvalues, per_position=_per_position(e.rows.values()),
            measured=measured(e.settings), aliases=tuple(e.aliases)))
        for pid in prompts:
            row = e.rows.get(pid)
            if row is None:
                continue
            tau = _prompt_tau(row)
            btau = _prompt_tau(base.rows[pid]) if base and pid in base.rows else None
            delta, pct = _ratio(tau, btau)
            rounds = row.rounds
            cells.append(Cell(pid, e.label, e.role, tau, btau, delta, pct,
                              len(rounds) if rounds is not None else None, mismatch, len(e.samples[pid])))
        overall.append(_overall(e, base, mismatch, seed, detect))
    by_label = {e.label: e for e in entries.values()}
    names = {**{a: e.label for e in entries.values() for a in e.aliases},
             **{lb: lb for lb in by_label}}
    chosen = _resolve_pairs(_measured(decide, names, warnings), names)
    first = len(chosen)
    chosen += [p for p in _resolve_pairs(pairs, names) if p not in chosen]
    done = [_pair(by_label[a], by_label[b], seed, detect) for a, b in chosen]
    verdicts = list(dict.fromkeys([(o.drafter, d.baseline) for o, d in zip(overall, drafters) if d.baseline]
                                  + [(p.a, p.b) for p in done]))
    targets = [target_warning(a, b, diff) for a, b in verdicts
               if (diff := target_differences(by_label[a].settings, by_label[b].settings))]
    return Comparison(tuple(drafters), tuple(cells), tuple(overall), tuple(prompts),
                      tuple(left_out + warnings + targets), tuple(done), tuple(left_out),
                      tuple(f for e in entries.values() for f in _domains(e, seed)), first,
                      tuple(targets))


TARGET_FACTS = (("revision", "revision"), ("dtype", "checkpoint dtype"), ("quantization", "quantisation"),
                ("config_sha256", "config"))
"""What a row's ``target_id`` (the run's record, core.ml.formats.reproduce) says of its target, in words."""


def target_differences(a: Mapping, b: Mapping) -> dict[str, list]:
    """``{what: [a's, b's]}`` for each way the targets two entries were measured against differ:
    the record's revision, checkpoint dtype, quantisation and config digest (compared only where
    both rows recorded them: an older row recorded none), the dtype it ran at, its fingerprint."""
    out: dict[str, list] = {}
    ta = a.get("target_id") if isinstance(a.get("target_id"), dict) else {}
    tb = b.get("target_id") if isinstance(b.get("target_id"), dict) else {}
    for key, words in TARGET_FACTS:
        va, vb = ta.get(key), tb.get(key)
        if (va is not None or vb is not None) and ta and tb and va != vb:
            out[words] = [va or "none", vb or "none"]
    if a.get("dtype") != b.get("dtype"):
        out["ran in"] = [a.get("dtype"), b.get("dtype")]
    if a.get("target") != b.get("target") and not out:
        out["target fingerprint"] = [a.get("target"), b.get("target")]
    return out


def target_warning(a: str, b: str, diff: Mapping[str, list]) -> str:
    what = ", ".join(f"{k} {v[0]}≠{v[1]}" if k != "config" else "config.json" for k, v in diff.items())
    return (f"⚠ {a} vs {b}: measured against different targets ({what}): a drafter paired with another "
            "revision or precision of its target (a requantised one) loses acceptance, so this verdict "
            "compares targets as much as drafters; measure both against one target")


def _domains(e: _Entry, seed: int) -> list[DomainFigures]:
    """The entry's figures per domain (its rows' ``domain``), each with its own interval; none
    when no prompt names a domain."""
    groups: dict[str, list[EvalRow]] = {}
    for pid, by_sample in e.samples.items():
        dom = (next(iter(by_sample.values())).settings or {}).get("domain")
        if isinstance(dom, str) and dom:
            groups.setdefault(dom, []).append(e.rows[pid])
    out = []
    for dom, rows in groups.items():
        macro, pooled, mci, _, rounds = _figures(f"{e.label}|{dom}", rows, seed)
        out.append(DomainFigures(e.label, dom, len(rows), macro, mci, token_weighted(rows), pooled, rounds))
    return out


def _measured(decide: Sequence[tuple[str, str]], names: Mapping[str, str],
              warnings: list[str]) -> list[tuple[str, str]]:
    """The decision's pairs whose two drafters have results (the others: a warning each)."""
    out = []
    for a, b in decide:
        missing = [x for x in (a, b) if x not in names]
        if missing:
            warnings.append(f"decide: {a} vs {b}: no eval results for {' or '.join(missing)} yet")
        elif names[a] != names[b]:
            out.append((a, b))
    return out


def _resolve_pairs(pairs: Sequence[tuple[str, str]], names: Mapping[str, str]
                   ) -> list[tuple[str, str]]:
    """The named pairs (as entry labels: ``names`` maps every label and alias to its entry's
    label), each followed by its siblings (the same suffix after both names)."""
    from core.errors import InvalidInput

    labels = list(dict.fromkeys(names.values()))
    out: list[tuple[str, str]] = []
    for x_a, x_b in pairs:
        for x in (x_a, x_b):
            if x not in names:
                raise InvalidInput(f"--pair: no drafter {x!r} in these eval results",
                                   hint="one of: " + ", ".join(labels))
        a, b = names[x_a], names[x_b]
        if a == b:
            raise InvalidInput(f"--pair {x_a} {x_b}: name two different drafters"
                               + (f" ({x_a} and {x_b} are one drafter: the same weights)"
                                  if x_a != x_b else ""))
        found = [(a, b)] + [(lb, b + lb[len(a):]) for lb in labels
                            if lb.startswith(a + " ") and b + lb[len(a):] in labels]
        out += [p for p in found if p not in out]
    return out


def _merge_same_weights(entries: list[_Entry], warnings: list[str]) -> list[_Entry]:
    """One entry per drafter: entries with the same weights sha256 (settings ``weights``),
    role and compared settings are merged into the one not bound to a step (else the first),
    the others becoming its aliases; a prompt both measured keeps that entry's figure (a
    warning says when the two differ). Returns the entries kept, in order."""
    groups: dict[tuple, list[_Entry]] = {}
    for e in entries:
        digest = e.settings.get("weights")
        if isinstance(digest, str) and digest:
            groups.setdefault((digest, e.role, e.skey), []).append(e)
    gone: set[int] = set()
    for group in groups.values():
        if len(group) < 2:
            continue
        keep = next((e for e in group if e.step is None), group[0])
        for e in group:
            if e is keep:
                continue
            gone.add(id(e))
            keep.aliases.append(e.label)
            keep.run_ids += [r for r in e.run_ids if r not in keep.run_ids]
            for pid, row in e.rows.items():
                mine = keep.rows.get(pid)
                if mine is None:
                    keep.rows[pid], keep.samples[pid] = row, e.samples[pid]
                elif _prompt_tau(mine) != _prompt_tau(row):
                    warnings.append(f"{keep.label} = {e.label} (the same weights): prompt {pid} "
                                    f"measured {fmt_tau(_prompt_tau(mine))} and "
                                    f"{fmt_tau(_prompt_tau(row))}; {keep.label}'s figure is used")
    return [e for e in entries if id(e) not in gone]


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


def _figures(label: str, rows: Sequence[EvalRow], seed: int) -> tuple:
    """(macro, pooled, macro_ci95, pooled_ci95, rounds) of ``rows`` (one per prompt)."""
    taus = [t for t in map(_prompt_tau, rows) if t is not None]
    groups = [r.rounds for r in rows]
    has_rounds = bool(rows) and all(g is not None for g in groups)
    return (_mean(taus), _pooled(rows),
            stats.mean_ci(taus, rng=stats.rng_for(label, "macro", seed=seed)),
            stats.pooled_ci(groups, rng=stats.rng_for(label, "pooled", seed=seed))
            if has_rounds else None,
            sum(len(g) for g in groups) if has_rounds else None)


def _compare(a: _Entry, b: _Entry, shared: Sequence[str], mismatch: tuple[str, ...],
             seed: int, detect: float) -> tuple[stats.Paired, str]:
    """The paired comparison of ``a`` with ``b`` over ``shared`` prompts, and its words."""
    both = [(ta, tb) for ta, tb in ((_prompt_tau(a.rows[p]), _prompt_tau(b.rows[p]))
                                    for p in shared) if ta is not None and tb is not None]
    res = stats.paired([x for x, _ in both], [y for _, y in both], name=f"{a.label}|{b.label}",
                       seed=seed, detect=detect)
    text = res.text(a.label, b.label, seeds=max(a.nsamples(shared), b.nsamples(shared)))
    if mismatch:
        diff = ", ".join(f"{k} {_shown(a.settings, k)}≠{_shown(b.settings, k)}" for k in mismatch)
        across = list(dict.fromkeys(ACROSS[k] for k in mismatch if k in ACROSS))
        text = (f"⚠ settings differ ({diff}), not comparable"
                + (f": a verdict across {' and '.join(across)}" if across else "") + f": {text}")
    return res, text


ACROSS = {"harness": "harnesses", "temperature": "decodings", "top_p": "decodings", "top_k": "decodings",
          "prompts": "prompt sets"}
"""The compared settings a verdict line names in words when a pair differs in them."""


def _shown(s: Mapping, key: str):
    """A setting as a mismatch shows it: a harness in words, a prompt set by its digest."""
    if key == "harness":
        return harness.of_settings(s)
    if key == "prompts":
        return harness.digest(s.get(key))
    return s.get(key)


def _overall(e: _Entry, base: _Entry | None, mismatch: tuple[str, ...], seed: int,
             detect: float) -> Overall:
    if base is None:
        rows = list(e.rows.values())
        macro, pooled, mci, pci, rounds = _figures(e.label, rows, seed)
        return Overall(e.label, e.role, len(rows), macro, pooled, mismatch=mismatch,
                       macro_ci95=mci, pooled_ci95=pci, rounds=rounds, samples=e.nsamples(),
                       token_weighted=token_weighted(rows))
    shared = [p for p in e.rows if p in base.rows]
    unmatched = tuple(p for p in e.rows if p not in base.rows)
    macro, pooled, mci, pci, rounds = _figures(e.label, [e.rows[p] for p in shared], seed)
    theirs = [base.rows[p] for p in shared]
    bmacro, bpooled = _mean([t for t in map(_prompt_tau, theirs) if t is not None]), \
        _pooled(theirs)
    dm, pm = _ratio(macro, bmacro)
    dp, pp = _ratio(pooled, bpooled)
    res, text = _compare(e, base, shared, mismatch, seed, detect)
    return Overall(e.label, e.role, len(shared), macro, pooled, bmacro, bpooled, dm, pm, dp, pp,
                   mismatch, unmatched, mci, pci, rounds, res.ci95, res.p_value, res.test,
                   res.verdict, text, res.prompts_needed, e.nsamples(shared),
                   token_weighted([e.rows[p] for p in shared]))


def _pair(a: _Entry, b: _Entry, seed: int, detect: float) -> Pair:
    shared = [p for p in a.rows if p in b.rows]
    unmatched = tuple([p for p in a.rows if p not in b.rows] +
                      [p for p in b.rows if p not in a.rows])
    mismatch = _differing(a.settings, b.settings)
    fa = _figures(a.label, [a.rows[p] for p in shared], seed)
    fb = _figures(b.label, [b.rows[p] for p in shared], seed)
    res, text = _compare(a, b, shared, mismatch, seed, detect)
    dp, _ = _ratio(fa[1], fb[1])
    return Pair(a.label, b.label, len(shared), *fa, *fb, res.delta, res.ci95, dp, res.p_value,
                res.test, res.verdict, text, res.prompts_needed, mismatch,
                {k: [_shown(a.settings, k), _shown(b.settings, k)] for k in mismatch}, unmatched)


# -- rendering ---------------------------------------------------------------------------
def to_dict(c: Comparison) -> dict:
    """Plain JSON-able values."""
    return {"compared_settings": list(COMPARED_SETTINGS), "prompts": list(c.prompts),
            "drafters": [asdict(d) for d in c.drafters], "cells": [asdict(x) for x in c.cells],
            "overall": [asdict(o) for o in c.overall], "pairs": [asdict(p) for p in c.pairs],
            "by_domain": [asdict(f) for f in c.by_domain], "aggregations": dict(harness.AGGREGATIONS),
            "warnings": list(c.warnings), "left_out": list(c.left_out)}


def to_json(c: Comparison, *, indent: int | None = 2) -> str:
    return strictjson.dumps(to_dict(c), indent=indent, default=str)


def _num(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def to_csv(c: Comparison) -> str:
    """One row per prompt x drafter (``scope`` = ``prompt``), then two per drafter for the
    overall figures (``scope`` = ``macro`` and ``pooled``), then one per named pair
    (``scope`` = ``pair``: ``drafter`` vs ``against``), then one per drafter and domain
    (``scope`` = ``domain``, ``prompt_id`` the domain). The intervals, the paired test and
    the verdict fill the columns after ``mismatch`` on the overall and pair rows. The last
    columns say how the row's tau was measured and aggregated: ``harness``, ``decoding``,
    ``block_size``, ``prompt_set``, ``prompt_digest``, ``aggregation`` (per-request mean,
    token-weighted, pooled; empty on a prompt's own row)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["scope", "prompt_id", "drafter", "role", "tau", "baseline_tau", "delta",
                "pct_of_baseline", "rounds", "mismatch", "ci95_lo", "ci95_hi", "delta_ci95_lo",
                "delta_ci95_hi", "p_value", "test", "verdict", "verdict_text", "against",
                *MEASURED_COLUMNS, "aggregation"])
    how = {d.label: [d.measured.get(k, "") for k in MEASURED_COLUMNS] for d in c.drafters}

    def ci(x):
        return ["", ""] if x is None else [_num(x[0]), _num(x[1])]

    def rounds(n):
        return "" if n is None else n

    for x in c.cells:
        w.writerow(["prompt", x.prompt_id, x.drafter, x.role, _num(x.tau), _num(x.baseline_tau),
                    _num(x.delta), _num(x.pct_of_baseline, 2), rounds(x.rounds),
                    ";".join(x.mismatch)] + [""] * 9 + how[x.drafter] + [""])
    for o in c.overall:
        miss = ";".join(o.mismatch)
        test = [*ci(o.delta_macro_ci95), _num(o.p_value), o.test or "", o.verdict or "",
                o.verdict_text or "", c.drafter(o.drafter).baseline or ""]
        w.writerow(["macro", "", o.drafter, o.role, _num(o.macro), _num(o.baseline_macro),
                    _num(o.delta_macro), _num(o.pct_macro, 2), rounds(o.rounds), miss,
                    *ci(o.macro_ci95), *test, *how[o.drafter], "per-request mean"])
        w.writerow(["pooled", "", o.drafter, o.role, _num(o.pooled), _num(o.baseline_pooled),
                    _num(o.delta_pooled), _num(o.pct_pooled, 2), rounds(o.rounds), miss,
                    *ci(o.pooled_ci95)] + [""] * 7 + how[o.drafter] + ["pooled"])
        w.writerow(["token_weighted", "", o.drafter, o.role, _num(o.token_weighted), "", "", "",
                    rounds(o.rounds), miss] + [""] * 9 + how[o.drafter] + ["token-weighted"])
    for pr in c.pairs:
        pct = 100.0 * pr.macro / pr.b_macro if pr.macro is not None and pr.b_macro else None
        w.writerow(["pair", "", pr.a, "", _num(pr.macro), _num(pr.b_macro), _num(pr.delta_macro),
                    _num(pct, 2), rounds(pr.rounds), ";".join(pr.mismatch), *ci(pr.macro_ci95),
                    *ci(pr.delta_macro_ci95), _num(pr.p_value), pr.test, pr.verdict,
                    pr.verdict_text, pr.b, *how[pr.a], "per-request mean"])
    for f in c.by_domain:
        w.writerow(["domain", f.domain, f.drafter, "", _num(f.macro), "", "", "", rounds(f.rounds), "",
                    *ci(f.macro_ci95)] + [""] * 7 + how[f.drafter] + ["per-request mean"])
    return buf.getvalue()


MEASURED_COLUMNS = ("harness", "decoding", "block_size", "prompt_set", "prompt_digest")
"""The CSV's columns saying how a row's tau was measured (:func:`measured`)."""


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


fmt_ci = stats.fmt_ci

VERDICT_MARK = {stats.BETTER: "▲ better", stats.WORSE: "▼ worse", stats.NONE: "≈ no difference"}
"""Short verdicts for tables."""


def verdict_lines(c: Comparison) -> list[str]:
    """The decision's pairs (a plan's ``decide:``), then each drafter against its baseline, then
    each other named pair, in words; then each settled stop's own verdict (an eval with ``stop:
    settled``, docs/evaluation.md §7), which is the one that holds for it: the fixed-n test ran on
    prompts a stopping rule chose."""
    settled = list(dict.fromkeys(f"{d.settings['sequential']} (settled stop, anytime-valid)" for d in c.drafters
                                 if isinstance((d.settings or {}).get("sequential"), str)))
    return ([p.verdict_text for p in c.decision]
            + [o.verdict_text for o in c.overall if o.verdict_text]
            + [p.verdict_text for p in c.pairs[c.decisions:]] + settled)


def method_note(c: Comparison) -> str:
    nested = any(o.samples > 1 for o in c.overall)
    return ("tau aggregations: macro = per-request mean (over prompts), token-weighted (by the tokens "
            "each prompt's rounds committed), pooled (all tokens over all rounds); "
            f"95 % intervals of tau: bootstrap over prompts, seeded (pooled: prompts, then rounds "
            f"within them); test: {stats.TEST} on per-prompt tau, p < 0.05; the Δ interval: the "
            "differences that test does not reject, so it excludes 0 exactly when p < 0.05; "
            "prompts needed: for 80 % power"
            + ("; sampled: each prompt's tau is the mean over its seeds, prompts are the unit" if nested else ""))


def _family(d: Drafter) -> str:
    """The label without its method suffix (``v5 ddtree-16`` -> ``v5``)."""
    sfx = f" ddtree-{d.settings.get('tree_budget')}"
    return d.label.replace(sfx, "", 1) if d.settings.get("method") == "ddtree" else d.label


def pivot_columns(c: Comparison) -> list[Drafter]:
    """Entries in pivot order: baselines first, then drafters; within each, the methods of
    one drafter (chain, DDTree) side by side, families in order of first appearance."""
    fams: dict[str, int] = {}
    for d in c.drafters:
        fams.setdefault(_family(d), len(fams))
    return sorted(c.drafters, key=lambda d: (d.role != "baseline", fams[_family(d)],
                                             d.settings.get("method") == "ddtree"))


def to_pivot_markdown(c: Comparison) -> str:
    """Prompts as rows, drafters as columns (baseline first, chain and DDTree side by side,
    each drafter's delta to its baseline beside it), then macro, interval, pooled, rounds
    and the verdict as the last rows."""
    cols = pivot_columns(c)
    overall = {o.drafter: o for o in c.overall}
    head, align = ["prompt"], ["---"]
    for d in cols:
        head.append(shown_label(d) + (" ⚠" if d.mismatch else ""))
        align.append("---:")
        if d.baseline:
            head.append("Δ")
            align.append("---:")
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]

    def line(name, own, delta):
        vals = [name]
        for d in cols:
            vals.append(own(d))
            if d.baseline:
                vals.append(delta(d))
        out.append("| " + " | ".join(vals) + " |")

    for pid in c.prompts:
        cell = {d.label: c.cell(pid, d.label) for d in cols}
        line(pid, lambda d: fmt_tau(cell[d.label].tau) if cell[d.label] else "",
             lambda d: fmt_delta(cell[d.label].delta) if cell[d.label] else "")
    line("**macro** (per-request mean)", lambda d: fmt_tau(overall[d.label].macro),
         lambda d: fmt_delta(overall[d.label].delta_macro))
    line("95 % CI", lambda d: fmt_ci(overall[d.label].macro_ci95),
         lambda d: fmt_ci(overall[d.label].delta_macro_ci95, signed=True))
    line("**pooled**", lambda d: fmt_tau(overall[d.label].pooled),
         lambda d: fmt_delta(overall[d.label].delta_pooled))
    line("**token-weighted**", lambda d: fmt_tau(overall[d.label].token_weighted), lambda d: "")
    line("rounds", lambda d: str(overall[d.label].rounds or "–"), lambda d: "")
    line("verdict", lambda d: "baseline" if d.role == "baseline" else "",
         lambda d: VERDICT_MARK.get(overall[d.label].verdict, "–"))
    return "\n".join(out) + "\n"


_EIGHTHS = " ▁▂▃▄▅▆▇█"


def bars(values: Sequence[float], height: int = 3) -> list[str]:
    """Vertical bars (one column per value in 0..1), ``height`` rows, top row first."""
    levels = height * 8
    cols = [round(max(0.0, min(1.0, v)) * levels) for v in values]
    return ["".join(_EIGHTHS[max(0, min(8, x - row * 8))] for x in cols)
            for row in range(height - 1, -1, -1)]


def pk_chart(c: Comparison, height: int = 3) -> str:
    """Per-position acceptance p_k of every entry as bar charts (one block per drafter,
    pivot order), with p_1 and the last position's value in figures."""
    cols = [d for d in pivot_columns(c) if d.per_position]
    if not cols:
        return ""
    width = max(len(d.label) for d in cols)
    k_max = max(len(d.per_position) for d in cols)
    out = [f"p_k: acceptance rate at draft position k (bar height 0..1; k = 1..{k_max})"]
    for d in cols:
        pp = d.per_position
        rows = bars([v for p in pp for v in (p, 0.0)], height)  # a gap between positions
        figures = f"p1 {pp[0]:.2f} … p{len(pp)} {pp[-1]:.2f}"
        for i, r in enumerate(rows):
            name = d.label if i == height - 1 else ""
            note = figures if i == height - 1 else ""
            out.append(f"{name:>{width}} │{r}│ {note}".rstrip())
    axis = "".join(f"{k:<2}" if k < 10 else str(k % 10) + " " for k in range(1, k_max + 1))
    out.append(" " * width + "  " + axis.rstrip())
    return "\n".join(out) + "\n"


SUMMARY_HEADERS = ("drafter", "verdict", "macro tau (per-request mean)", "Δ", "% of baseline", "Δ macro 95 % CI",
                   "p", "prompts", "pooled tau", "Δ", "% of baseline", "macro 95 % CI",
                   "pooled 95 % CI", "token-weighted tau", "rounds", "note")
"""The summary table's columns, most important first (a narrow terminal drops the last)."""


def verdicts_markdown(c: Comparison) -> str:
    """The verdicts in words and how they were reached ("" when there are none)."""
    lines = verdict_lines(c)
    how = measured_lines(c)
    if not lines:
        return "\n".join(how) + "\n" if how else ""
    first = [f"- {x}" for x in lines[:c.decisions]]
    head = ["Decision (the plan's decide:):", *first, ""] if first else []
    return "\n".join(head + [("Other verdicts:" if first else "Verdicts:")]
                     + [f"- {x}" for x in lines[c.decisions:]] + ["", f"({method_note(c)})"]
                     + ([""] + how if how else [])) + "\n"


def measured_lines(c: Comparison) -> list[str]:
    """How each entry was measured (harness, decoding, block size, prompt set and digest): one
    line when every entry was measured alike, else one per entry."""
    notes = {d.label: measured_note(d) for d in c.drafters}
    if not notes:
        return []
    if len(set(notes.values())) == 1:
        return [f"Measured: {next(iter(notes.values()))}"]
    return ["Measured:"] + [f"- {label}: {note}" for label, note in notes.items()]


def family_tag(d: Drafter) -> str:
    """`` [DFlash-2]`` for a DFlash-2 drafter's entry (settings ``family``), else "" (DFlash)."""
    return " [DFlash-2]" if (d.settings or {}).get("family") == "dflash2" else ""


def summary_markdown(c: Comparison) -> str:
    """One row per drafter: the verdict, macro tau against the baseline and its interval,
    then pooled tau, the intervals, the rounds and what makes a row incomparable."""
    by_label = {d.label: d for d in c.drafters}
    out = ["| " + " | ".join(SUMMARY_HEADERS) + " |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for o in c.overall:
        name = (shown_label(by_label[o.drafter]) + family_tag(by_label[o.drafter])
                + (" (baseline)" if o.role == "baseline" else ""))
        note = mismatch_note(by_label[o.drafter])
        if o.unmatched:
            note = (note + "; " if note else "") + f"no baseline for {', '.join(o.unmatched)}"
        p = stats.fmt_p(o.p_value).removeprefix("= ") if o.p_value is not None else "–"
        out.append(f"| {name} | {VERDICT_MARK.get(o.verdict, '')} | {fmt_tau(o.macro)} | "
                   f"{fmt_delta(o.delta_macro)} | {fmt_pct(o.pct_macro)} | "
                   f"{fmt_ci(o.delta_macro_ci95, signed=True)} | {p} | {o.prompts} | "
                   f"{fmt_tau(o.pooled)} | {fmt_delta(o.delta_pooled)} | {fmt_pct(o.pct_pooled)} | "
                   f"{fmt_ci(o.macro_ci95)} | {fmt_ci(o.pooled_ci95)} | {fmt_tau(o.token_weighted)} | "
                   f"{o.rounds or '–'} | "
                   f"{note} |")
    return "\n".join(out) + "\n"


def details_markdown(c: Comparison, *, pivot: bool = False) -> str:
    """The per-prompt table (long: one row per prompt x drafter; ``pivot``: prompts x
    drafters), the per-position acceptance table and chart, and the flags."""
    if pivot:
        out = to_pivot_markdown(c).rstrip("\n").split("\n")
    else:
        out = ["| prompt | drafter | tau | baseline | Δ | % of baseline | |",
               "|---|---|---:|---:|---:|---:|---|"]
        for x in c.cells:
            flag = "⚠ " + ", ".join(x.mismatch) if x.mismatch else ""
            name = x.drafter + (" (baseline)" if x.role == "baseline" else "")
            out.append(f"| {x.prompt_id} | {name} | {fmt_tau(x.tau)} | {fmt_tau(x.baseline_tau)} "
                       f"| {fmt_delta(x.delta)} | {fmt_pct(x.pct_of_baseline)} | {flag} |")
    width = max((len(d.per_position) for d in c.drafters), default=0)
    if width:
        out += ["", "| drafter | " + " | ".join(f"p{k}" for k in range(1, width + 1)) + " |",
                "|---|" + "---:|" * width]
        for d in c.drafters:
            vals = [f"{p:.3f}" for p in d.per_position] + [""] * (width - len(d.per_position))
            out.append(f"| {d.label} | " + " | ".join(vals) + " |")
        out += ["", "```", pk_chart(c).rstrip("\n"), "```"]
    if c.by_domain:
        out += ["", *domain_markdown(c).rstrip("\n").split("\n")]
    if c.warnings:
        out += [""] + [f"- {w}" for w in c.warnings]
    return "\n".join(out) + "\n"


def domain_markdown(c: Comparison) -> str:
    """tau by domain: one row per entry and domain, each with its own 95 % interval."""
    out = ["| drafter | domain | prompts | macro tau (per-request mean) | 95 % CI | token-weighted tau | "
           "pooled tau | rounds |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for f in c.by_domain:
        out.append(f"| {f.drafter} | {f.domain} | {f.prompts} | {fmt_tau(f.macro)} | {fmt_ci(f.macro_ci95)} | "
                   f"{fmt_tau(f.token_weighted)} | {fmt_tau(f.pooled)} | {f.rounds or '–'} |")
    return "\n".join(out) + "\n"


def to_markdown(c: Comparison, *, pivot: bool = False, verdicts: bool = True) -> str:
    """What a reader needs first, first: the verdicts in words, the summary table (one row
    per drafter, with intervals and verdicts), then the details (:func:`details_markdown`)."""
    parts = [verdicts_markdown(c) if verdicts else "", summary_markdown(c),
             details_markdown(c, pivot=pivot)]
    return "\n".join(p for p in parts if p)


__all__ = ["COMPARED_SETTINGS", "SAMPLING_DEFAULTS", "sampling_note", "sample_of", "Comparison", "Drafter", "Cell", "Overall", "Pair", "family_tag",
           "shown_label", "build_comparison", "DomainFigures", "domain_markdown", "measured", "measured_note",
           "measured_lines", "token_weighted", "MEASURED_COLUMNS", "to_dict", "to_json", "to_csv", "to_markdown", "to_pivot_markdown",
           "verdicts_markdown", "summary_markdown", "details_markdown", "SUMMARY_HEADERS",
           "pk_chart", "bars", "verdict_lines", "mismatch_note", "fmt_tau", "fmt_delta", "fmt_pct",
           "fmt_ci", "VERDICT_MARK"]
