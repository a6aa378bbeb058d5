"""The installed `specdeck demo --headless --quick` (the CI variant of the demo) runs the whole campaign
locally and ends with a tau table; a second run reuses everything (checks mark items done)."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from core.demo import disagreements, quoted
from tests.cli.conftest import specdeck as run_cli
from tests.unit.test_demo_readme import README, STORED

pytestmark = [pytest.mark.ml, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_demo_headless_quick_then_reuse(tmp_path):
    ws = tmp_path / "demo"
    t0 = time.monotonic()
    res = run_cli("demo", "--dir", ws, "--headless", "--quick", timeout=1500)
    first = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-4000:]
    out = res.stdout
    assert "| drafter | verdict | macro tau (per-request mean) |" in out  # the overall tau table (summary)
    for name in ("v4", "v5", "baseline"):
        assert f"| {name}" in out
    assert "ddtree-16" in out
    # the decision: verdict lines last, each drafter vs the baseline and v5 vs v4
    tail = out[out.index("Verdicts (paired over prompts, 95 %):"):]
    verdicts = [ln for ln in tail.splitlines() if ln.startswith("- ")]
    assert len(verdicts) == 6 and any(ln.startswith(("- v5 is", "- v5 vs v4")) for ln in verdicts)
    assert all("95 % CI" in ln and "8 prompts" in ln for ln in verdicts)
    # the review's decide: (v5 vs v4) leads; README quotes what this run printed (issue 48 §1),
    # and so does the stored output the quick tier checks README against
    assert verdicts[0].startswith(("- v5 is", "- v5 vs v4")), verdicts
    assert disagreements(quoted(README.read_text(encoding="utf-8"), "quick"), out) == []
    assert disagreements((STORED / "quick.txt").read_text(encoding="utf-8"), out) == []
    # tau over training: train-v5's checkpoints evaluated while it trained, with intervals
    assert "tau over training (train-v5" in out and "step   120  tau" in out
    data = json.loads(run_cli("--state", ws / "state.db", "compare", ws / "demo.yaml", "--json",
                              "--pair", "v5", "v4").stdout)
    v5 = [o for o in data["overall"] if o["drafter"] == "v5"][0]
    # train-v5's last checkpoint, evaluated while it trained, is the weights eval-v5 measured:
    # one drafter, one entry named with both labels (issue 48 §3)
    assert [d["aliases"] for d in data["drafters"] if d["label"] == "v5"] == [["train-v5@120"]]
    for key in ("macro_ci95", "pooled_ci95", "rounds", "delta_macro_ci95", "p_value", "test",
                "verdict", "verdict_text"):
        assert v5[key] is not None, key
    assert v5["verdict"] in ("better", "worse", "no_detectable_difference")
    assert [(p["a"], p["b"]) for p in data["pairs"]] == [("v5", "v4"),
                                                         ("v5 ddtree-16", "v4 ddtree-16")]
    status = json.loads(run_cli("--state", ws / "state.db", "status", ws / "demo.yaml",
                                "--json").stdout)
    st = {i["id"]: i["status"] for i in status["items"]}
    assert st.pop("review") == "pending" and set(st.values()) == {"done"}, st
    check_report(ws, run_cli)
    t0 = time.monotonic()
    res = run_cli("demo", "--dir", ws, "--headless", "--quick", timeout=600)
    again = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-3000:]
    assert again < first / 3, (first, again)
    # the demo's v5 as a model card (issue 45 §4): its sha256 is the weights the eval measured
    # (the stripped, relayed drafter on the eval host) and every tau row names its stored run
    v5_dir = ws / "hosts" / "eval" / "drafters" / "v5"
    card = run_cli("--state", ws / "state.db", "card", ws / "demo.yaml", "v5", "--drafter", v5_dir,
                   "--out", tmp_path / "card", "--cost", "1,0.05")
    assert card.returncode == 0, card.stderr
    text = (tmp_path / "card" / "README.md").read_text()
    sha = hashlib.sha256((v5_dir / "model.safetensors").read_bytes()).hexdigest()
    assert f"sha256: `{sha}`" in text and "recorded other weights" not in text
    run_ids = {d["run_ids"][0] for d in data["drafters"] if d["label"] in ("v5", "v5 ddtree-16")}
    tau = text.split("## Acceptance length (tau)")[1].split("## Draft length")[0]
    rows = [ln for ln in tau.splitlines() if ln.startswith(("| v5 |", "| v5 ddtree-16 |"))]
    assert len(rows) == 2 and all(any(f"run {r}" in ln for r in run_ids) for ln in rows), (rows, run_ids)
    assert f"{v5['macro']:.3f}" in text and "best k = " in text


def check_report(ws, cli) -> None:
    """Issue 47 §5: ``report --since`` over the demo lists every run, checkpoint and alert and the
    cost, in the order they happened, alike in text, Markdown and JSON. The demo raises no alert
    of itself: one is journaled as host telemetry journals a full disk."""
    import sqlite3

    from core.state.store import Store

    store = Store(str(ws / "state.db"))
    store.alert_once("disk_low", "disk /: 2.0 GiB free (the demo's test)", host="train")
    store.close()
    db = sqlite3.connect(ws / "state.db")
    runs = db.execute("SELECT id FROM runs").fetchall()
    checkpoints = db.execute("SELECT path FROM artefacts WHERE kind = 'checkpoint'").fetchall()
    db.close()
    args = ("--state", ws / "state.db", "report", ws / "demo.yaml", "--since", "12h")
    res = cli(*args, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    entries = doc["entries"]
    assert [e["at"] for e in entries] == sorted(e["at"] for e in entries)
    assert {e["run"] for e in entries if e["kind"] == "run_started"} == {r for (r,) in runs}
    assert {e["run"] for e in entries if e["kind"] == "run_ended"} == {r for (r,) in runs}
    assert {e["data"]["path"] for e in entries if e["kind"] == "checkpoint_written"} == {p for (p,) in checkpoints}
    assert [e["text"] for e in entries if e["kind"] == "disk"] == ["train: disk /: 2.0 GiB free (the demo's test)"]
    assert any(e["kind"] == "checkpoint_evaluated" for e in entries)  # train-v5's, while it trained
    assert doc["cost"]["total"]["USD"] > 0 and doc["cost"]["window"] == doc["cost"]["total"]
    (curve,) = doc["tau_over_training"]
    assert curve["item"] == "train-v5" and curve["best"] in curve["points"]
    text = cli(*args).stdout.splitlines()
    md = cli(*args, "--markdown").stdout.splitlines()
    timeline = [ln for ln in text if ln[:2].isdigit() and ln[2] == ":"]
    bullets = [ln for ln in md if ln.startswith("- `")]
    assert len(timeline) == len(bullets) == len(entries)
    for e, t, b in zip(entries, timeline, bullets):
        assert e["text"] in t and e["text"].replace("|", "\\|") in b
    assert any(ln.startswith("  in this window USD ") for ln in text)
    assert any(ln.startswith("- in this window USD ") for ln in md)
