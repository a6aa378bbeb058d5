"""What a runner tells the operator while it works: alerts it raises sent as notifications
(once across every specdeck, :mod:`core.runs.notify`), host telemetry sampled around a
followed train run (:mod:`core.capsules.telemetry`), and what hosts sent while no specdeck
watched, looked up after a reconcile. The runner owns one :class:`Alerts`."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from core.hosts.base import HostState
from core.plans.plan import Item, Plan
from core.runs import notify
from core.runs.events import Notice
from core.state.store import Store

TELEMETRY_EVENTS = {"gpu_idle": "stall", "disk_low": "disk", "gpu_memory": "gpu_memory"}
"""A telemetry alert's kind -> the event a plan's ``notify:`` names for it."""


class Alerts:
    def __init__(self, plan: Plan, store: Store, emit: Callable[[Any], None]) -> None:
        self.plan, self.store, self.emit = plan, store, emit
        self._sending: set[asyncio.Task] = set()
        """Notifications this specdeck is sending: awaited at :meth:`close`."""

    def send(self, item: Item, run_id: str | None, data: dict, message: str) -> None:
        """Send an alert this specdeck raised (a tau drop...), in the background, once across
        every specdeck."""
        if data.get("sent_by_host"):
            return  # its host told it already (a detached watcher)
        key = f"alert:{run_id}:{data['alert']}@{data.get('step')}"
        title = f"specdeck: {self.plan.name}/{item.id} {data['alert'].replace('_', ' ')}"
        task = asyncio.get_running_loop().create_task(notify.send_from_console(
            self.store, key, title, f"plan {self.plan.name}, item {item.id}, run {run_id}: "
            f"{message}", run_id=run_id, item_id=item.id, event=data["alert"]))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def close(self) -> None:
        if self._sending:  # bounded: notify.CONSOLE_TRIES_S
            await asyncio.gather(*list(self._sending), return_exceptions=True)

    def sampled(self, item: Item, host: Any, run_id: str, work: Awaitable) -> Awaitable:
        """``work`` (following a train run) while its host's GPUs and disks are sampled and
        stored, each alert raised once (:func:`core.capsules.telemetry.watch_while`; the
        plan's ``telemetry:``): a warning notice, and a notification when ``notify:`` names it."""
        if item.action is None or item.action.kind != "train":
            return work
        from core.capsules.telemetry import watch_while

        return watch_while(work, host, self.store, self.store.run(run_id), self.plan.telemetry,
                           on_alert_raised=lambda a: self._telemetry(item, a))

    def _telemetry(self, item: Item, alert: Any) -> None:
        self.emit(Notice(item.id, alert.text, "warning"))
        event = TELEMETRY_EVENTS.get(alert.kind)
        if event in self.plan.notify:
            self.send(item, alert.run, {"alert": event}, alert.text)

    async def catch_up(self, hosts: dict, host_of: Callable[[str], Awaitable]) -> None:
        """What hosts sent after their runs' ends were recorded (core.runs.notify.catch_up),
        looked up on the local host and on hosts connected already (no login for it)."""
        ids = {it.id for it in self.plan.items}
        ended = []
        for item_id, run in self.store.latest_runs().items():
            if run.live or item_id not in ids or run.host not in hosts:
                continue
            if self.plan.hosts[run.host].local:
                host = await host_of(run.host)
            elif hosts[run.host].status.state is HostState.CONNECTED:
                host = hosts[run.host]
            else:
                continue
            ended.append((self.plan.item(item_id), run, host))
        await notify.catch_up(self.store, self.plan, ended)
