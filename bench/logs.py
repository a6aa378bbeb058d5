"""Log streaming over loopback SSH into the store: throughput and latency.

1. Throughput: a finished run's 400,000-line log is drained from the host into the store
   by ``core.capsules.jobs.follow`` (lines/s), against a baseline measured in the same run: a plain
   ``ssh host cat log`` of the same file (lines/s of the transfer alone).
2. Latency: a run writes a line carrying its wall-clock time every 10 ms for 5 s while the
   follower polls; latency = arrival in the store - time written (median and p95).

Goal (issue 3): >= 50k lines/s, median < 250 ms.
Run: .venv/bin/python bench/logs.py
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._sshd import ssh_argv, sshd_hosts  # noqa: E402
from core.capsules import jobs
from core.actions.base import Launch  # noqa: E402
from core.hosts.ssh import SSHHost  # noqa: E402
from core.state.store import Store  # noqa: E402

N = 400_000


async def main() -> None:
    with sshd_hosts(1) as (servers, tmp):
        host = SSHHost("bench", target=servers[0].alias, workdir=str(tmp / "remote"))
        await host.connect()
        store = Store(Path(tempfile.mkdtemp()) / "s.db")

        # -- throughput ------------------------------------------------------------------
        store.claim_run("tp", "tp", "shell", "bench", owner="bench")
        gen = f"seq 1 {N} | sed 's/.*/{{\"step\": &, \"loss\": 0.5, \"note\": \"padding\"}}/'"
        info = await jobs.start(host, "tp", Launch(gen))
        store.update_run("tp", state="running", capsule=info.capsule)
        while (await jobs.inspect(host, info.capsule)).state == "running":
            await asyncio.sleep(0.05)
        size = (await host.stat(f"{info['capsule']}/log")).size
        t0 = time.perf_counter()
        await jobs.follow(host, store, "tp", info.capsule)
        dt = time.perf_counter() - t0
        lines = store.run("tp").log_lines
        assert lines == N, lines
        t0 = time.perf_counter()
        subprocess.run(ssh_argv(tmp, servers[0].alias) + ["cat", f"{info['capsule']}/log"], check=True,
                       stdout=subprocess.DEVNULL)
        base = time.perf_counter() - t0
        print(f"throughput: {N:,} lines ({size / 1e6:.1f} MB, each a JSON metric line) "
              f"into the store in {dt:.2f} s = {N / dt:,.0f} lines/s "
              f"(metrics parsed: {len(store.metric_series('tp', 'loss')):,})")
        print(f"baseline  : ssh cat of the same log {base:.2f} s = {N / base:,.0f} lines/s; "
              f"ratio specdeck/ssh-cat = {base / dt:.2f}x of its speed")

        # -- latency ---------------------------------------------------------------------
        store.claim_run("lat", "lat", "shell", "bench", owner="bench")
        writer = ("python3 -c 'import time,sys\n"
                  "for i in range(500):\n"
                  "    print(repr(time.time()), flush=True); time.sleep(0.01)'")
        info = await jobs.start(host, "lat", Launch(writer))
        store.update_run("lat", state="running", capsule=info.capsule)
        lat: list[float] = []

        def on_lines(ls):
            now = time.time()
            lat.extend(now - float(x) for x in ls if x.strip())

        await jobs.follow(host, store, "lat", info.capsule, on_lines=on_lines, poll=0.1)
        lat.sort()
        med = statistics.median(lat)
        p95 = lat[int(0.95 * (len(lat) - 1))]
        print(f"latency   : {len(lat)} lines, host write -> store: median {med * 1000:.0f} ms, "
              f"p95 {p95 * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms (poll interval 100 ms)")
        ok = N / dt >= 50_000 and med < 0.25
        print(f"goal (>= 50k lines/s, median < 250 ms): {'met' if ok else 'NOT met'}")
        await host.close()


if __name__ == "__main__":
    asyncio.run(main())
