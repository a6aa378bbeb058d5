"""``extract_hidden``: the target's greedy continuations and tapped hidden states for a
prompt set (``core.ml.extract``), cached on the host for training and offline eval.

Preflight estimates the output size from the target's config (layers tapped x hidden size x
tokens x 2 bytes) and refuses when the host lacks the space. ``check()`` is done when the
cache's manifest covers every prompt of the set; a partial cache resumes where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.actions.base import Action, CheckResult, Launch
from core.actions.mlbase import (host_python, launch_inputs, ml_failure, prompts_on_host,
                                 py_module, read_json, record_launch, validate_prompts)
from core.errors import ActionFailed, InvalidFile
from core.ml.formats import bounds
from core.plans.params import counts, problems


async def target_hidden_size(host, path: str) -> int:
    """The hidden size the target's config.json on ``host`` states (0 when it states none),
    its fields checked as every reader checks them (:func:`core.ml.formats.drafter_config.check_fields`).

    Raises:
        ActionFailed: the file is missing, or holds a value no reader may take (named by key).
    """
    from core.ml.formats.drafter_config import TARGET_FIELDS, TARGET_HINT, check_fields
    from core.text import loads_untrusted

    raw = await host.read_from(path, 0, 1 << 24)
    if not raw:
        raise ActionFailed(f"extract_hidden: {path} is missing on {host.name}",
                           hint="point target at a transformers model dir")
    try:
        cfg = loads_untrusted(raw, f"{host.name}:{path}", "target config")
        check_fields(cfg, f"{host.name}:{path}", TARGET_FIELDS, ("text_config",), hint=TARGET_HINT)
    except InvalidFile as e:
        raise ActionFailed(f"extract_hidden: {e.message}", hint=e.hint) from None
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    return text.get("hidden_size") or 0


@dataclass(frozen=True)
class ExtractHiddenParams:
    target: str
    """The target model directory on the host."""
    out: str
    """The feature cache directory to write."""
    prompts: str = "coding"
    """A shipped set name, a file beside the plan, or host:PATH."""
    layers: list[int] | None = None
    """Layer ids to tap; default: those of ``drafter``'s config."""
    drafter: str | None = None
    """A drafter dir on the host whose target_layer_ids to tap."""
    max_new_tokens: int = 256
    limit: int | None = None
    chat_template: bool = True
    dtype: str = "auto"
    engine: Literal["none", "llama.cpp"] = "none"
    """llama.cpp: a llama-server on the host (scripts/build-llama-server) decodes the greedy
    continuations, each checked against torch's (a prompt where they differ takes torch's);
    docs/evaluation.md §5."""

    def validate(self):
        return problems(
            ("layers", "give layers (e.g. [1, 9, 17]) or a drafter dir to read them from"
             if self.layers is None and self.drafter is None else None),
            *((("layers", i), bounds.count(layer, 0)) for i, layer in enumerate(self.layers or ())),
        ) + counts(self, max_new_tokens=1, limit=0)  # limit 0: every prompt, as unset


class ExtractHidden(Action, kind="extract_hidden", params=ExtractHiddenParams,
             summary="cache the target's greedy continuations + tapped hidden states for prompts"):

    @classmethod
    def validate_plan(cls, params, plan, item):
        return problems(("prompts", validate_prompts(plan, params.prompts, multi_turn=False)))

    async def check(self, ctx) -> CheckResult:
        _, ids = await prompts_on_host(ctx.host, ctx.plan, self.params.prompts, upload=False)
        if self.params.limit:
            ids = ids[: self.params.limit]
        man = await read_json(ctx.host, f"{self.params.out}/manifest.json")
        have = set((man or {}).get("entries", {}))
        missing = [i for i in ids if i not in have]
        if man is not None and not missing:
            return CheckResult.done(f"{self.params.out} covers all {len(ids)} prompts")
        if await ctx.host.stat(self.params.target) is None:
            return CheckResult.blocked(f"target {self.params.target} does not exist on {ctx.host.name}")
        return CheckResult.ready(f"{len(missing)} of {len(ids)} prompts to extract")

    async def prepare(self, ctx) -> None:
        host = ctx.host
        python = await host_python(host)
        prompts, ids = await prompts_on_host(ctx.host, ctx.plan, self.params.prompts,
                                             upload=True)
        hidden = await target_hidden_size(host, f"{self.params.target}/config.json")
        n_layers = len(self.params.layers) if self.params.layers else 6
        tokens = 512 + self.params.max_new_tokens  # a generous prompt length
        n = len(ids[: self.params.limit] if self.params.limit else ids)
        need = int(n * tokens * (n_layers + 1) * hidden * 2 * 1.2)
        free = await host.disk_free(self.params.out)
        if need > free:
            raise ActionFailed(
                f"extract_hidden: about {need / 1e9:.2f} GB needed for {n} prompts x {tokens} "
                f"tokens x {n_layers + 1} layers x {hidden}, {free / 1e9:.2f} GB free on {host.name}",
                hint="free space, lower max_new_tokens or limit, or choose another out dir")
        record_launch(ctx, python=python, prompts=prompts)

    def command(self, ctx) -> Launch:
        p = self.params
        h = ctx.host
        layers = ",".join(map(str, p.layers)) if p.layers else h.path(p.drafter)
        found = launch_inputs(ctx)
        return Launch(py_module(found["python"], "core.ml.extract", "--target", h.path(p.target),
                                "--prompts", found["prompts"], "--layers", layers,
                                "--out", h.path(p.out), "--max-new-tokens", p.max_new_tokens,
                                *(["--limit", p.limit] if p.limit else []),
                                "--dtype", p.dtype, *(["--engine", p.engine] if p.engine != "none" else []),
                                None if p.chat_template else "--no-chat-template"))

    async def finish(self, ctx, outcome) -> dict:
        if outcome.state != "succeeded":
            raise await ml_failure(ctx, outcome, "extract")
        man = await read_json(ctx.host, f"{self.params.out}/manifest.json") or {}
        entries = man.get("entries", {})
        sources = [e.get("tokens_from", "torch") for e in entries.values()]
        return {"out": ctx.host.path(self.params.out), "prompts": len(entries),
                "tokens": sum(e.get("num_tokens", 0) for e in entries.values()),
                "layers": man.get("layer_ids") or man.get("layers"),
                "tokens_from": {s: sources.count(s) for s in sorted(set(sources))}}


__all__ = ["ExtractHidden"]
