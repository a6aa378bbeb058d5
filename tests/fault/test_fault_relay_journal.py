"""Class 6 (issue 28): a relay's range journal is checked against the data. A journal line
that survived a crash its bytes did not (a claim past the end of ``.part``, or a hole inside
it) is cut back to what is on disk, re-verified against the source, and the rerun completes;
the source is untouched and no temporary is left. Over real sshd and over local hosts."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest

from tests.fault.test_fault_relay import MB, cli, make_file, plan_file, sha
from tests.integration.conftest import sshd_available, sshd_factory, ssh_home  # noqa: F401

SIZE = 4 * MB
RANGES = [[i * MB, (i + 1) * MB] for i in range(4)]


def _plant(tmp_path, src_id: str, how: str) -> None:
    src = (tmp_path / "A" / "w.bin").read_bytes()
    b = tmp_path / "B"
    b.mkdir(parents=True, exist_ok=True)
    (b / "w.bin.part.ranges").write_text(json.dumps(
        {"size": SIZE, "src": src_id, "mode": "ranges", "ranges": RANGES}))
    for i, (_, e) in enumerate(RANGES):
        (b / f"w.bin.part.r{i}").write_text(f"{e}\n")  # every range "done"
    if how == "short":  # the last 1.5 ranges never reached the disk
        part = src[:2 * MB + MB // 2]
    else:  # range 1's second half is a hole (zeros), the file has its full length
        part = src[:MB + MB // 2] + bytes(MB // 2) + src[2 * MB:]
    (b / "w.bin.part").write_bytes(part)


@pytest.fixture(params=["local", "ssh"])
def hosts(request, tmp_path):
    if request.param == "local":
        return None
    a, b = request.getfixturevalue("sshd_factory")(2)
    return {"kpro6": {"ssh": a.alias, "workdir": str(tmp_path / "A")},
            "ct129": {"ssh": b.alias, "workdir": str(tmp_path / "B")}}


@pytest.mark.parametrize("how", ["short", "hole"])
def test_fault_journal_claiming_more_than_the_part_is_cut_back(tmp_path, hosts, how):
    digest = make_file(tmp_path / "A" / "w.bin", SIZE)
    plan = plan_file(tmp_path, "w.bin", "w.bin", hosts=hosts, streams=4)
    # the identity the relay records for its source (core.hosts.base.Host.identity)
    src_id = subprocess.run(["find", "-L", str(tmp_path / "A" / "w.bin"), "-maxdepth", "0",
                             "-printf", "%s %i %D %T@\n"], capture_output=True, text=True,
                            check=True).stdout.strip()
    _plant(tmp_path, src_id, how)
    res = cli(plan, tmp_path)
    assert res.returncode == 0, res.stderr
    if how == "short":
        assert "journal claims byte" in res.stderr and "cut back" in res.stderr, res.stderr
    else:
        assert "differ from the source" in res.stderr, res.stderr
    assert "resuming at" in res.stderr, res.stderr
    assert sha(tmp_path / "B" / "w.bin") == digest == sha(tmp_path / "A" / "w.bin")
    assert sorted(p.name for p in (tmp_path / "B").iterdir()) == ["w.bin", "w.bin.sha256"]
    con = sqlite3.connect(tmp_path / "s.db")
    state, result = con.execute("SELECT state, result FROM runs").fetchone()
    con.close()
    assert state == "succeeded"
    result = json.loads(result)
    resent = {"short": SIZE - (2 * MB + MB // 2), "hole": MB}[how]
    assert result["bytes_sent"] == resent, result  # only what was missing is sent again
    assert result["resumed_from"] == SIZE - resent
