"""plans/ablation.yaml end to end, headless, on the demo's two local hosts (``specdeck demo
--ablation`` writes the same plan): the target is a tiny random Qwen3 built in code (the
demo's code model takes minutes) placed where ``make-target`` puts its model, so its
``check()`` finds it; every other item really runs: features, v4 and the three arms trained
(a few steps), stripped, relayed and evaluated; ``compare --arms`` then gives one row per arm
against v4 with its knob, Holm-corrected, and the arms against each other."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # a dozen torch subprocesses (``ml`` comes from tests/ml)


@pytest.fixture
def workspace(tmp_path, qwen3_target, tiny):
    from core.demo import write_ablation

    root = tmp_path / "ws"
    plan = write_ablation(root, quick=True)
    target = root / "hosts" / "train" / "models" / "code-target"
    qwen3_target.save_pretrained(target)
    tiny.tiny_tokenizer().save_pretrained(target)
    (target / "codemodel.json").write_text("{}")  # make-target's `creates`: it is there
    doc = yaml.safe_load(plan.read_text())
    for it in doc["items"]:  # the demo's settings, cut to a few steps and prompts
        params = (it.get("action") or {}).get("params") or {}
        if it["id"] == "features":
            params["max_new_tokens"] = 24
        if "overrides" in params:
            params["overrides"].update({"train.max_steps": 4, "train.checkpoint_every": 2,
                                        "train.log_every": 2})
        if "limit" in params:
            params.update(limit=6, max_new_tokens=12)
    plan.write_text(yaml.safe_dump(doc, sort_keys=False))
    return plan


def test_ablation_runs_end_to_end_and_compares_the_arms_against_v4(workspace):
    res = run_cli("validate", workspace)
    assert res.returncode == 0, res.stderr
    res = run_cli("run", workspace, "--all", timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    status = json.loads(run_cli("status", workspace, "--json").stdout)
    by_id = {i["id"]: i for i in status["items"]}
    for arm in ("noise", "taps", "loss"):
        for t in ("train", "strip", "relay", "eval"):
            assert by_id[f"{t}[{arm}]"]["status"] == "done", by_id[f"{t}[{arm}]"]
    assert by_id["train-v4"]["status"] == "done"

    res = run_cli("compare", workspace, "--arms", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["against"] == "v4" and doc["correction"] == "holm" and doc["family"] == 6
    rows = [p for p in doc["pairs"] if p["b"] == "v4"]
    assert [p["a"] for p in rows] == ["noise", "taps", "loss"]  # one row per arm
    knobs = {p["a"]: p["knob_a"] for p in rows}
    assert knobs["noise"] == ["noise.target=fc_input"] and knobs["taps"] == ["fc_layers=taps"]
    assert "loss.soft_kl_weight=0.0" in knobs["loss"]
    between = {(p["a"], p["b"]) for p in doc["pairs"] if p["b"] != "v4"}
    assert between == {("noise", "taps"), ("noise", "loss"), ("taps", "loss")}
    for p in doc["pairs"]:
        assert p["prompts"] == 6
        assert p["p_holm"] >= p["p_value"]  # corrected: never below the lone test's p
        assert (p["verdict"] != "no_detectable_difference") == (p["p_holm"] < 0.05)
    # the Markdown the operator reads: the knob beside each arm's row
    text = run_cli("compare", workspace, "--arms").stdout
    assert "| noise | noise.target=fc_input |" in text and "Holm" in text
    # the config diff between two arms is one command: exactly the knobs they change
    res = run_cli("diff", workspace, "train[noise]", "train[taps]", "--json")
    assert res.returncode == 0, res.stderr
    assert set(json.loads(res.stdout)) == {"noise.target", "fc_layers"}
    by_arm = run_cli("diff", workspace, "noise", "taps", "--json")  # the arms by name
    assert by_arm.returncode == 0 and json.loads(by_arm.stdout) == json.loads(res.stdout)
