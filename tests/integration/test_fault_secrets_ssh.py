"""Class 9: a host's env values never reach a process list. Over a real sshd, a token in
the host's ``env`` is read by the command, yet no process on the machine (the login shell
sshd starts, the command, a detached capsule) has it in its argv."""

from __future__ import annotations

import asyncio
import os
import secrets
import stat
from pathlib import Path

import pytest

from core.capsules import jobs
from core.actions.base import Launch

pytestmark = pytest.mark.integration


def _argv_holding(needle: str) -> list[str]:
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if needle.encode() in argv:
            found.append(argv.replace(b"\0", b" ").decode("utf-8", "replace"))
    return found


async def _watch_ps(needle: str, stop: asyncio.Event, seen: list[str]) -> None:
    while not stop.is_set():
        seen.extend(_argv_holding(needle))
        await asyncio.sleep(0.01)


async def test_env_values_travel_outside_argv(sshd, tmp_path):
    from core.hosts.ssh import SSHHost

    token = "tok-" + secrets.token_hex(12)
    host = SSHHost("remote", target=sshd.alias, workdir=str(tmp_path / "wd"),
                   env={"SOME_TOKEN_NAME": token, "PLAIN": "x y"}, connect_timeout=5.0)
    await host.connect()
    stop, seen = asyncio.Event(), []
    watcher = asyncio.create_task(_watch_ps(token, stop, seen))
    try:
        res = await host.run('sleep 0.5; printf "%s|%s" "$SOME_TOKEN_NAME" "$PLAIN"',
                             check=True)
        assert res.stdout == f"{token}|x y"
        # stdin given by the caller still arrives whole after the environment
        res = await host.run("cat", input=b"payload\n", env={"EXTRA": token}, check=True)
        assert res.stdout == "payload\n"
        # a detached capsule: the value sits in a file only its owner reads, never in argv
        info = await jobs.start(host, "r1", Launch('sleep 0.5; echo "$SOME_TOKEN_NAME"'))
        st = await jobs.inspect(host, info.capsule)
        while st.state == "running":
            await asyncio.sleep(0.1)
            st = await jobs.inspect(host, info.capsule)
        assert (await host.read_file(f"{info.capsule}/log")).decode().strip() == token
        mode = os.stat(f"{info.capsule}/cmd.sh").st_mode
        assert not mode & (stat.S_IRWXG | stat.S_IRWXO)
    finally:
        stop.set()
        await watcher
        await host.close()
    assert seen == [], seen[:3]
