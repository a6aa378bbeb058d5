"""``specdeck demo``: a whole drafter campaign on this machine, on the embedded default.

Two local hosts (two workdirs standing for the training host and the eval host), SQLite state
inside the workspace, a tiny code model trained here on the standard library's sources:

1. ``make-target``: ``core.ml.codemodel`` trains a tiny Qwen3 target (byte-level BPE) for a
   fixed number of steps (300 with ``--quick``, 600) on the standard library's sources;
2. ``relay-target``: its files go to the eval host, through specdeck;
3. ``features``: the target's greedy continuations and hidden states for training prompts
   (``Write a Python function <name>(<args>)`` for standard-library functions);
4. ``train-v4`` (legacy options) and ``train-v5`` (the fixed defaults), and a barely-trained
   ``train-baseline``, all with ``core.ml.train``; ``train-v5`` has ``watch_eval``: each of
   its checkpoints is evaluated on the eval host while it trains (tau over training);
5. ``strip-*``: their checkpoints -> drafter weights; ``relay-*`` to the eval host;
6. ``eval-v4`` / ``eval-v5``: tau (chain and DDTree) against the baseline, on the coding set;
7. ``review``: a manual step: read the tau table and decide (its ``decide:`` names v5 vs v4,
   so ``compare`` and the console lead with that verdict).

At the end it prints the tau table (prompts x drafters, 95 % intervals), tau over training
and the verdicts: v5 against v4 first, then each drafter against the baseline, paired over
prompts. README quotes them for both modes (:func:`disagreements` is how the tests hold the
quotes to what the demo prints).

The workspace is ``./specdeck-demo`` (``--dir``). A second run reuses what exists: every
action's ``check()`` finds its output and marks the item done.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import sysconfig
from pathlib import Path

import yaml

from core.ml.formats import strictjson

ROOT = Path(__file__).resolve().parent.parent
WATCHED = "train-v5"
"""The train item whose checkpoints are evaluated while it trains (tau over training)."""
DECIDE = (("v5", "v4"),)
"""The pair the demo's ``review`` decides (its ``decide:``): compare and the console lead with it."""
TRAIN_MODULES = ("textwrap", "shlex", "fnmatch", "glob", "posixpath", "heapq", "bisect",
                 "statistics", "string", "base64", "calendar", "difflib", "csv", "json/decoder",
                 "copy", "random", "colorsys", "html/__init__", "ipaddress", "fractions")


def training_prompts(n: int = 32) -> list[dict]:
    """Chat-style coding prompts built from standard-library function signatures."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out, seen = [], set()
    for mod in TRAIN_MODULES:
        path = stdlib / f"{mod}.py"
        if not path.is_file():
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                args = ", ".join(a.arg for a in node.args.args)
                if node.name in seen:
                    continue
                seen.add(node.name)
                doc = (ast.get_docstring(node) or "").strip().splitlines()
                text = f"Write a Python function {node.name}({args})"
                if doc:
                    text += f": {doc[0].rstrip('.')}."
                out.append({"id": f"{mod.replace('/', '.')}.{node.name}", "prompt": text})
                if len(out) >= n:
                    return out
    return out


# The target trains for a number of steps, not seconds: a model trained by time is another model
# on each machine, and early on the lengths of its answers swing (of the 32 training prompts,
# answers of 2 x block = 16+ tokens after 30 / 60 / 120 / 180 / 300 / 600 / 1000 steps: 32 / 11 / 23 /
# 32 / 30 / 32 / 32). After the old 20 s, a CI machine's target gave none of the 32 long enough to train on.
TARGET_STEPS = {True: 300, False: 600}


def demo_overrides(quick: bool) -> tuple[dict, int, int]:
    """The trainer overrides every demo drafter shares, its steps and the prompts evaluated."""
    steps = 120 if quick else 240
    limit = 8 if quick else 16  # fewer than 6 prompts can never show a difference
    return ({"target": "models/code-target", "data.features": "features/train",
             "train.max_steps": steps, "train.checkpoint_every": steps // 2,
             "train.log_every": 10, "drafter.target_layer_ids": [0, 2]}, steps, limit)


def demo_plan(root: Path, quick: bool) -> dict:
    py = sys.executable
    over, steps, limit = demo_overrides(quick)
    # OMP_WAIT_POLICY=PASSIVE: torch's OpenMP threads stop spinning while they wait, which
    # keeps two concurrent CPU jobs on a 2-core machine from stalling each other.
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    # prices as a cloud would charge the machines the two workdirs stand for (an 8-GPU training
    # node, a one-GPU eval box): status, the tau table and the report say what the demo cost
    hosts = {"train": {"local": True, "workdir": str(root / "hosts" / "train"), "python": py,
                       "env": env, "price": {"per_gpu_hour": 2.49, "gpus": 8}},
             "eval": {"local": True, "workdir": str(root / "hosts" / "eval"), "python": py,
                      "env": env, "price": {"per_hour": 1.10}}}
    items = [
        {"id": "make-target", "content": "Build a tiny code model (trained on Python's stdlib)",
         "priority": "high",
         "action": {"kind": "shell", "host": "train", "params": {
             "command": f"{py} -u -m core.ml.codemodel models/code-target --max-steps "
                        f"{TARGET_STEPS[quick]}",
             "creates": "models/code-target/codemodel.json"}}},
        {"id": "relay-target", "content": "Copy the target to the eval host (relay through specdeck)",
         "needs": ["make-target"],
         "action": {"kind": "relay", "params": {"src": "train:models/code-target",
                                                "dst": "eval:models/code-target"}}},
        {"id": "features", "content": "Extract target hidden states for the training prompts",
         "needs": ["make-target"],
         "action": {"kind": "extract_hidden", "host": "train", "params": {
             "target": "models/code-target", "prompts": "train-prompts.jsonl",
             "layers": [0, 2, 3], "out": "features/train", "max_new_tokens": 64}}},
    ]
    for name, cfg, extra in (("v4", "v4-legacy.yaml", {}), ("v5", "v5.yaml", {}),
                             ("baseline", "v5.yaml", {"train.max_steps": 10,
                                                      "train.checkpoint_every": 10})):
        watch = name == WATCHED.removeprefix("train-")
        items.append({"id": f"train-{name}", "content": {
            "v4": "Train the v4 drafter (legacy options: soft KL, streak weights, gamma 10, "
                  "noisy targets, fc sees the final layer)",
            "v5": "Train the v5 drafter (hard CE with position decay, noise on fc input only, "
                  "final layer reserved)",
            "baseline": "Train a barely-trained baseline drafter (10 steps)"}[name],
            "needs": ["features"] + (["relay-target"] if watch else []),
            "action": {"kind": "train", "host": "train", "params": {
                "config": f"train/{cfg}", "overrides": {
                    **over, **extra, **({"train.checkpoint_every": steps // 4} if watch else {})},
                **({"watch_eval": {"host": "eval", "target": "models/code-target",
                                   "mode": "online", "prompts": "coding", "max_prompts": limit,
                                   "max_new_tokens": 48}} if watch else {})}}})
        items.append({"id": f"strip-{name}", "content": f"Strip the {name} checkpoint to drafter weights",
                      "needs": [f"train-{name}"],
                      "action": {"kind": "extract_weights", "host": "train", "params": {
                          "checkpoint": f"item:train-{name}@latest", "out": f"drafters/{name}"}}})
        items.append({"id": f"relay-{name}", "content": f"Relay the {name} drafter to the eval host",
                      "needs": [f"strip-{name}"],
                      "action": {"kind": "relay", "params": {"src": f"train:drafters/{name}",
                                                             "dst": f"eval:drafters/{name}"}}})
    for name in ("v5", "v4"):
        params = {"drafter": f"drafters/{name}", "target": "models/code-target",
                  "prompts": "coding", "limit": limit, "max_new_tokens": 48, "tree_budget": 16,
                  "label": name}
        if name == "v5":  # the baseline is measured once, with the same settings
            params.update(baseline="drafters/baseline", baseline_label="baseline")
        items.append({"id": f"eval-{name}", "content": f"Evaluate {name} vs the baseline (chain + DDTree)",
                      "needs": [f"relay-{name}", "relay-baseline", "relay-target"],
                      "action": {"kind": "eval", "host": "eval", "params": params}})
    items.append({"id": "review", "content": "Read the tau table (specdeck compare) and decide",
                  "needs": ["eval-v4", "eval-v5"], "decide": [list(p) for p in DECIDE]})
    return {"name": "demo", "hosts": hosts, "items": items}


ABLATION = ROOT / "plans" / "ablation.yaml"
"""The shipped 3-arm ablation of v5's fixes (``specdeck demo --ablation`` runs it here)."""
ABLATION_STATE = "ablation.db"


def ablation_plan(root: Path, quick: bool) -> dict:
    """plans/ablation.yaml on this workspace's hosts (this interpreter), with the demo's
    step counts and prompts for ``quick``: its arms and items as shipped."""
    doc = yaml.safe_load(ABLATION.read_text())
    demo = demo_plan(root, quick)
    _, steps, limit = demo_overrides(quick)
    doc["hosts"] = demo["hosts"]
    for it in doc["items"]:
        action = it.get("action") or {}
        params = action.get("params") or {}
        if it["id"] == "make-target":
            params["command"] = demo["items"][0]["action"]["params"]["command"]
        if action.get("kind") == "train":
            params["overrides"].update({"train.max_steps": steps,
                                        "train.checkpoint_every": steps // 2})
        if action.get("kind") == "eval":
            params["limit"] = limit
    return doc


def write_ablation(root: Path, quick: bool, state: str | None = None) -> Path:
    """Write the demo workspace and ``ablation.yaml`` in it (state: ``ablation.db`` beside
    it unless ``state``); return the plan's path. The shared items find the demo's target and
    features when the demo ran there (their ``check()``), and build them otherwise."""
    write_workspace(root, quick)
    doc = {"name": "ablation", "state": state or ABLATION_STATE,
           **{k: v for k, v in ablation_plan(root, quick).items() if k != "name"}}
    text = ("# The 3-arm ablation of v5's fixes (written by `specdeck demo --ablation` from "
            "plans/ablation.yaml\n# with this workspace's hosts; edit freely).\n"
            + yaml.safe_dump(doc, sort_keys=False, width=100))
    plan = root / "ablation.yaml"
    if not plan.exists() or plan.read_text() != text:
        plan.write_text(text)
    return plan


def ablation_text(plan, rows: list) -> str:
    """The ablation's result: each arm against ``arms.against`` and each other (Holm)."""
    from core.plans.arms import arm_labels
    from core.tau import arms
    from core.tau.table import build_comparison

    if not rows:
        return ""
    taus = arms.per_prompt(build_comparison(rows))
    return "\n" + arms.to_markdown(arms.compare_arms(taus, arm_labels(plan),
                                                      plan.arms.against))


def write_workspace(root: Path, quick: bool, state: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train").mkdir(exist_ok=True)
    for name in ("v5.yaml", "v4-legacy.yaml"):
        src = ROOT / "plans" / "train" / name
        (root / "train" / name).write_text(src.read_text())
    prompts = root / "train-prompts.jsonl"
    rows = training_prompts()
    text = "".join(strictjson.dumps(r) + "\n" for r in rows)
    if not prompts.exists() or prompts.read_text() != text:
        prompts.write_text(text)
    plan = root / "demo.yaml"
    spec = demo_plan(root, quick)
    # recorded in the plan: status, compare, ui... find the demo's state without --state
    spec = {"name": spec.pop("name"), "state": state or "state.db", **spec}
    doc = yaml.safe_dump(spec, sort_keys=False, width=100)
    header = ("# The specdeck demo campaign (written by `specdeck demo`; edit freely).\n"
              "# Two local hosts stand for the training host and the eval host.\n")
    if not plan.exists() or plan.read_text() != header + doc:
        plan.write_text(header + doc)
    return plan


def open_workspace(directory: str | None, quick: bool, state: str | None = None, *,
                   ablation: bool = False) -> tuple[Path, Path, str]:
    """Write (or refresh) the demo workspace; return its root, its plan file and the state
    database it uses (``state``, else ``$SPECDECK_STATE``, else ``ROOT/state.db``;
    ``ablation``: the ablation's plan, ``ROOT/ablation.db``)."""
    root = Path(directory or "specdeck-demo").resolve()
    chosen = state or os.environ.get("SPECDECK_STATE")
    path = str(Path(chosen).resolve()) if chosen else str(
        root / (ABLATION_STATE if ablation else "state.db"))
    write = write_ablation if ablation else write_workspace
    return root, write(root, quick, path if chosen else None), path


async def run_campaign(session) -> tuple[dict, list, dict]:
    """Run every item of the demo plan in ``session`` (a :class:`core.session.Session`).

    Returns the runner's summary, the eval rows of the tau table (not ``WATCHED``'s, which
    are tau over training) and tau over training (:func:`tau_over_training`'s series).
    """
    store = session.store
    await session.reconcile()
    summary = await session.run(None)
    rows = session.eval_rows()
    run = session.latest_run(WATCHED)
    over = {n: dict(store.metric_series(run.id, n))
            for n in ("tau", "tau_ci95_lo", "tau_ci95_hi")} if run else {}
    if run:  # checkpoints not evaluated: a newer one was waiting, or the eval failed
        over["not evaluated"] = {e.step: e.state
                                 for e in store.watch_entries(run.id)
                                 if e.state != "done"}
    return summary, [r for r in rows if r.item_id != WATCHED], over


def results_text(rows: list, over: dict) -> str:
    """The tau table (prompts x drafters), tau over training and the verdicts (v5 vs v4 and
    each drafter vs the baseline); empty when no eval ran."""
    from core.tau.table import build_comparison, to_markdown, verdict_lines

    if not rows:
        return ""
    comp = build_comparison(rows, decide=DECIDE)
    return ("\n" + to_markdown(comp, pivot=True, verdicts=False) + "\n"
            + tau_over_training(over) + "\n"
            + VERDICTS_HEAD + "\n"
            + "".join(f"- {line}\n" for line in verdict_lines(comp)))


VERDICTS_HEAD = "Verdicts (paired over prompts, 95 %):"
"""The line :func:`results_text` puts above the verdicts (the decision's first)."""
_VERDICT = re.compile(r"^(?P<a>.+?)(?: is (?P<verdict>better|worse) than | vs )(?P<b>.+?)"
                      r"(?:: no detectable difference)? \((?P<delta>[^,]+), 95 % CI (?P<ci>\S+), "
                      r"(?P<prompts>\d+) prompts")


def verdicts(text: str) -> list[dict]:
    """The verdict lines (``- A is better than B (+0.42, 95 % CI ..., 8 prompts, ...)``) of a
    text, parsed: ``a``, ``b``, ``verdict`` (``better``, ``worse`` or ``none``), ``delta``,
    ``ci`` (lo, hi) and ``prompts``; lines that are no verdict are skipped."""
    out = []
    for line in text.splitlines():
        m = _VERDICT.match(line.removeprefix("- ").strip())
        if not line.startswith("- ") or not m:
            continue
        lo, _, hi = m["ci"].partition("..")
        out.append({"a": m["a"], "b": m["b"], "verdict": m["verdict"] or "none",
                    "delta": float(m["delta"]), "ci": (float(lo), float(hi)),
                    "prompts": int(m["prompts"])})
    return out


def quoted(readme: str, mode: str) -> str:
    """The text between ``<!-- demo MODE -->`` and ``<!-- /demo -->`` in the README ("" if none)."""
    start = f"<!-- demo {mode} -->"
    if start not in readme:
        return ""
    return readme.split(start, 1)[1].split("<!-- /demo -->", 1)[0]


def disagreements(quoted_text: str, printed_text: str) -> list[str]:
    """Where the verdicts quoted (a README's) disagree with those printed (a demo's): nothing
    quoted, a quoted pair the demo did not print, another verdict or number of prompts, or a
    quoted difference outside the printed interval (the run it was copied from may differ in
    the last digits, never beyond that)."""
    said = {(v["a"], v["b"]): v for v in verdicts(quoted_text)}
    seen = {(v["a"], v["b"]): v for v in verdicts(printed_text)}
    out = [] if said else ["no verdict quoted"]
    out += [f"{a} vs {b}: quoted, not printed" for a, b in said if (a, b) not in seen]
    for key in said.keys() & seen.keys():
        q, p = said[key], seen[key]
        if q["verdict"] != p["verdict"] or q["prompts"] != p["prompts"]:
            out.append(f"{key[0]} vs {key[1]}: quoted {q['verdict']} over {q['prompts']} prompts, "
                       f"printed {p['verdict']} over {p['prompts']}")
        elif not p["ci"][0] <= q["delta"] <= p["ci"][1]:
            out.append(f"{key[0]} vs {key[1]}: quoted {q['delta']:+.2f}, outside the printed "
                       f"95 % CI {p['ci'][0]:+.2f}..{p['ci'][1]:+.2f}")
    return out


def tau_over_training(series: dict[str, dict[int, float]], width: int = 40) -> str:
    """``train-v5``'s tau at each evaluated checkpoint with its 95 % interval: figures and
    the interval drawn on one axis (``├──●──┤``)."""
    tau = series.get("tau") or {}
    if not tau:
        return f"tau over training ({WATCHED}): no checkpoint evaluated\n"
    lo, hi = series.get("tau_ci95_lo") or {}, series.get("tau_ci95_hi") or {}
    a = min([*tau.values(), *lo.values()])
    b = max([*tau.values(), *hi.values()])

    def pos(x: float) -> int:
        return round((x - a) / (b - a) * (width - 1)) if b > a else 0

    out = [f"tau over training ({WATCHED}: watch_eval at each checkpoint, 95 % CI over "
           f"prompts; axis {a:.2f}..{b:.2f}):"]
    for step in sorted(tau):
        line = [" "] * width
        ci = "–"
        if step in lo and step in hi:
            ci = f"{lo[step]:.2f}..{hi[step]:.2f}"
            for i in range(pos(lo[step]), pos(hi[step]) + 1):
                line[i] = "─"
            line[pos(lo[step])], line[pos(hi[step])] = "├", "┤"
        line[pos(tau[step])] = "●"
        out.append(f"  step {step:>5}  tau {tau[step]:.3f}  [{ci:>10}]  {''.join(line)}")
    missed = series.get("not evaluated") or {}
    if missed:
        out.append("  not evaluated: " + ", ".join(f"step {k} ({v})" for k, v in
                                                   sorted(missed.items()))
                   + " (a newer checkpoint was waiting: only the newest is evaluated)"
                   * all(v == "skipped" for v in missed.values()))
    return "\n".join(out) + "\n"
