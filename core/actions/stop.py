"""``stop``: end another item's live run (the v4 run before v5 starts).

SIGTERM to the run's process group (or ``scancel`` for a Slurm job), ``grace_s`` seconds, then
SIGKILL. Done when the named item has no live run.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.actions.base import Action, CheckResult
from core.ml.formats import bounds
from core.plans.params import problems


@dataclass(frozen=True)
class StopParams:
    item: str
    grace_s: float = 30.0

    def validate(self):
        if self.grace_s < 0:
            return [(("grace_s",), "grace_s must be >= 0")]
        return problems(("grace_s", bounds.seconds(self.grace_s)))


class Stop(Action, kind="stop", params=StopParams,
             summary="stop another item's live run (SIGTERM, grace, SIGKILL)"):
    detached = False
    needs_host = False

    @classmethod
    def validate_plan(cls, params, plan, item):
        ids = {it.id for it in plan.items}
        if params.item not in ids:
            return [(("item",), f"no item {params.item!r} in this plan")]
        if params.item == item.id:
            return [(("item",), "an item cannot stop itself")]
        return []

    async def check(self, ctx) -> CheckResult:
        live = ctx.live_run(self.params.item)
        if live is None:
            return CheckResult.done(f"{self.params.item} has no live run")
        return CheckResult.ready(f"will stop run {live.id} on {live.host}")

    async def run(self, ctx) -> dict:
        live = ctx.live_run(self.params.item)
        if live is None:
            return {"stopped": None}
        ctx.progress(f"stopping {self.params.item} run {live.id} on {live.host}")
        outcome = await ctx.stop_run(live.id, grace_s=self.params.grace_s)
        return {"stopped": live.id, "signal": outcome.signal, "state": outcome.state}
