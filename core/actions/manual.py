"""``manual``: a step the operator does and ticks (`specdeck mark PLAN ITEM done`)."""

from __future__ import annotations

from dataclasses import dataclass

from core.actions.base import Action, CheckResult


@dataclass(frozen=True)
class ManualParams:
    note: str | None = None
    """Optional instructions shown with the item."""


class Manual(Action, kind="manual", params=ManualParams,
             summary="a step the operator does by hand and marks done"):
    detached = False
    needs_host = False

    async def check(self, ctx) -> CheckResult:
        return CheckResult.blocked(f"manual item: do it, then `specdeck mark "
                                   f"{ctx.plan.path or ctx.plan.name} {ctx.item.id} done`")

    async def run(self, ctx) -> dict:  # pragma: no cover - the runner never runs manual items
        raise RuntimeError("manual items are ticked, not run")
