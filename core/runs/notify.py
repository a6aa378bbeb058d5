"""Notifications: a run's end (and the events a plan's ``notify:`` names) told to the operator
wherever they are, with specdeck closed too.

Where to: one Apprise URL (``ntfy://``, ``slack://``, ``discord://``, ``json://`` a webhook...),
configured once, outside every plan: ``$SPECDECK_NOTIFY``, else the first line of
``$XDG_CONFIG_HOME/specdeck/notify`` (``~/.config/specdeck/notify``), a file only its owner may
read (mode 0600, checked). The URL is a secret: it is never written to a plan, the database, a
log or a command line; what is shown and stored is :func:`describe` (scheme and host).

Who sends:

* a run's end (succeeded, failed, stopped) is sent by its capsule on the host, once its exit
  status is written (``core.capsules.jobs.notify_step``), so it is sent with no specdeck
  running: :func:`arm` copies the URL into the capsule (``notify.url``, 0600, through the
  command's stdin) with what to say (``notify.json``), at launch;
* what only specdeck sees (a run lost: no exit status, its host rebooted) is sent by the
  specdeck that sees it (:func:`after_run`).

Once: a host records each event it sent beside the capsule's state (``notify.run_end``,
claimed exclusively: :mod:`core.ml.tasks.notify`); specdeck records its own in the store's
``notifications`` table, claimed before sending, so a second specdeck or a later reattach
sends nothing again. A target that cannot be reached is tried again with backoff
(``$SPECDECK_NOTIFY_BACKOFF`` seconds, doubling; ``$SPECDECK_NOTIFY_PATIENCE`` in all) after
the run's state is recorded, then recorded as not sent and journaled (``notify_failed``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import InvalidInput
from core.ml.formats import strictjson
from core.ml.formats.runio import UsageError
from core.ml.tasks.notify import (BACKOFF_S, PATIENCE_S, deliver, describe_target,
                                  read_secret)

if TYPE_CHECKING:
    from core.hosts.base import Host
    from core.plans.plan import Item, Plan
    from core.state.records import Run
    from core.state.store import Store

ENV = "SPECDECK_NOTIFY"
CONSOLE_TRIES_S = 30.0
"""How long a specdeck keeps trying a target itself (a host keeps trying for
``$SPECDECK_NOTIFY_PATIENCE``): it must not hold a command for an hour."""


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "specdeck" / "notify"


def target() -> tuple[str, str] | None:
    """(URL, where it was configured), or None when none is.

    Raises:
        InvalidInput: the config file is readable by others, or holds no URL.
    """
    url = os.environ.get(ENV, "").strip()
    if url:
        return url, f"${ENV}"
    path = config_path()
    if not path.exists():
        return None
    try:
        return read_secret(path), str(path)
    except UsageError as e:
        raise InvalidInput(str(e), hint=f"one Apprise URL on a line in {path}, mode 0600") from None


describe = describe_target


def timing() -> tuple[float, float]:
    """(first gap, patience) of retries, seconds: ``$SPECDECK_NOTIFY_BACKOFF`` and
    ``$SPECDECK_NOTIFY_PATIENCE`` (tests shorten them)."""
    def num(name: str, default: float) -> float:
        raw = os.environ.get(name)
        try:
            return float(raw) if raw else default
        except ValueError:
            raise InvalidInput(f"${name}: a number of seconds, got {raw!r}") from None
    return num("SPECDECK_NOTIFY_BACKOFF", BACKOFF_S), num("SPECDECK_NOTIFY_PATIENCE", PATIENCE_S)


def _wanted_at_host(plan: "Plan") -> list[str]:
    return [e for e in plan.notify if e in ("succeeded", "failed", "stopped")]


async def arm(store: "Store", host: "Host", capsule: str, plan: "Plan", item: "Item",
              run_id: str, events: tuple[str, ...] | None = None, *,
              run_end: bool = True) -> bool:
    """Make ``capsule`` on ``host`` send its events itself (module doc): its run's end
    (``run_end``: a ``notify.sh`` its wrapper starts) or what its program raises (the detached
    watcher's tau alerts: ``events``). False when the plan asks for none of them or no target
    is configured. Called before the command starts; never raises (a run starts without its
    notification rather than not at all: journaled)."""
    wanted = [e for e in (_wanted_at_host(plan) if events is None else events)
              if e in plan.notify]
    if not wanted:
        return False
    try:
        found = target()
        if found is None:
            return False
        cfg = await _write_target(host, capsule, plan, item, run_id, wanted, found[0])
        if run_end:
            await _write_run_end(host, capsule, cfg)
        return True
    except Exception as e:  # noqa: BLE001 - never a run's fault
        why = e.message if isinstance(e, InvalidInput) else type(e).__name__
        store.journal("notify_failed", f"{item.id}: run {run_id}'s {', '.join(wanted)} will "
                      f"not be notified: {why}", item_id=item.id, run_id=run_id,
                      host=host.name)
        return False


async def _write_target(host: "Host", capsule: str, plan: "Plan", item: "Item", run_id: str,
                        events: list[str], url: str) -> dict:
    """``notify.url`` (0600) and ``notify.json`` into ``capsule``; returns the latter."""
    backoff, patience = timing()
    cfg = {"plan": plan.name, "item": item.id, "host": host.name, "run": run_id,
           "events": events, "target": describe(url), "backoff_s": backoff,
           "patience_s": patience}
    q = shlex.quote(capsule)
    # The URL goes through stdin into a file created 0600: never argv, never a moment readable.
    await host.run(f"umask 077 && mkdir -p {q} && cat >{q}/notify.url.tmp && "
                   f"mv {q}/notify.url.tmp {q}/notify.url", input=url.encode(), check=True)
    await host.write_file(f"{capsule}/notify.json", strictjson.dumps(cfg).encode())
    return cfg


async def _write_run_end(host: "Host", capsule: str, cfg: dict) -> None:
    from core.actions.mlbase import host_python

    q = shlex.quote(capsule)
    python = await host_python(host)
    exports = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in host.env.items())
    script = ("#!/usr/bin/env bash\n# specdeck: the run's end, told (core.runs.notify)\n"
              f"{exports}cd {q} || exit 97\n"
              f"exec {shlex.join([python, '-u', '-m', 'core.ml.notify', 'run-end', capsule])}\n")
    await host.write_file(f"{capsule}/notify.sh", script.encode(), mode=0o700)


async def mark_stopping(host: "Host", capsule: str) -> None:
    """Tell the capsule its end is a stop (its notification then says ``stopped``)."""
    await host.run(f"D={shlex.quote(capsule)}; [ -d \"$D\" ] && : >\"$D/notify.stopping\"")


async def after_run(store: "Store", plan: "Plan", item: "Item", run_id: str, state: str,
                    host: "Host | None", capsule: str | None) -> None:
    """Once a run's end is recorded: journal what its host sent (or could not), and send what
    only specdeck sees (a lost run). Never raises: a notification never fails a run."""
    try:
        if capsule and host is not None and _wanted_at_host(plan):
            await _host_record(store, item, run_id, host, capsule)
        if state == "lost" and "lost" in plan.notify:
            body = (f"plan {plan.name}, item {item.id}, host {host.name if host else '-'}: "
                    f"run {run_id} lost (no exit status; its process is gone)")
            await send_from_console(store, f"run:{run_id}:end", f"specdeck: {plan.name}/"
                                    f"{item.id} lost", body, run_id=run_id, item_id=item.id,
                                    event="lost")
    except Exception as e:  # noqa: BLE001 - never a run's fault
        store.journal("notify_failed", f"notification of run {run_id} not handled: "
                      f"{type(e).__name__}", item_id=item.id, run_id=run_id)


LOOK_BACK_S = 2 * 86400.0
"""How long after a run's end specdeck still looks for what its host sent (a target down for
hours is retried there for ``$SPECDECK_NOTIFY_PATIENCE``)."""


async def catch_up(store: "Store", plan: "Plan", ended: list[tuple["Item", "Run", "Host"]]
                   ) -> None:
    """Journal what hosts sent for runs that ended recently (their sender was still trying
    when the run's end was recorded): each run once, then never looked at again."""
    if not _wanted_at_host(plan):
        return
    told = {r["run_id"] for r in store.notifications()}
    now = time.time()
    for item, run, host in ended:
        if run.id in told or not run.capsule or now - (run.ended_at or 0) > LOOK_BACK_S:
            continue
        try:
            await _host_record(store, item, run.id, host, run.capsule)
        except Exception:  # noqa: BLE001 - looked at again next time
            continue


async def _host_record(store: "Store", item: "Item", run_id: str, host: "Host",
                       capsule: str) -> None:
    raw = await host.read_from(f"{capsule}/notify.run_end", 0, 65536)
    if not raw.strip():
        if await host.stat(f"{capsule}/notify.json") is None:  # never armed: never look again
            store.claim_notification(f"run:{run_id}:end", run_id=run_id, item_id=item.id,
                                     event="run_end", state="off", by=host.name)
        return
    rec = json.loads(raw.decode())
    st = rec.get("state")
    key = f"run:{run_id}:end"
    fields = {"run_id": run_id, "item_id": item.id, "event": "run_end",
              "target": str(rec.get("target") or ""), "by": host.name, "state": st,
              "error": rec.get("error")}
    if st == "sending":
        return  # still trying: the next look records how it went
    if not store.claim_notification(key, **fields):
        return
    if st == "sent":
        store.journal("notified", f"{item.id}: run {run_id}'s end sent to {fields['target']} "
                      f"by {host.name}", item_id=item.id, run_id=run_id, host=host.name)
    else:
        store.journal("notify_failed", f"{item.id}: run {run_id}'s end NOT sent to "
                      f"{fields['target']} by {host.name} after {rec.get('tries')} tries: "
                      f"{rec.get('error')}; `specdeck notify --test` checks the target",
                      item_id=item.id, run_id=run_id, host=host.name)


async def send_from_console(store: "Store", key: str, title: str, body: str, *,
                            run_id: str | None = None, item_id: str | None = None,
                            event: str = "") -> str:
    """Send the event ``key`` from here, once across every specdeck (the store's claim);
    returns ``sent``, ``failed``, ``already`` or ``off`` (no target configured)."""
    found = target()
    if found is None:
        return "off"
    url, _ = found
    where = describe(url)
    if not store.claim_notification(key, run_id=run_id, item_id=item_id, event=event,
                                    state="sending", target=where, by="console"):
        return "already"
    backoff, patience = timing()
    ok, tries, why = await asyncio.to_thread(deliver, url, title, body, backoff_s=backoff,
                                             patience_s=min(patience, CONSOLE_TRIES_S))
    store.set_notification(key, state="sent" if ok else "failed", error=why or None)
    if ok:
        store.journal("notified", f"{title}: sent to {where}", item_id=item_id, run_id=run_id)
    else:
        store.journal("notify_failed", f"{title}: NOT sent to {where} after {tries} tries: "
                      f"{why}; `specdeck notify --test` checks the target",
                      item_id=item_id, run_id=run_id)
    return "sent" if ok else "failed"


def send_test() -> str:
    """``specdeck notify --test``: one message now; returns where it went.

    Raises:
        InvalidInput: no target configured (the message says where to put one).
        SpecdeckError: the target did not accept it.
    """
    from core.errors import SpecdeckError

    found = target()
    if found is None:
        raise InvalidInput("no notification target configured", hint=(
            f"put one Apprise URL (ntfy://ntfy.sh/TOPIC, json://host:port/path...) in "
            f"{config_path()} (chmod 600) or in ${ENV}"))
    url, source = found
    backoff, _ = timing()
    ok, tries, why = deliver(url, "specdeck: test", "a test message from `specdeck notify "
                             "--test`", backoff_s=backoff, patience_s=0)
    if not ok:
        raise SpecdeckError(f"the test message to {describe(url)} (from {source}) was not "
                            f"sent: {why}", hint="check the URL and that the target is up")
    return f"{describe(url)} (from {source})"
