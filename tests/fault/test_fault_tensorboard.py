"""Class 3 of issue 28: TensorBoard framing. A record larger than one read is skipped and
reported (the scalars after it are read); a length past the file's end is reported as
corrupt, once, naming the file, when the run has ended or the file stopped growing (and not
before: a torn record that is then completed is read); a bad checksum keeps every good
record before it, and the message says what was kept. The run ends as its command does;
the event files are never written."""

from __future__ import annotations

import asyncio
import json
import math
import struct
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.hosts.local import LocalHost
from core.capsules.metrics_sources import TB_READ, TensorBoardSource, frame
from core.state.store import Store
from tests.fault.conftest import cli, digest, local_plan, rows


def _record(data: bytes, *, good_crc: bool = True) -> bytes:
    from tensorboardX.record_writer import masked_crc32c

    head = struct.pack("<Q", len(data))
    crc = masked_crc32c(data) ^ (0 if good_crc else 1)
    return head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", crc)


def _scalar(step: int, value: float, tag: str = "loss") -> bytes:
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary

    ev = Event(wall_time=1000.0 + step, step=step,
               summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)]))
    return _record(ev.SerializeToString())


def _torn_header(length: int) -> bytes:
    from tensorboardX.record_writer import masked_crc32c

    head = struct.pack("<Q", length)
    return head + struct.pack("<I", masked_crc32c(head)) + b"partial"


CASES = {
    # name: (file bytes, steps kept, words of the one message)
    "bad-crc": (b"".join(_scalar(s, s / 10) for s in (1, 2, 3))
                + _record(_scalar(4, 0.4)[12:-4], good_crc=False) + _scalar(5, 0.5),
                [1, 2, 3], ("unreadable event file", "corrupt record at byte",
                            "kept every record before byte")),
    "bad-header": (_scalar(1, 0.1) + b"\x00" * 8 + b"\xff" * 8 + _scalar(2, 0.2), [1],
                   ("corrupt record header at byte", "kept every record before byte")),
    "not-an-event": (_scalar(1, 0.1) + _record(b"\xff" * 40) + _scalar(2, 0.2), [1],
                     ("is not an Event", "kept every record before byte")),
    "length-past-end": (_scalar(1, 0.1) + _scalar(2, 0.2) + _torn_header(10 ** 9), [1, 2],
                        ("corrupt event file", "claims 1,000,000,000 bytes",
                         "the run has ended")),
    "huge-length": (_scalar(1, 0.1) + _torn_header(2 ** 64 - 1), [1],
                    ("corrupt event file", "claims", "the run has ended")),
    "torn-header": (_scalar(1, 0.1) + b"\x05\x00\x00", [1],
                    ("corrupt event file", "has no whole header")),
    "oversized": (_scalar(1, 0.1) + _record(b"\x00" * (TB_READ + 1024)) + _scalar(2, 0.2),
                  [1, 2], ("skipped a record of", "more than one read")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_event_file_framing_faults_are_told_once_and_good_records_kept(tmp_path, case):
    data, steps, words = CASES[case]
    staged = tmp_path / "staged"
    staged.write_bytes(data)
    wd = tmp_path / "wd"
    script = tmp_path / "writer.py"
    # the whole file appears at once (renamed into place), then the run goes on a moment
    script.write_text("import os, sys, time\nos.makedirs('tb', exist_ok=True)\n"
                      "os.rename(sys.argv[1], 'tb/events.out.tfevents.1.host')\n"
                      "print('wrote', flush=True)\ntime.sleep(0.3)\n")
    plan = local_plan(tmp_path, f"""  - id: tb
    content: writes a faulty event file
    action:
      kind: shell
      host: here
      params: {{command: {json.dumps(f"{sys.executable} {script} {staged}")},
                metrics: {{tensorboard: tb}}}}
""")
    db = tmp_path / "s.db"
    res = cli("--state", db, "run", plan, "tb", timeout=180)
    assert res.returncode == 0, res.stderr
    assert rows(db, "SELECT state, exit_code, log_lines FROM runs") == [("succeeded", 0, 1)]
    assert cli("--state", db, "logs", plan, "tb").stdout == "wrote\n"
    assert [s for s, in rows(db, "SELECT step FROM metrics ORDER BY step")] == steps
    events = wd / "tb" / "events.out.tfevents.1.host"
    notes = rows(db, "SELECT message FROM events WHERE kind = 'metrics_dropped'")
    assert len(notes) == 1, notes
    (msg,) = notes[0]
    assert str(events) in msg and all(w in msg for w in words), msg
    assert res.stderr.count(str(events)) == 1, res.stderr  # told once
    assert events.read_bytes() == data  # never written
    # a second look (attach, a restart) tells nothing again
    assert cli("--state", db, "attach", plan).returncode == 0
    assert len(rows(db, "SELECT 1 FROM events WHERE kind = 'metrics_dropped'")) == 1


@pytest.fixture
def source(tmp_path):
    store = Store(tmp_path / "s.db")
    store.claim_run("r", "tb", "shell", "here", owner="t")
    host = LocalHost("here", workdir=str(tmp_path))
    (tmp_path / "tb").mkdir()
    src = TensorBoardSource(host, store, "r", "tb")
    return src, store, tmp_path / "tb" / "events.out.tfevents.1"


async def test_a_torn_record_that_is_completed_is_read_not_reported(source):
    src, store, f = source
    whole = _scalar(1, 0.1) + _scalar(2, 0.2)
    f.write_bytes(whole[:-7])  # the writer is mid-record
    assert await src.poll() == 1
    assert src.errors == [] and store.events(kinds=["metrics_dropped"]) == []
    f.write_bytes(whole)
    assert await src.poll(final=True) == 1
    assert [p.step for p in store.metric_rows("r")] == [1, 2]
    assert store.events(kinds=["metrics_dropped"]) == []


async def test_a_file_that_stopped_growing_with_a_torn_record_is_reported_once(source):
    src, store, f = source
    src.stale_s = 0.0  # (600 s in use: longer than any writer's flush interval)
    f.write_bytes(_scalar(1, 0.1) + _torn_header(4096))
    digest_before = digest(f)
    assert await src.poll() == 1
    assert await src.poll() == 0
    (ev,) = store.events(kinds=["metrics_dropped"])
    assert "has not grown for" in ev.message and str(f) in ev.message
    assert len(src.errors) == 1
    again = TensorBoardSource(src.host, store, "r", "tb", stale_s=0.0)
    await again.poll()
    assert again.errors == [] and len(store.events(kinds=["metrics_dropped"])) == 1
    assert digest(f) == digest_before


def test_frame_keeps_good_records_before_a_bad_one():
    good = _scalar(1, 0.1) + _scalar(2, 0.2)
    f = frame(good + _record(b"x" * 10, good_crc=False) + _scalar(3, 0.3), "w", base=100)
    assert len(f.records) == 2 and f.used == len(good)
    assert f.error == f"w: corrupt record at byte {100 + len(good)}"
    t = frame(good + _torn_header(10 ** 12))
    assert t.used == len(good) and t.need == 10 ** 12 + 16 and t.error is None


_value = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                   st.sampled_from([float("nan"), float("inf"), -float("inf"), 3.4e38]))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(-(2 ** 63), 2 ** 63 - 1), _value), min_size=1,
                max_size=6, unique_by=lambda p: p[0]),
       st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4),
       st.integers(0, 40))
def test_fuzz_hostile_event_files_never_raise_and_keep_the_good_prefix(
        tmp_path_factory, points, flips, cut):
    d = tmp_path_factory.mktemp("tb")
    (d / "tb").mkdir()
    good = b"".join(_scalar(s, v) for s, v in points)
    data = bytearray(good + _scalar(1, 1.0, tag="tail"))
    for at, byte in flips:  # bit rot in the last record, or past it
        data[min(len(good) + at, len(data) - 1)] ^= byte or 1
    data = bytes(data[:len(data) - cut])
    f = d / "tb" / "events.out.tfevents.9"
    f.write_bytes(data)
    store = Store(d / "s.db")
    store.claim_run("r", "tb", "shell", "here", owner="t")
    src = TensorBoardSource(LocalHost("here", workdir=str(d)), store, "r", "tb")
    asyncio.run(src.poll(final=True))
    got = store.metric_rows("r")
    assert all(math.isfinite(p.value) and -(2 ** 63) <= p.step < 2 ** 63 for p in got)
    kept = {(s, float(struct.unpack("<f", struct.pack("<f", v))[0])) for s, v in points
            if math.isfinite(v)}
    assert kept == {(p.step, p.value) for p in got if p.name == "loss"}  # the good prefix, whole
    assert len(store.events(kinds=["metrics_dropped"])) <= 3  # told once per kind
    assert f.read_bytes() == data
    store.close()
