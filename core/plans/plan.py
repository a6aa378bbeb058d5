"""Plans: the typed model of the YAML file a campaign is written in.

A plan is intent: specdeck never rewrites it behind the user's back (state lives in the
store). This module is the model only (hosts, items, their actions, dependency order);
:mod:`core.plans.planfile` reads and validates plan files into it, and :mod:`core.plans.todos` converts
to and from todowrite lists. The model imports neither, nor any action kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from core.capsules.telemetry import TelemetrySettings
from core.plans.adopt_spec import AdoptSpec
from core.plans.arms import ArmSet
from core.errors import InvalidInput
from core.text import did_you_mean

STATUSES = ("pending", "in_progress", "done", "failed", "stopped", "skipped")
"""An item's statuses: ``stopped`` is a run an operator (or a ``stop`` item) ended; like
``failed`` it never counts as done, and unlike it no ``retries:`` ever relaunches it."""
PRIORITIES = ("high", "medium", "low")
SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
"""Plan names, host names and item ids: they name files and directories (state databases,
run capsules), so a letter or digit first, then letters, digits, ``_ . -``, 64 at most."""
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
VAR_REF = re.compile(r"\$\$|\$\{([^}]*)\}")
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY)", re.I)


@dataclass(frozen=True)
class PlanIssue:
    """One validation problem, with where it was written."""

    file: str
    line: int
    col: int
    message: str
    item: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = []
        if self.item:
            where.append(f"item {self.item!r}")
        if self.field:
            where.append(f"field {self.field!r}")
        prefix = ": ".join(where)
        return f"{self.file}:{self.line}:{self.col}: " + (f"{prefix}: " if prefix else "") + self.message


@dataclass(frozen=True)
class Price:
    """What an hour on a host costs (a host's ``price:``; core.runs.cost multiplies it by each
    run's wall time): ``amount`` per hour, or per GPU-hour for ``gpus`` GPUs a run holds."""

    amount: float
    per: str = "hour"
    """``hour`` or ``gpu_hour``."""
    gpus: int = 1
    """The GPUs a run on the host holds (``gpu_hour`` only)."""
    currency: str = "USD"

    @property
    def hourly(self) -> float:
        """What one hour of a run on the host costs."""
        return self.amount * (self.gpus if self.per == "gpu_hour" else 1)


@dataclass(frozen=True)
class HostSpec:
    name: str
    workdir: str
    local: bool = False
    ssh: str | None = None
    python: str | None = None
    env: dict = field(default_factory=dict)
    price: Price | None = None
    """What an hour on it costs (``price:``), None when the plan gives none."""


@dataclass(frozen=True)
class ActionSpec:
    kind: str
    host: str | None
    params: Any
    """The action kind's own frozen params dataclass, ``${vars}`` already interpolated."""
    raw_params: dict
    """The params as written in the plan (before interpolation), for display."""


@dataclass(frozen=True)
class Item:
    id: str
    content: str
    priority: str = "medium"
    status: str | None = None
    """The initial status written in the plan; the store's status wins once there is one."""
    needs: tuple[str, ...] = ()
    action: ActionSpec | None = None
    line: int = 0
    adopt: AdoptSpec | None = None
    """Where its run already is (``adopt:`` in the plan): ``run`` adopts it."""
    after: tuple[str, ...] = ()
    """Ids that only come first: done or skipped lets it start (``needs`` wants done: a
    skipped need's output is missing)."""
    retries: int = 0
    """How many more times a failed run is launched without being asked (``run --all``)."""
    decide: tuple[tuple[str, str], ...] = ()
    """The pairs of drafters this item decides between (``decide: [[v5, v4]]``, labels as
    ``compare`` prints them): ``compare`` and the tau pane lead with their verdicts."""
    template: str | None = None
    """The template item it was expanded from (``train`` for ``train[noise]``), else None."""
    arm: str | None = None
    """The arm it runs for (:mod:`core.plans.arms`), else None (a shared item)."""
    on_preempt: str = "fail"
    """What a preempted run (a Slurm PREEMPTED, NODE_FAIL or requeue, a spot reclaim's
    SIGTERM) makes of its item: ``resume`` launches it again at once (a train item resumes
    from its last whole checkpoint), never counted against ``retries``; ``fail`` leaves it
    failed (relaunched only by ``retries:`` or when asked, still never counted)."""

    @property
    def deps(self) -> tuple[str, ...]:
        """Every id that comes first, its needs and its order-only ``after``."""
        return self.needs + tuple(a for a in self.after if a not in self.needs)

    @property
    def manual(self) -> bool:
        return self.action is None or self.action.kind == "manual"


@dataclass(frozen=True)
class Plan:
    name: str
    path: Path | None
    hosts: dict[str, HostSpec]
    vars: dict[str, Any]
    items: tuple[Item, ...]
    state: str | None = None
    """The state database this plan's runs are recorded in (``state:`` in the YAML, relative
    to the plan file); every command finds it without ``--state``."""
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    """How train runs' hosts are sampled and when their GPUs or disk raise an alert
    (``telemetry:``; :mod:`core.capsules.telemetry`)."""
    notify: tuple[str, ...] = ()
    """The events a notification is sent for (``notify:`` in the YAML: ``failed``, ``lost``,
    ``tau_drop``...; core.ml.tasks.notify.EVENTS); where to is the user's, never the plan's
    (core.runs.notify)."""
    arms: ArmSet | None = None
    """The campaign's arms (``arms:``; :mod:`core.plans.arms`), None when it declares none."""

    def item(self, item_id: str) -> Item:
        for it in self.items:
            if it.id == item_id:
                return it
        raise InvalidInput(f"{self.path or self.name}: no item {item_id!r} in plan {self.name!r}"
                           + did_you_mean(item_id, (it.id for it in self.items)),
                           hint=f"`specdeck status {self.path or self.name}` lists the item ids")

    @property
    def decisions(self) -> tuple[tuple[str, str], ...]:
        """Every item's ``decide:`` pairs, in file order, each once."""
        return tuple(dict.fromkeys(p for it in self.items for p in it.decide))

    @property
    def dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    def statuses(self, stored: dict[str, str]) -> dict[str, str]:
        """Each item's status: the one ``stored`` (the store's) holds, else the plan's own
        ``status:``, else ``pending``; in plan order."""
        return {it.id: stored.get(it.id, it.status or "pending") for it in self.items}

    def order(self, ids: Iterable[str] | None = None) -> list[Item]:
        """Items in dependency order (needs first), stable in file order."""
        wanted = set(ids) if ids is not None else None
        done: set[str] = set()
        out: list[Item] = []
        by_id = {it.id: it for it in self.items}

        for root in self.items:  # depth-first, needs first; iterative (long chains)
            if root.id in done:
                continue
            done.add(root.id)
            stack = [(root, iter(root.deps))]
            while stack:
                it, needs = stack[-1]
                n = next(needs, None)
                if n is None:
                    stack.pop()
                    out.append(it)
                elif n not in done and n in by_id:
                    done.add(n)
                    stack.append((by_id[n], iter(by_id[n].deps)))
        return [it for it in out if wanted is None or it.id in wanted]

    def arm_items(self, arm: str) -> list[Item]:
        """The items run for ``arm``, in file order."""
        return [it for it in self.items if it.arm == arm]

    def dependents(self, item_id: str) -> list[str]:
        """Ids of items that need (or come after) ``item_id``, directly or not."""
        out: list[str] = []
        frontier = [item_id]
        while frontier:
            cur = frontier.pop()
            for it in self.items:
                if cur in it.deps and it.id not in out:
                    out.append(it.id)
                    frontier.append(it.id)
        return out


def params_summary(item: Item) -> dict:
    """The item's params as plain values (for status --json and the console)."""
    from core.plans.params import to_plain
    from core.plans.shellvars import unsplice

    if item.action is None or item.action.params is None:
        return {}

    def shown(v):
        if isinstance(v, str):
            return unsplice(v)
        if isinstance(v, dict):
            return {k: shown(x) for k, x in v.items()}
        if isinstance(v, list):
            return [shown(x) for x in v]
        return v
    return shown(to_plain(item.action.params))


__all__ = ["Plan", "Item", "HostSpec", "ActionSpec", "PlanIssue", "params_summary", "STATUSES",
           "PRIORITIES"]
