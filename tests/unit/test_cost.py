"""Issue 47 §3: a host's ``price:`` (validated with file:line errors) and what runs cost under it:
per item, per arm and for the campaign (``status``), and per unit of tau gained (``compare``)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from core.errors import PlanError
from core.plans.planfile import load_plan
from core.runs import cost
from core.state.records import EvalRow, Run
from core.state.store import Store
from tests.conftest import run_cli

PLAN = """name: priced
hosts:
  gpu: {{local: true, workdir: {wd}/gpu, price: {{per_gpu_hour: 2.5, gpus: 4}}}}
  box: {{local: true, workdir: {wd}/box, price: {{per_hour: 1.2, currency: EUR}}}}
  free: {{local: true, workdir: {wd}/free}}
items:
  - id: train-a
    content: train a
    action: {{kind: shell, host: gpu, params: {{command: "true"}}}}
  - id: train-base
    content: train the baseline
    action: {{kind: shell, host: gpu, params: {{command: "true"}}}}
  - id: eval-a
    content: measure a
    needs: [train-a, train-base]
    action: {{kind: shell, host: box, params: {{command: "true"}}}}
  - id: look
    content: look around
    action: {{kind: shell, host: free, params: {{command: "true"}}}}
"""


def _plan(tmp_path, body=PLAN):
    p = tmp_path / "p.yaml"
    p.write_text(body.format(wd=tmp_path))
    return p


def _run(item, host, start, end, attempt=1, state="succeeded"):
    return Run(f"{item}-{attempt}", item, "shell", host, attempt, state, started_at=start, ended_at=end)


def test_prices_are_read_and_an_hour_of_a_run_costs_them(tmp_path):
    plan = load_plan(_plan(tmp_path))
    assert plan.hosts["gpu"].price.hourly == 10.0 and plan.hosts["gpu"].price.currency == "USD"
    assert plan.hosts["box"].price.hourly == 1.2 and plan.hosts["box"].price.currency == "EUR"
    assert plan.hosts["free"].price is None
    t0 = 1_000_000.0
    runs = {"train-a": [_run("train-a", "gpu", t0, t0 + 1800, 1, "failed"),  # every attempt was paid
                        _run("train-a", "gpu", t0 + 3600, t0 + 3 * 3600, 2)],
            "eval-a": [_run("eval-a", "box", t0, t0 + 900)],
            "look": [_run("look", "free", t0, t0 + 60)],
            "train-base": [_run("train-base", "gpu", t0, None, 1, "running")]}  # live: to now
    sheet = cost.sheet(plan, runs, now=t0 + 360)
    assert sheet.items["train-a"] == {"USD": pytest.approx(25.0)}  # 2.5 h x 4 GPUs x 2.5
    assert sheet.items["eval-a"] == {"EUR": pytest.approx(0.3)}
    assert sheet.items["train-base"] == {"USD": pytest.approx(1.0)}  # 0.1 h so far
    assert sheet.total == {"USD": pytest.approx(26.0), "EUR": pytest.approx(0.3)}  # never added across currencies
    assert sheet.unpriced == ("free",) and "look" not in sheet.items
    assert cost.fmt(sheet.total) == "EUR 0.30 + USD 26.00"


def test_costs_group_by_arm_when_items_carry_one(tmp_path):
    plan = load_plan(_plan(tmp_path))
    # plan arms (issue 46) are not in the model yet: an item that carries one is grouped by it
    armed = replace(plan, items=tuple(replace(it, **{}) for it in plan.items))
    object.__setattr__(armed.items[0], "arm", "v5")
    assert cost.arm_of(armed.items[0]) == "v5" and cost.arm_of(armed.items[1]) is None
    t0 = 0.0
    sheet = cost.sheet(armed, {"train-a": [_run("train-a", "gpu", t0, t0 + 3600)],
                               "train-base": [_run("train-base", "gpu", t0, t0 + 3600)]}, now=t0 + 3600)
    assert sheet.arms == {"v5": {"USD": pytest.approx(10.0)}}


CAMPAIGN = """name: arms
hosts:
  gpu: {{local: true, workdir: {wd}/gpu, price: {{per_gpu_hour: 2.5, gpus: 4}}}}
items:
""" + "".join(f"""  - id: train-{x}
    content: train {x}
    action: {{{{kind: train, host: gpu, params: {{{{command: "true"}}}}}}}}
""" for x in ("a", "b", "base")) + "".join(f"""  - id: eval-{x}
    content: measure {x}
    needs: [train-{x}, train-base]
    action: {{{{kind: eval, host: gpu, params: {{{{drafter: d, target: t}}}}}}}}
""" for x in ("a", "b"))


def test_a_drafters_cost_leaves_out_the_baseline_every_eval_shares(tmp_path):
    plan = load_plan(_plan(tmp_path, CAMPAIGN))
    runs = {i: [_run(i, "gpu", 0.0, 3600.0 * h)] for i, h in (("train-a", 1), ("train-b", 2), ("train-base", 4))}
    sheet = cost.sheet(plan, runs, now=1e6)
    paid = cost.drafter_costs(plan, sheet, {"a": ["eval-a"], "b": ["eval-b"], "train-a@10": ["train-a"]})
    assert paid == {"a": {"USD": pytest.approx(10.0)}, "b": {"USD": pytest.approx(20.0)},
                    "train-a@10": {"USD": pytest.approx(10.0)}}
    # one eval alone: nothing is shared, so its baseline's training counts too
    alone = cost.drafter_costs(plan, sheet, {"a": ["eval-a"]})
    assert alone == {"a": {"USD": pytest.approx(50.0)}}


@pytest.mark.parametrize("price,words", [
    ("{per_hour: -1}", "field 'hosts.gpu.price.per_hour': per_hour must be a number from 0"),
    ("{per_hour: 1, per_gpu_hour: 2}", "field 'hosts.gpu.price': give exactly one of per_hour or per_gpu_hour"),
    ("{per_hour: 2, gpus: 4}", "field 'hosts.gpu.price.gpus': gpus goes with per_gpu_hour"),
    ("{per_gpu_hour: 2, gpus: 0}", "gpus must be a whole number from 1 to 4096"),
    ("{per_hour: true}", "per_hour must be a number"),
    ("{per_hour: 1, currency: 'US D'}", "currency must be a code such as USD"),
    ("{per_hour: 1, per: month}", "unknown key 'per'"),
    ("3", "price is {per_hour: N} or {per_gpu_hour: N, gpus: G}"),
])
def test_a_bad_price_is_refused_naming_file_line_and_field(tmp_path, price, words):
    p = tmp_path / "p.yaml"
    p.write_text(f"name: bad\nhosts:\n  gpu: {{local: true, workdir: {tmp_path}, price: {price}}}\n"
                 "items:\n  - id: x\n    content: x\n")
    with pytest.raises(PlanError) as e:
        load_plan(p)
    text = "\n".join(map(str, e.value.issues))
    assert f"{p}:3:" in text and words in text, text
    res = run_cli("validate", p)
    assert res.returncode == 2 and words in res.stderr and res.stdout == ""


def test_status_shows_the_cost_per_item_and_the_campaigns(tmp_path):
    plan = _plan(tmp_path)
    state = tmp_path / "s.db"
    store = Store(str(state))
    now = time.time()
    for item, host, hours in (("train-a", "gpu", 2.0), ("eval-a", "box", 0.5), ("look", "free", 1.0)):
        store.claim_run(f"{item}-1", item, "shell", host, owner="test")
        store.update_run(f"{item}-1", state="running", started_at=now - hours * 3600)
        store.end_run(f"{item}-1", "succeeded", exit_code=0)
    store.add_eval_results([EvalRow("eval-a-1", "eval-a", "a", "drafter", "p1", 2.0, [2], None, {}, None)])
    store.close()
    res = run_cli("--state", state, "status", plan, "--no-reconcile", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)["cost"]
    assert doc["items"]["train-a"]["USD"] == pytest.approx(20.0, rel=0.01)
    assert doc["items"]["eval-a"]["EUR"] == pytest.approx(0.6, rel=0.01)
    assert doc["total"] == {"USD": pytest.approx(20.0, rel=0.01), "EUR": pytest.approx(0.6, rel=0.01)}
    assert doc["unpriced_hosts"] == ["free"]
    text = run_cli("--state", state, "status", plan, "--no-reconcile").stdout
    assert "cost so far: EUR 0.60 + USD 20.00" in text and "by item: train-a USD 20.00; eval-a EUR 0.60" in text
    assert "not counted: runs on free (no price: in the plan)" in text


def test_compare_gives_the_cost_per_unit_of_tau_gained(tmp_path):
    plan = _plan(tmp_path, CAMPAIGN)
    state = tmp_path / "s.db"
    store = Store(str(state))
    now = time.time()
    for item, hours in (("train-a", 1.0), ("train-b", 2.0), ("train-base", 4.0), ("eval-a", 0.0), ("eval-b", 0.0)):
        store.claim_run(f"{item}-1", item, "train", "gpu", owner="test")
        store.update_run(f"{item}-1", state="running", started_at=now - hours * 3600)
        store.end_run(f"{item}-1", "succeeded", exit_code=0)
    rows = []
    for label, run, gain in (("a", "eval-a-1", 1.0), ("b", "eval-b-1", -0.5)):
        for p in ("p1", "p2", "p3"):
            rows += [EvalRow(run, run[:-2], label, "drafter", p, 2.0 + gain, [2], None, {}, None),
                     EvalRow(run, run[:-2], "base", "baseline", p, 2.0, [2], None, {}, None)]
    store.add_eval_results(rows)
    store.close()
    res = run_cli("--state", state, "compare", plan, "--markdown")
    assert res.returncode == 0, res.stderr
    assert "| a | USD 10.00 | +1.000 | USD 10.00 |" in res.stdout, res.stdout
    assert "| b | USD 20.00 | -0.500 | no gain |" in res.stdout
    doc = json.loads(run_cli("--state", state, "compare", plan, "--json").stdout)
    a = [c for c in doc["cost_per_tau"] if c["drafter"] == "a"][0]
    assert a["cost"]["USD"] == pytest.approx(10.0, rel=0.01) and a["per_tau"]["USD"] == pytest.approx(10.0, rel=0.01)
