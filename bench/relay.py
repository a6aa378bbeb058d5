"""relay vs the OpenSSH pipe, on loopback, same 1 GB file, same run.

Two sshd hosts (127.0.0.2 = the training host, 127.0.0.3 = the eval host). Each repeat copies
the file A -> B once with specdeck's relay (streamed through this process, sha256 of the
stream compared with the destination's file) and once with ``ssh A cat f | ssh B 'cat > f'``
(no verification), three repeats each, interleaved. Prints MB/s of each and the ratio
relay/pipe. For context it also times the same pipe with the cipher the relay asks for
(``-o Ciphers=^aes128-gcm@openssh.com``), which is not the goal's baseline.

Goal (issue 4): ratio >= 1.5, at least >= 1.0.
Run: .venv/bin/python bench/relay.py [--size-mb 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._sshd import ssh_argv, sshd_hosts  # noqa: E402
from core.events import Progress  # noqa: E402
from core.plan import parse_plan  # noqa: E402
from core.runner import Runner  # noqa: E402
from core.store import Store  # noqa: E402


def make_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        block = os.urandom(16 << 20)
        for i in range(size // len(block)):
            f.write(block[i % 7:] + block[: i % 7])  # distinct blocks, cheap to make
        f.write(os.urandom(size % len(block)))


async def relay_once(tmp: Path, a: str, b: str, i: int) -> float:
    plan_text = f"""
name: bench
hosts:
  A: {{ssh: {a}, workdir: {tmp / 'A'}}}
  B: {{ssh: {b}, workdir: {tmp / 'B'}}}
items:
  - {{id: copy, content: relay, action: {{kind: relay, params: {{src: "A:big.bin", dst: "B:relay-{i}.bin"}}}}}}
"""
    plan = parse_plan(plan_text)
    store = Store(":memory:")

    def emit(ev) -> None:
        if isinstance(ev, Progress) and "data path" in ev.message and i == 0:
            print("  " + ev.message, flush=True)

    runner = Runner(plan, store, emit=emit)
    await runner.host("A")
    await runner.host("B")
    t0 = time.perf_counter()
    status = await runner.run_item(plan.item("copy"))
    dt = time.perf_counter() - t0
    assert status == "done", store.latest_run("copy")["error"]
    await runner.close()
    (tmp / "B" / f"relay-{i}.bin").unlink()
    return dt


def pipe_once(tmp: Path, a: str, b: str, i: int, cipher: list[str] = []) -> float:
    src = shlex.join(ssh_argv(tmp, a)[:-1] + cipher + [a, "cat", str(tmp / "A" / "big.bin")])
    dst = shlex.join(ssh_argv(tmp, b)[:-1] + cipher
                     + [b, f"cat > {shlex.quote(str(tmp / 'B' / f'pipe-{i}.bin'))}"])
    t0 = time.perf_counter()
    subprocess.run(f"{src} | {dst}", shell=True, check=True)
    dt = time.perf_counter() - t0
    (tmp / "B" / f"pipe-{i}.bin").unlink()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    size = args.size_mb << 20
    with sshd_hosts(2) as (servers, tmp):
        a, b = servers[0].alias, servers[1].alias
        make_file(tmp / "A" / "big.bin", size)
        (tmp / "B").mkdir()
        relay, pipe, pipe_aes = [], [], []
        aes = ["-o", "Ciphers=^aes128-gcm@openssh.com"]
        for i in range(args.repeats):
            pipe.append(pipe_once(tmp, a, b, i))
            relay.append(asyncio.run(relay_once(tmp, a, b, i)))
            pipe_aes.append(pipe_once(tmp, a, b, i, aes))
            print(f"repeat {i + 1}: pipe {size / pipe[-1] / 1e6:7.1f} MB/s   "
                  f"relay {size / relay[-1] / 1e6:7.1f} MB/s (sha256 verified)   "
                  f"[pipe with aes128-gcm {size / pipe_aes[-1] / 1e6:7.1f} MB/s]", flush=True)
        p, r, pa = statistics.median(pipe), statistics.median(relay), statistics.median(pipe_aes)
        print(f"median over {args.repeats}: pipe {size / p / 1e6:.1f} MB/s, relay "
              f"{size / r / 1e6:.1f} MB/s, ratio relay/pipe = {p / r:.2f} "
              f"({args.size_mb} MB file, loopback, {os.cpu_count()} CPUs); "
              f"context: relay / pipe-with-aes128-gcm = {pa / r:.2f}")


if __name__ == "__main__":
    main()
