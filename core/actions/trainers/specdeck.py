"""specdeck's own trainer, ``core.ml.train`` (``trainer: specdeck``, the default).

``config`` is its YAML, checked at ``specdeck validate`` (:func:`core.actions.fit.
trainer_config_problems`), uploaded into the run capsule with its paths absolute on the host
and run as ``python -m core.ml.train --config train.yaml --out OUT [--resume auto]``; or your
own ``command``. A new attempt resumes or starts fresh in its own output dir
(:func:`start_choice`). Its checkpoints are ``step_N.pt`` (``latest`` names
the newest), announced by ``{"event": "checkpoint"}`` log lines; its metrics are JSON lines
(``loss``, ``accuracy``...: the curves' names already); its resolved config
``resolved_config.yaml``. A stop gives it the stop's own grace.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from core.actions import fit
from core.actions.fit import deep_set
from core.actions.trainers.registry import Trainer, command_config, register
from core.capsules import jobs
from core.state.records import Run
from core.ml.formats import layouts
from core.text import load_yaml

PATH_KEYS = ("target", "out_dir", "data.features", "data.file", "drafter.init")
"""Paths in a core.ml.train config; made absolute on the host before upload (overrides are
relative to the host's workdir; other relative paths, on a local host, to the config file)."""


@register
class Specdeck(Trainer):
    name = "specdeck"
    layout = layouts.LAYOUTS["specdeck"]
    config_what = "core.ml.train YAML"
    out_key = None
    stop_grace_s = None
    prints_checkpoints = True
    execs = False
    resolved_config = "resolved_config.yaml"

    def module_words(self, out, recorded):
        resume = recorded.get("resume")
        return ["-m", "core.ml.train", "--config", "train.yaml", "--out", out,
                *(["--resume", resume] if resume else [])]

    def plan_problems(self, plan, item, params, doc):
        out = [(("config",), m) for m in
               (fit.trainer_config_problems(plan, item, params, doc) if doc is not None else [])]
        if params.watch_eval is not None:
            out += watch_block_size(params.watch_eval, plan, item)
        return out

    def metrics_spec(self, params):
        return params.metrics  # JSON lines under the curves' names already

    def start_note(self, params, runs, checkpoints, resume=None):
        if not params.config:
            return None  # a command trainer resumes (or not) as its command says
        return start_choice(params, runs, checkpoints, resume).note or None

    async def preflight(self, action, ctx):
        return None  # its own preflight refuses a mismatch on the host, before a GPU is touched

    async def prepare(self, action, ctx):
        """Upload the config into the run capsule and record with the run what the later
        hooks read (the action's ``choose_start``), or a command trainer's config."""
        p, host = action.params, ctx.host
        capsule = jobs.capsule_path(host, ctx.run_id)
        if p.config:
            doc = load_yaml((ctx.plan.dir / p.config).read_text()) or {}
            for k, v in p.overrides.items():
                deep_set(doc, k, v)
            if watch_prunes(doc, p, ctx.item.action.host):
                ctx.progress(f"train.keep_checkpoints: {doc['train']['keep_checkpoints']} is "
                             "applied by the tau watcher: it keeps the best by tau and the steps "
                             "other items name too, deleting the rest once evaluated")
                deep_set(doc, "train.keep_checkpoints", None)
            else:
                pin_named_steps(doc, ctx.plan, ctx.item.id)
            # the uploaded file lives in the capsule: make its paths absolute on the host
            local = ctx.plan.hosts[ctx.item.action.host].local
            absolute_paths(doc, host, (ctx.plan.dir / p.config).parent if local else None,
                           set(p.overrides))
            await host.write_file(f"{capsule}/train.yaml",
                                  yaml.safe_dump(doc, sort_keys=False).encode())
            await action.choose_start(ctx)
        await ctx.skip_earlier_metrics(self.metrics_spec(p))
        if p.command:
            ctx.record_config(await command_config(host, capsule, p.command))

    def resolved(self, doc, recorded):
        return doc


@dataclass(frozen=True)
class StartChoice:
    """What a new attempt of a ``core.ml.train`` item does with the earlier ones."""

    wanted: bool
    """It resumes when it can (False: fresh at step 0 in its own output dir)."""
    checkpoint: Any = None
    """The earlier attempt's newest checkpoint (an Artefact) it resumes from, or None."""
    note: str = ""


def start_choice(params: Any, runs: list[Run], checkpoints: list,
                 asked: bool | None = None) -> StartChoice:
    """Resume or start fresh, after the item's earlier ``runs`` (oldest first).

    A failed, stopped or interrupted attempt resumes from the newest checkpoint an attempt
    left (``resume: true``, the default); a succeeded one is done: running it again trains
    again, from step 0, unless ``asked`` (``--resume``) or ``resume: always`` says resume.
    """
    ended = [r for r in runs if not r.live]
    if not ended:
        return StartChoice(bool(params.resume) if asked is None else asked)
    last = ended[-1]
    wanted = asked if asked is not None else (
        params.resume == "always" or (params.resume is True and last.state != "succeeded"))
    if wanted:
        for r in reversed(ended):
            mine = sorted((a for a in checkpoints if a.run_id == r.id), key=lambda a: a.step or 0)
            if mine:
                c = mine[-1]
                return StartChoice(True, c, f"resumes attempt {r.attempt} ({r.state}) from its "
                                   f"checkpoint {posixpath.basename(c.path)} (step {c.step})")
        return StartChoice(True, None, "starts at step 0: no earlier attempt left a checkpoint "
                           "to resume")
    why = ("resume: false" if params.resume is False else
           f"attempt {last.attempt} succeeded; `--again --resume` or `resume: always` "
           "continues from its last checkpoint instead")
    return StartChoice(False, None, f"starts fresh at step 0 in its own output dir ({why})")


def watch_prunes(doc: dict, params, train_host: str) -> bool:
    """The config's ``train.keep_checkpoints`` is a detached watcher's to apply (it knows tau:
    :func:`core.actions.watch_eval.detached.retention_flags`), not the trainer's."""
    from core.actions.watch_eval.params import parse_watch

    train = doc.get("train")
    return (isinstance(train, dict) and train.get("keep_checkpoints") is not None
            and params.watch_eval is not None
            and parse_watch(params.watch_eval).placement(train_host) in ("train", "eval"))


def pin_named_steps(doc: dict, plan, item_id: str) -> None:
    """A config that prunes (``train.keep_checkpoints``) keeps the steps other items name
    (``item:<this>@step:N``) too: added to its ``train.keep_steps``."""
    from core.actions.mlbase import pinned_steps

    train = doc.get("train")
    pins = pinned_steps(plan, item_id)
    if not isinstance(train, dict) or train.get("keep_checkpoints") is None or not pins:
        return
    have = train.get("keep_steps")
    have = [s for s in have if type(s) is int] if isinstance(have, list) else []
    deep_set(doc, "train.keep_steps", sorted(set(have) | pins))


def watch_block_size(spec, plan, item) -> list:
    """watch_eval's baseline must share the trained drafter's block size unless it says so."""
    if spec.baseline is None:
        return []
    watch = SimpleNamespace(drafter=f"item:{item.id} (block size from its config)",
                            baseline=spec.baseline, block_size=spec.block_size,
                            allow_block_size_mismatch=spec.allow_block_size_mismatch)
    base = fit.drafter_block_size(fit.read_local_json(fit.local_path(
        plan, spec.eval_host(item.action.host), fit.config_json_of(spec.baseline))))
    err = fit.block_size_mismatch(watch, fit.train_item_block_size(plan, item.id), base)
    return [(("watch_eval", "baseline"), err)] if err else []


def absolute_paths(doc: dict, host, config_dir: Path | None, overridden: set[str]) -> None:
    """Rewrite the config's PATH_KEYS as absolute host paths: values from ``overrides`` are
    relative to the host's workdir; values written in the config file are relative to that
    file when the host is local (``config_dir``), else to the host's workdir too."""
    for key in PATH_KEYS:
        *parents, leaf = key.split(".")
        cur = doc
        for part in parents:
            cur = cur.get(part) if isinstance(cur, dict) else None
        if not isinstance(cur, dict) or not isinstance(cur.get(leaf), str):
            continue
        val = cur[leaf]
        if config_dir is not None and key not in overridden and not val.startswith(("/", "~")):
            cur[leaf] = str((config_dir / val).resolve())
        else:
            cur[leaf] = host.path(val)
