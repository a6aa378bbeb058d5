"""``shell``: a command on a host, run detached in a run capsule.

``command`` is shell text run as written by the host's shell (``${vars}`` spliced into it are
quoted as single words); ``args`` are literal arguments appended to it, each quoted, so
``args: ["; touch y", "$(touch x)"]`` reaches the command as two plain strings.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from core.actions.base import Action, CheckResult, Launch
from core.capsules.metrics_sources import MetricsParams, line_metrics


@dataclass(frozen=True)
class ShellParams:
    command: str = field(metadata={"shell": True, "doc": "shell text, run as written"})
    args: list[str] = field(default_factory=tuple, metadata={"doc": "literal arguments, each quoted"})
    cwd: str | None = field(default=None, metadata={"doc": "working dir (default: host workdir)"})
    creates: str | None = field(default=None, metadata={
        "doc": "a path the command creates: when it exists, check() reports done"})
    metrics: MetricsParams | None = field(default=None, metadata={
        "doc": "metric sources: regex list, hf_dicts, tensorboard dir (plans/README.md)"})

    def validate(self):
        return [(("command",), "command must not be empty")] if not self.command.strip() else []


class Shell(Action, kind="shell", params=ShellParams,
             summary="run a shell command on a host (detached; survives specdeck)"):

    async def check(self, ctx) -> CheckResult:
        if self.params.creates and await ctx.host.stat(self.params.creates) is not None:
            return CheckResult.done(f"{self.params.creates} exists")
        return CheckResult.ready()

    def metrics_regex(self):
        return line_metrics(self.params.metrics)

    def metrics_spec(self) -> MetricsParams | None:
        return self.params.metrics

    async def prepare(self, ctx) -> None:
        await ctx.skip_earlier_metrics(self.metrics_spec())

    def command(self, ctx) -> Launch:
        cmd = self.params.command
        if self.params.args:
            cmd = cmd + " " + shlex.join(self.params.args)
        return Launch(cmd, cwd=self.params.cwd)
