"""Faults and hostile set-ups around relay integrity (issue 16, class 4).

Each case runs the real CLI (``python -m console.cli``) against real sshd hosts on 127.0.0.x or
local hosts, and asserts the outcome: exit status, the message, files untouched.

* a symbolic link at any temporary name is refused, the file it points to untouched;
* ``check()`` never calls a destination current on its size alone: a source rewritten with
  new bytes of the same size is copied again, while an unchanged one is not even re-hashed;
* a directory relay copies every file whatever its name, and adds nothing to the tree;
* a destination that is an existing directory, or ends in ``/``, is refused before any byte;
* a full disk mid-copy fails with a clear message, keeps ``.part``, and the rerun resumes;
* an ``ssh`` client that cannot log in falls back to the asyncssh streams, saying why.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from core.state.store import Store
from tests.conftest import run_cli
from tests.fault.conftest import tmpfs
from tests.integration.conftest import sshd_available, sshd_factory, ssh_home  # noqa: F401

MB = 1 << 20


def make_file(path: Path, size: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plan_file(tmp_path: Path, src: str, dst: str, *, hosts=None, **params) -> Path:
    hosts = hosts or {"kpro6": {"local": True, "workdir": str(tmp_path / "A")},
                      "ct129": {"local": True, "workdir": str(tmp_path / "B")}}
    p = tmp_path / "relay.yaml"
    p.write_text(json.dumps({"name": "relay", "hosts": hosts, "items": [
        {"id": "copy", "content": "relay", "action": {"kind": "relay", "params": {
            "src": f"kpro6:{src}", "dst": f"ct129:{dst}", **params}}}]}))
    return p


@pytest.fixture
def ssh_hosts(sshd_factory, tmp_path):  # noqa: F811
    a, b = sshd_factory(2)
    return {"kpro6": {"ssh": a.alias, "workdir": str(tmp_path / "A")},
            "ct129": {"ssh": b.alias, "workdir": str(tmp_path / "B")}}


def cli(plan: Path, tmp_path: Path, *args, env=None, timeout=180):
    res = run_cli(*(args or ("run", plan, "copy")), env={
        "SPECDECK_STATE": str(tmp_path / "s.db"), **(env or {})}, timeout=timeout)
    assert "Traceback" not in res.stderr, res.stderr
    return res


@pytest.mark.parametrize("name,streams", [(".part", 1), (".part.ranges", 1), (".sha256", 1),
                                          (".part.r1", 2)])
def test_fault_symlink_at_a_temporary_name_is_refused(ssh_hosts, tmp_path, name, streams):
    make_file(tmp_path / "A" / "ckpt.pt", 40 * MB)
    victim = tmp_path / "victim.txt"
    victim.write_text("the operator's notes\n")
    (tmp_path / "B").mkdir()
    (tmp_path / "B" / f"ckpt.pt{name}").symlink_to(victim)
    plan = plan_file(tmp_path, "ckpt.pt", "ckpt.pt", hosts=ssh_hosts, streams=streams)
    res = cli(plan, tmp_path)
    assert res.returncode == 1, res.stderr
    assert "symbolic link" in res.stderr and f"ckpt.pt{name}" in res.stderr, res.stderr
    assert victim.read_text() == "the operator's notes\n"
    assert (tmp_path / "B" / f"ckpt.pt{name}").is_symlink()
    assert not (tmp_path / "B" / "ckpt.pt").exists()
    assert Store(tmp_path / "s.db").latest_run("copy").state == "failed"


def test_fault_same_size_rewrite_is_copied_again_and_unchanged_is_not_rehashed(
        tmp_path, monkeypatch):
    """check() on local hosts, counting the hashes it asks for."""
    import asyncio

    from core.hosts.local import LocalHost
    from core.plans.planfile import parse_plan
    from core.runs.runner import Runner

    make_file(tmp_path / "A" / "step.pt", 3 * MB)
    plan_path = plan_file(tmp_path, "step.pt", "step.pt")
    plan = parse_plan(plan_path.read_text())
    store = Store(tmp_path / "s.db")
    hashed: list[str] = []
    real = LocalHost.sha256

    async def counting(self, path):
        hashed.append(f"{self.name}:{path}")
        return await real(self, path)

    monkeypatch.setattr(LocalHost, "sha256", counting)

    async def again() -> str:
        store.set_status("copy", "pending")
        runner = Runner(plan, store)
        try:
            return await runner.run_item(plan.item("copy"))
        finally:
            await runner.close()

    assert asyncio.run(again()) == "done"
    first_run = store.latest_run("copy").id
    hashed.clear()
    assert asyncio.run(again()) == "done"
    assert store.latest_run("copy").id == first_run  # check said done: no new run
    assert hashed == []  # both identities as recorded: nothing re-read
    # the trainer writes the next checkpoint over it: same size, new bytes
    new = make_file(tmp_path / "A" / "step.pt", 3 * MB)
    assert asyncio.run(again()) == "done"
    assert store.latest_run("copy").id != first_run  # copied again
    assert sha(tmp_path / "B" / "step.pt") == new
    # touched, same bytes: re-hashed (the source), found equal, not copied
    second_run = store.latest_run("copy").id
    os.utime(tmp_path / "A" / "step.pt", (time.time() + 5, time.time() + 5))
    hashed.clear()
    assert asyncio.run(again()) == "done"
    assert store.latest_run("copy").id == second_run
    assert hashed == ["kpro6:step.pt"]


def test_fault_directory_relay_copies_every_name_and_adds_nothing(ssh_hosts, tmp_path):
    model = tmp_path / "A" / "model"
    names = ["w.bin", "w.bin.part", "w.bin.sha256", "w.bin.part.ranges", "w.bin.part.r0",
             ".specdeck-relay.json", "manifest.json", "sub/x.tmp.1234", "model.specdeck-relay"]
    digests = {n: make_file(model / n, 1000 + i) for i, n in enumerate(names)}
    plan = plan_file(tmp_path, "model", "out/model", hosts=ssh_hosts)
    res = cli(plan, tmp_path)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "B" / "out" / "model"
    got = {str(p.relative_to(out)): sha(p) for p in out.rglob("*") if p.is_file()}
    assert got == digests
    assert sorted(p.name for p in (tmp_path / "B" / "out").iterdir()) == [
        "model", "model.specdeck-relay"]
    cli(plan, tmp_path, "mark", plan, "copy", "pending")
    res = cli(plan, tmp_path)
    assert res.returncode == 0 and f"all {len(names)} files, verified" in res.stderr


def test_fault_destination_directory_or_trailing_slash_is_refused(ssh_hosts, tmp_path):
    make_file(tmp_path / "A" / "ckpt.pt", 40 * MB)
    (tmp_path / "B" / "ckpt").mkdir(parents=True)
    (tmp_path / "B" / "ckpt" / "keep.txt").write_text("keep")
    plan = plan_file(tmp_path, "ckpt.pt", "ckpt", hosts=ssh_hosts)
    res = cli(plan, tmp_path)
    assert res.returncode == 1, res.stderr
    assert "is an existing directory" in res.stderr and "full path" in res.stderr
    assert sorted(p.name for p in (tmp_path / "B").rglob("*")) == ["ckpt", "keep.txt"]
    plan = plan_file(tmp_path, "ckpt.pt", "ckpt/", hosts=ssh_hosts)
    for args in (("validate", plan), ("run", plan, "copy")):
        res = cli(plan, tmp_path, *args)
        assert res.returncode == 2, res.stderr
        assert "ends in '/'" in res.stderr and "dst" in res.stderr
    assert sorted(p.name for p in (tmp_path / "B").rglob("*")) == ["ckpt", "keep.txt"]


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB tmpfs as the destination's workdir (needs the right to mount)."""
    with tmpfs(tmp_path / "B", "64m") as mnt:
        yield mnt


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_fault_full_disk_mid_copy_fails_clearly_and_resumes(small_disk, tmp_path, request, kind):
    """Something else fills the disk while the relay writes: the item fails naming the
    host and the full disk, .part keeps what landed, and once space is freed the rerun
    resumes from it."""
    hosts = request.getfixturevalue("ssh_hosts") if kind == "ssh" else None
    size = 48 * MB
    digest = make_file(tmp_path / "A" / "ckpt.pt", size)
    plan = plan_file(tmp_path, "ckpt.pt", "ckpt.pt", hosts=hosts, bwlimit="24M")
    part = small_disk / "ckpt.pt.part"
    filler = small_disk / "other-job.bin"

    def fill() -> None:
        while not (part.exists() and part.stat().st_size >= 8 * MB):
            time.sleep(0.02)
        try:
            with filler.open("wb", buffering=0) as f:  # another job fills the disk
                while True:
                    f.write(b"\0" * MB)
        except OSError:
            pass

    t = threading.Thread(target=fill, daemon=True)
    t.start()
    res = cli(plan, tmp_path)
    t.join(10)
    assert res.returncode == 1, res.stderr
    assert "ct129 ran out of disk space" in res.stderr and "ckpt.pt.part" in res.stderr, res.stderr
    assert "free space on ct129" in res.stderr
    have = part.stat().st_size
    assert 8 * MB <= have < size
    assert (tmp_path / "A" / "ckpt.pt").read_bytes()[:have] == part.read_bytes()
    filler.unlink()
    res = cli(plan, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "resuming at" in res.stderr
    assert sha(small_disk / "ckpt.pt") == digest


def test_fault_ssh_client_that_cannot_log_in_falls_back_to_asyncssh(ssh_hosts, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text("#!/bin/sh\necho 'Permission denied (publickey).' >&2\nexit 255\n")
    (fake / "ssh").chmod(0o755)
    digest = make_file(tmp_path / "A" / "ckpt.pt", 40 * MB)
    plan = plan_file(tmp_path, "ckpt.pt", "ckpt.pt", hosts=ssh_hosts)
    res = cli(plan, tmp_path, env={"PATH": f"{fake}:{os.environ['PATH']}"})
    assert res.returncode == 0, res.stderr
    assert "in-process streams (kpro6: the ssh client did not log in (Permission denied" in (
        res.stderr) or "in-process streams (ct129: the ssh client did not log in" in res.stderr
    assert sha(tmp_path / "B" / "ckpt.pt") == digest


def test_fault_local_record_write_never_follows_a_planted_temporary_link(tmp_path):
    """The relay's small records (hash, layout, journals) go through write_file's temporary
    name, predictable on a local host: a link planted there is replaced, not written
    through."""
    import asyncio

    from core.hosts.local import LocalHost

    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / "B").mkdir()
    target = tmp_path / "B" / "ckpt.pt.sha256"
    Path(f"{target}.tmp.{os.getpid()}").symlink_to(victim)
    b = LocalHost("b", workdir=str(tmp_path / "B"))
    asyncio.run(b.write_file("ckpt.pt.sha256", b"record\n"))
    assert victim.read_text() == "keep"
    assert target.read_text() == "record\n" and not target.is_symlink()
