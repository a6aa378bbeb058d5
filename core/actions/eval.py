"""``eval``: acceptance length (tau) of a drafter against a baseline on a prompt set.

One capsule runs ``core.ml.eval`` for the drafter and then for the baseline with the same
settings (a training checkpoint is stripped first), and ``finish`` stores one row per prompt
and drafter in the store's eval results, with the settings that make rows comparable (mode,
block size, DDTree budget, target fingerprint, prompt file hash) and the definition of tau
the numbers follow. ``specdeck compare`` and the console's tau pane read those rows.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from typing import Literal

from core.actions import fit
from core.actions.base import Action, CheckResult, Launch
from core.actions.mlbase import (drafter_command, host_python, launch_inputs, ml_failure,
                                 prompts_on_host, py_module, read_json, record_launch, reproduce_record,
                                 resolve_checkpoint, resolve_ref, validate_prompts, validate_ref)
from core.errors import ActionFailed
from core.ml.formats import bounds, resultfile
from core.ml.models import sampling
from core.ml.measure import harness, tau
from core.ml.measure.parity import drafter_identity
from core.ml.formats.runio import parse_bytes
from core.plans.params import counts, problems, to_plain
from core.state.records import EvalRow


@dataclass(frozen=True)
class EvalParams:
    drafter: str
    """A drafter dir, a training checkpoint (.pt, stripped first) or item:<train>@latest|@best|@step:N
    (any trainer's layout, core.ml.formats.layouts: a speculators epoch dir is evaluated as it is)."""
    target: str
    """The target model dir on the host."""
    baseline: str | None = None
    """A baseline drafter dir (e.g. z-lab's), evaluated with the same settings."""
    prompts: str = "coding"
    """A set under plans/prompts/, a file beside the plan, host:PATH, or zlab:NAME[:PATH], one of
    the reference's benchmark sets (docs/evaluation.md); ``limit`` is its seeded subset size."""
    mode: Literal["online", "offline"] = "online"
    cache: str | None = None
    """The extract_hidden cache dir (offline mode)."""
    tree_budget: int | None = None
    """Also evaluate DDTree with this many draft nodes."""
    block_size: int | None = None
    max_new_tokens: int = 128
    limit: int | None = None
    label: str | None = None
    """The drafter's name in comparisons (default: the item id)."""
    baseline_label: str = "baseline"
    step: int | None = None
    """The training step this drafter comes from (tau over training)."""
    chat_template: bool = True
    allow_block_size_mismatch: bool = False
    """Compare a drafter and a baseline trained with different block sizes, each at its own
    (otherwise refused; ``block_size`` evaluates both at one size instead)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The target's dtype on the eval host; auto keeps the checkpoint's own (bf16 stays bf16)."""
    max_memory: str | None = None
    """Refuse before loading when the eval needs more (e.g. 60G); default: what the host has free."""
    cpu_matmul: Literal["auto", "torch"] = "auto"
    """auto: on a CPU without bf16/fp16 matrix instructions, linears of 8+ rows (verify, prefill)
    run in float32 tiles (core.ml.models.cpu_rows; a 16-row linear 2-3x faster, a round about 2x
    cheaper, bench/eval_speed.py); torch: torch's own kernels, bit-identical to results made before."""
    temperature: float = 0.0
    """0: greedy; > 0: sampled speculative decoding, lossless (chain only: no tree_budget, online)."""
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    samples: int = 1
    """Sampled: generations per prompt, each with its own seed (compare averages them per prompt)."""
    engine_rule: Literal["vllm", "sglang", "llama.cpp"] | None = None
    """Run the drafter in process under this engine's attention rule (core.ml.engines.served): tau as
    that engine would serve it, beside an ``engine`` eval of the same drafter (``specdeck parity``)."""
    engine: Literal["llama.cpp"] | None = None
    """Measure through this engine instead of in process (core.ml.engines.llama: a llama-server on
    the eval host, loopback only, ended with the run); the rows are labelled with the engine."""
    engine_bin: str | None = None
    """The llama-server binary on the host (default: the newest build of scripts/build-llama-server)."""
    engine_target: str | None = None
    """The target as a .gguf on the host (default: ``target``, converted in the capsule)."""
    engine_drafter: str | None = None
    """The drafter as a .gguf on the host (default: the drafter, converted in the capsule)."""
    engine_threads: int | None = None
    """llama-server's CPU threads (default 2)."""
    engine_context: int = 4096
    """llama-server's context length (prompt + max_new_tokens + block size must fit)."""
    stop: Literal["settled"] | None = None
    """settled: the drafter and the baseline run prompt by prompt and the eval stops as soon as the
    verdict is settled (better, worse, or no difference as large as ``min_difference``), ``limit``
    being the cap (docs/evaluation.md §7); the result says how many prompts it took."""
    min_difference: float | None = None
    """With ``stop: settled``: the smallest tau difference that matters (e.g. 0.25)."""
    alpha: float = 0.05
    """With ``stop: settled``: each verdict's error rate."""

    def validate(self):
        out = []
        out += sampling_problems(self)
        out += engine_problems(self)
        out += settled_problems(self)
        if self.max_memory is not None:
            try:
                parse_bytes(self.max_memory)
            except ValueError as exc:
                out.append((("max_memory",), str(exc)))
        return out + counts(self, max_new_tokens=1, limit=0, block_size=1, tree_budget=1) + problems(
            ("cache", "offline mode needs the extract_hidden cache dir"
             if self.mode == "offline" and not self.cache else None),
            ("step", bounds.count(self.step, 0, bounds.INT64_MAX) if self.step is not None else None),
        )


def settled_problems(p) -> list:
    """``stop: settled``'s problems (``core.ml.eval --stop settled`` refuses the same, exit 2)."""
    if p.stop is None:
        return problems(("min_difference", "set stop: settled to use it" if p.min_difference is not None else None))
    d = p.min_difference
    return problems(
        ("baseline", "stop: settled decides a drafter against its baseline: set baseline" if not p.baseline else None),
        ("min_difference", "give the smallest tau difference that matters, a number > 0 (e.g. 0.25)"
         if d is None or isinstance(d, bool) or not (0 < d < bounds.COUNT_MAX) else None),
        ("alpha", "an error rate between 0 and 1 (e.g. 0.05)" if not 0 < p.alpha < 1 else None),
        ("mode", "the settled stop pairs online chains" if p.mode != "online" else None),
        ("tree_budget", "the settled stop pairs chains: drop tree_budget" if p.tree_budget is not None else None),
        ("samples", "the settled stop pairs one sample per prompt" if p.samples > 1 else None),
        ("engine", "the settled stop runs in process" if p.engine is not None else None),
        ("engine_rule", "the settled stop runs both drafters under specdeck's rule" if p.engine_rule else None),
    )


def settled_flags(h, p) -> list:
    """``core.ml.eval``'s flags for ``stop: settled``: the baseline paired in the same run."""
    if p.stop != "settled":
        return []
    return ["--baseline-drafter", h.path(p.baseline), "--baseline-out", "baseline/result.json",
            "--baseline-label", p.baseline_label, "--stop", "settled", "--min-difference", p.min_difference,
            "--alpha", p.alpha]


def engine_problems(p) -> list:
    """The engine params' problems (``core.ml.eval --engine`` refuses the same, exit 2)."""
    if p.engine is None:
        named = [f for f in ("engine_bin", "engine_target", "engine_drafter", "engine_threads") if getattr(p, f)]
        return [((named[0],), "set engine: llama.cpp to use it")] if named else []
    return problems(
        ("engine_rule", "the engine applies its own rule; measure specdeck under it in another eval item "
         "(engine_rule, no engine)" if p.engine_rule is not None else None),
        ("mode", "the engine decodes online" if p.mode == "offline" else None),
        ("tree_budget", "llama-server verifies a chain" if p.tree_budget is not None else None),
        ("temperature", "the engine leg is measured greedy" if p.temperature else None),
    ) + counts(p, engine_threads=1, engine_context=16)


def sampling_problems(p, offline_field: str = "mode") -> list:
    """The sampling params' problems, as ``validate`` reports them (``core.ml.eval`` refuses the same).

    ``p``: eval's params or watch_eval's (which has no ``tree_budget``); ``offline_field`` is the
    field an offline mode at a temperature > 0 is blamed on: the one the user set away from its
    default (``mode`` for eval, online by default; ``temperature`` for watch_eval, offline)."""
    why = sampling.Sampling(p.temperature, p.top_p, p.top_k).problem()
    if why:
        return [((why[0],), why[1])]
    if p.samples < 1:
        return [(("samples",), "must be >= 1")]
    if counts(p, samples=1):
        return counts(p, samples=1)
    if p.temperature == 0 and p.samples > 1:
        return [(("samples",), "greedy decoding (temperature 0) is deterministic: set a temperature > 0")]
    if p.temperature > 0 and getattr(p, "tree_budget", None) is not None:
        return [(("tree_budget",), "DDTree verifies greedily: there is no lossless sampled tree "
                                   "verification; drop tree_budget or use temperature 0")]
    if p.temperature > 0 and p.mode == "offline":
        return [((offline_field,), "offline tau is not defined at a temperature > 0: use mode online")]
    return []


class Eval(Action, kind="eval", params=EvalParams,
             summary="measure tau (chain, DDTree) of a drafter vs a baseline on a prompt set"):

    @classmethod
    def validate_plan(cls, params, plan, item):
        return problems(
            ("prompts", validate_prompts(plan, params.prompts, multi_turn=params.mode == "online")),
            ("drafter", validate_ref(plan, item, params.drafter)),
            ("top_k", fit.top_k_beyond_vocab(plan, item, params)),
            ("baseline", fit.block_size_mismatch(params, fit.local_block_size(plan, item, params.drafter),
                                                 fit.local_block_size(plan, item, params.baseline))),
        )

    #: Params added after results were first keyed: they count in the key only when set off
    #: their default, so an upgrade leaves the evals already measured measured.
    KEYED_WHEN_SET = {"cpu_matmul": "auto", "stop": None, "min_difference": None, "alpha": 0.05}

    def settings_key(self) -> str:
        plain = to_plain(self.params)
        for name, default in self.KEYED_WHEN_SET.items():
            if plain.get(name) == default:
                plain.pop(name)
        return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]

    async def check(self, ctx) -> CheckResult:
        run = (ctx.runs() or [None])[-1]
        if run and run.state == "succeeded" and run.result:
            res = run.result
            if res.get("settings_key") == self.settings_key() and \
                    res.get("drafter_path") == _display(ctx, self.params.drafter):
                tau = res.get("tau")  # null: no prompt had a round (or a non-finite one, strict JSON)
                shown = f"tau {tau:.3f}" if isinstance(tau, (int, float)) else "tau (none)"
                return CheckResult.done(f"{shown} already measured with "
                                        f"these settings (target in {res.get('dtype') or self.params.dtype})")
        if await ctx.host.stat(self.params.target) is None:
            return CheckResult.blocked(f"target {self.params.target} does not exist on {ctx.host.name}")
        p = self.params
        if p.baseline and p.block_size is None and not p.allow_block_size_mismatch:
            try:
                drafter = resolve_ref(ctx, p.drafter)
            except ActionFailed:
                drafter = None
            err = fit.block_size_mismatch(
                p, await fit.host_block_size(ctx.host, drafter) if drafter else None,
                await fit.host_block_size(ctx.host, p.baseline))
            if err:
                return CheckResult.blocked(err)
        return CheckResult.ready()

    async def prepare(self, ctx) -> None:
        python = await host_python(ctx.host)
        prompts, _ = await prompts_on_host(ctx.host, ctx.plan, self.params.prompts, upload=True)
        record_launch(ctx, python=python, prompts=prompts)

    def _eval_cmd(self, ctx, found: dict, drafter: str, out: str, label: str) -> str:
        """``core.ml.eval`` of ``drafter`` into ``out``; ``label`` names it in the progress and
        metric lines (the drafter's and the baseline's come from one capsule, one after the
        other: each line says which it measures)."""
        p, h = self.params, ctx.host
        return py_module(found["python"], "core.ml.eval", "--target", h.path(p.target),
                         "--drafter", drafter, "--prompts", found["prompts"], "--out", out,
                         "--label", label, "--mode", p.mode,
                         *(["--cache", h.path(p.cache)] if p.cache else []),
                         *(["--tree-budget", p.tree_budget] if p.tree_budget else []),
                         *(["--block-size", p.block_size] if p.block_size else []),
                         "--max-new-tokens", p.max_new_tokens,
                         *(["--limit", p.limit] if p.limit else []),
                         "--dtype", p.dtype,
                         *(["--max-memory", p.max_memory] if p.max_memory else []),
                         *(["--cpu-matmul", p.cpu_matmul] if p.cpu_matmul != "auto" else []),
                         *sampling.cli_flags(p),
                         *engine_flags(h, p),
                         *settled_flags(h, p),  # only the drafter runs in settled mode: it pairs the baseline
                         None if p.chat_template else "--no-chat-template")

    def command(self, ctx) -> Launch:
        h = ctx.host
        found = launch_inputs(ctx)
        art = resolve_checkpoint(ctx, self.params.drafter)
        src = h.path(art.path if art is not None else self.params.drafter)
        lines = ["set -e"]
        drafter = src
        strip = drafter_command(found["python"], src, "drafter", art)
        if strip:
            drafter = "drafter"
            lines.append(strip)
        lines.append(self._eval_cmd(ctx, found, drafter, "result-drafter.json",
                                    self.params.label or ctx.item.id))
        if self.params.baseline and self.params.stop is None:  # settled: the drafter's run paired it
            lines.append(self._eval_cmd(ctx, found, h.path(self.params.baseline),
                                        "baseline/result.json", self.params.baseline_label))
        from core.capsules import jobs

        return Launch("\n".join(lines), cwd=jobs.capsule_path(h, ctx.run_id))

    async def finish(self, ctx, outcome) -> dict:
        if outcome.state != "succeeded":
            raise await ml_failure(ctx, outcome, "eval")
        host = ctx.host
        mine = await read_json(host, posixpath.join(outcome.capsule, "result-drafter.json"))
        if mine is None:
            raise ActionFailed(f"eval finished but wrote no result-drafter.json in {outcome.capsule}")
        base = None
        if self.params.baseline:
            base = await read_json(host, posixpath.join(outcome.capsule, "baseline/result.json"))
        for name, res in (("result-drafter.json", mine), ("baseline/result.json", base)):
            why = resultfile.problem(res) if res is not None else None
            if why:  # never stored: a row of it would be a figure no eval measured
                raise ActionFailed(f"eval wrote {posixpath.join(outcome.capsule, name)} holding what no eval "
                                   f"writes: {why}", hint="run the item again")
        label = self.params.label or ctx.item.id
        rows = eval_rows(ctx.run_id, ctx.item.id, mine, label, "drafter", self.params.step)
        if base is not None:
            rows += eval_rows(ctx.run_id, ctx.item.id, base, self.params.baseline_label,
                              "baseline", None)
        ctx.record_eval_rows(rows)
        out = {"tau": mine.get("tau"), "tau_pooled": mine.get("tau_pooled"),
               "settings_key": self.settings_key(),
               "drafter_path": _display(ctx, self.params.drafter), "dtype": mine.get("dtype"),
               "result": posixpath.join(outcome.capsule, "result-drafter.json")}
        record = reproduce_record(mine)
        if record is not None:  # what reproduces it (core.ml.formats.reproduce): `specdeck diff` reads it
            out["record"] = record
        if "ddtree" in mine:
            out["ddtree_tau"] = mine["ddtree"].get("tau")
        if base is not None:
            out["baseline_tau"] = base.get("tau")
        if isinstance(mine.get("sequential"), dict):  # stop: settled: the verdict and the prompts it took
            out["sequential"] = {k: mine["sequential"].get(k) for k in
                                 ("verdict", "prompts", "fixed_prompts", "prompts_saved", "confidence_sequence", "text")}
        return out


def engine_flags(h, p) -> list:
    """``core.ml.eval``'s engine flags for ``p`` (``--engine-rule``; the engine's with ``engine``)."""
    if p.engine is None:
        return ["--engine-rule", p.engine_rule] if p.engine_rule else []
    return ["--engine", p.engine,
            *(["--engine-bin", h.path(p.engine_bin)] if p.engine_bin else []),
            *(["--engine-target", h.path(p.engine_target)] if p.engine_target else []),
            *(["--engine-drafter", h.path(p.engine_drafter)] if p.engine_drafter else []),
            *(["--engine-threads", p.engine_threads] if p.engine_threads else []),
            "--engine-context", p.engine_context]


def _display(ctx, ref: str) -> str:
    try:
        return resolve_ref(ctx, ref)
    except ActionFailed:
        return ref


def _set_name(res: dict) -> str | None:
    """A described prompt set's name (``zlab:gsm8k``), shown beside the prompts' digest."""
    name = ((res.get("prompts") or {}).get("set") or {}).get("name")
    return name[:200] if isinstance(name, str) else None


def eval_rows(run_id: str, item_id: str, res: dict, label: str, role: str,
              step: int | None) -> list[EvalRow]:
    """The rows a result.json records: one per prompt (and per method: chain, and DDTree
    when measured), labelled ``label`` in the role ``drafter`` or ``baseline``."""
    legacy = res.get("accounting") is None
    settings = {"mode": res.get("mode"), "block_size": res.get("block_size"),
                "target": (res.get("target") or {}).get("fingerprint"),
                "prompts": (res.get("prompts") or {}).get("sha256"),
                "max_new_tokens": res.get("max_new_tokens"),
                "definition": res.get("definition"), "dtype": res.get("dtype"),
                "accounting": res.get("accounting") or tau.LEGACY, "template": res.get("template"),
                "method": "chain", "tree_budget": None,
                "family": (res.get("drafter") or {}).get("family") or "dflash",  # shown, not compared
                "weights": drafter_identity(res)["sha256"],  # not compared: one drafter's rows are merged by it
                "temperature": res.get("temperature", 0), "top_p": res.get("top_p", 1.0),
                "top_k": res.get("top_k", 0), "seed": res.get("seed"), "samples": res.get("samples", 1),
                "harness": harness.of_result(res), "prompt_set": _set_name(res)}
    target = (reproduce_record(res) or {}).get("target")
    if isinstance(target, dict):  # not compared: compare warns when a verdict's two targets differ
        settings["target_id"] = {k: target.get(k) for k in ("revision", "dtype", "quantization", "config_sha256")}
    seq = res.get("sequential")
    if isinstance(seq, dict) and isinstance(seq.get("text"), str):  # stop: settled: compare says its verdict
        settings["sequential"] = seq["text"][:500]
    rule = (res.get("drafter") or {}).get("engine_rule")
    if isinstance(rule, dict):  # in process under an engine's rule: named, so never merged with specdeck's own rule
        settings["engine_rule"] = f"{rule.get('engine')}@{rule.get('revision')}"
        label = f"{label} under {rule.get('engine')}"
    engine = res.get("engine")
    if isinstance(engine, dict):  # measured through an engine: named in the label, so never merged with in-process rows
        settings["engine"] = f"{engine.get('name')}@{engine.get('revision')}"
        label = f"{label} @{engine.get('name')}"
    out = []
    sections = [(label, settings, res)]
    if isinstance(res.get("ddtree"), dict):
        budget = res["ddtree"].get("budget")
        sections.append((f"{label} ddtree-{budget}",
                         {**settings, "method": "ddtree", "tree_budget": budget}, res["ddtree"]))
    domains = (res.get("prompts") or {}).get("domains")
    domains = domains if isinstance(domains, dict) else {}
    for name, st, sec in sections:
        for pp in sec.get("per_prompt", []):
            row_tau, rounds, row_st = pp.get("tau"), pp.get("rounds"), st
            if legacy and isinstance(rounds, list) and isinstance(pp.get("tokens"), list):
                # counted the old way, but the tokens are there: recount as the reference counts
                rounds = tau.recount(rounds, len(pp["tokens"]))
                row_tau, row_st = tau.mean_tau(rounds), {**st, "accounting": tau.ACCOUNTING, "recounted": True}
            per_position = None if row_st is not st else pp.get("per_position_acceptance")
            if pp.get("sample"):  # a sampled prompt's later samples (compare nests them in the prompt)
                row_st = {**row_st, "sample": pp["sample"]}
            domain = domains.get(str(pp.get("id")))
            if isinstance(domain, str) and domain:  # compare splits tau by it, one interval per domain
                row_st = {**row_st, "domain": domain[:200]}
            out.append(EvalRow(run_id, item_id, name, role, str(pp.get("id")), row_tau,
                               rounds, per_position, row_st, step))
    return out
