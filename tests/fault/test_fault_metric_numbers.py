"""Class 1 of issue 28: numbers from runs are bounded. A step or value from any metric source
(JSON lines, regex groups, HF dicts, TensorBoard, checkpoint events and file names, eval
results) may be 20-400 digits, NaN or infinite: the point is dropped with one journal
notice per run and source, the log line is stored all the same (never rolled back with the
point), ``metrics --jsonl`` stays strict JSON and ``--csv`` numeric, and ``compare`` and the
statistics leave a NaN or infinite tau out, naming the row."""

from __future__ import annotations

import json
import math
import sqlite3

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.tau import stats
from core.tau.table import build_comparison
from core.capsules.metrics_sources import LineMetrics, parse_metrics, regex_metrics, scalars
from core.capsules.progress import describe, record_text
from core.state.records import EvalRow
from core.state.store import Store
from tests.fault.conftest import cli, digest, local_plan, rows

BIG = "9" * 400
LINES = [
    '{"step": 1, "loss": 0.5}',
    '{"step": ' + BIG + ', "loss": 1.0}',
    '{"step": 1e400, "loss": 1.0}',
    '{"step": NaN, "loss": 1.0}',
    '{"step": 2, "loss": NaN, "acc": 0.25, "inf": Infinity, "ninf": -Infinity}',
    '{"step": 3, "v": 1' + "0" * 400 + '}',
    "step 5 loss 0.75",
    "step 99999999999999999999 loss 1",  # 20 digits: past int64
    "step 6 loss nan",
    "step 6 loss 1e400",
    "step 1e400 loss 2",
    "step " + BIG + " loss 3",
    "{'loss': nan, 'global_step': 7}",
    "{'loss': 0.125, 'global_step': 8}",
    "{'loss': 1.5, 'global_step': " + "1" * 30 + "}",
    "{'loss': inf, 'epoch': -inf}",
    '{"event": "checkpoint", "step": ' + BIG + ', "path": "ck/a.pt"}',
    '{"event": "checkpoint", "step": 9, "path": "ck/b.pt"}',
    "the last line",
]
KEPT = [(1, "loss", 0.5), (2, "acc", 0.25), (5, "loss", 0.75), (8, "loss", 0.125)]


def _plan(tmp_path):
    f = tmp_path / "lines.txt"
    f.write_text("\n".join(LINES) + "\n")
    plan = local_plan(tmp_path, f"""  - id: m
    content: prints huge and non-finite numbers in every log-line source
    action:
      kind: shell
      host: here
      params:
        command: "cat {f}"
        metrics: {{regex: ['step (?P<step>\\S+) loss (?P<loss>\\S+)'], hf_dicts: true}}
""")
    return plan, f


def test_unstorable_numbers_are_dropped_once_and_every_line_is_kept(tmp_path):
    plan, f = _plan(tmp_path)
    before = digest(f)
    db = tmp_path / "s.db"
    res = cli("--state", db, "run", plan, "m")
    assert res.returncode == 0, res.stderr
    assert rows(db, "SELECT state, exit_code, log_lines FROM runs") == [
        ("succeeded", 0, len(LINES))]
    assert rows(db, "SELECT status FROM items WHERE item_id = 'm'") == [("done",)]
    assert cli("--state", db, "logs", plan, "m").stdout == f.read_text()  # byte for byte
    assert rows(db, "SELECT step, name, value FROM metrics ORDER BY step, name") == KEPT
    notes = rows(db, "SELECT data, message FROM events WHERE kind = 'metrics_dropped'")
    by_source = {json.loads(d)["source"]: m for d, m in notes}
    assert sorted(by_source) == ["checkpoint steps", "log"], notes  # one per source
    assert "not an integer in SQLite's range" in by_source["log"]
    assert "log lines are kept" in by_source["log"]
    assert "ck/a.pt" in by_source["checkpoint steps"]
    assert rows(db, "SELECT path, step FROM artefacts ORDER BY path") == [
        ("ck/a.pt", None), ("ck/b.pt", 9)]
    assert digest(f) == before

    jl = cli("--state", db, "metrics", plan, "m", "--jsonl")
    assert jl.returncode == 0, jl.stderr
    got = [json.loads(ln, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
           for ln in jl.stdout.splitlines()]
    assert [(p["step"], p["name"], p["value"]) for p in got] == KEPT
    csv_ = cli("--state", db, "metrics", plan, "m", "--csv").stdout.splitlines()
    assert csv_[0] == "step,name,value,time"
    assert all(math.isfinite(float(r.split(",")[2])) for r in csv_[1:]) and len(csv_) == 5


def test_metrics_output_of_an_older_store_with_non_finite_points_is_strict(tmp_path):
    plan, _ = _plan(tmp_path)
    db = tmp_path / "s.db"
    assert cli("--state", db, "run", plan, "m").returncode == 0
    con = sqlite3.connect(db)  # what an older specdeck stored
    run_id = con.execute("SELECT id FROM runs").fetchone()[0]
    con.executemany("INSERT INTO metrics (run_id, step, name, value, at) VALUES (?, ?, ?, ?, ?)",
                    [(run_id, 20, "x", float("inf"), 1.0), (run_id, 21, "x", float("nan"), 1.0)])
    con.commit()
    con.close()
    jl = cli("--state", db, "metrics", plan, "m", "--jsonl")
    assert jl.returncode == 0 and "left out" in jl.stderr, jl.stderr
    assert "Infinity" not in jl.stdout and "NaN" not in jl.stdout
    assert [json.loads(ln)["step"] for ln in jl.stdout.splitlines()] == [s for s, *_ in KEPT]
    csv_ = cli("--state", db, "metrics", plan, "m", "--csv")
    assert all(math.isfinite(float(r.split(",")[2])) for r in csv_.stdout.splitlines()[1:])
    assert cli("--state", db, "metrics", plan, "m").returncode == 0  # the summary table


def test_store_keeps_the_log_of_a_piece_whose_points_cannot_be_stored(tmp_path):
    store = Store(tmp_path / "s.db")
    store.claim_run("r", "m", "shell", "here", owner="t")
    data = b"a\nb\n"
    assert store.append_log("r", 0, data, [(10 ** 30, "x", 1.0), (1, "y", float("nan")),
                                           (2, "z", 10 ** 400), (3, "ok", 1.0)],
                            [("checkpoint", "p.pt", 10 ** 30)])
    assert store.log_bytes("r") == data and store.run("r").log_offset == len(data)
    assert [(p.step, p.name, p.value) for p in store.metric_rows("r")] == [(3, "ok", 1.0)]
    assert store.append_log("r", len(data), b"c\n", [(-(10 ** 30), "x", 1.0)])
    store.add_metrics("r", [(1, "w", float("inf"))], "tau watcher")
    store.add_source_metrics("r", "tb:/f", 0, 10, [(1, "t", float("nan"), float("inf")),
                                                   (2, "t", 1.0, float("nan"))])
    assert [(p.step, p.name) for p in store.metric_rows("r")] == [(2, "t"), (3, "ok")]
    assert store.metric_rows("r")[0].time > 1e9  # a non-finite wall time: when stored
    kinds = [(e.data["source"], e.item_id) for e in store.events(kinds=["metrics_dropped"])]
    assert kinds == [("log", "m"), ("checkpoint steps", "m"), ("tau watcher", "m"),
                     ("tb:/f", "m")]
    assert Store(tmp_path / "s.db").metric_notice("r", "log", "again") is False  # once, ever
    assert store.artefacts("m")[0].step is None


def test_eval_rows_with_a_non_finite_tau_are_never_stored(tmp_path):
    store = Store(tmp_path / "s.db")
    store.claim_run("e", "ev", "eval", "here", owner="t")
    good = EvalRow("e", "ev", "v5", "drafter", "p1", 3.0, [3, 3])
    store.add_eval_results([good, EvalRow("e", "ev", "v5", "drafter", "p2", float("nan")),
                            EvalRow("e", "ev", "v5", "drafter", "p3", float("inf")),
                            EvalRow("e", "ev", "v5", "drafter", "p4", None, [1, float("nan")]),
                            EvalRow("e", "ev", "v5", "drafter", "p5", 2.0, step=10 ** 30)])
    assert [r.prompt_id for r in store.eval_results()] == ["p1"]
    (ev,) = store.events(kinds=["metrics_dropped"])
    assert "prompt 'p2'" in ev.message and "nan" in ev.message
    assert not store.watch_ingest("e", "ev", 10 ** 400, state="done", tau=2.0)
    assert store.watch_ingest("e", "ev", 5, state="done", tau=float("nan"))
    assert store.watch_add("e", "ev", 6) and not store.watch_add("e", "ev", 2 ** 63)
    store.watch_update("e", 6, state="done", tau=float("inf"))
    assert [(w.step, w.tau) for w in store.watch_entries("e")] == [(5, None), (6, None)]


def _eval_plan(tmp_path, db):
    plan = local_plan(tmp_path, "  - {id: ev, content: an eval}\n")
    store = Store(db)
    store.claim_run("e1", "ev", "eval", "here", owner="t")
    store.close()
    con = sqlite3.connect(db)  # rows an older specdeck (or another tool) stored
    for i in range(8):
        for who, role, tau in (("base", "baseline", 2.0 + i / 10), ("v5", "drafter", 3.0 + i)):
            if who == "v5" and i == 2:
                tau = float("inf")
            con.execute("INSERT INTO eval_results (run_id, item_id, drafter, role, prompt_id, "
                        "tau, rounds, settings) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        ["e1", "ev", who, role, f"p{i}", tau,
                         "[1, NaN]" if who == "v5" and i == 5 else None, '{"mode": "online"}'])
    con.commit()
    con.close()
    return plan


def test_compare_leaves_out_a_non_finite_tau_and_names_it(tmp_path):
    db = tmp_path / "s.db"
    plan = _eval_plan(tmp_path, db)
    before = digest(db)
    for fmt in ((), ("--json",), ("--csv",), ("--markdown",), ("--pivot",)):
        res = cli("--state", db, "compare", plan, *fmt)
        assert res.returncode == 0, (fmt, res.stderr)
        assert res.stderr.count("left out") == 2, res.stderr
        assert "prompt 'p2'" in res.stderr and "inf" in res.stderr
        assert "prompt 'p5'" in res.stderr and "rounds" in res.stderr
    doc = json.loads(cli("--state", db, "compare", plan, "--json").stdout)
    (v5,) = [o for o in doc["overall"] if o["drafter"] == "v5"]
    assert v5["prompts"] == 6 and len(doc["left_out"]) == 2
    assert digest(db) == before


finite_or_not = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.integers(-(10 ** 40), 10 ** 40), st.sampled_from([10 ** 400]))


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(finite_or_not, max_size=12), st.lists(finite_or_not, max_size=12),
       st.lists(st.lists(finite_or_not, max_size=5), max_size=6))
def test_fuzz_statistics_never_raise_on_non_finite_figures(a, b, groups):
    stats.mean_ci(a, b=50)
    stats.pooled_ci(groups, b=50)
    stats.sign_flip_p(a, permutations=50)
    n = min(len(a), len(b))
    p = stats.paired(a[:n], b[:n], permutations=50)
    assert p.delta is None or math.isfinite(p.delta)
    for x in a[:3]:
        stats.prompts_to_detect(x if isinstance(x, float) else None)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(["base", "v4", "v5"]), st.sampled_from(["p1", "p2"]),
                          st.one_of(st.none(), finite_or_not),
                          st.one_of(st.none(), st.lists(finite_or_not, max_size=4))),
                max_size=12))
def test_fuzz_compare_never_raises_and_names_what_it_leaves_out(cells):
    rows = [EvalRow("r", "i", d, "baseline" if d == "base" else "drafter", p, tau, rounds,
                    settings={"block_size": 8}) for d, p, tau, rounds in cells]
    comp = build_comparison(rows)

    def usable(x) -> bool:
        try:
            return not isinstance(x, bool) and abs(float(x)) <= 1e150
        except OverflowError:
            return False

    bad = [r for r in rows if (r.tau is not None and not usable(r.tau))
           or (r.rounds is not None and not all(map(usable, r.rounds)))]
    assert len(comp.left_out) == len(bad)
    assert all(f"prompt '{r.prompt_id}'" in w for r, w in zip(bad, comp.left_out))
    for o in comp.overall:
        for x in (o.macro, o.pooled, o.delta_macro):
            assert x is None or math.isfinite(x)


_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10 ** 30), 10 ** 30).map(str),
    st.integers(19, 400).map(lambda n: "9" * n),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "inf", "-inf", "1e400", "-1e400",
                     "1" + "0" * 5000, "1_0", "0x10", "", "True"]))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_numbers, _numbers, st.sampled_from(["json", "regex", "hf", "hfjson", "ckpt", "progress",
                                             "steps", "train"]))
def test_fuzz_metric_lines_with_hostile_numbers_never_raise_and_store(tmp_path_factory, step,
                                                                       value, kind):
    line = {"json": f'{{"step": {step}, "loss": {value}, "acc": [{value}, 1]}}',
            "regex": f"step {step} loss {value}",
            "hf": f"{{'loss': {value}, 'global_step': {step}}}",
            "hfjson": f'{{"loss": {value}, "epoch": {step}}}',
            "ckpt": f'{{"event": "checkpoint", "step": {step}, "path": "c.pt"}}',
            "progress": (f'{{"event": "progress", "done": {step}, "total": {value}, '
                         f'"eta_s": {value}, "tokens_per_s": {step}}}'),
            "steps": (f'{{"event": "progress", "done": {step}, "total": {step}, '
                      f'"unit": "steps", "loss": {value}}}'),  # a point at step done
            "train": f'{{"step": {step}, "loss": {value}, "eta_s": {value}, "eal": {step}}}'}[kind]
    parser = LineMetrics([r"step (?P<step>\S+) loss (?P<loss>\S+)"], hf_dicts=True)
    got = parser.parse(line.encode())
    parse_metrics(line.encode())
    describe(line)  # the progress line the console and the CLI show
    record_text(line)  # the log pane's text of it
    store = Store()
    store.claim_run("r", "m", "shell", "here", owner="t")
    from core.capsules.jobs import parse_artefact

    art = parse_artefact(line.encode())
    assert store.append_log("r", 0, line.encode() + b"\n", got, [art] if art else [])
    assert store.log_bytes("r") == line.encode() + b"\n"  # never a lost line
    for p in store.metric_rows("r"):
        assert -(2 ** 63) <= p.step < 2 ** 63 and math.isfinite(p.value)


def test_tensorboard_non_finite_scalars_are_parsed_for_the_store_to_drop():
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary

    ev = Event(wall_time=float("nan"), step=2 ** 62, summary=Summary(value=[
        Summary.Value(tag="a", simple_value=float("nan")),
        Summary.Value(tag="b", simple_value=float("inf")),
        Summary.Value(tag="c", simple_value=1.5)]))
    got = scalars(ev.SerializeToString())
    store = Store()
    assert store.add_source_metrics("r", "tb:/x", 0, 10, got)
    assert [(p.step, p.name, p.value) for p in store.metric_rows("r")] == [(2 ** 62, "c", 1.5)]


def test_regex_groups_of_any_size_are_numbers_or_nothing():
    import re

    m = re.search(r"(?P<step>\S+) (?P<v>\S+) (?P<w>\S+)", "1.9 " + "9" * 5000 + " x")
    assert regex_metrics(m) == [(1, "v", float("inf"))]  # past int()'s digit limit: a float


def test_a_notice_rolled_back_with_its_piece_is_told_again(tmp_path):
    import pytest

    store = Store(tmp_path / "s.db")
    store.claim_run("r", "m", "shell", "here", owner="t")
    with pytest.raises(sqlite3.Error):  # a checkpoint path no database can bind: all rolled back
        store.append_log("r", 0, b"a\n", [(10 ** 30, "x", 1.0)], [("checkpoint", object(), 1)])
    assert store.log_bytes("r") == b"" and store.events(kinds=["metrics_dropped"]) == []
    assert store.append_log("r", 0, b"a\n", [(10 ** 30, "x", 1.0)])
    assert len(store.events(kinds=["metrics_dropped"])) == 1
