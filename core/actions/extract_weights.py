"""``extract_weights``: strip a training checkpoint to drafter weights (``core.ml.strip``).

The checkpoint is opened with ``weights_only=True`` (memory-mapped: the optimizer state is
never read) unless the plan sets ``trust_pickle: true`` for a file it trusts. ``finish``
records what it made in ``OUT/.specdeck-strip.json`` (the source checkpoint's size and mtime,
the tensor names and shapes), so ``check()`` can say "done" from a header read.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.actions.base import Action, CheckResult, Launch
from core.actions.mlbase import (drafter_command, host_python, launch_inputs, ml_failure,
                                 record_launch, resolve_checkpoint, resolve_ref, validate_ref)
from core.errors import ActionFailed
from core.ml.formats import strictjson
from core.plans.params import problems

RECORD = ".specdeck-strip.json"


async def safetensors_header(host, path: str) -> dict | None:
    """Tensor name -> shape from a safetensors file's header on ``host``; None when the file
    is missing or not whole (cut short, empty, not safetensors: the header is checked against
    the file's size as every loader checks it, :mod:`core.ml.formats.safetensors_header`)."""
    from core.ml.formats.safetensors_header import header_from, header_length

    st = await host.stat(path)
    if st is None:
        return None
    head = await host.read_from(path, 0, 9)
    more = header_length(head, st.size)
    try:
        header = header_from(path, st.size, head, await host.read_from(path, 9, more) if more else b"")
    except ValueError:  # InvalidFile
        return None
    return {k: v["shape"] for k, v in header.tensors.items()}


@dataclass(frozen=True)
class ExtractWeightsParams:
    checkpoint: str
    """A path on the host, or ``item:<train id>@latest|@best|@step:N`` (any trainer's layout,
    core.ml.formats.layouts: a speculators epoch dir is rewritten in the z-lab layout, not stripped)."""
    out: str
    """The drafter directory to write (config.json + model.safetensors)."""
    trust_pickle: bool = False
    """Allow arbitrary unpickling (runs code from the file): only for files you made."""
    key: str | None = None
    prefix: str | None = None
    config: str | None = None
    """A drafter config.json or dir, when the checkpoint carries none."""


def loads_record(raw: bytes) -> dict | None:
    """The strip record (``RECORD``) ``finish`` wrote, or None when there is none or it is not
    one (a damaged file means: not done)."""
    from core.text import loads_untrusted

    try:
        rec = loads_untrusted(raw, RECORD, "strip record") if raw else None
    except ValueError:  # InvalidFile
        return None
    return rec if isinstance(rec, dict) else None


class ExtractWeights(Action, kind="extract_weights", params=ExtractWeightsParams,
             summary="strip optimizer state from a training checkpoint -> drafter safetensors"):

    @classmethod
    def validate_plan(cls, params, plan, item):
        return problems(("checkpoint", validate_ref(plan, item, params.checkpoint)))

    async def check(self, ctx) -> CheckResult:
        host = ctx.host
        try:
            ckpt = resolve_ref(ctx, self.params.checkpoint)
        except ActionFailed as e:
            return CheckResult.blocked(e.message)
        src = await host.stat(ckpt)
        rec_raw = await host.read_from(f"{self.params.out}/{RECORD}", 0, 1 << 20)
        rec = loads_record(rec_raw)
        if rec is not None:
            tensors = await safetensors_header(host, f"{self.params.out}/model.safetensors")
            cfg = await host.stat(f"{self.params.out}/config.json")
            same_src = src is None or (rec.get("checkpoint") == host.path(ckpt) and
                                       rec.get("size") == src.size and
                                       abs(rec.get("mtime", 0) - src.mtime) < 1.0)
            if cfg is not None and tensors == rec.get("tensors") and same_src:
                return CheckResult.done(f"{self.params.out} holds the {len(tensors)} drafter "
                                        f"tensors of {ckpt}")
        if src is None:
            return CheckResult.blocked(f"checkpoint {ckpt} does not exist on {host.name}")
        return CheckResult.ready()

    def command(self, ctx) -> Launch:
        p = self.params
        art = resolve_checkpoint(ctx, p.checkpoint)
        ckpt = ctx.host.path(art.path if art is not None else p.checkpoint)
        return Launch(drafter_command(
            launch_inputs(ctx)["python"], ckpt, ctx.host.path(p.out), art, convert=True,
            key=p.key, prefix=p.prefix, config=ctx.host.path(p.config) if p.config else None,
            trust_pickle=p.trust_pickle))

    async def prepare(self, ctx) -> None:
        record_launch(ctx, python=await host_python(ctx.host))

    async def finish(self, ctx, outcome) -> dict:
        host = ctx.host
        if outcome.state != "succeeded":
            err = await ml_failure(ctx, outcome, "strip")
            if "--trust-pickle" in err.message:
                err.hint = ("the checkpoint needs arbitrary unpickling: set trust_pickle: true "
                            "in the plan only if you made this file")
            raise err
        ckpt = host.path(resolve_ref(ctx, self.params.checkpoint))
        src = await host.stat(ckpt)
        tensors = await safetensors_header(host, f"{self.params.out}/model.safetensors")
        if tensors is None:
            raise ActionFailed(f"strip finished but {self.params.out}/model.safetensors is "
                               "missing or truncated")
        rec = {"checkpoint": ckpt, "size": src.size if src else None,
               "mtime": src.mtime if src else None, "tensors": tensors}
        await host.write_file(f"{self.params.out}/{RECORD}", strictjson.dumps(rec, indent=1).encode())
        out = await host.stat(f"{self.params.out}/model.safetensors")
        return {"out": host.path(self.params.out), "checkpoint": ckpt, "tensors": len(tensors),
                "checkpoint_bytes": src.size if src else None, "weights_bytes": out.size}
