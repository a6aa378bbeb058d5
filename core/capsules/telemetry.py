"""Host telemetry: a host's GPUs and free disk, sampled over its existing connection.

No agent is installed: one shell command (:func:`sample_script`) asks ``nvidia-smi`` for its
GPUs (``--query-gpu``) and their compute processes (``--query-compute-apps``), and ``df -Pk``
for the filesystems a run writes to (its capsule, its checkpoints), in one round trip. A host
without ``nvidia-smi`` (or whose driver does not answer) gives a sample with no GPUs and the
reason, never an error: the console's pane and ``status --json`` say so.

While a train run lives, :func:`watch_while` samples its host every ``every`` seconds
(the plan's ``telemetry:``, :class:`TelemetrySettings`), stores each sample with the run
(:meth:`core.state.store.Store.add_telemetry`), and raises three alerts, each once per run
(:func:`raise_alert`): its GPUs idle (a GPU that was busy during the run, under ``idle_util``
% for ``idle_minutes``: a stalled dataloader, a hung collective), a GPU's memory near full
(``mem_full_pct``), the checkpoint disk's free space below the last checkpoint's size (the
next one would not fit).

Notifications hook in at :func:`on_alert`: every alert raised, once, reaches the callbacks
registered there as an :class:`Alert` (kind, host, item, run, text), after it is journaled.

Below the action kinds and the runner (``core.capsules``): imports ``core.hosts``,
``core.state`` and the leaves only; the runner and ``status`` call in.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from dataclasses import asdict, dataclass
from typing import Callable

GPU_FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "power.draw",
              "temperature.gpu", "uuid")
"""What ``nvidia-smi --query-gpu`` is asked, in this order (uuid last: it ties a GPU to its
compute processes)."""
APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")
"""What ``--query-compute-apps`` is asked (the process name last: it may hold a comma)."""
GPU_QUERY = ["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]
APP_QUERY = ["nvidia-smi", f"--query-compute-apps={','.join(APP_FIELDS)}",
             "--format=csv,noheader,nounits"]
NO_VALUE = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]",
            "[GPU is lost]", "")
"""How nvidia-smi writes a value it cannot give (unsupported by the GPU or the driver)."""
ALERT_KINDS = ("gpu_idle", "gpu_memory", "disk_low")
MARK = "@@specdeck-telemetry"


@dataclass(frozen=True)
class TelemetrySettings:
    """The plan's ``telemetry:`` (every field optional)::

        telemetry: {every: 30, idle_util: 5, idle_minutes: 10, mem_full_pct: 97}
    """

    every: float = 30.0
    """Seconds between two samples of a live train run's host (0: never sample)."""
    idle_util: float = 5.0
    """A GPU under this utilisation (%) counts as idle."""
    idle_minutes: float = 10.0
    """A GPU busy earlier in the run and idle this long raises the stall alert."""
    mem_full_pct: float = 97.0
    """A GPU's memory used at or above this % of its total raises the memory alert."""
    disk_alert: bool = True
    """Alert when the checkpoint disk's free space is below the last checkpoint's size."""

    def validate(self) -> list[tuple[tuple, str]]:
        out = []
        if self.every < 0:
            out.append((("every",), "must be 0 (never) or more seconds"))
        if not 0 <= self.idle_util <= 100:
            out.append((("idle_util",), "must be a utilisation from 0 to 100 (%)"))
        if self.idle_minutes <= 0:
            out.append((("idle_minutes",), "must be more than 0 minutes"))
        if not 0 < self.mem_full_pct <= 100:
            out.append((("mem_full_pct",), "must be a share of memory above 0, at most 100 (%)"))
        return out


@dataclass(frozen=True)
class GpuProcess:
    pid: int | None
    used_mib: float | None
    name: str = ""


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reported it (None: a value it gave as ``[N/A]``)."""

    index: int
    name: str
    util: float | None
    """Utilisation, %."""
    mem_used: float | None
    """MiB."""
    mem_total: float | None
    power: float | None
    """Watts."""
    temp: float | None
    """Degrees C."""
    uuid: str = ""
    processes: tuple[GpuProcess, ...] = ()

    @property
    def mem_pct(self) -> float | None:
        if self.mem_used is None or not self.mem_total:
            return None
        return 100.0 * self.mem_used / self.mem_total


@dataclass(frozen=True)
class Disk:
    """``df -Pk`` of one path: the filesystem holding it (its nearest existing ancestor)."""

    path: str
    free: int
    """Bytes available to the user."""
    total: int
    mount: str = ""


@dataclass(frozen=True)
class HostSample:
    """One look at a host."""

    host: str
    at: float
    gpus: tuple[Gpu, ...] = ()
    no_gpus: str | None = None
    """Why there are no GPUs (``nvidia-smi`` missing, its driver not answering), or None."""
    disks: tuple[Disk, ...] = ()
    checkpoint_bytes: int | None = None
    """The size of the run's last checkpoint, when one was asked about."""

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Alert:
    """What :func:`on_alert` callbacks receive: one alert, raised once."""

    kind: str
    """``gpu_idle``, ``gpu_memory`` or ``disk_low``."""
    host: str
    item: str | None
    run: str | None
    text: str


# -- the notifier's hook ------------------------------------------------------------------
_HOOKS: list[Callable[[Alert], None]] = []


def on_alert(callback: Callable[[Alert], None]) -> Callable[[], None]:
    """Call ``callback(alert)`` for every alert raised from now on, once each (after it is
    journaled). Returns the function that unregisters it. A callback that raises is ignored:
    an alert never fails a run or a sample."""
    _HOOKS.append(callback)
    return lambda: _HOOKS.remove(callback) if callback in _HOOKS else None


def raise_alert(store, alert: Alert) -> bool:
    """Journal ``alert`` (kind ``alert``) unless its run has had one of its kind already (in
    this process or another), then tell the :func:`on_alert` callbacks. True when raised."""
    if not store.alert_once(alert.kind, alert.text, item_id=alert.item, run_id=alert.run,
                            host=alert.host):
        return False
    for cb in list(_HOOKS):
        try:
            cb(alert)
        except Exception:  # noqa: BLE001 - a notifier's fault is its own, never the run's
            pass
    return True


# -- sampling -----------------------------------------------------------------------------
def sample_script(dirs: list[str], checkpoint: str | None = None) -> str:
    """The one shell command a sample runs: GPUs, their processes, ``df -Pk`` of ``dirs``
    (absolute paths; a missing one: its nearest existing ancestor), ``du -sk`` of
    ``checkpoint``. Every path is quoted."""
    parts = ["if command -v nvidia-smi >/dev/null 2>&1; then",
             f"echo '{MARK} gpus'; {shlex.join(GPU_QUERY)} 2>&1; echo \"{MARK} rc $?\";",
             f"echo '{MARK} apps'; {shlex.join(APP_QUERY)} 2>&1; echo \"{MARK} rc $?\";",
             f"else echo '{MARK} none'; fi;"]
    for d in dirs:
        q = shlex.quote(d)
        parts.append(f"echo {shlex.quote(f'{MARK} df {d}')}; d={q}; "
                     "while [ ! -e \"$d\" ] && [ \"$d\" != / ]; do d=$(dirname \"$d\"); done; "
                     "df -Pk \"$d\" 2>&1;")
    if checkpoint:
        parts.append(f"echo '{MARK} du'; du -sk {shlex.quote(checkpoint)} 2>/dev/null;")
    return " ".join(parts) + " true"


def value(text: str) -> float | None:
    """A number nvidia-smi printed (``nounits``), or None for ``[N/A]`` and its kin."""
    t = text.strip()
    if t in NO_VALUE:
        return None
    try:
        return float(t)
    except ValueError:
        return None


def parse_gpus(text: str) -> list[Gpu]:
    """``--query-gpu`` CSV (:data:`GPU_FIELDS`, noheader, nounits) -> one :class:`Gpu` per
    line; a line that is not one (an error message) is skipped."""
    out = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(", ")]
        if len(parts) != len(GPU_FIELDS):
            continue
        try:
            index = int(parts[0])
        except ValueError:
            continue
        util, used, total, power, temp = (value(p) for p in parts[2:7])
        out.append(Gpu(index, parts[1], util, used, total, power, temp, parts[7]))
    return out


def parse_apps(text: str) -> dict[str, list[GpuProcess]]:
    """``--query-compute-apps`` CSV (:data:`APP_FIELDS`) -> processes by GPU uuid."""
    out: dict[str, list[GpuProcess]] = {}
    for line in text.strip().splitlines():
        parts = line.split(", ", 3)
        if len(parts) < 3 or not parts[0].startswith("GPU-"):
            continue
        pid = value(parts[1])
        out.setdefault(parts[0].strip(), []).append(GpuProcess(
            int(pid) if pid is not None else None, value(parts[2]),
            parts[3].strip() if len(parts) > 3 else ""))
    return out


def parse_df(text: str, path: str) -> Disk | None:
    """The data line of ``df -Pk`` (1024-byte blocks) -> :class:`Disk`, or None."""
    lines = [ln for ln in text.strip().splitlines() if ln and not ln.startswith("Filesystem")]
    if not lines:
        return None
    f = lines[-1].split()
    if len(f) < 6:
        return None
    try:
        total, avail = int(f[1]) * 1024, int(f[3]) * 1024
    except ValueError:
        return None
    return Disk(path, avail, total, " ".join(f[5:]))


def parse_sample(host: str, out: str, *, at: float | None = None) -> HostSample:
    """What :func:`sample_script` printed -> :class:`HostSample`."""
    sections: list[tuple[str, list[str]]] = []
    for line in out.splitlines():
        if line.startswith(MARK + " "):
            sections.append((line[len(MARK) + 1:], []))
        elif sections:
            sections[-1][1].append(line)
    gpus: list[Gpu] = []
    apps: dict[str, list[GpuProcess]] = {}
    no_gpus, disks, ckpt = None, [], None
    rc: dict[str, str] = {}
    last = ""
    for head, body in sections:
        text = "\n".join(body)
        if head == "none":
            no_gpus = "no nvidia-smi on this host"
        elif head == "gpus":
            gpus = parse_gpus(text)
            if not gpus:
                no_gpus = ("nvidia-smi answered no GPU"
                           + (f": {text.strip().splitlines()[0][:200]}" if text.strip() else ""))
        elif head == "apps":
            apps = parse_apps(text)
        elif head.startswith("rc "):
            rc[last] = head[3:]
        elif head.startswith("df "):
            disk = parse_df(text, head[3:])
            if disk is not None:
                disks.append(disk)
        elif head == "du":
            try:
                ckpt = int(text.split()[0]) * 1024
            except (IndexError, ValueError):
                ckpt = None
        if not head.startswith("rc "):
            last = head
    gpus = [Gpu(**{**asdict(g), "processes": tuple(apps.get(g.uuid, ()))}) for g in gpus]
    return HostSample(host, time.time() if at is None else at, tuple(gpus),
                      None if gpus else no_gpus, tuple(disks), ckpt)


async def sample_host(host, dirs: list[str] = (), checkpoint: str | None = None, *,
                      timeout: float = 20.0) -> HostSample:
    """Sample ``host`` (connected) once; raises HostUnreachable / TimeoutError when it does
    not answer (a missing nvidia-smi is a sample saying so, not an error)."""
    paths = [host.path(d) for d in dirs]
    ckpt = host.path(checkpoint) if checkpoint else None
    res = await host.run(sample_script(paths, ckpt), timeout=timeout)
    return parse_sample(host.name, res.stdout)


# -- a live run's sampling and alerts -------------------------------------------------------
def _idle_gpus(store, run, sample: HostSample, settings: TelemetrySettings) -> list[tuple[int, float]]:
    """(GPU index, idle seconds) of the run's host GPUs that were busy during the run and have
    been under ``idle_util`` for ``idle_minutes`` or more, by the stored samples."""
    window = settings.idle_minutes * 60
    out = []
    for g in sample.gpus:
        hist = store.gpu_history(sample.host, g.index, since=run.started_at or 0)
        busy = [at for at, util, _ in hist if util is not None and util >= settings.idle_util]
        if not busy:
            continue  # never busy in this run: not one of its GPUs
        idle = [at for at, util, _ in hist if at > busy[-1]]
        if idle and sample.at - idle[0] >= window:
            out.append((g.index, sample.at - idle[0]))
    return out


def alerts_for(store, run, sample: HostSample, settings: TelemetrySettings) -> list[Alert]:
    """The alerts ``sample`` (stored already) gives for ``run`` (each raised once by
    :func:`raise_alert`)."""
    out = []
    who = f"{run.item_id} (run {run.id}) on {sample.host}"
    idle = _idle_gpus(store, run, sample, settings)
    if idle:
        names = ", ".join(f"GPU {i} ({s / 60:.1f} min)" for i, s in idle)
        out.append(Alert("gpu_idle", sample.host, run.item_id, run.id,
                         f"stall: {who}: {names} under {settings.idle_util:g} % utilisation "
                         f"after being busy (a stalled dataloader or a hung collective?)"))
    full = [g for g in sample.gpus if g.mem_pct is not None and g.mem_pct >= settings.mem_full_pct]
    if full:
        names = ", ".join(f"GPU {g.index} {g.mem_used / 1024:.1f}/{g.mem_total / 1024:.1f} GiB"
                          for g in full)
        out.append(Alert("gpu_memory", sample.host, run.item_id, run.id,
                         f"GPU memory near full: {who}: {names} (>= {settings.mem_full_pct:g} %)"))
    if settings.disk_alert and sample.checkpoint_bytes and sample.disks:
        disk = sample.disks[-1]  # the checkpoint dir's filesystem (sample_for_run asks it last)
        if disk.free < sample.checkpoint_bytes:
            out.append(Alert("disk_low", sample.host, run.item_id, run.id,
                             f"disk low: {who}: {disk.path} has {gib(disk.free)} free, the last "
                             f"checkpoint took {gib(sample.checkpoint_bytes)}: the next one "
                             f"will not fit (free space on {disk.mount or disk.path})"))
    return out


def gib(n: int | float) -> str:
    return f"{n / 2**30:.1f} GiB"


async def sample_for_run(host, store, run, settings: TelemetrySettings,
                         *, timeout: float = 20.0) -> tuple[HostSample, list[Alert]]:
    """Sample a live run's host (its capsule's disk, and its last checkpoint's disk and size),
    store the sample with the run, raise what it shows. Returns the sample and the alerts
    raised now (an alert its run had already is not raised again)."""
    dirs = [run.capsule] if run.capsule else ["."]
    ckpts = [a for a in store.artefacts(run.item_id, "checkpoint") if a.run_id == run.id]
    last = ckpts[-1].path if ckpts else None
    if last:
        dirs.append(posixpath.dirname(host.path(last)) or "/")
    sample = await sample_host(host, dirs, last, timeout=timeout)
    if not record(store, sample, run.id):
        return sample, []  # a full state disk: shown, not stored, nothing raised
    raised = [a for a in alerts_for(store, run, sample, settings) if raise_alert(store, a)]
    return sample, raised


def record(store, sample: HostSample, run_id: str | None = None) -> bool:
    """Store ``sample``; False when the state disk took no more writes (the run's own
    writes report that; a sample is not worth failing anything for)."""
    from core.errors import StateDiskFull

    try:
        store.add_telemetry(sample, run_id=run_id)
    except StateDiskFull:
        return False
    return True


async def watch_while(work, host, store, run, settings: TelemetrySettings, *,
                      on_alert_raised: Callable[[Alert], None] = lambda a: None):
    """Await ``work`` (following ``run``) while its host is sampled every ``settings.every``
    seconds; a sample that fails (the host dropped, nvidia-smi hung) is skipped."""
    if not settings.every or host is None:
        return await work
    import asyncio  # here, not at the top: reading a plan (its settings) needs none of it

    stop = asyncio.Event()

    async def loop():
        from core.errors import SpecdeckError

        while not stop.is_set():
            try:
                fresh = store.run(run.id)
                if fresh is None or not fresh.live:
                    return
                _, raised = await sample_for_run(host, store, fresh, settings)
                for a in raised:
                    on_alert_raised(a)
            except (SpecdeckError, TimeoutError, OSError):
                pass  # the follower reports the host; the next sample tries again
            try:  # the stop event, not only the cancel: a cancel that lands as a command
                # ends can be lost inside asyncio.wait_for (Python 3.11), so the loop also
                # wakes when the run is followed to its end
                await asyncio.wait_for(stop.wait(), settings.every)
            except TimeoutError:
                pass

    task = asyncio.create_task(loop())
    try:
        return await work
    finally:
        stop.set()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


def describe(sample: dict) -> str:
    """One line for a stored sample (:func:`latest_json`'s values): ``4 GPUs 90 % (0 91 % ·
    1 93 % ...), memory 241.9/318.6 GiB; disk 40.1 GiB free of 100.0 GiB (/data)``."""
    gpus = sample.get("gpus") or []
    if not gpus:
        head = f"no GPU telemetry ({sample.get('no_gpus') or 'no GPU answered'})"
    else:
        utils = [g["util"] for g in gpus if g.get("util") is not None]
        used = sum(g.get("mem_used") or 0 for g in gpus) / 1024
        total = sum(g.get("mem_total") or 0 for g in gpus) / 1024
        each = " · ".join(f"{g['index']} " + ("n/a" if g.get("util") is None else
                                             f"{g['util']:.0f} %") for g in gpus)
        head = (f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} "
                + (f"{sum(utils) / len(utils):.0f} % " if utils else "")
                + f"({each}), memory {used:.1f}/{total:.1f} GiB")
    disks = sample.get("disks") or []
    if disks:
        d = min(disks, key=lambda x: x["free"])
        head += f"; disk {gib(d['free'])} free of {gib(d['total'])} ({d.get('mount') or d['path']})"
    return head


def latest_json(store, hosts) -> dict:
    """Each host's latest stored sample (``status --json``'s ``hosts``): GPUs, disks, when,
    and why there are no GPUs; a host never sampled is absent."""
    out = {}
    for name in hosts:
        s = store.latest_telemetry(name)
        if s is not None:
            out[name] = s
    return out


__all__ = ["Alert", "Disk", "Gpu", "GpuProcess", "HostSample", "TelemetrySettings",
           "alerts_for", "describe", "latest_json", "on_alert", "parse_sample", "raise_alert", "record",
           "sample_for_run", "sample_host", "sample_script", "watch_while"]
