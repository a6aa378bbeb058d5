"""Metric sources: TensorBoard event files (written by tensorboardX), HF dict lines, regexes."""

from __future__ import annotations

import pytest

from core.capsules.metrics_sources import (EventFileError, LineMetrics, MetricsParams, read_records,
                                  scalars)
from core.plans.params import parse_params
from core.state.records import MetricPoint
from core.state.store import Store


def _write_events(d, points):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(d))
    for step, tag, value in points:
        w.add_scalar(tag, value, step)
    w.close()
    (f,) = list(d.glob("events.out.tfevents*"))
    return f


def _shell_plan(tmp_path, wd, item_id: str, command: str, **params):
    """A plan file of one shell item ``item_id`` running ``command`` on a local host in ``wd``."""
    import json

    plan = tmp_path / "p.yaml"
    plan.write_text(json.dumps({"name": "p", "hosts": {"here": {"local": True, "workdir": str(wd)}},
                                "items": [{"id": item_id, "content": f"{item_id} loop", "action": {
                                    "kind": "shell", "host": "here",
                                    "params": {"command": command, **params}}}]}))
    return plan


def test_event_file_scalars_read_in_pieces_once(tmp_path):
    points = [(s, "train/loss", 3.0 - s / 10) for s in range(1, 21)] + [(10, "lr", 1e-4)]
    f = _write_events(tmp_path / "tb", points)
    data = f.read_bytes()
    got, off = [], 0
    # feed the file in ragged pieces, as a growing file is read: torn records wait
    for cut in (7, 50, 51, 300, len(data)):
        recs, used = read_records(data[off:cut])
        got += [r for rec in recs for r in scalars(rec)]
        off += used
    assert off == len(data)
    assert sorted((s, t, round(v, 6)) for s, t, v, _ in got) == sorted(
        (s, t, round(v, 6)) for s, t, v in points)
    assert all(at > 1e9 for *_, at in got)


def test_corrupt_event_file_is_named(tmp_path):
    f = _write_events(tmp_path / "tb", [(1, "loss", 1.0)])
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    with pytest.raises(EventFileError, match="corrupt record"):
        read_records(bytes(data), "gpu:/x/events")


def test_hf_dict_lines_numbered_by_line_or_global_step():
    p = LineMetrics(hf_dicts=True)
    out = p.parse(b"{'loss': 2.5, 'learning_rate': 5e-05, 'epoch': 0.1}")
    out += p.parse(b" 10%|#   | 10/100 [00:01<00:09]\r 20%|##  | 20/100\r"
                   b"{'loss': 2.1, 'grad_norm': 1.5, 'epoch': 0.2}")
    out += p.parse(b"{'eval_loss': 1.9, 'global_step': 40, 'epoch': 0.4}")
    out += p.parse(b'{"step": 7, "loss": 9.0}')  # JSON with a step: not counted as HF
    out += p.parse(b"{'train_runtime': 'n/a'}")  # nothing numeric: not a metric line
    assert out == [(1, "loss", 2.5), (1, "learning_rate", 5e-05), (1, "epoch", 0.1),
                   (2, "loss", 2.1), (2, "grad_norm", 1.5), (2, "epoch", 0.2),
                   (40, "eval_loss", 1.9), (40, "epoch", 0.4), (7, "loss", 9.0)]


def test_hf_count_is_rederived_from_the_stored_log(tmp_path):
    store = Store(tmp_path / "s.db")
    store.claim_run("r1", "t", "train", None, owner="x")
    log = b"{'loss': 3.0}\nnoise\n{'loss': 2.0}\n"
    store.append_log("r1", 0, log)
    p = LineMetrics(hf_dicts=True)
    p.prime(store, "r1", len(log))
    assert p.parse(b"{'loss': 1.0}") == [(3, "loss", 1.0)]
    p.prime(store, "r1", len(b"{'loss': 3.0}\n"))
    assert p.hf_count == 1


def test_several_regexes_each_give_their_groups():
    spec = parse_params(MetricsParams, {"regex": [
        r"step (?P<step>\d+) loss (?P<loss>[\d.]+)",
        r"eval@(?P<step>\d+) acc=(?P<eval_acc>[\d.]+)"]})
    p = LineMetrics(spec.regexes)
    assert p.parse(b"step 10 loss 2.50") == [(10, "loss", 2.5)]
    assert p.parse(b"eval@10 acc=0.75") == [(10, "eval_acc", 0.75)]
    assert p.parse(b"nothing here") == []


@pytest.mark.parametrize("bad, msg", [
    ({"regex": ["loss (?P<loss>x)"]}, "regex.0: needs a named group \\(\\?P<step>"),
    ({"regex": "(?P<step>\\d+"}, "regex: not a regex"),
    ({"regex": ["(?P<step>\\d+)"]}, "a named group per metric"),
    ({"tensorboard": " "}, "tensorboard: an empty path"),
    ({"hf_dicts": "yes"}, "hf_dicts: must be true/false"),
])
def test_bad_metrics_params_name_the_field(bad, msg):
    import re

    with pytest.raises(ExceptionGroup) as ei:
        parse_params(MetricsParams, bad)
    text = "; ".join(".".join(map(str, e.path)) + ": " + e.message for e in ei.value.exceptions)
    assert re.search(msg, text), text


def test_source_offsets_store_each_piece_once(tmp_path):
    store = Store(tmp_path / "s.db")
    store.metric_source_init("r", "tb:/f", 100)
    store.metric_source_init("r", "tb:/f", 0)  # known already: unchanged
    assert store.metric_source_offset("r", "tb:/f") == 100
    assert store.add_source_metrics("r", "tb:/f", 100, 150, [(1, "loss", 2.0, 5.0)])
    assert not store.add_source_metrics("r", "tb:/f", 100, 150, [(1, "loss", 9.0, 5.0)])
    assert store.metric_rows("r") == [MetricPoint(step=1, name="loss", value=2.0, time=5.0)]


def test_readme_metric_examples_parse():
    import yaml

    from tests.conftest import ROOT

    doc = (ROOT / "plans" / "README.md").read_text()
    section = doc[doc.index("## Metric sources"):]
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    assert len(blocks) >= 3
    for b in blocks:
        spec = parse_params(MetricsParams, yaml.safe_load(b)["metrics"])
        for rx in spec.regexes:
            assert LineMetrics([rx]).patterns
    p = LineMetrics(parse_params(MetricsParams, yaml.safe_load(blocks[0])["metrics"]).regexes)
    assert p.parse(b"step 100 | loss 2.31 | lr 3e-4") == [(100, "loss", 2.31), (100, "lr", 3e-4)]
    assert p.parse(b"eval @ step 100: acc=0.61") == [(100, "eval_acc", 0.61)]


def test_shell_item_reads_event_files_and_reports_a_corrupt_one_once(tmp_path):
    import sys

    from tests.conftest import run_cli

    wd = tmp_path / "w"
    f = _write_events(wd / "tb" / "bad", [(1, "x", 1.0)])
    script = tmp_path / "writer.py"
    script.write_text(
        "import sys\nfrom tensorboardX import SummaryWriter\n"
        "w = SummaryWriter(sys.argv[1])\n"
        "for s in range(1, 6):\n    w.add_scalar('eval/tau', 2.0 + s / 10, s * 100)\n"
        "w.close()\n"
        # the earlier file is corrupted while this run goes on: reported, never half-read
        "p = sys.argv[2]\nd = bytearray(open(p, 'rb').read())\nd[-3] ^= 0xFF\n"
        "open(p, 'ab').write(bytes(d))\n")
    plan = _shell_plan(tmp_path, wd, "ev", f"{sys.executable} {script} tb/good {f}",
                       metrics={"tensorboard": "tb"})
    state = tmp_path / "s.db"
    res = run_cli("run", plan, "ev", "--state", state)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("unreadable event file") == 1, res.stderr
    out = run_cli("metrics", plan, "ev", "--csv", "--state", state).stdout.splitlines()
    rows = [r.split(",") for r in out[1:]]
    assert [r[:2] for r in rows] == [[str(s * 100), "eval/tau"] for s in range(1, 6)]
    assert [float(r[2]) for r in rows] == pytest.approx([2.0 + s / 10 for s in range(1, 6)])


def test_zero_values_and_tf2_tensor_scalars(tmp_path):
    import struct

    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary
    from tensorboardX.proto.tensor_pb2 import TensorProto
    from tensorboardX.record_writer import masked_crc32c

    f = _write_events(tmp_path / "tb", [(3, "zero", 0.0)])
    recs, _ = read_records(f.read_bytes())
    assert [(s, t, v) for r in recs for s, t, v, _ in scalars(r)] == [(3, "zero", 0.0)]

    def frame(ev) -> bytes:
        data = ev.SerializeToString()
        head = struct.pack("<Q", len(data))
        return (head + struct.pack("<I", masked_crc32c(head)) + data
                + struct.pack("<I", masked_crc32c(data)))

    tf2 = [Summary.Value(tag="a", tensor=TensorProto(dtype=1, float_val=[1.5])),
           Summary.Value(tag="b", tensor=TensorProto(dtype=2, tensor_content=struct.pack(
               "<d", 2.25))),
           Summary.Value(tag="c", tensor=TensorProto(dtype=9, int64_val=[7])),
           Summary.Value(tag="img", tensor=TensorProto(dtype=7))]  # a string tensor: skipped
    buf = frame(Event(wall_time=10.0, step=5, summary=Summary(value=tf2)))
    buf += frame(Event(wall_time=11.0, step=6, file_version="brain.Event:2"))  # no summary
    recs, used = read_records(buf)
    assert used == len(buf)
    assert [x for r in recs for x in scalars(r)] == [(5, "a", 1.5, 10.0), (5, "b", 2.25, 10.0),
                                                     (5, "c", 7.0, 10.0)]


def test_reading_events_imports_no_torch_nor_tensorboard(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    f = _write_events(tmp_path / "tb", [(1, "loss", 0.5)])
    code = ("import sys\nfrom core.capsules.metrics_sources import read_records, scalars\n"
            f"recs, _ = read_records(open({str(f)!r}, 'rb').read())\n"
            "print([x[:3] for r in recs for x in scalars(r)])\n"
            "print(sorted(m for m in ('torch', 'tensorboardX', 'tensorboard', 'tensorflow')"
            " if m in sys.modules))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert res.stdout.splitlines() == ["[(1, 'loss', 0.5)]", "[]"], res.stderr


def test_log_tail_collapses_redraws_and_is_empty_for_no_log(tmp_path):
    store = Store(tmp_path / "s.db")
    store.claim_run("r", "t", "shell", None, owner="x")
    assert store.log_tail("r") == []
    store.append_log("r", 0, b"a\n 10%|#\r 90%|#########\r{'loss': 1.0}\nlast")
    assert store.log_tail("r") == ["a", "{'loss': 1.0}", "last"]
    assert store.log_tail("r", 1) == ["last"]


def test_step_progress_records_are_curves_at_their_done_step(tmp_path):
    """``core.ml.codemodel`` (the demo's make-target) logs its loss only on progress records
    counted in steps: a shell item running the same emitter stores a loss curve at each
    ``done`` (not ``done``/``total`` as curves), and the CLI's progress line says it as
    ``codemodel: 3/3 steps, ...``; a progress record in prompts is no curve."""
    import sys

    from core.capsules.metrics_sources import parse_metrics
    from tests.conftest import ROOT, run_cli

    wd = tmp_path / "w"
    script = tmp_path / "target.py"
    script.write_text(  # codemodel's own emit call, field for field
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom core.ml.formats.runio import emit\n"
        "emit('progress', task='eval', done=1, total=8, unit='prompts', tokens_per_s=9.0)\n"
        "for s, loss in ((1, 6.25), (2, 5.5), (3, 4.75)):\n"
        "    emit('progress', task='codemodel', done=s, total=3, unit='steps',\n"
        "         tokens_per_s=11703.2, eta_s=21.2 * (3 - s), loss=loss)\n")
    plan = _shell_plan(tmp_path, wd, "make-target", f"{sys.executable} {script}")
    state = tmp_path / "s.db"
    res = run_cli("run", plan, "make-target", "--state", state)
    assert res.returncode == 0, res.stderr
    assert "make-target: codemodel: 3/3 steps, 11,703 tokens/s" in res.stderr, res.stderr
    out = run_cli("metrics", plan, "make-target", "--csv", "--state", state).stdout.splitlines()
    rows = [r.split(",") for r in out[1:]]
    assert [(r[0], float(r[2])) for r in rows if r[1] == "loss"] == [
        ("1", 6.25), ("2", 5.5), ("3", 4.75)]
    assert {r[1] for r in rows} == {"loss", "tokens_per_s", "eta_s"}  # done/total: no curves
    assert parse_metrics(b'{"event": "progress", "done": 1, "total": 8, "unit": "prompts", '
                         b'"tau": 3.0}') == []
    # an HF dict line with a "steps" key is still an HF line, not a step record
    p = LineMetrics([], hf_dicts=True)
    assert p.parse(b"{'steps': 4, 'loss': 2.0}") == [(1, "steps", 4), (1, "loss", 2.0)]
