"""What every action kind is: typed params, a side-effect-free check, and a way to run.

Two shapes of action exist:

* **detached** (``detached = True``, the default): the work is a command that runs on the
  host inside a run capsule (``core.jobs``) and outlives specdeck. The runner calls
  :meth:`Action.prepare` (uploads, preflight), launches :meth:`Action.command` detached,
  follows its log into the store, and calls :meth:`Action.finish` with the outcome. After a
  crash, reconcile calls ``finish`` alone on the run it finds ended, so ``finish`` must
  only read what the command left on the host.
* **in-process** (``detached = False``): the work happens inside specdeck itself (a relay
  streaming through the console, a manual tick, stopping another run). :meth:`Action.run`
  does it; it must be resumable, since specdeck can die at any point.

``check()`` answers "already done / can it run / why not" and must not change anything.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping

from core.errors import ActionFailed

if TYPE_CHECKING:
    from core.hosts.base import Host
    from core.plan import Item, Plan


@dataclass(frozen=True)
class CheckResult:
    state: Literal["done", "ready", "blocked"]
    reason: str = ""

    @classmethod
    def done(cls, reason: str = "") -> "CheckResult":
        return cls("done", reason)

    @classmethod
    def ready(cls, reason: str = "") -> "CheckResult":
        return cls("ready", reason)

    @classmethod
    def blocked(cls, reason: str) -> "CheckResult":
        return cls("blocked", reason)


@dataclass(frozen=True)
class Launch:
    """A command to run detached in a capsule on the action's host."""

    command: str
    """Shell text, run by bash in the capsule; every spliced value already quoted."""
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    launcher: str = "process"
    """``process`` (setsid capsule) or ``slurm`` (sbatch); see core.jobs."""
    slurm: Mapping[str, Any] = field(default_factory=dict)
    metrics_regex: str | None = None
    """For trainers that print text: a regex with named groups, ``step`` among them."""


@dataclass
class Outcome:
    """How a detached run ended."""

    state: Literal["succeeded", "failed", "stopped", "lost"]
    exit_code: int | None = None
    signal: str | None = None
    capsule: str = ""
    """The capsule directory on the host (result files live beside the log)."""
    run_id: str = ""


class ActionContext(ABC):
    """What an action may use; the runner provides it. Never the store directly."""

    plan: "Plan"
    item: "Item"
    host: "Host | None"
    run_id: str | None

    def host_named(self, name: str) -> "Host":  # pragma: no cover - interface
        raise NotImplementedError

    def progress(self, message: str, **fields: Any) -> None:  # pragma: no cover - interface
        """Report progress (printed by the CLI, shown by the console, journaled sparsely)."""
        raise NotImplementedError

    def services(self) -> Any:  # pragma: no cover - interface
        """Runner services for actions that act on other runs (stop, artefacts)."""
        raise NotImplementedError


class Action(ABC):
    """Base class of every action kind. Subclasses set ``kind`` and ``Params``."""

    kind: ClassVar[str]
    Params: ClassVar[type]
    detached: ClassVar[bool] = True
    needs_host: ClassVar[bool] = True
    summary: ClassVar[str] = ""

    def __init__(self, params: Any):
        self.params = params

    @classmethod
    def validate_plan(cls, params: Any, plan: "Plan", item: "Item") -> list[tuple[tuple, str]]:
        """Rules that need the whole plan (hosts named in params, other items)."""
        return []

    async def check(self, ctx: ActionContext) -> CheckResult:
        """Is it already done, can it run, and why not. No side effects."""
        return CheckResult.ready()

    # detached actions
    async def prepare(self, ctx: ActionContext) -> None:
        """Uploads and preflight before launching; raise ActionFailed to refuse."""

    def command(self, ctx: ActionContext) -> Launch:
        raise NotImplementedError(f"{self.kind} is not a detached action")

    async def finish(self, ctx: ActionContext, outcome: Outcome) -> dict:
        """Read what the run left and return the result record; raise ActionFailed on failure."""
        if outcome.state != "succeeded":
            how = f"signal {outcome.signal}" if outcome.signal else f"exit code {outcome.exit_code}"
            if outcome.state == "lost":
                how = "the process vanished without an exit status (host rebooted?)"
            raise ActionFailed(f"item {ctx.item.id!r}: {self.kind} run {outcome.state} ({how})",
                               hint=f"`specdeck logs {ctx.plan.path or ctx.plan.name} {ctx.item.id}` shows its log")
        return {}

    # in-process actions
    async def run(self, ctx: ActionContext) -> dict:
        raise NotImplementedError(f"{self.kind} is a detached action")


class _Registry:
    def __init__(self) -> None:
        self._kinds: dict[str, type[Action]] = {}

    def add(self, cls: type[Action]) -> type[Action]:
        self._kinds[cls.kind] = cls
        return cls

    def get(self, kind: str) -> type[Action]:
        return self._kinds[kind]

    def kinds(self) -> list[str]:
        return sorted(self._kinds)


registry = _Registry()


def register(cls: type[Action]) -> type[Action]:
    """Class decorator: make ``cls.kind`` usable in plans."""
    return registry.add(cls)
