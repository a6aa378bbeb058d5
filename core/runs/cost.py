"""What a campaign cost (issue 47 §3): each run's wall time times its host's ``price:``.

A run's cost is its hours (from start to end; a live run's to now) times what an hour on its
host costs (:class:`core.plans.plan.Price`: per hour, or per GPU-hour times the GPUs a run
holds). An item's cost is the sum over its runs (every attempt was paid for), an arm's the sum
over its items, the campaign's the sum over all. A run on a host without a price, or with no
start time, costs nothing known: the sheet names those hosts, so a total is never read as
complete when it is not. Amounts in different currencies are never added: each total is per
currency.

Arms: an item's arm is its ``arm`` (plan arms, issue 46) when the plan model has one;
:func:`arm_of` is the one place that reads it, so costs group by arm as soon as items carry it.

A drafter's cost, for the tau table's cost per unit of tau gained (:func:`drafter_costs`), is the
cost of the train items its eval stands on: those among the eval item's needs (transitively),
less those every eval stands on (the shared baseline), or the train item itself for a checkpoint
evaluated while it trained.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping

from core.plans.plan import Item, Plan
from core.state.records import Run

if TYPE_CHECKING:
    from core.tau.table import Comparison


def arm_of(item: Item) -> str | None:
    """The arm ``item`` belongs to (plan arms, issue 46), None when it has none or the plan
    model has no arms yet."""
    arm = getattr(item, "arm", None)
    return arm if isinstance(arm, str) and arm else None


def run_hours(run: Run, now: float, window: tuple[float, float] | None = None) -> float | None:
    """Wall hours of ``run`` (to ``now`` while it is live), only those inside ``window``
    (``(since, until)``) when given; None without a start."""
    if run.started_at is None:
        return None
    start = run.started_at
    end = run.ended_at if run.ended_at is not None else (now if run.live else None)
    if end is None:
        return None
    if window is not None:
        start, end = max(start, window[0]), min(end, window[1])
    return max(0.0, end - start) / 3600.0


def run_cost(plan: Plan, run: Run, now: float, window: tuple[float, float] | None = None
             ) -> tuple[float, str] | None:
    """``(amount, currency)`` of ``run`` (its hours inside ``window`` when given); None when its
    host has no price or its time is unknown."""
    host = plan.hosts.get(run.host) if run.host else None
    price = host.price if host is not None else None
    hours = run_hours(run, now, window)
    if price is None or hours is None:
        return None
    return hours * price.hourly, price.currency


@dataclass
class Sheet:
    """The campaign's costs, each ``{currency: amount}``."""

    items: dict[str, dict[str, float]] = field(default_factory=dict)
    arms: dict[str, dict[str, float]] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=dict)
    hours: float = 0.0
    """Wall hours of the priced runs."""
    unpriced: tuple[str, ...] = ()
    """Hosts that ran something and carry no ``price:``."""

    def to_json(self) -> dict:
        return {"total": self.total, "items": self.items, "arms": self.arms,
                "hours": round(self.hours, 4), "unpriced_hosts": list(self.unpriced)}


def _add(into: dict[str, float], amount: float, currency: str) -> None:
    into[currency] = into.get(currency, 0.0) + amount


def sheet(plan: Plan, runs: Mapping[str, Iterable[Run]], now: float | None = None,
          window: tuple[float, float] | None = None) -> Sheet:
    """The costs of ``runs`` (``{item id: its runs}``) under ``plan``'s host prices; with
    ``window`` (``(since, until)``) only what their hours inside it cost."""
    now = time.time() if now is None else now
    out = Sheet()
    unpriced: list[str] = []
    ids = {it.id: it for it in plan.items}
    for item_id, item_runs in runs.items():
        for run in item_runs:
            got = run_cost(plan, run, now, window)
            if got is None:
                if run.host and run.host not in unpriced and run.started_at is not None:
                    unpriced.append(run.host)
                continue
            amount, currency = got
            out.hours += run_hours(run, now, window) or 0.0
            _add(out.items.setdefault(item_id, {}), amount, currency)
            _add(out.total, amount, currency)
            arm = arm_of(ids[item_id]) if item_id in ids else None
            if arm:
                _add(out.arms.setdefault(arm, {}), amount, currency)
    out.unpriced = tuple(h for h in unpriced if plan.hosts.get(h) is None or plan.hosts[h].price is None)
    return out


def fmt(amounts: Mapping[str, float] | None) -> str:
    """``USD 12.34`` (several currencies: ``USD 1.00 + EUR 2.00``); ``–`` for none."""
    if not amounts:
        return "–"
    return " + ".join(f"{c} {a:,.2f}" for c, a in sorted(amounts.items()))


def _trains_under(plan: Plan, item_id: str) -> list[str]:
    """The train items ``item_id`` stands on: itself if it is one, else those among its needs,
    transitively, in plan order."""
    seen: set[str] = set()
    todo = [item_id]
    while todo:
        i = todo.pop()
        if i in seen or i not in {it.id for it in plan.items}:
            continue
        seen.add(i)
        it = plan.item(i)
        if i == item_id and it.action is not None and it.action.kind == "train":
            return [i]
        todo += list(it.needs)
    return [it.id for it in plan.items if it.id in seen and it.action is not None
            and it.action.kind == "train"]


def drafter_costs(plan: Plan, costs: Sheet, run_items: Mapping[str, Iterable[str]]
                  ) -> dict[str, dict[str, float]]:
    """``{drafter label: {currency: amount}}``: what the train items behind each drafter cost.

    A drafter stands on the train items its eval item needs (transitively); those that every
    eval item stands on (the baseline all of them compare with, when two or more evals exist)
    are no one drafter's cost and are left out. A checkpoint evaluated while it trained stands
    on its own train item.

    Args:
        run_items: ``{label: the item ids of the runs its figures come from}``.
    """
    under = {label: list(dict.fromkeys(t for i in items for t in _trains_under(plan, i)))
             for label, items in run_items.items()}
    evals = {frozenset(under[label]) for label, items in run_items.items()
             if any(plan.item(i).action is not None and plan.item(i).action.kind == "eval"
                    for i in items if i in {it.id for it in plan.items})}
    shared = frozenset.intersection(*evals) if len(evals) > 1 else frozenset()
    out: dict[str, dict[str, float]] = {}
    for label, trains in under.items():
        total: dict[str, float] = {}
        for t in trains:
            if t in shared:
                continue
            for currency, amount in costs.items.get(t, {}).items():
                _add(total, amount, currency)
        if total:
            out[label] = total
    return out


def cost_per_tau(plan: Plan, comp: "Comparison", costs: Sheet, run_items: Mapping[str, str]) -> list[dict]:
    """The tau table's cost: per drafter with a baseline, what its training cost
    (:func:`drafter_costs`), its macro tau gained over the baseline, and the cost per unit of tau
    gained where both are known and the gain is above 0.

    Returns:
        ``[{"drafter", "cost": {currency: amount}, "delta_tau", "per_tau": {currency: amount} or
        None}]`` in the comparison's order; a drafter whose training cost is unknown is left out.
    """
    labels = {d.label: [run_items[r] for r in d.run_ids if r in run_items] for d in comp.drafters
              if d.baseline}
    paid = drafter_costs(plan, costs, labels)
    out = []
    for o in comp.overall:
        if o.drafter not in paid or o.delta_macro is None:
            continue
        out.append({"drafter": o.drafter, "cost": paid[o.drafter], "delta_tau": o.delta_macro,
                    "per_tau": {c: a / o.delta_macro for c, a in paid[o.drafter].items()}
                    if o.delta_macro > 0 else None})
    return out


def run_items_of(rows, run_of) -> dict[str, str]:
    """``{run id: its item id}`` for the runs eval ``rows`` come from (``run_of``: the store's
    ``run``), what :func:`cost_per_tau` maps a drafter's runs to its items with."""
    runs = {rid: run_of(rid) for rid in {r.run_id for r in rows if r.run_id}}
    return {rid: run.item_id for rid, run in runs.items() if run is not None}
