"""One behavioural suite for every Host implementation, plus what only SSH can do.

The shared tests are parametrised over :class:`LocalHost` and :class:`SSHHost` (a real
OpenSSH sshd on 127.0.0.x) and make the same assertions on both, so the two stay
interchangeable for the runner. The SSH-only tests cover ``~/.ssh/config`` (aliases,
User, IdentityFile, ProxyJump), ssh-agent keys, host key refusal (unknown, changed, changed
while reconnecting), transport errors versus command errors, dropping and regaining the
connection (a reset, a silent network caught by the keepalive), and channel multiplexing
on one connection. Waits are bounded and event-driven (status listeners) wherever the code
under test offers an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import time

import pytest

from core.errors import HostKeyRejected, HostUnreachable, InvalidInput, RemoteCommandFailed
from core.hosts.base import Host, HostState, HostStatus
from core.hosts.local import LocalHost

pytestmark = pytest.mark.integration


# -- fixtures and helpers ----------------------------------------------------------------
@pytest.fixture
async def local_host(ssh_home, tmp_path):
    host = LocalHost("local", workdir=str(tmp_path / "local-wd"),
                     env={"SPECDECK_HOST_VAR": "from host"})
    await host.connect()
    yield host
    await host.close()


@pytest.fixture(params=["local", "ssh"])
def host(request) -> Host:
    """The same suite runs against LocalHost and against SSHHost over a real sshd."""
    return request.getfixturevalue("local_host" if request.param == "local" else "ssh_host")


def make_ssh_host(target: str, tmp_path, **kwargs):
    from core.hosts.ssh import SSHHost

    kwargs.setdefault("connect_timeout", 5.0)
    return SSHHost("remote", target=target, workdir=str(tmp_path / "remote-wd"), **kwargs)


async def wait_for_state(host: Host, *states: HostState, timeout: float) -> HostStatus:
    """Wait (bounded) until the host reports one of ``states`` through on_status."""
    reached = asyncio.Event()
    host.on_status(lambda _name, status: reached.set() if status.state in states else None)
    if host.status.state not in states:
        await asyncio.wait_for(reached.wait(), timeout)
    return host.status


def processes_running(argv: list[str]) -> list[int]:
    """PIDs whose command line is exactly ``argv`` (read from /proc: every test host,
    sshd included, runs on this machine)."""
    want = ("\0".join(argv) + "\0").encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read() == want:
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


async def gone(argv: list[str], timeout: float = 5.0) -> bool:
    """Whether no process runs ``argv`` within ``timeout`` seconds.

    A killed process takes a moment to vanish and nothing signals that, so this polls,
    bounded.
    """
    deadline = time.monotonic() + timeout
    while processes_running(argv):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


# -- commands ----------------------------------------------------------------------------
async def test_run_returns_a_record(host):
    res = await host.run("echo out; echo err >&2; exit 3")
    assert (res.host, res.command) == (host.name, "echo out; echo err >&2; exit 3")
    assert (res.exit_status, res.signal, res.ok) == (3, None, False)
    assert (res.stdout, res.stderr) == ("out\n", "err\n")
    assert (await host.run(["true"])).ok


async def test_check_raises_remote_command_failed_with_context(host):
    with pytest.raises(RemoteCommandFailed) as info:
        await host.run("echo first >&2; echo boom >&2; exit 7", check=True)
    exc = info.value
    assert (exc.host, exc.remote_status) == (host.name, 7)
    assert exc.command == "echo first >&2; echo boom >&2; exit 7"
    assert "boom" in str(exc) and "exit status 7" in str(exc)


async def test_killed_command_reports_its_signal(host):
    res = await host.run("kill -9 $$")
    assert (res.exit_status, res.signal) == (None, "KILL")


async def test_list_arguments_reach_the_command_literally(host):
    hostile = ["'; touch x #", "$(touch y)", "`touch w`", "two words", 'q"uo\'te',
               "new\nline", "*", "$HOME", "-n"]
    res = await host.run(["printf", "%s\\0", *hostile], check=True)
    assert res.stdout.split("\0")[:-1] == hostile
    for name in ("x", "y", "w"):
        assert await host.stat(name) is None


async def test_env_layers_over_host_env_and_is_quoted(host):
    value = "it's $(touch z) `touch z` \"q\" \n end"
    res = await host.run('printf "%s|%s" "$SPECDECK_HOST_VAR" "$V"', env={"V": value},
                         check=True)
    assert res.stdout == f"from host|{value}"
    res = await host.run('printf "%s" "$SPECDECK_HOST_VAR"',
                         env={"SPECDECK_HOST_VAR": "override"}, check=True)
    assert res.stdout == "override"
    assert await host.stat("z") is None


async def test_cwd_defaults_to_workdir_and_is_created(host):
    assert (await host.run("pwd", check=True)).stdout.strip() == host.path(".")
    res = await host.run("pwd", cwd="sub/dir with space", check=True)
    assert res.stdout.strip() == host.path("sub/dir with space")
    assert (await host.stat("sub/dir with space")).is_dir


async def test_input_is_fed_and_stdin_is_otherwise_empty(host):
    res = await host.run("cat", input="héllo\nworld\n".encode(), check=True)
    assert res.stdout == "héllo\nworld\n"
    res = await host.run("wc -c", input=b"\x00\x01\xff" * 1000, check=True)
    assert res.stdout.strip() == "3000"
    # No input: stdin is at EOF at once, so a reading command does not hang.
    assert (await host.run("cat", timeout=10)).stdout == ""


async def test_timeout_raises_and_kills_the_whole_command(host):
    secs = f"30.{secrets.randbelow(10**6):06d}"
    start = time.monotonic()
    assert not processes_running(["sleep", secs])
    with pytest.raises(TimeoutError):
        await host.run(f"sleep {secs} & sleep {secs}; wait", timeout=0.5)
    assert time.monotonic() - start < 8
    assert await gone(["sleep", secs])  # the background child died too


# -- files -------------------------------------------------------------------------------
async def test_write_read_stat_listdir(host):
    data = os.urandom(100_000)
    await host.write_file("a/b/c.bin", data)
    assert await host.read_file("a/b/c.bin") == data
    st = await host.stat("a/b/c.bin")
    assert (st.path, st.size, st.is_dir) == (host.path("a/b/c.bin"), len(data), False)
    assert st.mtime > 0
    assert (await host.stat("a/b")).is_dir
    assert await host.stat("a/missing") is None

    await host.write_file("a/b/c.bin", b"new", mode=0o600)
    assert await host.read_file("a/b/c.bin") == b"new"
    assert await host.listdir("a/b") == ["c.bin"]  # no temporary file left behind
    perms = await host.run(["stat", "-c", "%a", host.path("a/b/c.bin")], check=True)
    assert perms.stdout.strip() == "600"

    await host.write_file("a/b/a.txt", b"")
    assert await host.listdir("a/b") == ["a.txt", "c.bin"]
    assert await host.read_file("a/b/a.txt") == b""
    with pytest.raises(FileNotFoundError):
        await host.read_file("a/nope")
    with pytest.raises(FileNotFoundError):
        await host.listdir("nope")


async def test_makedirs_rename_remove(host):
    await host.makedirs("d/e/f")
    await host.makedirs("d/e/f")
    assert (await host.stat("d/e/f")).is_dir
    await host.write_file("d/x", b"x")
    await host.write_file("d/y", b"old y")
    await host.rename("d/x", "d/y")
    assert await host.stat("d/x") is None
    assert await host.read_file("d/y") == b"x"
    with pytest.raises(FileNotFoundError):
        await host.rename("d/missing", "d/z")
    await host.remove("d/y")
    assert await host.stat("d/y") is None
    await host.remove("d/y")  # already gone: no error
    await host.remove("d", recursive=True)
    assert await host.stat("d") is None


async def test_read_from_offsets(host):
    data = bytes(range(256)) * 4
    await host.write_file("r.bin", data)
    assert await host.read_from("r.bin", 0, 10) == data[:10]
    assert await host.read_from("r.bin", 1000, 100) == data[1000:]
    assert await host.read_from("r.bin", 1024, 10) == b""
    assert await host.read_from("r.bin", 5000, 10) == b""
    assert await host.read_from("missing.bin", 0, 10) == b""


async def test_read_from_a_growing_file_never_invents_bytes(host):
    """A live log grows while it is read: every read is a prefix of the final file, never
    padded with NULs (asyncssh's parallel SFTP blocks did that when a block came back short
    and a later one had data)."""
    import threading

    path = host.path("grow.log")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()
    done = threading.Event()
    reads, have = [], 0

    def writer() -> None:
        with open(path, "ab", buffering=0) as f:
            for i in range(120):
                if i % 30 == 0:  # the reader reads while the file grows, however loaded the machine
                    deadline = time.monotonic() + 60
                    while len(reads) <= i // 30 and time.monotonic() < deadline:
                        time.sleep(0.01)
                f.write(bytes([65 + i % 26]) * (1 << 20))  # big writes, as a 1 MB log line
                time.sleep(0.001)
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    while not done.is_set():  # as the log follower does: from the end of what it has
        got = await host.read_from("grow.log", have, 8 << 20)
        reads.append((have, got))
        have += len(got)
    t.join()
    final = open(path, "rb").read()
    assert len(reads) > 3
    for at, got in reads:
        assert b"\0" not in got and final[at:at + len(got)] == got


async def test_stream_writer_and_reader_roundtrip(host):
    data = os.urandom(3 * 1024 * 1024 + 123)
    writer = await host.open_writer("s/big.bin", append=False)
    for i in range(0, len(data), 200_000):
        await writer.write(data[i:i + 200_000])
    await writer.close()
    assert await host.sha256("s/big.bin") == hashlib.sha256(data).hexdigest()

    chunks = [c async for c in host.open_reader("s/big.bin", chunk_size=1 << 20)]
    assert b"".join(chunks) == data
    assert max(len(c) for c in chunks) <= 1 << 20
    tail = b"".join([c async for c in host.open_reader("s/big.bin", offset=12345)])
    assert tail == data[12345:]
    assert [c async for c in host.open_reader("s/big.bin", offset=len(data))] == []
    assert [c async for c in host.open_reader("s/big.bin", offset=len(data) + 9)] == []

    more = os.urandom(500_000)
    writer = await host.open_writer("s/big.bin", append=True)
    await writer.write(more)
    await writer.close()
    assert await host.sha256("s/big.bin") == hashlib.sha256(data + more).hexdigest()

    writer = await host.open_writer("s/big.bin", append=False)  # truncates
    await writer.write(b"short")
    await writer.close()
    assert await host.read_file("s/big.bin") == b"short"

    with pytest.raises(FileNotFoundError):
        async for _ in host.open_reader("s/missing.bin"):
            pass


async def test_reader_stopped_early_frees_its_stream(host):
    await host.write_file("e.bin", os.urandom(3 << 20))
    for _ in range(10):  # more than SSHHost.max_channels: a leaked channel would block
        async with contextlib.aclosing(host.open_reader("e.bin", chunk_size=1 << 20)) as it:
            async for chunk in it:
                assert len(chunk) == 1 << 20
                break
    assert (await asyncio.wait_for(host.run("echo free"), 10)).stdout == "free\n"


async def test_disk_free_and_sha256(host):
    assert await host.disk_free(".") > 0
    assert await host.disk_free("not/yet/created/file.bin") > 0
    await host.write_file("h.txt", b"hash me")
    assert await host.sha256("h.txt") == hashlib.sha256(b"hash me").hexdigest()


# -- SSH only ----------------------------------------------------------------------------
def test_parse_target():
    from core.hosts.ssh import parse_target

    assert parse_target("gpu1") == ("gpu1", None, None)
    assert parse_target("me@gpu1") == ("gpu1", None, "me")
    assert parse_target("me@10.0.0.5:2222") == ("10.0.0.5", 2222, "me")
    assert parse_target("[::1]:2222") == ("::1", 2222, None)
    assert parse_target("::1") == ("::1", None, None)
    with pytest.raises(InvalidInput):
        parse_target("gpu1:ssh")


async def test_alias_resolves_through_ssh_config(ssh_host, sshd, ssh_home, tmp_path):
    # sshd0 is only an alias: HostName, Port, User and a non-default IdentityFile all come
    # from ~/.ssh/config in the isolated HOME.
    assert ssh_host.status.state is HostState.CONNECTED
    res = await ssh_host.run('echo "$SSH_CONNECTION"; id -un', check=True)
    conn_line, user = res.stdout.split("\n")[:2]
    assert conn_line.split()[2:] == [sshd.address, str(sshd.port)]
    assert user == sshd.user
    assert ssh_host.home == str(sshd.remote_home)  # detected at connect

    # The User line is honoured: a wrong one fails authentication (transport, not command).
    ssh_home.add_alias("wronguser", hostname=sshd.address, port=sshd.port,
                       user="specdeck-nobody")
    bad = make_ssh_host("wronguser", tmp_path)
    with pytest.raises(HostUnreachable) as info:
        await bad.connect()
    assert not isinstance(info.value, HostKeyRejected)
    assert "specdeck-nobody@" in str(info.value) and "authentication" in str(info.value)
    assert bad.status.state is HostState.UNREACHABLE

    # user@host:port works too (the identity comes from a Host pattern block).
    with ssh_home.config_path.open("a") as f:
        f.write(f"Host 127.0.0.*\n    IdentityFile {ssh_home.identity}\n")
    direct = make_ssh_host(f"{sshd.user}@{sshd.address}:{sshd.port}", tmp_path)
    async with direct:
        assert (await direct.run("echo ok", check=True)).stdout == "ok\n"


async def test_agent_keys_are_used_when_ssh_auth_sock_is_set(sshd, ssh_home, tmp_path,
                                                            request):
    from tests.integration.sshd import keygen

    agent_key = keygen(tmp_path / "agent_only_key")
    with sshd.authorized_keys.open("a") as f:
        f.write((tmp_path / "agent_only_key.pub").read_text())
    ssh_home.add_alias("via-agent", hostname=sshd.address, port=sshd.port, user=sshd.user,
                       identity=None)
    # No key file can log in to via-agent: it names none, and no ~/.ssh/id_* exists.
    with pytest.raises(HostUnreachable):
        await make_ssh_host("via-agent", tmp_path).connect()
    agent = request.getfixturevalue("ssh_agent")
    agent.add(agent_key)
    agent_key.unlink()  # only the agent holds it now
    async with make_ssh_host("via-agent", tmp_path) as host:
        assert (await host.run("echo agent", check=True)).stdout == "agent\n"


async def test_unknown_host_key_is_refused_with_a_trust_hint(sshd_factory, tmp_path):
    server = sshd_factory(1, trust=False)[0]
    host = make_ssh_host(server.alias, tmp_path)
    with pytest.raises(HostKeyRejected) as info:
        await host.connect()
    text = str(info.value)
    assert server.fingerprint() in text
    assert f"ssh-keyscan -t ed25519 -p {server.port} {server.address} >> " in text
    assert f"ssh {server.alias}" in text
    assert host.status.state is HostState.UNREACHABLE
    with pytest.raises(HostKeyRejected):
        await host.run("true")  # operations never slip past the check


async def test_changed_host_key_is_refused_loudly(sshd_factory, ssh_home, tmp_path):
    server = sshd_factory(1, trust=False)[0]
    ssh_home.trust("[127.0.0.9]:22 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvZzU4mQpXhG4rJqQ1"
                   "UE3VvD2k6gYcA4l0t8V2QmJ3x")
    ssh_home.trust("# a comment")
    old_key = server.root / "old_key"
    from tests.integration.sshd import fingerprint, keygen

    keygen(old_key)
    old_pub = " ".join(old_key.with_name("old_key.pub").read_text().split()[:2])
    lineno = ssh_home.trust(f"[{server.address}]:{server.port} {old_pub}")
    host = make_ssh_host(server.alias, tmp_path)
    with pytest.raises(HostKeyRejected) as info:
        await host.connect()
    text = str(info.value)
    assert "CHANGED" in text and "man-in-the-middle" in text
    assert f"known_hosts:{lineno}" in text
    assert server.fingerprint() in text
    assert fingerprint(old_key.with_name("old_key.pub")) in text


async def test_reconnect_refuses_a_host_key_changed_meanwhile(ssh_host, sshd):
    sshd.stop()
    sshd.regenerate_host_key()
    sshd.start()
    status = await wait_for_state(ssh_host, HostState.UNREACHABLE, timeout=15)
    assert "CHANGED" in status.reason and sshd.fingerprint() in status.reason
    with pytest.raises(HostUnreachable):
        await ssh_host.run("true")


async def test_connection_refused_is_host_unreachable(sshd, tmp_path):
    sshd.stop()
    host = make_ssh_host(sshd.alias, tmp_path)
    with pytest.raises(HostUnreachable) as info:
        await host.connect()
    assert "refused" in info.value.reason
    assert not isinstance(info.value, HostKeyRejected)
    with pytest.raises(HostUnreachable):
        await host.run("true")  # never a RemoteCommandFailed or a CommandResult
    assert host.status.state is HostState.UNREACHABLE


async def test_drop_then_reconnect_by_itself(ssh_host, sshd):
    seen: list[HostStatus] = []
    ssh_host.on_status(lambda _name, status: seen.append(status))
    in_flight = asyncio.create_task(ssh_host.run("sleep 30"))
    await asyncio.wait_for(ssh_host.run("true"), 5)  # the sleep's channel is open by now

    sshd.stop()
    status = await wait_for_state(ssh_host, HostState.RECONNECTING, HostState.UNREACHABLE,
                                  timeout=10)
    assert status.reason
    with pytest.raises(HostUnreachable):
        await asyncio.wait_for(in_flight, 10)  # lost mid-command: transport error
    with pytest.raises(HostUnreachable):
        await ssh_host.run("true")  # waits a bounded time while the host is down
    assert ssh_host.status.state in (HostState.RECONNECTING, HostState.UNREACHABLE)

    sshd.start()
    await wait_for_state(ssh_host, HostState.CONNECTED, timeout=20)
    assert (await ssh_host.run("echo back", check=True)).stdout == "back\n"
    await ssh_host.write_file("after.txt", b"sftp reopened")
    assert await ssh_host.read_file("after.txt") == b"sftp reopened"
    states = [s.state for s in seen]
    assert states[0] is HostState.RECONNECTING and states[-1] is HostState.CONNECTED
    assert ssh_host.connection_count == 2


async def test_operation_waits_for_a_reconnect_in_progress(ssh_host, sshd):
    sshd.stop()
    await wait_for_state(ssh_host, HostState.RECONNECTING, HostState.UNREACHABLE, timeout=10)
    sshd.start()
    # Issued while the host is still disconnected: waits for the reconnect, then runs.
    assert (await ssh_host.run("echo waited", check=True)).stdout == "waited\n"
    assert ssh_host.status.state is HostState.CONNECTED


async def test_silent_drop_is_noticed_by_keepalive(sshd, tmp_path):
    host = make_ssh_host(sshd.alias, tmp_path, keepalive_interval=0.5, connect_timeout=2.0)
    async with host:
        sshd.pause()  # no reset, no FIN: only the keepalive can tell
        try:
            status = await wait_for_state(host, HostState.RECONNECTING,
                                          HostState.UNREACHABLE, timeout=10)
        finally:
            sshd.resume()
        assert status.reason
        await wait_for_state(host, HostState.CONNECTED, timeout=20)
        assert (await host.run("echo ok", check=True)).stdout == "ok\n"


async def test_proxy_jump_from_ssh_config(sshd_factory, ssh_home, tmp_path):
    jump, target = sshd_factory(2)
    ssh_home.add_alias("behind-jump", hostname=target.address, port=target.port,
                       user=target.user, proxy_jump=jump.alias)
    host = make_ssh_host("behind-jump", tmp_path)
    async with host:
        res = await host.run('echo "$SSH_CONNECTION"', check=True)
        assert res.stdout.split()[2:] == [target.address, str(target.port)]
    jump.stop()  # the target is still up, but only reachable through the jump host
    with pytest.raises(HostUnreachable):
        await make_ssh_host("behind-jump", tmp_path).connect()


async def test_concurrent_operations_share_one_connection(ssh_host, sshd):
    # More concurrent commands than OpenSSH's MaxSessions (10): they queue for channels.
    results = await asyncio.gather(
        *(ssh_host.run(f'sleep 0.2; echo "$SSH_CONNECTION" {i}', check=True) for i in range(24)),
        *(ssh_host.write_file(f"c/{i}.txt", str(i).encode()) for i in range(8)))
    lines = [r.stdout.split() for r in results[:24]]
    assert {tuple(line[:4]) for line in lines} == {tuple(lines[0][:4])}
    assert sorted(int(line[4]) for line in lines) == list(range(24))
    assert ssh_host.connection_count == 1
    assert sshd.log.count("Accepted publickey") == 1


async def test_noisy_login_scripts_do_not_break_the_session(sshd, tmp_path):
    # Login scripts that print are common on real hosts (module systems, banners).
    (sshd.remote_home / ".bashrc").write_text("echo rc-noise; echo rc-noise >&2\n")
    host = make_ssh_host(sshd.alias, tmp_path)
    async with host:
        assert host.home == str(sshd.remote_home)
        res = await host.run("echo hi >&2; exit 4")
        assert res.exit_status == 4
        # Debian's bash sources ~/.bashrc for ssh commands; the PID marker is stripped.
        assert res.stderr in ("rc-noise\nhi\n", "hi\n")
        with pytest.raises(TimeoutError):
            await host.run("sleep 30", timeout=0.3)


async def test_invalid_env_name_is_rejected(ssh_host):
    with pytest.raises(InvalidInput):
        await ssh_host.run("true", env={"BAD NAME; touch x": "1"})
