"""A drafter card (issue 45 §4): README.md with Hugging Face front matter, every figure from a
stored result named by its run id, and what was not measured said rather than left out.

``specdeck card PLAN LABEL --drafter DIR`` writes it: the architecture from the drafter's own
``config.json`` (as specdeck and each engine read it: :mod:`core.ml.engines.lint`), the weights'
sha256 (the stream ``eval`` records, :func:`core.ml.tasks.eval.drafter_weights`), tau from the
plan's stored eval rows of LABEL by harness and decoding (:mod:`core.tau.table`: the three
aggregations by name, intervals, domains, the verdict against a baseline), and the draft length
to serve when a round's cost is given (:mod:`core.ml.measure.draftlen`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core import __version__
from core.errors import InvalidInput
from core.ml.measure import harness
from core.ml.measure.draftlen import Cost, advise, engine_settings
from core.state.records import EvalRow
from core.tau.table import Comparison, build_comparison, measured_note

NOT_MEASURED = "not measured"


def _fmt(x: float | None, ci: Sequence[float] | None = None) -> str:
    if x is None:
        return NOT_MEASURED
    return f"{x:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _yaml_str(v: str) -> str:
    return v if re.fullmatch(r"[A-Za-z0-9_.\-/]+", v) else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _front_matter(base_model: str | None, license: str | None, family: str) -> list[str]:
    out = ["---"]
    if base_model:
        out.append(f"base_model: {_yaml_str(base_model)}")
    out += [f"license: {_yaml_str(license or 'other')}", "library_name: specdeck", "pipeline_tag: text-generation",
            "tags:", "- speculative-decoding", f"- {family}", "- block-diffusion", "---"]
    return out


def _architecture(drafter: Path) -> tuple[list[str], dict[str, Any]]:
    from core.ml.engines.lint import lint

    found = lint(drafter)
    spec = found.specdeck
    if spec is None:
        raise InvalidInput(f"{drafter}: specdeck cannot read this drafter's config ({found.specdeck_error})")
    family = spec.family
    lines = ["## Architecture", "",
             f"- family: {'DFlash-2' if family == 'dflash2' else 'DFlash-1'} (`{family}`)",
             f"- block size: {spec.block_size} (drafts {spec.block_size - 1} tokens a round)",
             f"- target layers tapped: {list(spec.target_layer_ids)}",
             f"- layers: {spec.attention_text()}",
             f"- sliding window: {spec.sliding_window if spec.sliding_window else 'none'}",
             f"- mask token id: {spec.mask_token_id}", ""]
    lines += ["## What each engine does with it", "",
              "From `specdeck engines` (each engine's reading of config.json against specdeck's):", ""]
    for r in found.readings:
        notes = [f for f in r.findings if f.kind in ("differs", "missing", "refused", "note")]
        if not notes:
            lines.append(f"- {r.engine} ({r.revision}): reads it as specdeck does")
        for f in notes:
            lines.append(f"- {r.engine} ({r.revision}): {f.kind} `{f.field}`: {f.message}")
    lines.append("")
    return lines, {"family": family, "block_size": spec.block_size, "raw": found.raw}


def _weights(drafter: Path) -> tuple[list[str], dict[str, Any]]:
    from core.ml.tasks.eval import drafter_weights

    w = drafter_weights(drafter)["weights"]
    if w is None:
        raise InvalidInput(f"{drafter}: no weights file there (model.safetensors or an index)")
    return (["## Weights", "", f"- sha256: `{w['sha256']}` (files {', '.join(w['files'])}, "
             f"{w['bytes']:,} bytes, read in their order)", ""], w)


def _tau(label: str, comp: Comparison, rows: Sequence[EvalRow], sha256: str) -> list[str]:
    # the label's own rows and its other harnesses and methods (``v5 ddtree-16``, ``v5 @llama.cpp``)
    mine = [d for d in comp.drafters if d.name == label or d.name.startswith(label + " ")]
    out = ["## Acceptance length (tau)", "",
           "Each figure comes from the stored eval results named beside it (`specdeck compare` on the "
           "plan shows the same). Aggregations: " + "; ".join(f"{k}: {v}" for k, v in harness.AGGREGATIONS.items()),
           ""]
    out += ["| entry | measured as | prompts | per-request mean [95% CI] | token-weighted | pooled [95% CI] | "
            "rounds | results |", "|---|---|---|---|---|---|---|---|"]
    for d in mine:
        o = comp.overall_of(d.label)
        out.append(f"| {d.label} | {measured_note(d)} | {o.prompts} | {_fmt(o.macro, o.macro_ci95)} | "
                   f"{_fmt(o.token_weighted)} | {_fmt(o.pooled, o.pooled_ci95)} | {o.rounds or NOT_MEASURED} | "
                   f"{', '.join('run ' + r for r in d.run_ids)} |")
    labels = {d.label for d in mine}
    doms = [f for f in comp.by_domain if f.drafter in labels]
    if doms:
        out += ["", "By domain:", "", "| measured as | domain | prompts | per-request mean [95% CI] | "
                "token-weighted | pooled |", "|---|---|---|---|---|---|"]
        for f in doms:
            d = comp.drafter(f.drafter)
            out.append(f"| {measured_note(d)} | {f.domain} | {f.prompts} | {_fmt(f.macro, f.macro_ci95)} | "
                       f"{_fmt(f.token_weighted)} | {_fmt(f.pooled)} |")
    verdicts = [comp.overall_of(d.label) for d in mine if d.baseline]
    if verdicts:
        out += ["", "Against the baseline measured the same way:", ""]
        for d, o in zip([d for d in mine if d.baseline], verdicts):
            out.append(f"- {measured_note(d)}: vs {d.baseline}: delta {_fmt(o.delta_macro, o.delta_macro_ci95)}"
                       f" per-request mean; {o.verdict_text or o.verdict or NOT_MEASURED} "
                       f"(runs {', '.join(d.run_ids)})")
    else:
        out += ["", f"Against a baseline: {NOT_MEASURED} (no baseline in these results)."]
    unsure = {r.run_id for r in rows if not (isinstance(r.settings, dict) and
                                              str(r.settings.get("weights") or sha256) == sha256)}
    if unsure:
        out += ["", f"Note: runs {', '.join(sorted(unsure))} recorded other weights than `{sha256[:16]}`."]
    out.append("")
    return out


def _draft_length(rows: Sequence[EvalRow], block: int, cost: Cost | None) -> list[str]:
    out = ["## Draft length to serve", ""]
    chains = [r for r in rows if r.rounds and not (isinstance(r.settings, dict) and
                                                    r.settings.get("tree_budget") is not None)]
    if cost is None or not chains:
        why = "no round cost was given (`specdeck card --cost BASE,PER_TOKEN`)" if chains else "no chain rounds"
        return out + [f"{NOT_MEASURED.capitalize()}: {why}. Each engine's setting for the whole block "
                      f"({block - 1}): " + _settings(block - 1), ""]
    a = advise([[int(x) for x in r.rounds] for r in chains], block, cost)
    b = a["best"]
    runs = ", ".join(sorted({r.run_id for r in chains}))
    out += [f"From runs {runs}, a round costing {cost.base:g} + {cost.per_token:g}*k plain target steps "
            f"(docs/evaluation.md §8): best k = {b['k']}, speedup {_fmt(b['speedup'], b['speedup_ci'])}; "
            f"k in {b['within']} are indistinguishable.", "", "Engine settings: " + _settings(b["k"]), ""]
    if b["speedup_ci"][1] < 1:
        out.insert(-3, "At this cost no draft length beats plain decoding (every interval is below 1): "
                       "do not serve this drafter on it.")
    return out


def _settings(k: int) -> str:
    s = engine_settings(k)
    return (f"vLLM `num_speculative_tokens: {s['vllm']['num_speculative_tokens']}`, SGLang "
            f"`--speculative-num-draft-tokens {s['sglang']['--speculative-num-draft-tokens']}`, llama.cpp "
            f"`--spec-draft-n-max {s['llama.cpp']['--spec-draft-n-max']}`")


def render(label: str, rows: Sequence[EvalRow], drafter: str | Path, *, plan: str, base_model: str | None = None,
           license: str | None = None, cost: Cost | None = None) -> str:
    """The card's text for LABEL's stored eval ``rows`` (baselines included for the verdict)."""
    drafter = Path(drafter)
    if not (drafter / "config.json").is_file():
        raise InvalidInput(f"--drafter {drafter}: no config.json there (a drafter directory)")
    own = [r for r in rows if r.drafter == label or r.drafter.startswith(label + " ")]
    if not own:
        known = sorted({r.drafter for r in rows if r.role != "baseline"})
        raise InvalidInput(f"plan {plan!r} has no eval results of {label!r}"
                           + (f" (it has {', '.join(known)})" if known else ""))
    arch, info = _architecture(drafter)
    weights, w = _weights(drafter)
    base = base_model or info["raw"].get("base_model") or _target_of(own)
    comp = build_comparison(list(rows), [])
    out = _front_matter(base, license, info["family"])
    out += ["", f"# {label}: a {'DFlash-2' if info['family'] == 'dflash2' else 'DFlash'} drafter"
            + (f" for {base}" if base else ""), "",
            f"Written by specdeck {__version__} from plan `{plan}`. Every figure names the stored result it "
            f"comes from; what was not measured says so.", ""]
    out += ["## Target", "", f"- base model: {base or NOT_MEASURED}",
            f"- target fingerprint (as the evals recorded it): {_target_fp(own) or NOT_MEASURED}", ""]
    out += arch + weights + _tau(label, comp, own, w["sha256"]) + _draft_length([r for r in own if r.drafter == label], info["block_size"], cost)
    out += ["## Training recipe", "", f"{NOT_MEASURED.capitalize()} by this card: no train run is linked to these "
            "weights in the plan's results (config digest, steps, tokens seen and data sources are in the train "
            "run's provenance on its host).", ""]
    return "\n".join(out)


def _target_of(rows: Sequence[EvalRow]) -> str | None:
    for r in rows:
        t = (r.settings or {}).get("target") if isinstance(r.settings, dict) else None
        if isinstance(t, str) and t and "/" in t and not t.startswith("/"):
            return t
    return None


def _target_fp(rows: Sequence[EvalRow]) -> str | None:
    for r in rows:
        t = (r.settings or {}).get("target") if isinstance(r.settings, dict) else None
        if isinstance(t, str) and t:
            return t
    return None
