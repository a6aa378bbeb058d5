"""``export``: write a drafter in the layout a serving engine loads (``core.ml.export``).

Runs ``python -m core.ml.export DRAFTER --out OUT --format F --dtype D`` on the host
(docs/serving.md §1). The task reads the drafter with every engine's rule table first and
prints, then keeps in ``OUT/provenance.json``, each way an engine would run the export
otherwise than specdeck measured it; ``finish`` returns those warnings with the run's record.
``check()`` says "done" when ``OUT/provenance.json`` records an export of this drafter in this
format and dtype and its files are there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from core.actions.base import Action, CheckResult, Launch
from core.actions.mlbase import host_python, ml_failure, py_module
from core.errors import ActionFailed
from core.plans.params import problems


@dataclass(frozen=True)
class ExportParams:
    drafter: str
    """The drafter directory on the host (a strip output, a published drafter)."""
    out: str
    """The directory to write."""
    format: str = "zlab"
    """``zlab`` (vLLM, SGLang), ``speculators`` (vLLM) or ``gguf`` (llama.cpp's converter)."""
    dtype: str = "bf16"
    """``bf16`` (default) or ``fp32``."""
    target: str | None = None
    """The target's directory on the host (needed by speculators and gguf)."""
    verifier: str | None = None
    """speculators: the verifier id the serving host loads (default: ``target``)."""
    llama_cpp: str | None = None
    """gguf: a llama.cpp tree on the host holding convert_hf_to_gguf.py."""


class Export(Action, kind="export", params=ExportParams,
             summary="write a drafter in the layout vLLM, SGLang or llama.cpp loads, and say how each reads it"):

    @classmethod
    def validate_plan(cls, params, plan, item):
        return problems(
            ("format", None if params.format in ("zlab", "speculators", "gguf")
             else f"{params.format!r}: zlab, speculators or gguf"),
            ("dtype", None if params.dtype in ("bf16", "fp32") else f"{params.dtype!r}: bf16 or fp32"),
            ("target", f"format {params.format} needs target: the target's directory"
             if params.format in ("speculators", "gguf") and not params.target else None),
        )

    async def record(self, ctx) -> dict | None:
        raw = await ctx.host.read_from(f"{self.params.out}/provenance.json", 0, 1 << 20)
        try:
            rec = json.loads(raw) if raw else None
        except ValueError:
            return None
        return rec if isinstance(rec, dict) and rec.get("task") == "export" else None

    async def check(self, ctx) -> CheckResult:
        host, p = ctx.host, self.params
        if await host.stat(f"{p.drafter}/config.json") is None:
            return CheckResult.blocked(f"no drafter at {p.drafter} on {host.name} (config.json missing)")
        rec = await self.record(ctx)
        if rec and rec.get("source") == host.path(p.drafter) and rec.get("format") == p.format \
                and rec.get("dtype") == {"bf16": "bfloat16", "fp32": "float32"}.get(p.dtype):
            files = rec.get("files") or []
            if files and all([await host.stat(f"{p.out}/{f}") is not None for f in files]):
                n = len(rec.get("engine_warnings") or [])
                return CheckResult.done(f"{p.out} holds the {p.format} export of {p.drafter} "
                                        f"({n} engine warning{'s' if n != 1 else ''})")
        return CheckResult.ready()

    async def prepare(self, ctx) -> None:
        self._python = await host_python(ctx.host)

    def command(self, ctx) -> Launch:
        p, h = self.params, ctx.host
        cmd = py_module(self._python, "core.ml.export", h.path(p.drafter), "--out", h.path(p.out),
                        "--format", p.format, "--dtype", p.dtype,
                        *(["--target", h.path(p.target)] if p.target else []),
                        *(["--verifier", p.verifier] if p.verifier else []),
                        *(["--llama-cpp", h.path(p.llama_cpp)] if p.llama_cpp else []))
        return Launch(cmd)

    async def finish(self, ctx, outcome) -> dict:
        if outcome.state != "succeeded":
            raise await ml_failure(ctx, outcome, "export")
        rec = await self.record(ctx)
        if rec is None:
            raise ActionFailed(f"export finished but {self.params.out}/provenance.json is missing")
        return {"out": ctx.host.path(self.params.out), "format": rec.get("format"), "dtype": rec.get("dtype"),
                "files": rec.get("files"), "engine_warnings": rec.get("engine_warnings") or []}
