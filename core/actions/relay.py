"""``relay``: copy a file or a model directory from one host to another *through specdeck*.

The training host and the eval host often cannot reach each other; the console machine
reaches both. Bytes stream src -> specdeck -> dst without touching the console's disk.

**Data paths.** Big files go through OpenSSH's own ``ssh`` client, one process per endpoint
running ``dd`` on the host, with a thread in specdeck moving the bytes between their pipes
(:mod:`core.hosts.bulk`): the ciphers run in C (AES-GCM first, the cheapest both ends
offer with AES instructions). Small files, and hosts the ``ssh`` client cannot log in to
with our settings, use the asyncssh connection already open (a reader task and a writer
task with a bounded queue). The ``ssh`` client's login is probed as soon as both hosts are
connected, while ``check()`` and the set-up round trips run.

**Streams.** One stream appends to ``DST.part``. ``streams: N`` (default from the file size
and this machine's CPUs: 1 for small files) splits the file into N byte ranges, each its own
pair of ssh data paths writing its range into ``.part`` at its offset, so one cipher core
no longer caps a fast link. Each range has a resume journal on the destination: its
writer appends the end offset of every whole chunk (:data:`JOURNAL_CHUNK`) that landed, so a
cut or kill re-sends at most one chunk per range. ``bwlimit`` caps the total.

**Verification.** A fresh one-stream copy hashes the bytes as they stream through specdeck,
which is the source's hash taken from the bytes it sends (no second read of the file) and
what the destination's ``dd`` received (SSH's MAC) and wrote (exit 0, sizes agree,
fsync'ed). Ranges, and resumed copies, hash the destination's ``.part`` whole and compare
it with the source's hash (the plan's ``sha256`` when given, else hashed on the source host
during the copy). The source's identity (size, inode, device, mtime) is taken before and
after the copy: a source rewritten meanwhile fails the copy. Only then is ``.part`` renamed
atomically onto ``DST``, and ``DST.sha256`` records the hash with the identities of both
files, so that ``check()`` answers "already done" cheaply, and re-hashes (never trusts the
size alone) when either file changed.

**Bookkeeping never meets user files or links.** A file relay keeps ``DST.part``,
``DST.sha256``, ``DST.part.ranges`` and the range journals ``DST.part.rN`` beside ``DST``.
A directory relay copies every file of the tree whatever its name, and keeps all of its own
files in a sibling ``DST.specdeck-relay/`` outside the tree. A symbolic link at any
temporary name is refused (and ``dd`` opens with ``nofollow``); a destination that is an
existing directory (for a file) or ends in ``/`` is refused before any byte moves. A full
disk mid-copy fails with a clear message and keeps ``.part`` for the rerun to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import posixpath
import re
import shlex
import time
from dataclasses import dataclass
from typing import Any

from core.actions.base import Action, CheckResult
from core.errors import ActionFailed, HostUnreachable
from core.hosts import bulk
from core.ml.formats import strictjson
from core.text import human

CHUNK = 1 << 20
"""Bytes per message on the asyncio path."""
DEPTH = 16
BULK_MIN = 32_000_000
"""Files with at least this much left to send take the descriptor path (ssh clients)."""
JOURNAL_CHUNK = 16 << 20
"""A range's writer journals its progress every this many bytes: what a kill can cost."""
MAX_STREAMS = 16
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


def default_streams(size: int, cpus: int | None = None) -> int:
    """Streams for a file of ``size`` bytes: 1 under 512 MB, then 2 / 4 / 8 as it grows
    (2, 8, 32 GB), never more than half this machine's CPUs (each stream runs two ``ssh``
    clients' ciphers here)."""
    cpus = cpus or os.cpu_count() or 1
    by_size = 1 if size < 512_000_000 else 2 if size < 2_000_000_000 else (
        4 if size < 8_000_000_000 else 8)
    return max(1, min(by_size, cpus // 2))


def split_ranges(size: int, n: int, chunk: int = JOURNAL_CHUNK) -> list[list[int]]:
    """``[start, end)`` of ``n`` ranges covering ``size`` bytes, ends on chunk boundaries."""
    chunks = max(1, -(-size // chunk))
    n = max(1, min(n, chunks))
    bounds = [min(size, (chunks * i // n) * chunk) for i in range(n)] + [size]
    return [[bounds[i], bounds[i + 1]] for i in range(n) if bounds[i] < bounds[i + 1]] or [[0, 0]]


@dataclass(frozen=True)
class RelayParams:
    src: str
    """``HOST:PATH`` of the file or directory to copy."""
    dst: str
    """``HOST:PATH`` to write (a directory is recreated file by file)."""
    sha256: str | None = None
    """The expected sha256 of a single file (checked end to end)."""
    bwlimit: str | None = None
    """Bandwidth cap for the whole transfer (all streams), e.g. ``50M`` (bytes per second)."""
    streams: int | None = None
    """Parallel range streams for a big file (default: from its size and this machine)."""

    def validate(self):
        out = []
        for f in ("src", "dst"):
            try:
                split_endpoint(getattr(self, f))
            except ValueError as e:
                out.append(((f,), str(e)))
        if self.dst.endswith("/"):
            out.append((("dst",), f"{self.dst!r} ends in '/': give the full path to write "
                        "(the file's or the directory's own name), e.g. ct129:ckpt/step.pt"))
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", self.sha256):
            out.append((("sha256",), "sha256 must be 64 hex digits"))
        try:
            parse_rate(self.bwlimit)
        except ValueError as e:
            out.append((("bwlimit",), str(e)))
        if self.streams is not None and (isinstance(self.streams, bool) or not isinstance(
                self.streams, int) or not 1 <= self.streams <= MAX_STREAMS):
            out.append((("streams",), f"streams must be a whole number from 1 to {MAX_STREAMS}"))
        return out


@dataclass
class _Overall:
    """A directory relay's totals, so each file's progress line also tells the whole ETA."""

    total: int
    done: int = 0
    """Bytes of the files before the current one (copied, resumed or already verified)."""
    sent: int = 0
    """Bytes sent for them in this run (the rate's numerator)."""
    t0: float = 0.0


class _Meter:
    """Bytes, rate and ETA for progress lines (all streams, and each), plus the asyncio
    path's bandwidth cap."""

    def __init__(self, ctx, total: int, done: int, limit: float | None, label: str,
                 overall: _Overall | None = None):
        self.ctx, self.total, self.done, self.limit, self.label = ctx, total, done, limit, label
        self.overall = overall
        self.sent = 0
        self.per_stream: list[int] = []
        self.t0 = time.monotonic()
        self.last = 0.0

    async def add(self, n: int) -> None:
        """``n`` more bytes sent by the asyncio path (which this paces to the cap)."""
        if self.limit:
            ahead = (self.sent + n) / self.limit - (time.monotonic() - self.t0)
            if ahead > 0:
                await asyncio.sleep(ahead)
        self.set_sent(self.sent + n)

    def set_sent(self, sent: int, per_stream: list[int] | None = None) -> None:
        """The bytes sent so far (and by each stream); a progress line every half second."""
        self.done += sent - self.sent
        self.sent = sent
        if per_stream is not None:
            self.per_stream = list(per_stream)
        now = time.monotonic()
        if now - self.last >= 0.5:
            self.last = now
            self.report(now)

    def report(self, now: float | None = None, final: bool = False) -> None:
        now = now or time.monotonic()
        dt = max(now - self.t0, 1e-6)
        rate = self.sent / dt
        left = self.total - self.done
        eta = left / rate if rate > 0 else None
        pct = 100.0 * self.done / self.total if self.total else 100.0
        # figures first: a narrow pane cuts the end of the line, and the name matters least
        msg = (f"{pct:.1f}% {human(self.done)} / {human(self.total)}, {human(rate)}/s"
               + (f", ETA {eta:.0f}s" if eta is not None and not final else ""))
        rates = [n / dt for n in self.per_stream]
        if len(rates) > 1:
            msg += (f" · {len(rates)} streams " + " ".join(f"{r / 1e6:.0f}" for r in rates)
                    + " MB/s")
        msg += f" · {self.label}"
        o = self.overall
        if o is not None and o.total:
            done = o.done + self.done
            all_rate = (o.sent + self.sent) / max(now - o.t0, 1e-6)
            msg += f" · all {100.0 * done / o.total:.0f}% of {human(o.total)}"
            if all_rate > 0 and done < o.total:
                msg += f", ETA {(o.total - done) / all_rate:.0f}s"
        self.ctx.progress(msg, bytes=self.done, total=self.total, rate=rate, eta_s=eta,
                          final=final, stream_rates=rates if len(rates) > 1 else None)


@dataclass(frozen=True)
class _Book:
    """Where one destination file's temporaries and records live."""

    part: str
    sums: str
    """The verified hash, with both files' identities (``hash size`` / ``src ID`` / ``dst ID``)."""
    state: str
    """The copy in progress: size, source identity, ranges (JSON)."""
    journals: str
    """Prefix of the per-range journals (``{journals}{i}``)."""

    @classmethod
    def beside(cls, dp: str) -> "_Book":
        return cls(dp + ".part", dp + ".sha256", dp + ".part.ranges", dp + ".part.r")

    @classmethod
    def under(cls, book_dir: str, rel: str) -> "_Book":
        """A directory relay's: out of the tree, so no user file can collide with them."""
        j = posixpath.join(book_dir, "journal", rel)
        return cls(posixpath.join(book_dir, "parts", rel), posixpath.join(book_dir, "sums", rel),
                   posixpath.join(j, "ranges"), posixpath.join(j, "r"))

    def journal(self, i: int) -> str:
        return f"{self.journals}{i}"


def book_dir(dp: str) -> str:
    """A directory relay's bookkeeping: a sibling of the destination tree."""
    return dp.rstrip("/") + ".specdeck-relay"


@dataclass(frozen=True)
class _Record:
    digest: str
    size: int
    src_id: str | None
    dst_id: str | None

    @classmethod
    def parse(cls, raw: bytes) -> "_Record | None":
        lines = raw.decode(errors="replace").splitlines()
        if not lines:
            return None
        first = lines[0].split()
        if len(first) < 2 or not re.fullmatch(r"[0-9a-f]{64}", first[0].lower()) \
                or not first[1].isdigit():
            return None
        ids = {k: v for k, _, v in (ln.partition(" ") for ln in lines[1:])}
        return cls(first[0].lower(), int(first[1]), ids.get("src"), ids.get("dst"))

    def text(self) -> bytes:
        return f"{self.digest} {self.size}\nsrc {self.src_id}\ndst {self.dst_id}\n".encode()


class Relay(Action, kind="relay", params=RelayParams,
             summary="stream a file or model dir between hosts through specdeck (resumable, verified)"):
    detached = False
    needs_host = False

    @classmethod
    def validate_plan(cls, params, plan, item):
        out = []
        for f in ("src", "dst"):
            host, _ = split_endpoint(getattr(params, f))
            if host not in plan.hosts:
                out.append(((f,), f"unknown host {host!r} (defined: {', '.join(plan.hosts)})"))
        return out

    async def _ends(self, ctx):
        """Both hosts, connected at once; the ``ssh`` client probes start right away."""
        sh, sp = split_endpoint(self.params.src)
        dh, dp = split_endpoint(self.params.dst)
        src, dst = await asyncio.gather(ctx.connected(sh), ctx.connected(dh))
        return src, sp, dst, dp

    async def check(self, ctx) -> CheckResult:
        src, sp, dst, dp = await self._ends(ctx)
        sst, dstat = await asyncio.gather(src.stat(sp), dst.stat(dp))
        if sst is None:
            if dstat is not None and not dstat.is_dir:
                rec = await self._record(dst, _Book.beside(dp))
                if rec and await self._current(None, sp, None, dst, dp, rec, rec.size):
                    return CheckResult.done(f"{dp} holds a verified copy (source gone)")
            return CheckResult.blocked(f"source {self.params.src} does not exist")
        refused = _refuse_destination(sst.is_dir, dstat, self.params.dst)
        if refused:
            return CheckResult.blocked(refused)
        if sst.is_dir:
            if dstat is None:
                return CheckResult.ready()
            man = await dst.read_from(posixpath.join(book_dir(dp), "manifest.json"), 0, 1 << 24)
            try:
                files = json.loads(man)["files"] if man else None
            except (ValueError, KeyError, TypeError):
                files = None
            if files and await self._dir_done(src, sp, dst, dp, files):
                return CheckResult.done(f"{dp} holds all {len(files)} files, verified")
            return CheckResult.ready()
        sid, rec = await asyncio.gather(src.identity(sp), self._record(dst, _Book.beside(dp)))
        if rec and await self._current(src, sp, sid, dst, dp, rec, sst.size):
            return CheckResult.done(f"{dp} holds the same file (sha256 recorded)")
        return CheckResult.ready()

    @staticmethod
    async def _record(dst, book: _Book) -> _Record | None:
        raw = await dst.read_from(book.sums, 0, 4096)
        return _Record.parse(raw) if raw else None

    async def _current(self, src, sp, sid, dst, dp, rec: _Record, size: int,
                       did: str | None | bool = False) -> bool:
        """Whether ``dp`` holds the source's bytes, by the record: cheap while both files'
        identities are the ones recorded, re-hashed where one changed (a rewrite with the
        same size included). ``src`` None: the source is gone, the destination alone."""
        if rec.size != size or (self.params.sha256 and rec.digest != self.params.sha256.lower()):
            return False
        if did is False:
            did = await dst.identity(dp)
        if did is None or int(did.split()[0]) != size:
            return False
        if did != rec.dst_id and await dst.sha256(dp) != rec.digest:
            return False
        if src is not None and sid != rec.src_id and await src.sha256(sp) != rec.digest:
            return False
        return True

    async def _dir_done(self, src, sp, dst, dp, files) -> bool:
        listing, there = await asyncio.gather(_list_tree(src, sp), _list_tree(dst, dp))
        if sorted((rel, int(i.split()[0])) for rel, i in listing.items()) != sorted(
                (f["path"], f["size"]) for f in files):
            return False
        bd = book_dir(dp)
        for f in files:
            rel = f["path"]
            rec = await self._record(dst, _Book.under(bd, rel))
            if rel not in there or rec is None or not await self._current(
                    src, posixpath.join(sp, rel), listing[rel], dst, posixpath.join(dp, rel),
                    rec, f["size"], did=there[rel]):
                return False
        return True

    async def run(self, ctx) -> dict:
        src, sp, dst, dp = await self._ends(ctx)
        sst, dstat = await asyncio.gather(src.stat(sp), dst.stat(dp))
        if sst is None:
            raise ActionFailed(f"relay: source {self.params.src} does not exist")
        refused = _refuse_destination(sst.is_dir, dstat, self.params.dst)
        if refused:
            raise ActionFailed(f"relay: {refused}", hint="fix dst in the plan, then run again")
        limit = parse_rate(self.params.bwlimit)
        if not sst.is_dir:
            return await self._one(ctx, src, sp, dst, dp, sst.size, self.params.sha256, limit,
                                   streams=self.params.streams)
        tree, there = await asyncio.gather(_list_tree(src, sp), _list_tree(dst, dp))
        sizes = {rel: int(ident.split()[0]) for rel, ident in tree.items()}
        total = sum(sizes.values())
        await self._preflight(dst, dp, total, label=self.params.dst)
        bd = book_dir(dp)
        results = []
        overall = _Overall(total=total, t0=time.monotonic())
        for i, rel in enumerate(sorted(tree)):
            size = sizes[rel]
            target = posixpath.join(dp, rel)
            book = _Book.under(bd, rel)
            rec = await self._record(dst, book) if rel in there else None
            if rec is not None and await self._current(src, posixpath.join(sp, rel), tree[rel],
                                                       dst, target, rec, size, did=there[rel]):
                # verified by an earlier run: a rerun skips it
                ctx.progress(f"file {i + 1}/{len(tree)}: {rel} already there, verified")
                results.append({"size": size, "sha256": rec.digest, "resumed_from": size,
                                "bytes_sent": 0})
            else:
                ctx.progress(f"file {i + 1}/{len(tree)}: {rel}")
                results.append(await self._one(
                    ctx, src, posixpath.join(sp, rel), dst, target, size, None, limit,
                    label=rel, overall=overall, book=book, src_id=tree[rel],
                    streams=self.params.streams))
            overall.done += size
            overall.sent += results[-1]["bytes_sent"]
        manifest = {"src": self.params.src, "files": [
            {"path": rel, "size": r["size"], "sha256": r["sha256"]}
            for rel, r in zip(sorted(tree), results)]}
        await dst.write_file(posixpath.join(bd, "manifest.json"),
                             strictjson.dumps(manifest, indent=1).encode())
        return {"files": len(results), "bytes": total,
                "bytes_sent": sum(r["bytes_sent"] for r in results)}

    async def _preflight(self, dst, dp, need: int, *, label: str) -> None:
        free = await dst.disk_free(posixpath.dirname(dst.path(dp)) or "/")
        if need > free:
            raise ActionFailed(
                f"relay: {label} needs {human(need)} but {dst.name} has {human(free)} free",
                hint=f"free space on {dst.name} (or relay somewhere else), then run it again")

    async def _one(self, ctx, src, sp, dst, dp, size, expected, limit, label=None,
                   overall: _Overall | None = None, *, book: _Book | None = None,
                   src_id: str | None = None, streams: int | None = None) -> dict:
        label = label or posixpath.basename(dp)
        book = book or _Book.beside(dp)
        f = _File(src, sp, dst, dp, size, expected, limit, label, book, overall, src_id, streams)
        try:
            return await self._copy(ctx, f)
        except OSError as exc:
            raise _os_failure(exc, label, dst, book) from None

    async def _copy(self, ctx, f: _File) -> dict:
        """Copy one file (resuming what an earlier run left), verify its sha256, and rename
        its ``.part`` into place; returns what the run's result says of it."""
        pst, layout, src_id = await _standing(f)
        f = dataclasses.replace(f, src_id=src_id)
        layout_written: asyncio.Future = asyncio.ensure_future(_noop())
        ranges, progress, resumable = _resumable(f, pst, layout)
        if not resumable:
            ranges, progress, layout, pst = await _new_layout(ctx, f, pst, layout)
            layout_written = asyncio.ensure_future(self._start_layout(f.dst, f.book, layout,
                                                                      ranges, progress))
        elif layout.get("mode") != "append":
            progress = await _verified(ctx, f.src, f.sp, f.dst, f.book, ranges,
                                       await _read_journals(f.dst, f.book, ranges), pst.size,
                                       f.label)
        mode = layout["mode"]
        resumed = sum(p - s for p, (s, _) in zip(progress, ranges))
        left = f.size - resumed
        try:
            await self._preflight(f.dst, f.dp, left, label=f.label)
            if resumed:
                ctx.progress(f"{f.label}: resuming at {human(resumed)} of {human(f.size)}"
                             + (f" ({len(ranges)} ranges)" if mode == "ranges" else ""))
            meter = _Meter(ctx, f.size, resumed, f.limit, f.label, f.overall)
            fresh_stream = mode == "append" and resumed == 0
            stream = hashlib.sha256() if fresh_stream else None
            reference = f.expected.lower() if f.expected else None
            src_hash = asyncio.ensure_future(
                _value(reference) if reference or fresh_stream else f.src.sha256(f.sp))
            try:
                if mode == "ranges":  # the prefix journals first: the writers append to them
                    await layout_written
                jobs = [(i, p, e) for i, (p, (_, e)) in enumerate(zip(progress, ranges)) if p < e]
                sent_digest = None
                if mode == "append" and not jobs and pst is None:
                    await f.dst.write_file(f.book.part, b"")  # an empty file
                if jobs:
                    sent_digest = await _send(ctx, f, jobs, mode, meter, stream, left)
                meter.report(final=True)
                await layout_written
                await _check_written(f)
                digests = await _digests(ctx, f, stream, sent_digest, reference, src_hash)
            finally:
                src_hash.cancel()
        finally:
            layout_written.cancel()
        _refuse_mismatch(f, digests, streamed=stream is not None)
        await _land(f, digests.src, layout)
        return {"size": f.size, "sha256": digests.src, "resumed_from": resumed,
                "bytes_sent": meter.sent, "streams": len(jobs) if jobs else 0}

    @staticmethod
    async def _start_layout(dst, book: _Book, layout: dict, ranges, progress) -> None:
        """Record a new copy's layout (and the journals of ranges an append prefix covers),
        and drop any verified-hash record of an older file at the destination."""
        await dst.remove(book.sums)
        await dst.write_file(book.state, strictjson.dumps(layout).encode())
        if layout["mode"] == "ranges":
            await asyncio.gather(*(dst.write_file(book.journal(i), f"{p}\n".encode())
                                   for i, (p, (s, _)) in enumerate(zip(progress, ranges))
                                   if p > s))


_SMALL = "a small file"


@dataclass(frozen=True)
class _File:
    """One file's copy: ``src:sp`` to ``dst:dp`` through the bookkeeping files of ``book``."""

    src: Any
    sp: str
    dst: Any
    dp: str
    size: int
    expected: str | None
    """The plan's sha256 of it (a single-file relay), or None."""
    limit: float | None
    """Bytes per second at most (``bwlimit``), or None."""
    label: str
    """Its name in progress and errors."""
    book: _Book
    overall: _Overall | None = None
    """The whole tree's progress (a directory relay), or None."""
    src_id: str | None = None
    """The source's identity (size, inode, mtime), when already known (a tree listing)."""
    streams: int | None = None
    """Streams asked for (``streams:``), or None: :func:`default_streams`."""


@dataclass(frozen=True)
class _Digests:
    """The two sha256s compared before a copy is renamed into place, and what each is of."""

    src: str
    dst: str
    src_what: str
    dst_what: str


async def _standing(f: _File) -> tuple[Any, dict | None, str]:
    """Where the copy stands: the ``.part``'s stat, the layout an earlier run recorded (or
    None), the source's identity. Refuses bookkeeping files that are links or directories."""
    dst, book = f.dst, f.book
    looked = await asyncio.gather(
        dst.lstat(book.part), dst.lstat(book.state), dst.lstat(book.sums),
        f.src.identity(f.sp) if f.src_id is None else _value(f.src_id))
    pst, sst_state, _ = looked[:3]
    src_id = looked[3]
    for path, st in zip((book.part, book.state, book.sums), looked[:3]):
        if st is not None and (st.is_link or st.is_dir):
            kind = "a symbolic link" if st.is_link else "a directory"
            raise ActionFailed(
                f"relay: {f.label}: {dst.name}:{dst.path(path)} is {kind}; specdeck writes "
                "its temporary files only as plain files, never through a link",
                hint=f"remove it on {dst.name} (`rm {shlex.quote(dst.path(path))}`) if it "
                     "is not yours, then run the item again")
    if src_id is None:
        raise ActionFailed(f"relay: source {f.src.name}:{f.sp} does not exist")
    layout = None
    if sst_state is not None:
        try:
            layout = json.loads(await dst.read_from(book.state, 0, 1 << 20))
        except ValueError:
            layout = None
    return pst, layout, src_id


def _resumable(f: _File, pst, layout: dict | None) -> tuple[list, list, bool]:
    """An earlier run's copy of this very source: its ranges and (an append) how far it got;
    ``([], [], False)`` when there is none to resume."""
    if (layout and pst is not None and layout.get("size") == f.size
            and layout.get("src") == f.src_id and _ranges_ok(layout.get("ranges"), f.size)):
        return layout["ranges"], [min(pst.size, f.size)], True
    return [], [], False


async def _new_layout(ctx, f: _File, pst, layout: dict | None):
    """A new copy's layout (what an outdated one left is cleared): one append stream, or
    ranges for parallel streams; a ``.part`` an append left (no layout) is kept. Returns
    ranges, progress, the layout and the ``.part``'s stat (None once cleared)."""
    size = f.size
    if layout is not None or (pst is not None and pst.size > size):
        if layout is not None and pst is not None:
            ctx.progress(f"{f.label}: the source changed since the partial copy: "
                         "starting over")
        await _clear(f.dst, f.book, layout, keep_sums=True)
        pst = None
    offset = pst.size if pst is not None else 0  # a .part from an append (no layout)
    n = f.streams or default_streams(size - offset)
    if n > 1 and size - offset >= BULK_MIN and await _bulk_unavailable(
            f.src, f.dst, size - offset) is None:
        ranges = split_ranges(size, n)
        progress = [min(max(offset, s), e) for s, e in ranges]
        layout = {"size": size, "src": f.src_id, "mode": "ranges", "ranges": ranges}
    else:
        ranges, progress = [[0, size]], [offset]
        layout = {"size": size, "src": f.src_id, "mode": "append", "ranges": ranges}
    return ranges, progress, layout, pst


async def _send(ctx, f: _File, jobs, mode: str, meter: _Meter, stream, left: int):
    """Move the missing bytes: the bulk data path when it can run, else in-process streams.
    Returns the digest the bulk path computed of a fresh stream (None otherwise)."""
    src, dst = f.src, f.dst
    why = await _bulk_unavailable(src, dst, left)
    sent_digest = None
    try:
        if why is None:
            try:
                sent_digest = await _pump_bulk(ctx, src, f.sp, dst, f.book, jobs,
                                               mode, meter, stream, f.label)
            except bulk.NotReady as exc:  # no byte moved: the other path
                why = str(exc)
        if why is not None:
            if why is not _SMALL:  # a small file's path is not news
                ctx.progress(f"{f.label}: data path: {src.name} -> specdeck -> "
                             f"{dst.name} in-process streams ({why})")
            await _pump(src, f.sp, dst, f.book, jobs, mode, meter, stream)
    except BaseException:  # cut, stopped or failed: where it got to, for the log
        meter.report(final=True)
        raise
    return sent_digest


async def _check_written(f: _File) -> None:
    """The ``.part`` has every byte, and the source did not change while it was copied."""
    got, after = await asyncio.gather(f.dst.stat(f.book.part), f.src.identity(f.sp))
    if got is None or got.size != f.size:
        raise ActionFailed(
            f"relay: {f.label}: wrote {got.size if got else 0} bytes of {f.size}",
            hint="run the item again; it resumes from the .part file")
    if after != f.src_id:
        rm = f"rm {shlex.quote(f.dst.path(f.book.part))}"
        raise ActionFailed(
            f"relay: {f.label}: {f.src.name}:{f.sp} changed while it was copied "
            f"(size, inode or mtime: {f.src_id} -> {after}); nothing was renamed",
            hint="the source changed while it was copied (is something still "
                 "writing it?): once it is complete, run the item again (the "
                 f"partial copy is discarded then; or remove it: {rm})")


async def _digests(ctx, f: _File, stream, sent_digest, reference, src_hash) -> _Digests:
    """The sha256s to compare: of the fresh stream (what was sent is what was written), or
    of the destination's whole file against the source's (or the plan's)."""
    src, dst = f.src, f.dst
    if stream is not None:
        ctx.progress(f"{f.label}: verifying sha256: the stream against the plan's"
                     if reference else
                     f"{f.label}: verified: sha256 of the bytes {src.name} sent, "
                     "which the destination wrote")
        h = sent_digest or stream.hexdigest()
        return _Digests(h, h, src.name, "the stream from it")
    ctx.progress(f"{f.label}: verifying sha256 of {dst.name}'s whole file "
                 f"against {'the plan' if reference else src.name}")
    h_src, h_dst = await asyncio.gather(src_hash, dst.sha256(f.book.part))
    return _Digests(h_src, h_dst, "the plan's sha256" if reference else src.name,
                    f"{dst.name}:{f.book.part}")


def _refuse_mismatch(f: _File, d: _Digests, *, streamed: bool) -> None:
    """Raise (nothing renamed) when the digests differ, or differ from the plan's."""
    expected = f.expected
    if d.src == d.dst and not (expected and expected.lower() != d.src):
        return
    rm = f"rm {shlex.quote(f.dst.path(f.book.part))}"
    if expected and expected.lower() != d.dst and streamed:
        hint = "the source differs from the plan's sha256: check which checkpoint you meant"
    elif streamed:
        hint = (f"the source changed while it was copied (is something still writing "
                f"it?): once it is complete, remove the partial copy ({rm}) and run "
                "the item again")
    else:
        hint = (f"the copy is corrupt (or the source is not the plan's file): remove "
                f"it ({rm}) and run the item again")
    raise ActionFailed(
        f"relay: {f.label}: sha256 mismatch: {d.src_what} has {d.src}, {d.dst_what} has "
        f"{d.dst}" + (f", plan expects {expected}" if expected else "") + "; nothing was renamed",
        hint=hint)


async def _land(f: _File, digest: str, layout: dict) -> None:
    """Rename the verified ``.part`` into place and record its hash (a rerun skips it)."""
    dst, book = f.dst, f.book
    if book.part != f.dp + ".part":
        await dst.makedirs(posixpath.dirname(f.dp))
    await dst.rename(book.part, f.dp)
    did = await dst.identity(f.dp)
    await asyncio.gather(dst.write_file(book.sums, _Record(digest, f.size, f.src_id, did).text()),
                         _clear(dst, book, layout, keep_sums=True, part=False))


async def _noop() -> None:
    return None


async def _value(v):
    return v


def _refuse_destination(src_is_dir: bool, dstat, dst_text: str) -> str | None:
    """Why the destination is refused before any byte moves (None: it is fine)."""
    if dst_text.endswith("/"):
        return (f"destination {dst_text} ends in '/': give the full path to write "
                "(the file's or the directory's own name)")
    if dstat is None:
        return None
    if not src_is_dir and dstat.is_dir:
        return (f"destination {dst_text} is an existing directory: give the full path of "
                f"the file to write (e.g. {dst_text.rstrip('/')}/NAME)")
    if src_is_dir and not dstat.is_dir:
        return f"destination {dst_text} is an existing file but the source is a directory"
    return None


def _ranges_ok(ranges, size: int) -> bool:
    if not isinstance(ranges, list) or not ranges:
        return False
    try:
        flat = [int(x) for r in ranges for x in r]
    except (TypeError, ValueError):
        return False
    return (all(len(r) == 2 for r in ranges) and flat[0] == 0 and flat[-1] == size
            and all(a <= b for a, b in zip(flat, flat[1:])))


async def _read_journals(dst, book: _Book, ranges) -> list[int]:
    """Each range's resume point: the last whole line of its journal, within the range."""
    raws = await asyncio.gather(*(dst.read_from(book.journal(i), 0, 1 << 20)
                                  for i in range(len(ranges))))
    out = []
    for raw, (s, e) in zip(raws, ranges):
        done = s
        for line in raw.decode(errors="replace").split("\n")[:-1]:  # whole lines only
            if line.strip().isdigit() and s <= int(line) <= e:
                done = max(done, int(line))
        out.append(done)
    return out


async def _range_sha(host, path: str, start: int, length: int) -> str | None:
    """sha256 of ``length`` bytes of ``path`` from ``start``, computed on the host."""
    res = await host.run(f"dd if={shlex.quote(host.path(path))} bs=1M iflag=skip_bytes,"
                         f"count_bytes skip={int(start)} count={int(length)} status=none "
                         "| sha256sum")
    words = res.stdout.split()
    return words[0] if res.ok and words else None


async def _verified(ctx, src, sp, dst, book: _Book, ranges, journaled: list[int],
                    part_size: int, label: str) -> list[int]:
    """Each range's resume point, checked against the data: a journal line can survive a
    crash its bytes did not (the journal and the data are flushed apart). A claim past the
    end of ``.part`` is cut back to it, and the last journaled chunk of each range is hashed
    on both hosts; one that differs (a hole the crash left) steps back a chunk at a time
    until the bytes match. So a rerun re-sends what is missing and completes, instead of
    failing on a short ``.part`` or a final hash mismatch every time."""
    async def one(i: int, s: int, e: int, p: int) -> int:
        q = min(p, max(s, part_size))
        if q < p:
            ctx.progress(f"{label}: range {i}'s journal claims byte {p:,}, the .part holds "
                         f"{max(part_size - s, 0):,} bytes of it: cut back to {q:,}")
        while q > s:
            b = s + (q - s - 1) // JOURNAL_CHUNK * JOURNAL_CHUNK
            got = await asyncio.gather(_range_sha(src, sp, b, q - b),
                                       _range_sha(dst, book.part, b, q - b))
            if got[0] is not None and got[0] == got[1]:
                break
            ctx.progress(f"{label}: range {i}: bytes {b:,}..{q:,} on {dst.name} differ from "
                         "the source (lost in a crash?): re-sending them")
            q = b
        if q < p:  # the journal says no more than is there (a later kill resumes from it)
            await dst.write_file(book.journal(i), f"{q}\n".encode())
        return q

    return list(await asyncio.gather(*(one(i, s, e, p) for i, ((s, e), p)
                                       in enumerate(zip(ranges, journaled)))))


async def _clear(dst, book: _Book, layout: dict | None, *, keep_sums: bool,
                 part: bool = True) -> None:
    """Remove a copy's temporaries (the .part unless ``part`` is False)."""
    n = len(layout.get("ranges") or []) if isinstance(layout, dict) else 0
    paths = [book.state, *(book.journal(i) for i in range(max(n, 1)))]
    if part:
        paths.append(book.part)
    if not keep_sums:
        paths.append(book.sums)
    await asyncio.gather(*(dst.remove(p) for p in paths))


def _os_failure(exc: OSError, label: str, dst, book: _Book) -> ActionFailed:
    """A clear failure for a file-system error during a copy (the .part is kept)."""
    part = f"{dst.name}:{dst.path(book.part)}"
    if exc.errno == errno.ENOSPC:
        return ActionFailed(
            f"relay: {label}: {dst.name} ran out of disk space while writing {part}; "
            "what landed is kept",
            hint=f"free space on {dst.name}, then run the item again: it resumes from the "
                 ".part file")
    if exc.errno == errno.ELOOP:
        return ActionFailed(
            f"relay: {label}: a temporary file on {dst.name} is a symbolic link: {exc.strerror}",
            hint="remove that link if it is not yours, then run the item again")
    what = exc.strerror or str(exc)
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) not in what else ""
    return ActionFailed(f"relay: {label}: {what}{where}",
                        hint="fix the cause, then run the item again: it resumes from the "
                             ".part file")


async def _bulk_unavailable(src, dst, left: int) -> str | None:
    """None when the bytes can take the descriptor path (:mod:`core.hosts.bulk`), else why
    they go through the in-process asyncio streams (asyncssh channels for an SSH host).
    ``SPECDECK_RELAY_PATH`` = ``bulk`` / ``asyncssh``
    forces a path (tests, benchmarks); by default files under BULK_MIN stay on the open
    connection, as two ssh logins would cost more than they save."""
    forced = os.environ.get("SPECDECK_RELAY_PATH", "auto")
    if forced == "asyncssh":
        return "SPECDECK_RELAY_PATH=asyncssh"
    if forced != "bulk" and left < BULK_MIN:
        return _SMALL
    for host, why in zip((src, dst), await asyncio.gather(src.bulk_ready(), dst.bulk_ready())):
        if why is not None:
            return f"{host.name}: {why}"
    return None


async def _open_pair(src, sp, dst, book: _Book, job, mode: str):
    """One stream's two ends: the source from the range's resume point, the destination
    appending (one stream) or writing the range in place with its journal."""
    i, start, end = job
    reader = await src.open_bulk(sp, offset=start, length=end - start)
    try:
        if mode == "append":
            writer = await dst.open_bulk(book.part, write=True)
        else:
            writer = await dst.open_bulk_range(book.part, book.journal(i), start, end,
                                               JOURNAL_CHUNK)
    except BaseException:
        await reader.close_quietly()
        raise
    return reader, writer


async def _pump_bulk(ctx, src, sp, dst, book: _Book, jobs, mode: str, meter: _Meter, stream,
                     label) -> str | None:
    """Move each stream's bytes in a thread of its own between two descriptor ends (ssh
    client processes or local files); this loop reports progress and handles cancellation
    and failures (one stream failing stops them all: what landed is journaled). Returns
    the sha256 a lone source computed of what it sent (else ``stream`` saw the bytes)."""
    opened = await asyncio.gather(*(_open_pair(src, sp, dst, book, j, mode) for j in jobs),
                                  return_exceptions=True)
    failed = [o for o in opened if isinstance(o, BaseException)]
    pairs = [o for o in opened if not isinstance(o, BaseException)]
    if not failed:  # every login proven before a byte moves
        ups = await asyncio.gather(*(e.ready() for p in pairs for e in p),
                                   return_exceptions=True)
        failed = [u for u in ups if isinstance(u, BaseException)]
    if failed:
        for r, w in pairs:
            await r.close_quietly()
            await w.close_quietly()
        raise next((f for f in failed if isinstance(f, bulk.NotReady)), failed[0])
    r0, w0 = pairs[0]
    ctx.progress(f"{label}: data path: {src.name} ({r0.describe}) -> specdeck -> "
                 f"{dst.name} ({w0.describe})"
                 + (f", {len(pairs)} range streams" if len(pairs) > 1 else ""))
    sents = [[0] for _ in pairs]
    stopping = [False]
    pacer = bulk.Pacer(meter.limit)
    # A source that hashes what it sends (mode h) leaves the pump nothing to read: splice.
    hashed_at_source = len(pairs) == 1 and r0.mode == "h"
    update = stream.update if stream is not None and not hashed_at_source else None
    threads = [bulk.in_background_thread(
        lambda r=r, w=w, s=s, j=j: bulk.pump(
            r, w, chunk=bulk.BLOCK, update=update, sent=s, stop=lambda: stopping[0],
            pace=pacer.add, limit=j[2] - j[1]))
        for (r, w), s, j in zip(pairs, sents, jobs)]

    def tick() -> None:
        per = [s[0] for s in sents]
        meter.set_sent(sum(per), per)

    def stop_all() -> None:
        stopping[0] = True
        for r, w in pairs:
            r.abort()
            w.abort()

    try:
        pending = set(threads)
        while pending:
            done, pending = await asyncio.wait(pending, timeout=0.5,
                                               return_when=asyncio.FIRST_EXCEPTION)
            tick()
            if any(t.exception() is not None for t in done):
                break
    except BaseException:  # cancelled (a stop, ctrl-c): unblock the threads, then leave
        stop_all()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.gather(*threads, return_exceptions=True), 10)
        tick()
        for r, w in pairs:
            await r.close_quietly()
            await w.close_quietly()
        raise
    broken = [t for t in threads if t.done() and t.exception() is not None]
    if broken:
        stop_all()
        await asyncio.gather(*threads, return_exceptions=True)
    tick()
    # Finish every end (what landed is flushed and journaled) and say what failed first:
    # an end's own error (dd's stderr, a lost connection) explains more than a broken pipe.
    errors: list[BaseException] = []
    for (r, w), s, j, t in zip(pairs, sents, jobs, threads):
        for end in (r, w) if not broken else (w, r):
            try:
                await end.finish()
            except BaseException as exc:  # noqa: BLE001 - collected, the first re-raised
                errors.append(exc)
    if errors:  # the cause first: a full disk or a refused link, then a lost host
        first = next((e for e in errors if isinstance(e, OSError)
                      and e.errno in (errno.ENOSPC, errno.ELOOP)), None)
        first = first or next((e for e in errors if isinstance(e, HostUnreachable)), errors[0])
        raise first
    if broken:
        exc = broken[0].exception()
        if isinstance(exc, OSError) and exc.errno not in (errno.EPIPE, errno.ECONNRESET):
            raise exc  # a local file's own error (a full disk): said as such by _one
        raise ActionFailed(f"relay: {label}: writing to {dst.name} failed: {exc}",
                           hint="run the item again; it resumes from what landed")
    for s, (_, start, end) in zip(sents, jobs):
        if s[0] != end - start:
            raise ActionFailed(
                f"relay: {label}: {src.name} sent {s[0]} bytes of the {end - start} asked "
                f"for (from byte {start}): is the file being rewritten?",
                hint="run the item again once the source is complete")
    if hashed_at_source:
        sent = r0.sent_sha256()
        if sent is None or sent[1] != jobs[0][2] - jobs[0][1]:
            raise ActionFailed(f"relay: {label}: {src.name} did not report the sha256 of "
                               f"what it sent ({sent})", hint="run the item again")
        return sent[0]
    return None


async def _pump(src, sp, dst, book: _Book, jobs, mode: str, meter: _Meter, stream=None) -> None:
    """The asyncio path: each range in turn, a reader and a writer task with a bounded
    queue between them (a range's journal is written once the range is whole)."""
    for i, start, end in jobs:
        q: asyncio.Queue = asyncio.Queue(maxsize=DEPTH)
        if mode == "append":
            writer = await dst.open_writer(book.part, append=True)
        else:
            writer = await dst.open_writer(book.part, append=False, offset=start)

        async def read(start=start, end=end) -> None:
            try:
                async for chunk in src.open_reader(sp, start, chunk_size=CHUNK,
                                                   length=end - start):
                    await q.put(chunk)
            finally:
                await q.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                chunk = await q.get()
                if chunk is None:
                    break
                if stream is not None:
                    stream.update(chunk)
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
        if mode != "append":
            await dst.write_file(book.journal(i), f"{end}\n".encode())


async def _list_tree(host, path: str) -> dict[str, str]:
    """Relative path -> identity (``size inode device mtime``) of every regular file under
    ``path``, whatever its name (empty when ``path`` is missing)."""
    q = shlex.quote(host.path(path))
    res = await host.run(f"cd {q} 2>/dev/null || exit 0\n"
                         "find . -type f -printf '%P\\0%s %i %D %T@\\0'", check=True)
    fields = res.stdout.split("\0")  # NUL: the one byte no name holds (not even a newline)
    return {rel: ident for rel, ident in zip(fields[0::2], fields[1::2]) if rel}


__all__ = ["Relay", "RelayParams", "parse_rate", "HostUnreachable"]


class _QuietCtx:
    def progress(self, message: str, **fields) -> None:
        pass


async def copy_verified(src, sp: str, dst, dp: str) -> str:
    """Copy one file between hosts through specdeck (resumable, sha256-verified); its hash."""
    st = await src.stat(sp)
    if st is None:
        raise ActionFailed(f"{sp} does not exist on {src.name} (was the checkpoint deleted "
                           "before it could be copied?)")
    size = st.size
    return (await Relay(RelayParams(src=f"{src.name}:{sp}", dst=f"{dst.name}:{dp}"))._one(
        _QuietCtx(), src, sp, dst, dp, size, None, None))["sha256"]
