"""``python -m core.ml.notify``: send a notification from a host, once, whatever happens to the
target meanwhile.

    python -m core.ml.notify run-end CAPSULE
    python -m core.ml.notify event DIR KEY --title T --body B

specdeck arms a run capsule (``core.runs.notify``) with three files beside the capsule's state:

``notify.json``  what to tell and to whom, no secret: ``{"plan", "item", "host", "run",
                 "events": [...], "target": "json://127.0.0.1:8080", "backoff_s", "patience_s"}``;
``notify.url``   the Apprise URL (ntfy, Slack, Discord, ``json://``...), mode 0600: the secret.
                 It is read from this file only: never argv, never the environment;
``notify.sh``    what the capsule's wrapper starts, detached, once the command's exit status
                 is recorded (``core.capsules.jobs.notify_step``).

``run-end`` reads the capsule's ``exit`` (and ``notify.stopping``, written by a stop) and, when
the plan's ``notify:`` names that end (succeeded, failed, stopped), sends one message naming
plan, item, host and exit. ``event`` sends one message keyed ``KEY`` from ``DIR`` (the detached
watcher's tau alerts).

Once per event: the sender claims ``notify.<key>.claim`` (created exclusively, so a second
sender, or a later one, sends nothing) and keeps ``notify.<key>`` up to date: ``{"state":
"sending" | "sent" | "failed", "event", "target", "tries", "at", "error"}``. A target that does
not answer is tried again with backoff (``backoff_s`` doubling, at most 5 minutes apart) until
``patience_s`` has passed; then the record says ``failed``, and specdeck journals it when it
next looks. The run's own state is never touched: this runs after the exit status is written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

from core.ml.formats.runio import UsageError, atomic_write_json, emit

RUN_ENDS = ("succeeded", "failed", "stopped", "lost")
TAU_ALERTS = ("tau_drop", "tau_flat")
EVENTS = RUN_ENDS + TAU_ALERTS + ("stall", "disk", "gpu_memory")
"""What a plan's ``notify:`` may name: a run's end, a watcher's tau alert, and host telemetry's
alerts (idle GPUs: ``stall``, a checkpoint disk running out: ``disk``, a GPU's memory full)."""
BACKOFF_S = 5.0
PATIENCE_S = 3600.0
MAX_GAP_S = 300.0


def describe_target(url: str) -> str:
    """``json://user:pw@127.0.0.1:8080/hook?x=1`` -> ``json://127.0.0.1:8080``: where a
    message goes, without its secret parts (credentials, path, query: a Slack or ntfy token
    often sits there). Many Apprise schemes put a token where a host would be
    (``slack://TokenA/...``, ``discord://WebhookID/...``, ``ntfy://topic``): a "host" that
    is not a dotted name, an address or ``localhost`` is shown as ``…``."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unreadable URL)"
    if not ("." in host or ":" in host or host == "localhost"):
        host, port = "…", ""
    return f"{parts.scheme or '?'}://{host}{port}"


def read_secret(path: Path) -> str:
    """The URL in ``path``: its first line that is not blank or a ``#`` comment. The file must
    be the user's alone (mode 0600 or stricter): others could read the secret."""
    try:
        st = path.stat()
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"{path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                         f"`chmod 600 {path}`, since it holds the notification URL")
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line
    raise UsageError(f"{path} holds no URL (one Apprise URL on a line, e.g. "
                     "ntfy://ntfy.sh/TOPIC or json://host:port/path)")


def _quiet_apprise() -> None:
    """Apprise logs failures with its own wording, which may carry parts of the URL: it says
    nothing here; this module reports (with :func:`describe_target`)."""
    lg = logging.getLogger("apprise")
    lg.setLevel(logging.CRITICAL + 1)
    lg.propagate = False


def send_once(url: str, title: str, body: str) -> tuple[bool, str]:
    """One attempt; (sent, what went wrong). Apprise is imported here only: a host that never
    notifies needs it not."""
    try:
        import apprise
    except ImportError:
        return False, "the apprise package is not installed on this host (pip install apprise)"
    _quiet_apprise()
    ap = apprise.Apprise()
    if not ap.add(url):
        return False, f"not an Apprise URL ({describe_target(url)}...)"
    try:
        ok = ap.notify(title=title, body=body)
    except Exception as e:  # noqa: BLE001 - a plugin's fault is one failed try
        return False, type(e).__name__
    return bool(ok), "" if ok else f"{describe_target(url)} did not accept it"


def deliver(url: str, title: str, body: str, *, backoff_s: float = BACKOFF_S,
            patience_s: float = PATIENCE_S, on_try=None) -> tuple[bool, int, str]:
    """:func:`send_once` until it is sent or ``patience_s`` has passed, the gaps doubling from
    ``backoff_s`` (at most :data:`MAX_GAP_S`); (sent, tries, last error)."""
    start, gap, tries = time.monotonic(), max(0.01, backoff_s), 0
    while True:
        tries += 1
        ok, why = send_once(url, title, body)
        if on_try:
            on_try(tries, ok, why)
        if ok:
            return True, tries, ""
        left = patience_s - (time.monotonic() - start)
        if left <= 0:
            return False, tries, why
        time.sleep(min(gap, left))
        gap = min(gap * 2, MAX_GAP_S)


def notify_event(where: Path, key: str, title: str, body: str, cfg: dict) -> str:
    """Send the event ``key`` from ``where`` once (see the module doc); returns its state:
    ``sent``, ``failed`` or ``already`` (another sender has it)."""
    claim = where / f"notify.{key}.claim"
    try:
        os.close(os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return "already"
    record = where / f"notify.{key}"
    target = cfg.get("target") or "?"
    base = {"event": key, "target": target, "title": title}
    atomic_write_json(record, {**base, "state": "sending", "tries": 0, "at": time.time()})
    try:
        url = read_secret(where / "notify.url")
    except UsageError as e:
        atomic_write_json(record, {**base, "state": "failed", "tries": 0, "error": str(e),
                                   "at": time.time()})
        emit("notify", key=key, state="failed", error=str(e))
        return "failed"

    def told(n, ok, why):
        emit("notify", key=key, target=target, tries=n, state="sent" if ok else "retrying",
             **({"error": why} if why else {}))
        if not ok:
            atomic_write_json(record, {**base, "state": "sending", "tries": n, "error": why,
                                       "at": time.time()})
    ok, tries, why = deliver(url, title, body, backoff_s=float(cfg.get("backoff_s", BACKOFF_S)),
                             patience_s=float(cfg.get("patience_s", PATIENCE_S)), on_try=told)
    atomic_write_json(record, {**base, "state": "sent" if ok else "failed", "tries": tries,
                               "error": why or None, "at": time.time()})
    return "sent" if ok else "failed"


def run_end_message(cfg: dict, exit_text: str, stopping: bool) -> tuple[str, str, str]:
    """(event, title, body) of a capsule's end: ``exit 0`` succeeded, ``exit N`` or ``signal N``
    failed, either after a stop: stopped."""
    words = exit_text.split()
    how = " ".join(words[:2]) if len(words) >= 2 else "no exit status"
    if stopping:
        event = "stopped"
    elif words[:2] == ["exit", "0"]:
        event = "succeeded"
    else:
        event = "failed"
    title = f"specdeck: {cfg.get('plan')}/{cfg.get('item')} {event}"
    body = (f"plan {cfg.get('plan')}, item {cfg.get('item')}, host {cfg.get('host')}: run "
            f"{cfg.get('run')} {event} ({how})")
    return event, title, body


def run_end(capsule: Path) -> int:
    cfg = json.loads((capsule / "notify.json").read_text())
    try:
        exit_text = (capsule / "exit").read_text()
    except FileNotFoundError:
        raise UsageError(f"{capsule}: no exit file: the run has not ended") from None
    event, title, body = run_end_message(cfg, exit_text, (capsule / "notify.stopping").exists())
    if event not in cfg.get("events", ()):
        emit("notify", key="run_end", state="not asked", event=event)
        return 0
    state = notify_event(capsule, "run_end", title, body, cfg)
    emit("notify", key="run_end", event=event, state=state)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.ml.notify", description=(
        "Send a notification from a host once (the URL is read from notify.url, mode 0600)."))
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run-end", help="a run capsule's end")
    r.add_argument("capsule")
    e = sub.add_parser("event", help="one keyed event from a directory holding notify.json/url")
    e.add_argument("dir")
    e.add_argument("key")
    e.add_argument("--title", required=True)
    e.add_argument("--body", required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.what == "run-end":
        return run_end(Path(args.capsule))
    d = Path(args.dir)
    cfg = json.loads((d / "notify.json").read_text())
    notify_event(d, args.key, args.title, args.body, cfg)
    return 0
