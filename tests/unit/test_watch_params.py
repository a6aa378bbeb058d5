"""watch_eval's typed params (placement, fetch, backfill), console-driven backfill, and the
store's exactly-once ingest of a detached watcher's results."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from core.state.records import EvalRow
from core.actions.watch_eval.params import parse_watch
from core.actions.watch_eval.on_console import Watcher
from core.runs.runner import _Context
from core.state.store import Store
from tests.conftest import run_cli


def plan_file(tmp_path, watch: str) -> str:
    p = tmp_path / "p.yaml"
    p.write_text(f"""name: w
hosts:
  gpu: {{local: true, workdir: {tmp_path}/gpu}}
  ev: {{local: true, workdir: {tmp_path}/ev}}
items:
  - id: train
    content: t
    action:
      kind: train
      host: gpu
      params:
        command: "echo hi"
        watch_eval: {watch}
""")
    return str(p)


@pytest.mark.parametrize("watch,field,words", [
    ("{target: t, on: eval, cache: c}", "watch_eval.host", "on: eval needs host"),
    ("{target: t, on: eval, host: ev, cache: c, fetch: relay}", "watch_eval.fetch",
     "on: eval reads checkpoints by path"),
    ("{target: t, host: ev, mode: online, fetch: direct}", "watch_eval.fetch",
     "a direct fetch needs on: eval"),
    ("{target: t, cache: c, backfill: true}", "watch_eval.backfill", "backfill is for on: console"),
    ("{target: t, on: train, host: ev, cache: c}", "watch_eval.host",
     "on: train runs on the training host 'gpu'"),
    ("{target: t, on: everywhere, cache: c}", "watch_eval.on", "must be 'train' | 'eval' | 'console'"),
    ("{target: t, cache: c, alerts: {drop_pct: lots}}", "watch_eval.alerts.drop_pct",
     "must be number"),
    ("{target: t, host: nowhere, mode: online}", "watch_eval.host", "unknown host 'nowhere'"),
    ("{target: t, cache: c, device: gpu0}", "watch_eval.device", "cpu, auto, cuda or cuda:N"),
    ("{target: t, host: ev, mode: online, device: cuda}", "watch_eval.device",
     "device is for a detached watcher"),
    # sampling: eval's checks (core.actions.eval.sampling_problems), offline named by temperature
    ("{target: t, cache: c, temperature: 0.7}", "watch_eval.temperature",
     "offline tau is not defined at a temperature > 0: use mode online"),
    ("{target: t, host: ev, mode: online, temperature: -1}", "watch_eval.temperature",
     "must be a finite number >= 0"),
    ("{target: t, host: ev, mode: online, top_k: 5}", "watch_eval.top_k",
     "greedy decoding (temperature 0) samples nothing"),
    ("{target: t, host: ev, mode: online, temperature: 0.7, top_p: 0}", "watch_eval.top_p",
     "must be in (0, 1]"),
    ("{target: t, host: ev, mode: online, temperature: 0.7, samples: 0}", "watch_eval.samples",
     "must be >= 1"),
    ("{target: t, host: ev, mode: online, samples: 4}", "watch_eval.samples",
     "greedy decoding (temperature 0) is deterministic"),
    ("{target: t, cache: c, settle_s: -1}", "watch_eval.settle_s",
     "must be a number of seconds from 0 to"),
    ("{target: t, cache: c, settle_s: .inf}", "watch_eval.settle_s", "inf: must be a finite number"),
])
def test_bad_watch_eval_is_named_by_field_and_exits_2(tmp_path, watch, field, words):
    res = run_cli("validate", plan_file(tmp_path, watch))
    assert res.returncode == 2, res.stderr
    assert f"field 'action.params.{field}'" in res.stderr and words in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_yaml_bare_on_key_and_placement_defaults(tmp_path):
    # YAML 1.1 reads `on:` as true: it still means the field
    res = run_cli("validate", plan_file(tmp_path, "{target: t, on: eval, host: ev, cache: c}"))
    assert res.returncode == 0, res.stderr
    assert parse_watch({"target": "t", "cache": "c"}).placement("gpu") == "train"
    assert parse_watch({"target": "t", "cache": "c", "host": "gpu"}).placement("gpu") == "train"
    # another host named without on: the console-driven relay, as before
    assert parse_watch({"target": "t", "cache": "c", "host": "ev"}).placement("gpu") == "console"
    assert parse_watch({"target": "t", "mode": "online", "host": "ev"}).placement("gpu") == "console"
    p = parse_watch({"target": "t", "cache": "c", "host": "ev", "on": "eval"})
    assert (p.placement("gpu"), p.eval_host("gpu")) == ("eval", "ev")
    assert parse_watch({"target": "t", "cache": "c"}).eval_host("gpu") == "gpu"


SAMPLED = {"target": "t", "mode": "online", "prompts": "host:p.jsonl", "temperature": 0.7,
           "top_p": 0.9, "top_k": 5, "seed": 3, "samples": 4}


def test_sampled_online_watch_eval_validates(tmp_path):
    res = run_cli("validate", plan_file(tmp_path, "{target: t, host: ev, mode: online, "
                                                  "temperature: 0.7, top_p: 0.9, samples: 4}"))
    assert res.returncode == 0, res.stderr


def _ctx(store):
    """The context of train item ``train``'s run r1 (no plan: prompts are host:PATH here)."""
    runner = SimpleNamespace(store=store, emit=lambda e: None, plan=None, poll=0.1, watch=True)
    return _Context(runner, SimpleNamespace(id="train"), None, "r1")


def _sampled(args) -> tuple:
    return args.temperature, args.top_p, args.top_k, args.seed, args.samples


def _local_ev(tmp_path):
    from core.hosts.local import LocalHost

    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "p.jsonl").write_text('{"id": "p0", "prompt": "hi"}\n')
    return LocalHost("ev", workdir=str(tmp_path / "ev"))


def test_the_console_watchers_evals_carry_the_sampling_flags(tmp_path):
    import asyncio

    from core.ml.tasks import eval as ml_eval

    ev = _local_ev(tmp_path)
    for spec, want in ((SAMPLED, (0.7, 0.9, 5, 3, 4)),
                       ({**SAMPLED, "temperature": 0, "top_p": 1.0, "top_k": 0, "samples": 1},
                        (0.0, 1.0, 0, 0, 1))):
        w = Watcher(_ctx(Store(":memory:")), {**spec, "host": "ev"})
        words = [str(a) for a in asyncio.run(w.eval_args(ev))]
        assert ("--temperature" in words) == bool(spec["temperature"])  # greedy: as before
        parsed = ml_eval.build_parser().parse_args(["--drafter", "d", "--out", "o", *words])
        assert _sampled(parsed) == want and parsed.mode == "online"


def test_the_detached_watchers_command_carries_the_sampling_flags(tmp_path):
    import asyncio
    import shlex

    from core.actions.watch_eval import detached
    from core.ml.tasks import watcher as ml_watcher

    ev = _local_ev(tmp_path)
    ctx = _ctx(Store(":memory:"))
    run = SimpleNamespace(id="r1", host="gpu", capsule=None)
    launch = asyncio.run(detached.command(ctx, parse_watch({**SAMPLED, "on": "eval", "host": "ev"}),
                                          run, "/ckpts", ev))
    words = shlex.split(launch.command)
    parsed = ml_watcher.build_parser().parse_args(words[words.index("core.ml.watcher") + 1:])
    assert _sampled(parsed) == (0.7, 0.9, 5, 3, 4) and parsed.mode == "online"


def test_the_detached_watcher_waits_settle_s_for_a_checkpoint_no_trainer_marks_complete(tmp_path):
    import asyncio
    import shlex

    from core.actions.watch_eval import detached
    from core.ml.formats import layouts
    from core.ml.tasks import watcher as ml_watcher

    ev = _local_ev(tmp_path)
    run = SimpleNamespace(id="r1", host="gpu", capsule=None)

    def settle(spec: dict) -> float:
        launch = asyncio.run(detached.command(_ctx(Store(":memory:")), parse_watch(spec), run,
                                              "/ckpts", ev))
        words = shlex.split(launch.command)
        return ml_watcher.build_parser().parse_args(words[words.index("core.ml.watcher") + 1:]).settle

    base = {"target": "t", "cache": "c", "on": "eval", "host": "ev"}
    assert settle(base) == layouts.SETTLE_S == 30.0  # long enough for a slow disk
    assert settle({**base, "settle_s": 2.5}) == 2.5


def test_a_sampled_evals_interval_is_over_prompts_with_their_seeds_nested():
    w = Watcher(_ctx(Store(":memory:")), {**SAMPLED, "host": "ev", "samples": 2})
    per_prompt = [{"id": pid, "sample": k, "seed": 1 + k, "tau": t, "rounds": [t]}
                  for pid, k, t in (("a", 0, 2.0), ("a", 1, 4.0), ("b", 0, 3.0), ("b", 1, 3.0))]
    res = {"tau": 3.0, "temperature": 0.7, "samples": 2, "per_prompt": per_prompt}
    metrics, rows = w.result_rows(20, res, None)
    got = {name: v for _, name, v in metrics}
    # prompts a and b both average 3.0: no spread over prompts (the seeds' spread is within one)
    assert (got["tau_ci95_lo"], got["tau_ci95_hi"]) == (3.0, 3.0)
    assert len(rows) == 4 and {r.settings["temperature"] for r in rows} == {0.7}


def _watcher(backfill: bool):
    store = Store(":memory:")
    spec = {"host": "ev", "target": "t", "mode": "online", "backfill": backfill}
    w = Watcher(_ctx(store), spec)
    for step in (10, 20, 30):
        store.watch_add("r1", "train", step)
    return w, store


def test_console_backfill_takes_the_oldest_and_skips_none():
    w, store = _watcher(True)
    assert w._next().step == 10
    assert {e.state for e in store.watch_entries("r1")} == {"pending"}
    w, store = _watcher(False)  # without it: the newest, the others recorded skipped
    assert w._next().step == 30
    assert [e.state for e in store.watch_entries("r1")] == ["skipped", "skipped", "pending"]


def test_ingest_stores_a_step_once_with_its_rows(tmp_path):
    a, b = Store(tmp_path / "s.db"), Store(tmp_path / "s.db")  # two specdecks on one file
    rows = [EvalRow(run_id="r1", item_id="train", drafter="train", role="drafter",
                    prompt_id="p0", tau=2.5, step=20)]
    kw = dict(state="done", tau=2.5, metrics=[(20, "tau", 2.5)], eval_rows=rows)
    assert a.watch_ingest("r1", "train", 20, **kw) is True
    assert b.watch_ingest("r1", "train", 20, **kw) is False
    assert a.watch_ingest("r1", "train", 20, **kw) is False
    assert len(b.eval_results("train")) == 1 and b.metric_series("r1", "tau") == [(20, 2.5)]
    assert [(e.step, e.state) for e in b.watch_entries("r1")] == [(20, "done")]
    # a failed step is an outcome too: stored once, with its error
    assert b.watch_ingest("r1", "train", 40, state="failed", error="boom") is True
    assert a.watch_ingest("r1", "train", 40, state="failed", error="boom") is False
    assert a.watch_entries("r1")[1].error == "boom"


def test_readme_watch_eval_example_parses():
    import yaml

    from tests.conftest import ROOT

    doc = (ROOT / "plans" / "README.md").read_text()
    block = doc[doc.index("```yaml\nwatch_eval:") + 8:]
    spec = parse_watch(yaml.safe_load(block.split("```", 1)[0])["watch_eval"])
    assert spec.placement("kpro6") == "train" and spec.validate() == []


def test_a_missing_cache_on_the_watcher_host_blocks_the_launch_naming_it(tmp_path):
    plan = plan_file(tmp_path, "{target: models/t, cache: feats/coding}")
    (tmp_path / "gpu/models/t").mkdir(parents=True)
    (tmp_path / "gpu/models/t/config.json").write_text("{}")
    env = {"SPECDECK_STATE": str(tmp_path / "s.db")}
    res = run_cli("run", plan, "train", env=env)
    assert res.returncode == 1, res.stderr
    assert (f"watch_eval: gpu has no feature cache at {tmp_path}/gpu/feats/coding (no "
            "manifest.json): relay it there once") in res.stderr
    assert Store(tmp_path / "s.db").latest_run("train") is None  # nothing was launched


def test_only_one_specdeck_takes_a_killed_watcher_to_restart_it(tmp_path):
    a, b = Store(tmp_path / "s.db"), Store(tmp_path / "s.db")
    assert a.watcher_claim("r1", "train", "gpu", "/c", "/out")
    assert not b.watcher_claim("r1", "train", "gpu", "/c", "/out")  # one watcher per run
    a.watcher_update("r1", state="lost", queue=[40])
    assert a.watcher_take("r1", ("lost",), "starting") is True
    assert b.watcher_take("r1", ("lost",), "starting") is False
    assert b.watcher("r1").state == "starting" and b.watcher("r1").queue == [40]
