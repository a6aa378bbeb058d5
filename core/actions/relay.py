"""``relay``: copy a file or a model directory from one host to another *through specdeck*.

The training host and the eval host often cannot reach each other; the console machine
reaches both. Bytes stream src -> specdeck -> dst without touching the console's disk: a
reader task pulls chunks from the source while a writer task pushes them to the
destination, with a bounded queue between them, so the rate approaches the slower side and
memory stays at ``queue depth x chunk size``.

Resumable by construction: the destination is written as ``DST.part`` and appended to; a
rerun after a cut, a crash or a kill of specdeck resumes from the length of ``.part``. At
the end both hosts hash their copy (in parallel) and the hashes (and ``sha256`` when the plan
gives one) must agree before ``.part`` is renamed atomically onto ``DST``. The verified hash
is recorded beside the file as ``DST.sha256`` so that ``check()`` can answer "already done"
without re-reading a 17 GB file. A directory relays file by file with a manifest.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import shlex
import time
from dataclasses import dataclass

from core.actions.base import Action, CheckResult, register
from core.errors import ActionFailed, HostUnreachable

CHUNK = 1 << 20
DEPTH = 16
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)(i?[bB])?(/s)?\s*$")


def parse_rate(text: str | None) -> float | None:
    """``"50M"``, ``"1.5G/s"``, ``"800k"`` -> bytes per second (None: unlimited)."""
    if text is None:
        return None
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"bandwidth {text!r}: expected a number with an optional K/M/G suffix")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return float(m.group(1)) * mult


def split_endpoint(text: str) -> tuple[str, str]:
    host, sep, path = text.partition(":")
    if not sep or not host or not path:
        raise ValueError(f"{text!r}: expected HOST:PATH")
    return host, path


@dataclass(frozen=True)
class RelayParams:
    src: str
    """``HOST:PATH`` of the file or directory to copy."""
    dst: str
    """``HOST:PATH`` to write (a directory is recreated file by file)."""
    sha256: str | None = None
    """The expected sha256 of a single file (checked end to end)."""
    bwlimit: str | None = None
    """Bandwidth cap, e.g. ``50M`` (bytes per second)."""

    def validate(self):
        out = []
        for f in ("src", "dst"):
            try:
                split_endpoint(getattr(self, f))
            except ValueError as e:
                out.append(((f,), str(e)))
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", self.sha256):
            out.append((("sha256",), "sha256 must be 64 hex digits"))
        try:
            parse_rate(self.bwlimit)
        except ValueError as e:
            out.append((("bwlimit",), str(e)))
        return out


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


class _Meter:
    """Bytes, rate and ETA for progress lines, plus the optional bandwidth cap."""

    def __init__(self, ctx, total: int, done: int, limit: float | None, label: str):
        self.ctx, self.total, self.done, self.limit, self.label = ctx, total, done, limit, label
        self.sent = 0
        self.t0 = time.monotonic()
        self.last = 0.0

    async def add(self, n: int) -> None:
        self.sent += n
        self.done += n
        now = time.monotonic()
        if self.limit:
            ahead = self.sent / self.limit - (now - self.t0)
            if ahead > 0:
                await asyncio.sleep(ahead)
                now = time.monotonic()
        if now - self.last >= 0.5:
            self.last = now
            self.report(now)

    def report(self, now: float | None = None, final: bool = False) -> None:
        now = now or time.monotonic()
        rate = self.sent / max(now - self.t0, 1e-6)
        left = self.total - self.done
        eta = left / rate if rate > 0 else None
        pct = 100.0 * self.done / self.total if self.total else 100.0
        msg = (f"{self.label}: {human(self.done)} / {human(self.total)} ({pct:.1f}%), "
               f"{human(rate)}/s" + (f", ETA {eta:.0f}s" if eta is not None and not final else ""))
        self.ctx.progress(msg, bytes=self.done, total=self.total, rate=rate, eta_s=eta,
                          final=final)


@register
class Relay(Action):
    kind = "relay"
    Params = RelayParams
    detached = False
    needs_host = False
    summary = "stream a file or model dir between hosts through specdeck (resumable, verified)"

    @classmethod
    def validate_plan(cls, params, plan, item):
        out = []
        for f in ("src", "dst"):
            host, _ = split_endpoint(getattr(params, f))
            if host not in plan.hosts:
                out.append(((f,), f"unknown host {host!r} (defined: {', '.join(plan.hosts)})"))
        return out

    async def _ends(self, ctx):
        sh, sp = split_endpoint(self.params.src)
        dh, dp = split_endpoint(self.params.dst)
        return (await ctx.connected(sh)), sp, (await ctx.connected(dh)), dp

    async def check(self, ctx) -> CheckResult:
        src, sp, dst, dp = await self._ends(ctx)
        sst = await src.stat(sp)
        if sst is None:
            dstat = await dst.stat(dp)
            if dstat is not None and await self._recorded_ok(dst, dp, None):
                return CheckResult.done(f"{dp} holds a verified copy (source gone)")
            return CheckResult.blocked(f"source {self.params.src} does not exist")
        if sst.is_dir:
            man = await dst.read_from(posixpath.join(dp, ".specdeck-relay.json"), 0, 1 << 24)
            if man:
                try:
                    files = json.loads(man)["files"]
                except (ValueError, KeyError):
                    files = None
                if files and await self._dir_done(src, sp, dst, dp, files):
                    return CheckResult.done(f"{dp} holds all {len(files)} files, verified")
            return CheckResult.ready()
        if await self._recorded_ok(dst, dp, sst.size):
            return CheckResult.done(f"{dp} holds the same file (sha256 recorded)")
        return CheckResult.ready()

    async def _recorded_ok(self, dst, dp, size: int | None) -> bool:
        raw = await dst.read_from(dp + ".sha256", 0, 4096)
        dstat = await dst.stat(dp)
        if not raw or dstat is None:
            return False
        parts = raw.decode(errors="replace").split()
        if len(parts) < 2:
            return False
        digest, rec_size = parts[0], int(parts[1]) if parts[1].isdigit() else -1
        if rec_size != dstat.size or (size is not None and size != dstat.size):
            return False
        return self.params.sha256 is None or digest.lower() == self.params.sha256.lower()

    async def _dir_done(self, src, sp, dst, dp, files) -> bool:
        listing = await _list_tree(src, sp)
        if sorted(listing.items()) != sorted((f["path"], f["size"]) for f in files):
            return False
        for f in files:
            if not await self._recorded_ok(dst, posixpath.join(dp, f["path"]), f["size"]):
                return False
        return True

    async def run(self, ctx) -> dict:
        src, sp, dst, dp = await self._ends(ctx)
        sst = await src.stat(sp)
        if sst is None:
            raise ActionFailed(f"relay: source {self.params.src} does not exist")
        limit = parse_rate(self.params.bwlimit)
        if not sst.is_dir:
            return await self._one(ctx, src, sp, dst, dp, sst.size, self.params.sha256, limit)
        tree = await _list_tree(src, sp)
        total = sum(tree.values())
        await self._preflight(dst, dp, total, label=self.params.dst)
        results = []
        for i, (rel, size) in enumerate(sorted(tree.items())):
            ctx.progress(f"file {i + 1}/{len(tree)}: {rel}")
            results.append(await self._one(ctx, src, posixpath.join(sp, rel), dst,
                                           posixpath.join(dp, rel), size, None, limit,
                                           label=rel))
        manifest = {"src": self.params.src, "files": [
            {"path": rel, "size": r["size"], "sha256": r["sha256"]}
            for rel, r in zip(sorted(tree), results)]}
        await dst.write_file(posixpath.join(dp, ".specdeck-relay.json"),
                             json.dumps(manifest, indent=1).encode())
        return {"files": len(results), "bytes": total,
                "bytes_sent": sum(r["bytes_sent"] for r in results)}

    async def _preflight(self, dst, dp, need: int, *, label: str) -> None:
        free = await dst.disk_free(posixpath.dirname(dst.path(dp)) or "/")
        if need > free:
            raise ActionFailed(
                f"relay: {label} needs {human(need)} but {dst.name} has {human(free)} free",
                hint=f"free space on {dst.name} (or relay somewhere else), then run it again")

    async def _one(self, ctx, src, sp, dst, dp, size, expected, limit, label=None) -> dict:
        label = label or posixpath.basename(dp)
        part = dp + ".part"
        pst = await dst.stat(part)
        offset = pst.size if pst is not None and pst.size <= size else 0
        if pst is not None and offset == 0 and pst.size:
            await dst.remove(part)  # longer than the source: not a prefix of it
        await self._preflight(dst, dp, size - offset, label=label)
        if offset:
            ctx.progress(f"{label}: resuming at {human(offset)} of {human(size)}")
        meter = _Meter(ctx, size, offset, limit, label)
        # The source hashes its file while the bytes flow (it reads from page cache), so
        # only the destination's hash is left once the transfer ends.
        src_hash = asyncio.create_task(src.sha256(sp))
        try:
            if offset < size:
                await _pump(src, sp, dst, part, offset, meter)
            elif pst is None:
                await dst.write_file(part, b"")
        except BaseException:
            src_hash.cancel()
            raise
        meter.report(final=True)
        got = await dst.stat(part)
        if got is None or got.size != size:
            src_hash.cancel()
            raise ActionFailed(f"relay: {label}: wrote {got.size if got else 0} bytes of {size}",
                               hint="run the item again; it resumes from the .part file")
        ctx.progress(f"{label}: verifying sha256 on {src.name} and {dst.name}")
        h_src, h_dst = await asyncio.gather(src_hash, dst.sha256(part))
        if h_src != h_dst or (expected and expected.lower() != h_src):
            want = expected or h_src
            raise ActionFailed(
                f"relay: {label}: sha256 mismatch: {src.name} has {h_src}, "
                f"{dst.name}:{part} has {h_dst}" + (f", plan expects {expected}" if expected else "")
                + "; nothing was renamed",
                hint=f"the partial copy is corrupt: remove it (rm {shlex.quote(dst.path(part))}) "
                     "and run the item again" if h_dst != want else
                     "the source differs from the plan's sha256: check which checkpoint you meant")
        await dst.rename(part, dp)
        await dst.write_file(dp + ".sha256", f"{h_src} {size}\n".encode())
        return {"size": size, "sha256": h_src, "resumed_from": offset,
                "bytes_sent": meter.sent}


async def _pump(src, sp, dst, part, offset, meter: _Meter) -> None:
    """Reader and writer in parallel with a bounded queue between them."""
    q: asyncio.Queue = asyncio.Queue(maxsize=DEPTH)
    writer = await dst.open_writer(part, append=True)

    async def read() -> None:
        try:
            async for chunk in src.open_reader(sp, offset, chunk_size=CHUNK):
                await q.put(chunk)
        finally:
            await q.put(None)

    reader = asyncio.create_task(read())
    try:
        while True:
            chunk = await q.get()
            if chunk is None:
                break
            await writer.write(chunk)
            await meter.add(len(chunk))
    except BaseException:
        reader.cancel()
        try:
            await writer.close()
        except Exception:  # the original error matters more than the close
            pass
        raise
    await writer.close()
    await reader  # re-raises a read failure (e.g. HostUnreachable mid-stream)


async def _list_tree(host, path: str) -> dict[str, int]:
    """Relative path -> size of every regular file under ``path``."""
    res = await host.run(f"cd {shlex.quote(host.path(path))} && find . -type f -printf '%P\\t%s\\n'",
                         check=True)
    out = {}
    for line in res.stdout.splitlines():
        rel, _, size = line.rpartition("\t")
        if rel and not rel.endswith((".part", ".sha256")) and rel != ".specdeck-relay.json":
            out[rel] = int(size)
    return out


__all__ = ["Relay", "RelayParams", "parse_rate", "HostUnreachable"]


class _QuietCtx:
    def progress(self, message: str, **fields) -> None:
        pass


async def copy_verified(src, sp: str, dst, dp: str) -> str:
    """Copy one file between hosts through specdeck (resumable, sha256-verified); its hash."""
    size = (await src.stat(sp)).size
    return (await Relay(RelayParams(src=f"{src.name}:{sp}", dst=f"{dst.name}:{dp}"))._one(
        _QuietCtx(), src, sp, dst, dp, size, None, None))["sha256"]
