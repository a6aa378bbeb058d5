"""relay vs the plain OpenSSH pipe, timed as the user meets them: whole commands, same file.

Two sshd hosts on loopback (127.0.0.2 = the training host, 127.0.0.3 = the eval host) and
one file (1 GB by default). Each repeat times, interleaved, the whole of:

* ``pipe``: ``ssh A cat f | ssh B 'cat > f'`` (the user's ssh defaults, no verification, no
  fsync);
* ``relay 1``: ``python -m console.cli run PLAN copy`` of one relay item with ``streams: 1``
  (interpreter start-up, connections, check, copy, sha256 verification, fsync, rename);
* ``relay N``: the same with ``streams: N`` (4 by default).

Prints each repeat's MB/s, then per variant the median and the ratio relay/pipe (pipe time
divided by relay time: above 1.0 the relay is faster), and the CPU seconds of every process
involved (the sshd servers are restarted around each run so their sessions are counted):
on a busy shared machine the CPU ratio is the steadier figure. Goal (issue 22): 1-stream
ratio >= 1.0 on a 2-CPU machine. See NOTE below for the N-stream figure.

Run: .venv/bin/python bench/relay.py [--size-mb 1024] [--repeats 3] [--streams 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._sshd import ssh_argv, sshd_hosts  # noqa: E402

NOTE = """\
note: on loopback both hosts, both sshd, every ssh client and specdeck share this machine's
CPUs. One stream already keeps 2 CPUs busy (4 cipher passes per byte: sshd and ssh on each
side), so N streams here only add processes and per-stream set-up (2N logins, N journals,
the destination's whole-file hash after the copy): on 2 CPUs the N-stream ratio measures
that overhead, not the link. Between real hosts each sshd runs on its own machine and the
console carries the 2 ssh clients per stream. Measured here, an ssh client spends about
1.1 CPU-s per GiB with AES-GCM (about 0.57 s per 512 MiB each), so one core caps one stream
near 0.9 GB/s (about 7 Gbps), below a 10 Gbps link (1.25 GB/s). On a 16-core console 4
streams (8 clients, 4 cores at line rate) should reach the link, about 1.1-1.2 GB/s, ~1.4x
one stream; what is left is the destination's disk and its whole-file hash of .part after
the copy (about 2 GB/s with SHA extensions: ~9 s for a 17 GB checkpoint)."""


def make_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        block = os.urandom(16 << 20)
        for i in range(size // len(block)):
            f.write(block[i % 7:] + block[: i % 7])  # distinct blocks, cheap to make
        f.write(os.urandom(size % len(block)))


def relay_once(tmp: Path, a: str, b: str, streams: int, tag: str) -> float:
    plan = tmp / f"relay-{tag}.yaml"
    plan.write_text(json.dumps({
        "name": "bench",
        "hosts": {"A": {"ssh": a, "workdir": str(tmp / "A")},
                  "B": {"ssh": b, "workdir": str(tmp / "B")}},
        "items": [{"id": "copy", "content": "relay", "action": {"kind": "relay", "params": {
            "src": "A:big.bin", "dst": f"B:relay-{tag}.bin", "streams": streams}}}]}))
    state = tmp / f"state-{tag}.db"
    env = {**os.environ, "SPECDECK_STATE": str(state), "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "console.cli", "run", str(plan), "copy"], env=env,
                         capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"relay failed:\n{res.stderr}")
    for p in (tmp / "B").glob(f"relay-{tag}.bin*"):
        p.unlink()
    state.unlink()
    return dt


def pipe_once(tmp: Path, a: str, b: str, tag: str) -> float:
    src = shlex.join(ssh_argv(tmp, a) + ["cat", str(tmp / "A" / "big.bin")])
    out = tmp / "B" / f"pipe-{tag}.bin"
    dst = shlex.join(ssh_argv(tmp, b) + [f"cat > {shlex.quote(str(out))}"])
    t0 = time.perf_counter()
    subprocess.run(f"{src} | {dst}", shell=True, check=True)
    dt = time.perf_counter() - t0
    out.unlink()
    return dt


def measured(servers, fn, *args) -> tuple[float, float]:
    """(wall s, CPU s of every process involved): the sshd servers are restarted around the
    run, so their sessions' CPU (ciphers, dd/cat) is reaped into this process's children
    usage along with the ssh clients' and specdeck's. On a shared, busy machine the CPU
    seconds are the steadier figure."""
    for s in servers:
        s.stop()
        s.start()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    dt = fn(*args)
    for s in servers:
        s.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    for s in servers:
        s.start()
    return dt, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--streams", type=int, default=4)
    args = ap.parse_args()
    size = args.size_mb << 20
    with sshd_hosts(2) as (servers, tmp):
        a, b = servers[0].alias, servers[1].alias
        make_file(tmp / "A" / "big.bin", size)
        (tmp / "B").mkdir()
        names = ["pipe", "relay 1", f"relay {args.streams}"]
        runs = {
            "pipe": lambda i: pipe_once(tmp, a, b, str(i)),
            "relay 1": lambda i: relay_once(tmp, a, b, 1, f"1-{i}"),
            f"relay {args.streams}": lambda i: relay_once(tmp, a, b, args.streams, f"n-{i}"),
        }
        wall: dict[str, list[float]] = {k: [] for k in names}
        cpu: dict[str, list[float]] = {k: [] for k in names}
        for i in range(args.repeats):
            for k in names:
                dt, c = measured(servers, runs[k], i)
                wall[k].append(dt)
                cpu[k].append(c)
            print(f"repeat {i + 1}: " + "   ".join(
                f"{k} {size / wall[k][-1] / 1e6:6.1f} MB/s ({wall[k][-1]:.2f} s, "
                f"cpu {cpu[k][-1]:.2f} s)" for k in names), flush=True)
        pipe = statistics.median(wall["pipe"])
        pipe_cpu = statistics.median(cpu["pipe"])
        print(f"medians over {args.repeats} ({args.size_mb} MiB file, loopback, "
              f"{os.cpu_count()} CPUs, whole commands; cpu = CPU seconds of every process "
              "involved, both sshd included):")
        for k in names:
            med, mc = statistics.median(wall[k]), statistics.median(cpu[k])
            ratio = "" if k == "pipe" else (f"   ratio relay/pipe = {pipe / med:.2f}"
                                            f"   cpu ratio pipe/relay = {pipe_cpu / mc:.2f}")
            print(f"  {k:8s} {size / med / 1e6:6.1f} MB/s  {med:.2f} s  cpu {mc:.2f} s{ratio}")
        print(NOTE)

if __name__ == "__main__":
    main()
