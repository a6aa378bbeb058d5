"""A train item with ``trainer: specforge`` on a real local host, hook by hook: the uploaded
config passes SpecForge's own validation (``specforge train --plan``, when SpecForge is
installed), check() names a missing input before anything runs, the stop grace is theirs,
and the TensorBoard dir and tag names come from what the trainer writes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
import yaml

from core.capsules import jobs
from core.actions.train import TrainParams
from core.capsules.metrics_sources import MetricsParams
from core.plans.params import parse_params
from core.plans.planfile import parse_plan
from core.runs.runner import Runner, _Context
from core.state.store import Store
from tests.conftest import ROOT

SHIPPED = ROOT / "plans/train/specforge-qwen3.6-27b-dflash.yaml"


def train_runner(tmp_path, params: dict) -> Runner:
    """A runner over a plan whose one item ``train`` on the local host ``box`` (workdir
    ``tmp_path/box``) has these train ``params``; the shipped SpecForge config is at
    ``train/sf.yaml`` beside the plan."""
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "sf.yaml").write_text(SHIPPED.read_text())
    plan = tmp_path / "p.yaml"
    plan.write_text(json.dumps({
        "name": "ext", "hosts": {"box": {"local": True, "workdir": str(tmp_path / "box"),
                                         "python": sys.executable}},
        "items": [{"id": "train", "content": "train", "action": {
            "kind": "train", "host": "box", "params": params}}]}))
    (tmp_path / "box").mkdir()
    return Runner(parse_plan(plan.read_text(), str(plan), path=plan), Store(tmp_path / "s.db"),
                  poll=0.05)


async def _hook(runner: Runner, run_id: str, hook: str, *args):
    item = runner.plan.item("train")
    host = await runner.host("box")
    res = getattr(runner.action(item), hook)(_Context(runner, item, host, run_id), *args)
    return await res if asyncio.iscoroutine(res) else res


def test_specforge_config_is_uploaded_valid_for_specforge_and_checked_first(tmp_path):
    runner = train_runner(tmp_path, {"trainer": "specforge", "config": "train/sf.yaml",
                                "overrides": {"training.save_interval": 500},
                                "out": "runs/sf", "launcher": "torchrun", "nproc_per_node": 2})
    wd = tmp_path / "box"

    async def go():
        store = runner.store
        # nothing of what the config names is on the host: check() says the first, with its field
        check = await _hook(runner, "r1", "check")
        assert check.state == "blocked" and "model.target_model_path" in check.reason \
            and str(wd / "models/Qwen3.6-27B") in check.reason, check
        for d in ("models/Qwen3.6-27B", "features/train-specforge", "drafters/v5-init"):
            (wd / d).mkdir(parents=True)
        (wd / "drafters/v5-init/config.json").write_text("{}")
        assert (await _hook(runner, "r1", "check")).state == "ready"
        assert store.claim_run("r1", "train", "train", "box", owner=runner.owner) is not None
        await _hook(runner, "r1", "prepare")
        launch = await _hook(runner, "r1", "command")
        cap = jobs.capsule_path(await runner.host("box"), "r1")
        assert launch.command == (f"exec {sys.executable} -u -m torch.distributed.run "
                                  "--nproc_per_node 2 --standalone -m specforge.cli train "
                                  "--config train.yaml")
        assert launch.cwd == cap
        up = yaml.safe_load(open(f"{cap}/train.yaml").read())
        assert up["output_dir"] == str(wd / "runs/sf")  # the item's out, absolute
        assert up["model"]["target_model_path"] == str(wd / "models/Qwen3.6-27B")
        assert up["training"]["save_interval"] == 500  # the override
        rec = store.run("r1").config
        assert rec["trainer"] == "specforge" and rec["out_dir"] == str(wd / "runs/sf")
        assert rec["drafter_config"] == str(wd / "drafters/v5-init/config.json")
        assert rec["tensorboard"] == "runs/sf/runs" and rec["config"] == up
        await runner.close()
        return cap

    cap = asyncio.run(asyncio.wait_for(go(), 60))
    pytest.importorskip("specforge", reason="SpecForge's own validation needs specforge==0.2.0")
    res = subprocess.run([sys.executable, "-m", "specforge.cli", "train", "--config", "train.yaml",
                          "--plan"], cwd=cap, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["kind"] == "worker"
    # the negative control: a config SpecForge refuses is refused by the same command
    doc = yaml.safe_load(open(f"{cap}/train.yaml").read())
    doc["training"]["max_grad_norm"] = -1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    bad = subprocess.run([sys.executable, "-m", "specforge.cli", "train", "--config",
                          str(tmp_path / "bad.yaml"), "--plan"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0 and "max_grad_norm" in bad.stderr


def test_one_simple_command_is_execed_shell_syntax_is_left_alone():
    from core.actions.train import exec_form

    assert exec_form("speculators train --save-path o") == "exec speculators train --save-path o"
    for cmd in ("a && b", "a | tee log", "a; b", "cd x\nrun", "a $(b)", "a > log"):
        assert exec_form(cmd) == cmd


def _params(**kw) -> TrainParams:
    return parse_params(TrainParams, kw)


def test_their_stop_grace_tensorboard_dir_and_metric_names():
    from core.actions.train import Train

    sf = Train(_params(trainer="specforge", config="c.yaml", out="runs/sf"))
    assert sf.stop_grace(30.0) == 300.0  # time to save on SIGTERM
    assert Train(_params(trainer="specforge", config="c.yaml", out="o", stop_grace_s=20)
                 ).stop_grace(30.0) == 20
    assert Train(_params(config="c.yaml")).stop_grace(30.0) == 30.0  # specdeck's: the stop's
    spec = sf.metrics_spec()
    assert spec.tensorboard == "runs/sf/runs"
    assert spec.names["eval/simulated_acc_len"] == "sim_acc_len"  # an accuracy, not a tau
    assert spec.names["train/loss"] == "loss" and spec.names["train/acc"] == "accuracy"
    cmd = ("speculators train --verifier-name-or-path /m/t --save-path runs/s --logger "
           "tensorboard,wandb --log-dir logs --run-name v5")
    sp = Train(_params(trainer="speculators", command=cmd, out="runs/s")).metrics_spec()
    assert sp.tensorboard == "logs/v5" and sp.names["val/loss_epoch"] == "val_loss"
    mine = Train(_params(trainer="speculators", command=cmd, out="runs/s",
                         metrics={"tensorboard": "tb", "names": {"train/loss": "l"}})).metrics_spec()
    assert mine.tensorboard == "tb" and mine.names["train/loss"] == "l"  # the plan's own win
    assert Train(_params(config="c.yaml")).metrics_spec() is None
    assert isinstance(spec, MetricsParams)


@pytest.mark.parametrize("params, msg", [
    ({"trainer": "specforge", "config": "c.yaml"}, "set out:"),
    ({"trainer": "speculators", "command": "speculators train", "out": "o", "stop_grace_s": -1},
     "must be >= 0"),
])
def test_their_params_refused_with_the_field(params, msg):
    with pytest.raises(ExceptionGroup) as ei:
        _params(**params)
    assert any(msg in str(e) for e in ei.value.exceptions), ei.value.exceptions


def test_tensorboard_tags_they_write_are_stored_under_the_curves_names(tmp_path):
    """SpecForge's own tracker namespace (training_metric_names) and eval keys, written as
    event files, read back under the names the curves use."""
    tbx = pytest.importorskip("tensorboardX")
    tracking = pytest.importorskip("specforge.training.tracking")
    from core.actions.trainers import METRIC_NAMES
    from core.hosts.local import LocalHost
    from core.capsules.metrics_sources import TensorBoardSource

    w = tbx.SummaryWriter(str(tmp_path / "runs"))
    for step in (50, 100):
        tags = tracking.training_metric_names({"loss": 2.0 / step, "acc": step / 200})
        tags["eval/simulated_acc_len"] = 1.0 + step / 100
        for tag, v in tags.items():
            w.add_scalar(tag, v, step)
    w.close()
    store = Store(tmp_path / "s.db")
    store.claim_run("r", "train", "train", "box", owner="t")

    async def go():
        host = LocalHost("box", workdir=str(tmp_path))
        src = TensorBoardSource(host, store, "r", "runs", names=METRIC_NAMES["specforge"])
        return await src.poll(final=True)

    assert asyncio.run(go()) == 6
    assert [s for s, _ in store.metric_series("r", "loss")] == [50, 100]
    assert [v for _, v in store.metric_series("r", "accuracy")] == [0.25, 0.5]
    assert [v for _, v in store.metric_series("r", "sim_acc_len")] == [1.5, 2.0]
    assert store.metric_series("r", "tau") == [] and store.metric_series("r", "train/loss") == []


def test_references_latest_best_and_step_name_their_checkpoints():
    from types import SimpleNamespace

    from core.actions.mlbase import REF, drafter_command, resolve_checkpoint, validate_ref
    from core.errors import ActionFailed
    from core.state.records import Artefact, Run

    sf = {"layout": "specforge", "drafter_config": "/w/d/config.json"}
    arts = [Artefact("r1", "t", "checkpoint", f"/o/x-step{s}/training_state.pt", s, data=sf, id=i)
            for i, s in enumerate((10, 20, 30))]
    runs = [Run("r1", "t", result={"best": {"step": 20, "path": arts[1].path}})]
    ctx = SimpleNamespace(artefacts=lambda item, kind=None: arts, runs=lambda item=None: runs)
    assert resolve_checkpoint(ctx, "item:t@latest").step == 30
    assert resolve_checkpoint(ctx, "item:t@best").step == 20
    assert resolve_checkpoint(ctx, "item:t@step:10").step == 10
    assert resolve_checkpoint(ctx, "item:t@step_10").step == 10  # the older spelling
    assert resolve_checkpoint(ctx, "drafters/x") is None
    with pytest.raises(ActionFailed, match=r"recorded: step:10, step:20, step:30"):
        resolve_checkpoint(ctx, "item:t@step:40")
    runs[0] = Run("r1", "t", result={"out": "/o"})
    with pytest.raises(ActionFailed, match="left no best pointer"):
        resolve_checkpoint(ctx, "item:t@best")
    assert REF.match("item:t@best") and not REF.match("item:t@bestest")
    plan = SimpleNamespace(items=[SimpleNamespace(id="t")])
    assert "item:<id>@best" in validate_ref(plan, SimpleNamespace(needs=["t"]), "item:t@worst")
    # strip gets SpecForge's drafter config; a speculators epoch dir is evaluated as it is,
    # and rewritten in the z-lab layout by extract_weights
    cmd = drafter_command("py", arts[1].path, "out", arts[1])
    assert cmd == f"py -u -m core.ml.strip {arts[1].path} out --config /w/d/config.json"
    spec = Artefact("r1", "t", "checkpoint", "/o/3", 3, data={"layout": "speculators"})
    assert drafter_command("py", "/o/3", "out", spec) is None
    assert drafter_command("py", "/o/3", "out", spec, convert=True) == \
        "py -u -m core.ml.export /o/3 --out out --format zlab --dtype fp32"
