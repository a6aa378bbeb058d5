"""``extract_weights``: strip a training checkpoint to drafter weights (``core.ml.strip``).

The checkpoint is opened with ``weights_only=True`` (memory-mapped: the optimizer state is
never read) unless the plan sets ``trust_pickle: true`` for a file it trusts. ``finish``
records what it made in ``OUT/.specdeck-strip.json`` (the source checkpoint's size and mtime,
the tensor names and shapes), so ``check()`` can say "done" from a header read.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from core.actions.base import Action, CheckResult, Launch
from core.actions.mlbase import (drafter_command, host_python, launch_inputs, ml_failure,
                                 record_launch, resolve_checkpoint, resolve_ref, validate_ref)
from core.errors import ActionFailed
from core.ml import strictjson
from core.params import problems

RECORD = ".specdeck-strip.json"


async def safetensors_header(host, path: str) -> dict | None:
    """Tensor name -> shape from a safetensors file's header (None if missing/truncated)."""
    head = await host.read_from(path, 0, 8)
    st = await host.stat(path)
    if len(head) < 8 or st is None:
        return None
    (n,) = struct.unpack("<Q", head)
    if n > 100 << 20:
        return None
    try:
        meta = json.loads(await host.read_from(path, 8, n))
    except ValueError:
        return None
    end = max((v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__"), default=0)
    if 8 + n + end != st.size:
        return None  # truncated or padded: not a complete file
    return {k: v["shape"] for k, v in meta.items() if k != "__metadata__"}


@dataclass(frozen=True)
class ExtractWeightsParams:
    checkpoint: str
    """A path on the host, or ``item:<train id>@latest|@best|@step:N`` (any trainer's layout,
    core.ml.layouts: a speculators epoch dir is rewritten in the z-lab layout, not stripped)."""
    out: str
    """The drafter directory to write (config.json + model.safetensors)."""
    trust_pickle: bool = False
    """Allow arbitrary unpickling (runs code from the file): only for files you made."""
    key: str | None = None
    prefix: str | None = None
    config: str | None = None
    """A drafter config.json or dir, when the checkpoint carries none."""


class ExtractWeights(Action):
    kind = "extract_weights"
    Params = ExtractWeightsParams
    summary = "strip optimizer state from a training checkpoint -> drafter safetensors"

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
        if rec_raw:
            rec = json.loads(rec_raw)
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
