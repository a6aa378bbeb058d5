"""``train``: a training run on a host, detached, with one of three launchers.

* ``process`` (default): a run capsule on the host (``core.capsules.jobs``).
* ``torchrun``: ``python -m torch.distributed.run`` with ``nproc_per_node`` workers; with
  ``nodes`` (more plan hosts) one capsule per node, the rendezvous on the first. specdeck
  starts, watches and stops them; torchrun does the distributed part.
* ``slurm``: the host is the cluster's login node; ``sbatch`` with the item's resources, the
  job id recorded in the store, state from ``squeue`` / ``scontrol`` (``sacct`` when it
  answers), the log from the job's output file, stop = ``scancel``. Reconcile after a restart
  uses the job id. Slurm schedules; specdeck never does.

With ``watch_eval`` the train run gets tau at each checkpoint (:mod:`core.actions.watch_eval`,
driven from the hooks below: launch, follow, stopping, reconciling).

Every hook may run on a fresh instance (the runner builds one per call; after a restart
``follow``, ``inspect``, ``stop`` and ``finish`` come without ``prepare``): what ``prepare``
works out (the output dir, the python, a resume) is recorded with the run (its config) and
read back from there, the rest is worked out again.

The trainer (``trainer:``, default ``core.ml.train``) is one object of
:mod:`core.actions.trainers`: its command on the uploaded ``config`` (or the user's own
``command``), its checkpoint layout, metric names, stop grace, preflight and checkpoint
reader; this action asks it and wraps the launcher around it. Metrics come from JSON lines
with a ``step`` (or ``metrics_regex`` for trainers that print text);
``{"event": "checkpoint"}`` lines and the checkpoints found in the output dir, in the
trainer's layout (:mod:`core.ml.formats.layouts`), become artefacts that eval items name as
``item:<this id>@latest``, ``@best`` (the trainer's own best pointer) or ``@step:N``. The
resolved trainer config is stored with the run, for ``specdeck diff``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from core.capsules import jobs, slurm
from core.actions.base import Action, CheckResult, Launch
from core.actions import trainers
from core.actions.trainers.specdeck import StartChoice, start_choice
from core.actions.fit import deep_set
from core.errors import HostUnreachable
from core.faults import describe_fault
from core.actions.mlbase import host_content_problem, host_entries, host_python, ml_failure, read_json, \
    reproduce_record
from core.capsules.metrics_sources import MetricsParams, line_metrics
from core.ml.formats import bounds, layouts
from core.actions.watch_eval import detached as watch_detached
from core.actions.watch_eval.params import WatchEvalParams, validate_watch
from core.actions.watch_eval.on_console import Watcher
from core.plans.params import problems
from core.state.records import Run
from core.text import load_yaml, loads_untrusted


@dataclass(frozen=True)
class SlurmParams:
    partition: str | None = None
    nodes: int = 1
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | None = None
    account: str | None = None
    extra: list[str] = field(default_factory=tuple)
    """More ``#SBATCH`` options, e.g. ``["--qos=high"]``."""


@dataclass(frozen=True)
class TrainParams:
    config: str | None = None
    """A ``core.ml.train`` YAML beside the plan (uploaded into the run capsule)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Dotted keys merged into ``config`` before upload, e.g. ``{"train.max_steps": 100}``."""
    command: str | None = field(default=None, metadata={"shell": True})
    """Your own trainer's command line instead of ``config`` (shell text)."""
    out: str | None = None
    """The trainer's output dir on the host (default: ``out`` in the run capsule)."""
    launcher: Literal["process", "torchrun", "slurm"] = "process"
    nproc_per_node: int = 1
    nodes: list[str] = field(default_factory=tuple)
    """torchrun: further plan hosts (the item's host is node 0, the rendezvous)."""
    rdzv_port: int = 29500
    rdzv_host: str | None = None
    """torchrun with nodes: the address the other nodes reach node 0 at (default: node 0's
    HostName as the ssh config resolves it, 127.0.0.1 for the local host)."""
    slurm: SlurmParams = field(default_factory=SlurmParams)
    metrics_regex: str | None = None
    """For text logs: a regex with named groups, ``step`` among them."""
    metrics: MetricsParams | None = None
    """More metric sources: regexes, HF dict lines, TensorBoard event files (see
    core.capsules.metrics_sources and plans/README.md)."""
    resume: bool | Literal["always"] = True
    """A new attempt after a failed or stopped one resumes from its newest checkpoint; after
    a succeeded one it starts fresh at step 0 in its own output dir (``always``: resumes then
    too; ``false``: never; ``specdeck run --again --resume`` asks once)."""
    watch_eval: WatchEvalParams | None = None
    """Evaluate each new checkpoint while it trains (core.actions.watch_eval, plans/README.md)."""
    trainer: str = "specdeck"
    """Whose trainer runs, by name (core.actions.trainers): ``specdeck`` (core.ml.train:
    ``config`` is its YAML), ``specforge`` (``config`` is a ``specforge train`` YAML) or
    ``speculators`` (``command``: its ``speculators train`` argv, or ``config``: its run.yaml)."""
    stop_grace_s: float | None = None
    """Seconds a stop waits after SIGTERM before SIGKILL (default: the trainer's time to save
    a checkpoint, 300 s for SpecForge and speculators; a specdeck trainer: the stop's)."""

    def validate(self):
        if trainers.unknown(self.trainer):
            return problems(("trainer", trainers.unknown(self.trainer)))
        t = trainers.get(self.trainer)
        return problems(
            ("config", f"give exactly one of config ({t.config_what}) or command"
             if (self.config is None) == (self.command is None) else None),
            *t.validate(self),
            ("stop_grace_s", "must be >= 0"
             if self.stop_grace_s is not None and self.stop_grace_s < 0 else
             bounds.seconds(self.stop_grace_s) if self.stop_grace_s is not None else None),
            ("rdzv_port", bounds.count(self.rdzv_port, 1, 65535)),
            ("metrics_regex", _step_regex_problem(self.metrics_regex)),
            ("nproc_per_node", "must be >= 1" if self.nproc_per_node < 1 else None),
            ("nodes", "nodes are for launcher: torchrun"
             if self.nodes and self.launcher != "torchrun" else None),
        )


def _step_regex_problem(regex: str | None) -> str | None:
    """Why ``metrics_regex`` cannot parse log lines (None: unset, or it can)."""
    if regex is None:
        return None
    try:
        return None if "step" in re.compile(regex).groupindex else "needs a named group (?P<step>...)"
    except re.error as e:
        return f"not a regex: {e}"


class Train(Action, kind="train", params=TrainParams,
             summary="launch training detached (process, torchrun, or Slurm sbatch)"):

    @classmethod
    def validate_plan(cls, params, plan, item):
        out, config_doc = [], None
        if params.config is not None:
            p = plan.dir / params.config
            if not p.is_file():
                out.append((("config",), f"no trainer config {p}"))
            else:
                try:
                    doc = load_yaml(p.read_text()) or {}
                    for k, v in params.overrides.items():
                        deep_set(doc, k, v)
                except (yaml.YAMLError, ValueError, AttributeError) as e:
                    out.append((("overrides",), str(e)))
                else:  # the config itself, and its sizes against the target/cache where they are here
                    config_doc = doc
        for n in params.nodes:
            if n not in plan.hosts:
                out.append((("nodes",), f"unknown host {n!r}"))
        if params.watch_eval is not None:
            out += [(("watch_eval",) + tuple(p), m) for p, m in
                    validate_watch(params.watch_eval, plan, item)]
        return out + trainers.get(params.trainer).plan_problems(plan, item, params, config_doc)

    @property
    def trainer(self) -> trainers.Trainer:
        """The trainer object ``trainer:`` names (core.actions.trainers)."""
        return trainers.get(self.params.trainer)

    def launcher_name(self) -> str:
        return self.params.launcher

    def metrics_regex(self):
        """The log-line metric parser (a regex string stays the simple case); the trainer's
        metric names map its log keys to the curves'."""
        p = self.params
        return line_metrics(p.metrics, p.metrics_regex, self.trainer.metric_names) or \
            p.metrics_regex

    def metrics_spec(self) -> MetricsParams | None:
        """``metrics:`` as the trainer completes it: its TensorBoard dir (from ``out`` / its
        argv) unless ``metrics.tensorboard`` names one, its tags mapped to the curves' names."""
        return self.trainer.metrics_spec(self.params)

    def _out(self, ctx, run_id: str) -> str:
        if self.params.out:
            return ctx.host.path(self.params.out)
        return posixpath.join(jobs.capsule_path(ctx.host, run_id), "out")

    async def check(self, ctx) -> CheckResult:
        missing = await self.trainer.preflight(self, ctx)
        if missing:
            return CheckResult.blocked(missing)
        if self.params.launcher == "slurm":
            res = await ctx.host.run("command -v sbatch squeue scancel")
            if not res.ok:
                return CheckResult.blocked(f"{ctx.host.name} has no sbatch/squeue/scancel: "
                                           "is it the cluster's login node?")
        if self._detached_watch(ctx.host.name):
            missing = await watch_detached.missing_inputs(ctx, self.params.watch_eval)
            if missing:
                return CheckResult.blocked(missing)
        return CheckResult.ready()

    async def prepare(self, ctx) -> None:
        """The trainer uploads its config into the run capsule and records with the run what
        the later hooks read (for core.ml.train, :meth:`choose_start`'s choice)."""
        await self.trainer.prepare(self, ctx)

    async def choose_start(self, ctx) -> None:
        """Resume an earlier attempt (its dir, ``--resume auto``) or start fresh in this
        attempt's own dir (see :func:`start_choice`); the progress says which. Recorded with
        the run (``out_dir``, ``python``, ``resume``) until finish records the resolved
        config: what :meth:`command` reads."""
        prior = [r for r in ctx.runs() if r.id != ctx.run_id]
        choice = start_choice(self.params, prior, ctx.artefacts(kind="checkpoint"), ctx.resume)
        outdir, resume = self._out(ctx, ctx.run_id), None
        if choice.checkpoint is not None:
            outdir, resume = posixpath.dirname(choice.checkpoint.path), "auto"
        elif self.params.out and prior and not choice.wanted:
            outdir = f"{outdir.rstrip('/')}-attempt{len(prior) + 1}"
        elif choice.wanted and await ctx.host.stat(f"{outdir}/latest") is not None:
            resume = "auto"  # what an earlier trainer left in ``out``
        elif self.params.launcher == "slurm" and ctx.item.on_preempt == "resume":
            resume = "auto"  # a job Slurm requeues runs again: from its own last checkpoint
        if choice.note:
            ctx.progress(f"attempt {len(prior) + 1} {choice.note}; output in {outdir}")
        ctx.record_config({"out_dir": outdir, "python": await host_python(ctx.host),
                           **({"resume": resume} if resume else {})})

    def start_note(self, runs, checkpoints, resume=None) -> str | None:
        return self.trainer.start_note(self.params, runs, checkpoints, resume)

    def _trainer(self, ctx, run: Run, module_prefix: list[str]) -> str:
        if self.params.command:
            return self.params.command
        # its CLI on the config beside the command, in the capsule it runs in (every node)
        return shlex.join(module_prefix + self.trainer.module_words(
            self._ckpt_dir(ctx.host, run), run.config or {}))

    def command(self, ctx, node_rank: int = 0, master: str | None = None) -> Launch:
        p = self.params
        run = _run_of(ctx)
        python = (run.config or {}).get("python") or "python3"  # a command trainer: unused
        if p.launcher == "torchrun":
            prefix = [python, "-u", "-m", "torch.distributed.run",
                      "--nproc_per_node", str(p.nproc_per_node)]
            if p.nodes:
                prefix += ["--nnodes", str(1 + len(p.nodes)), "--node_rank", str(node_rank),
                           "--rdzv_backend", "c10d", "--rdzv_id", ctx.run_id or "specdeck",
                           "--rdzv_endpoint", f"{master}:{p.rdzv_port}"]
            else:
                prefix += ["--standalone"]
            cmd = self._trainer(ctx, run, prefix)
        else:
            cmd = self._trainer(ctx, run, [python, "-u"])
        if self.trainer.execs:
            cmd = exec_form(cmd)
        return Launch(cmd, env={"PYTHONUNBUFFERED": "1"},
                      cwd=jobs.capsule_path(ctx.host, run.id), launcher=p.launcher,
                      metrics_regex=p.metrics_regex)

    # -- launcher hooks (used by the runner) ---------------------------------------------
    async def launch(self, ctx, host, run_id: str, launch: Launch) -> jobs.Launched:
        info = await self._launch(ctx, host, run_id, launch)
        if self._detached_watch(host.name):  # started with the run: no window without it
            run = next(r for r in ctx.runs(ctx.item.id) if r.id == run_id)
            run = dataclasses.replace(run, host=host.name, capsule=info.capsule)
            try:
                await watch_detached.ensure_started(ctx, run, self.params.watch_eval,
                                                    self._ckpt_dir(host, run))
            except Exception as e:  # noqa: BLE001 - the follower tries again; training runs
                ctx.notice(f"{ctx.item.id}: the tau watcher could not start: "
                           f"{describe_fault(e)}", "warning")
        return info

    def _detached_watch(self, train_host: str) -> bool:
        return watch_detached.detached(self.params.watch_eval, train_host)

    def _ckpt_dir(self, host, run: Run) -> str | None:
        """Where this run's checkpoints land: as recorded with it, else worked out again
        (None: an adopted run that did not say)."""
        if recorded_out(run):
            return recorded_out(run)
        if self.params.out:
            return host.path(self.params.out)
        if run.adopt:
            return None
        return posixpath.join(run.capsule or jobs.capsule_path(host, run.id), "out")

    async def _launch(self, ctx, host, run_id: str, launch: Launch) -> jobs.Launched:
        p = self.params
        if p.launcher == "slurm":
            from core.capsules import slurm

            return await slurm.submit(host, run_id, launch, p.slurm)
        if p.launcher == "torchrun" and p.nodes:
            master = p.rdzv_host or host.address
            info = await jobs.start(host, run_id, self._node_launch(launch, 0, master, host,
                                                                    run_id))
            started = [host]
            config = await _uploaded_config(host, run_id) if self.params.config else None
            try:
                for rank, name in enumerate(p.nodes, start=1):
                    node = await ctx.connected(name)
                    # Each node gets its own capsule with the config in it: nothing is
                    # assumed about a filesystem shared with node 0 (the target and
                    # features are).
                    if config is not None:
                        await node.write_file(f"{jobs.capsule_path(node, run_id)}/train.yaml",
                                              config)
                    await jobs.start(node, run_id, self._node_launch(launch, rank, master,
                                                                     node, run_id))
                    started.append(node)
            except BaseException:
                # a node that cannot start fails the run: the ranks already started would
                # wait for it forever, so they are stopped (best effort) before it ends
                await asyncio.gather(*(jobs.stop(n, jobs.capsule_path(n, run_id), grace_s=2.0)
                                       for n in started), return_exceptions=True)
                raise
            return info
        return await jobs.start(host, run_id, launch)

    def _node_launch(self, launch: Launch, rank: int, master: str, node, run_id: str) -> Launch:
        cmd = launch.command
        cmd = re.sub(r"--node_rank \d+", f"--node_rank {rank}", cmd)
        endpoint = shlex.quote(f"{master}:{self.params.rdzv_port}")
        cmd = re.sub(r"--rdzv_endpoint \S+", lambda _: f"--rdzv_endpoint {endpoint}", cmd)
        return Launch(cmd, env=launch.env, cwd=jobs.capsule_path(node, run_id),
                      launcher=launch.launcher, metrics_regex=launch.metrics_regex)

    async def inspect(self, ctx, host, run: Run) -> jobs.CapsuleState:
        if self.params.launcher == "slurm":
            from core.capsules import slurm

            return await slurm.inspect(host, run)
        st = await super().inspect(ctx, host, run)
        if self.params.nodes and st.state == "ended":
            for name in self.params.nodes:
                node = await ctx.connected(name)
                other = await jobs.inspect(node, jobs.capsule_path(node, run.id))
                if other.state == "running":
                    return other
                if other.state == "ended" and (other.exit_code or other.signal) and not (
                        st.exit_code or st.signal):
                    st = other
        return st

    async def follow(self, ctx, host, run: Run, on_lines, *, log_path: str | None = None,
                     inspector=None) -> jobs.CapsuleState:
        """Follow the log; with ``watch_eval``, evaluate checkpoints alongside (and drain).
        ``log_path`` / ``inspector``: another log and end test (an adopted run's)."""
        inspector = inspector or (lambda: self.inspect(ctx, host, run))
        if self.params.launcher == "slurm":
            on_lines = slurm.noting_requeues(on_lines, lambda n, job: requeued(ctx, run, n, job))
        follow_log = super().follow(ctx, host, run, on_lines, log_path=log_path,
                                    inspector=inspector)
        spec = self.params.watch_eval
        if spec is not None and self._detached_watch(host.name):
            return await self._follow_detached(ctx, host, run, follow_log, inspector)
        if spec is None or not ctx.watch:
            return await follow_log
        watcher = Watcher(ctx, spec, poll=max(ctx.poll, 0.2))
        done = asyncio.Event()
        wtask = asyncio.create_task(watcher.run(done))
        # a trainer that prints no checkpoint lines: its output dir is looked at
        ended = asyncio.Event()
        scan = (asyncio.create_task(self._scan_checkpoints(ctx, host, run, ended))
                if not self.trainer.prints_checkpoints else None)
        try:
            st = await follow_log
        finally:
            ended.set()
            try:
                if scan is not None:
                    await scan  # its last listing records the final checkpoint before the watcher drains
            finally:
                done.set()
        await wtask  # the checkpoints still waiting (the final one) are evaluated
        return st

    SCAN_S = 5.0
    """How often a run of another trainer's output dir is listed for new checkpoints (console watcher)."""

    async def _scan_checkpoints(self, ctx, host, run: Run, ended: asyncio.Event) -> None:
        """Record the checkpoints of a run whose trainer prints no checkpoint lines (SpecForge,
        speculators) as they land, for the console's watcher (which evaluates recorded
        checkpoints): while it trains, a checkpoint counts once it is whole
        (core.ml.formats.layouts: its trainer marked it complete, or nothing in it changed for
        ``watch_eval.settle_s`` by this process's clock, no host clock needed) and its files
        show no problem (a safetensors header that says the file is longer: a save still
        going, or stalled); once the run has ended, one last listing records every one with no
        problem (``finish`` names the others)."""
        steady, recorded = layouts.Steady(self.params.watch_eval.settle_s), set()
        while True:
            last = ended.is_set()
            outdir = self._ckpt_dir(host, run)
            try:
                listing = (await host_entries(host, outdir, self.trainer.layout.name)
                           if outdir else None)
                for e in listing.entries if listing else []:
                    ck = e.checkpoint
                    if ck.path in recorded or not (last or e.complete
                                                   or steady.steady(ck.path, e.state)):
                        continue
                    if not await host_content_problem(host, e):  # else landing, or bad (finish names it)
                        recorded.add(ck.path)  # the run as recorded now: prepare's drafter config
                        record_checkpoint(ctx, _run_of(ctx), ck)
            except (HostUnreachable, OSError, asyncio.TimeoutError):
                pass  # the log follower reconnects; the next listing (or finish) catches up
            if last:
                return
            try:
                await asyncio.wait_for(ended.wait(), self.SCAN_S)
            except asyncio.TimeoutError:
                pass

    async def _follow_detached(self, ctx, host, run: Run, follow_log, inspector
                               ) -> jobs.CapsuleState:
        """The run's log, and alongside it the results of its detached watcher (started here
        when it is not yet: an adopted run, or a specdeck killed at the launch). A run
        followed live waits for its watcher's last eval; a run found ended (reconcile) does
        not: the watcher goes on detached and `attach` follows it."""
        wait = ctx.watch and (await inspector()).state == "running"

        item = ctx.item
        spec = self.params.watch_eval
        try:
            await watch_detached.ensure_started(ctx, run, spec, self._ckpt_dir(host, run))
        except Exception as e:  # noqa: BLE001 - training goes on without its tau
            ctx.notice(f"{item.id}: the tau watcher could not start: {describe_fault(e)}",
                       "error")
        done = asyncio.Event()
        wtask = asyncio.create_task(watch_detached.follow(
            ctx, spec, done, wait=wait, every=max(ctx.poll * 10, 0.5)))
        try:
            st = await follow_log
        except BaseException:  # Ctrl-C, a lost host: the watcher goes on on its host
            wtask.cancel()
            raise
        finally:
            done.set()
        try:
            await wtask  # the watcher evaluates what the run left; its results are stored
        except Exception as e:  # noqa: BLE001 - tau's trouble never fails the training run
            ctx.notice(f"{item.id}: tau watcher: {describe_fault(e)} "
                       "(`specdeck attach` picks its results up later)", "warning")
        return st

    def stop_grace(self, grace_s: float) -> float:
        """The grace a stop gives the run: ``stop_grace_s``, else at least the trainer's time
        to save on SIGTERM (its ``stop_grace_s``)."""
        if self.params.stop_grace_s is not None:
            return self.params.stop_grace_s
        return max(grace_s, self.trainer.stop_grace_s or 0.0)

    async def stop(self, ctx, host, run: Run, grace_s: float) -> jobs.CapsuleState:
        grace_s = self.stop_grace(grace_s)
        if self.params.launcher == "slurm":
            from core.capsules import slurm

            return await slurm.cancel(host, run, grace_s=grace_s)

        async def stop_node(name: str) -> jobs.CapsuleState:
            node = await ctx.connected(name)
            return await jobs.stop(node, jobs.capsule_path(node, run.id), grace_s=grace_s)

        # every node at once; node 0's end is the run's, another node's trouble is told
        first, *others = await asyncio.gather(super().stop(ctx, host, run, grace_s),
                                              *map(stop_node, self.params.nodes),
                                              return_exceptions=True)
        for name, res in zip(self.params.nodes, others):
            if isinstance(res, BaseException):
                ctx.notice(f"{ctx.item.id}: torchrun node {name} could not be stopped: "
                           f"{describe_fault(res)}", "warning")
        if isinstance(first, BaseException):
            raise first
        return first

    async def stopping(self, ctx, run: Run) -> None:
        """The run's detached tau watcher ends after its current eval."""
        if self.params.watch_eval is not None:
            await watch_detached.request_stop(ctx)

    async def reconciling(self, ctx, *, follow: bool, hosts=None) -> None:
        """Detached tau watchers still live after their train run ended: caught up (and, when
        following, until they end)."""
        if self.params.watch_eval is not None:
            await watch_detached.reconcile(ctx, self.params.watch_eval, wait=follow,
                                           hosts=hosts)

    async def finish(self, ctx, outcome) -> dict:
        host = ctx.host
        outdir = await self._find_out(ctx, outcome)
        # the checkpoint list is complete even when specdeck missed a log line; what the
        # trainer left beside its checkpoints (a link loop, a bad entry) is named, never the
        # run's failure
        found, best = [], None
        try:
            listed = bool(outdir) and await host.stat(outdir) is not None
            ckpts, best, bad, files = (
                await host_checkpoints(host, outdir, self.trainer.layout.name) if listed
                else ([], None, [], frozenset()))
        except (OSError, asyncio.TimeoutError) as e:
            listed = False
            _name_bad(ctx, f"{outdir}: cannot be listed ({describe_fault(e)})")
        if listed:
            run = _run_of(ctx)
            for problem in bad:
                _name_bad(ctx, problem)
            for e in ckpts:
                ck = e.checkpoint
                record_checkpoint(ctx, run, ck)
                found.append(ck.step)
                named = self.trainer.checkpoint_metrics  # its figures (speculators' epoch's
                metrics = posixpath.join(e.name, named or "")  # validation), stored once
                if named and metrics in files:
                    path = posixpath.join(outdir, metrics)
                    try:
                        raw = await host.read_from(path, 0, 1 << 20)
                        ctx.record_metrics(self.trainer.checkpoint_metric_rows(
                            ck.step, loads_untrusted(raw, path, "validation metrics file")))
                    except (ValueError, OSError):
                        pass  # torn or unreadable: the curves go without that epoch's figures
            await self._record_resolved(ctx, outdir, run, files)
        result = {"out": outdir, "checkpoints": sorted(found)}
        if listed and "provenance.json" in files:  # what reproduces it, for `specdeck diff`
            record = reproduce_record(await read_json(host, posixpath.join(outdir, "provenance.json")))
            if record is not None:
                result["record"] = record
        if best is not None:
            result["best"] = {"step": best.step, "path": best.path}
        if outcome.state == "stopped":
            return result
        if outcome.state != "succeeded":
            raise await ml_failure(ctx, outcome, f"train ({self.params.launcher})")
        return result

    async def _record_resolved(self, ctx, outdir: str, run: Run | None,
                               files: frozenset[str]) -> None:
        """The trainer's resolved config, as it wrote it beside its checkpoints
        (core.ml.train's ``resolved_config.yaml``, speculators' ``run.yaml``), for diff; read
        only when ``files`` (the output dir's listing) has it as a regular file."""
        name = self.trainer.resolved_config
        if name not in files:
            return
        try:
            raw = await ctx.host.read_from(posixpath.join(outdir, name), 0, 1 << 20)
        except OSError as e:
            _name_bad(ctx, f"{posixpath.join(outdir, name)}: cannot be read ({describe_fault(e)})")
            return
        if not raw:
            return
        try:
            doc = load_yaml(raw)
        except yaml.YAMLError:
            return
        ctx.record_config(self.trainer.resolved(doc, (run.config or {}) if run else {}))

    async def _find_out(self, ctx, outcome) -> str | None:
        run = _run_of(ctx)
        if recorded_out(run):
            return recorded_out(run)
        if self.params.out:
            return ctx.host.path(self.params.out)
        arts = [a for a in ctx.artefacts(kind="checkpoint") if a.run_id == ctx.run_id]
        if arts:
            return posixpath.dirname(arts[-1].path)
        return posixpath.join(outcome.capsule or jobs.capsule_path(ctx.host, ctx.run_id), "out")


def record_checkpoint(ctx, run: Run | None, ck: layouts.Checkpoint) -> bool:
    """Record ``ck`` as the run's checkpoint artefact (once: False when it was known), with its
    layout and, for another trainer's, the drafter config its strip needs."""
    extra = {k: v for k, v in ((run.config or {}) if run else {}).items() if k == "drafter_config" and v}
    data = None if ck.layout == "specdeck" else {"layout": ck.layout, **extra}
    return ctx.record_artefact("checkpoint", ck.path, ck.step, data=data)


async def host_checkpoints(host, outdir: str, trainer: str) -> tuple[
        list[layouts.Entry], layouts.Checkpoint | None, list[str], frozenset[str]]:
    """The checkpoints in ``outdir`` on ``host`` in ``trainer``'s layout, oldest first, whose
    files show no problem (:func:`core.actions.mlbase.host_entries`; a speculators dir's
    config and safetensors headers read too), the one its best pointer names (None: no
    pointer, or it names none of them), the problems of the others, each naming its file,
    and the regular files listed (relative to ``outdir``: the only ones to read)."""
    listing = await host_entries(host, outdir, trainer)
    found, bad = [], []
    for e in listing.entries:
        problem = await host_content_problem(host, e)
        if problem:
            bad.append(problem)
        else:
            found.append(e)
    best = next((e.checkpoint for e in found if e.checkpoint.step == listing.best), None)
    return found, best, bad, listing.files


def _name_bad(ctx, problem: str) -> None:
    """Name what the trainer left that is not a checkpoint to read (journal and notice); the
    run goes on as if it were not there."""
    msg = f"{problem}: skipped, not a checkpoint to read"
    ctx.journal("checkpoint_bad", msg, host=ctx.host.name, data={"problem": problem[:2000]})
    ctx.notice(f"{ctx.item.id}: {msg}", "warning")


SHELL_SYNTAX = re.compile(r"[;&|<>`$()\n]")


def exec_form(command: str) -> str:
    """``exec COMMAND`` when it is one simple command: the trainer then is the capsule's own
    process, so the run ends when the trainer has saved on a stop's SIGTERM and exited, not
    when the shell around it died of that signal (SpecForge and speculators save then). A
    command with shell syntax is left as it is."""
    return command if SHELL_SYNTAX.search(command) else f"exec {command}"


def requeued(ctx, run: Run, restart: int, job: str) -> None:
    """Slurm ran the job again (preempted and requeued): journaled and told; the run goes on
    (resuming from its last checkpoint) and uses up none of the item's ``retries:``."""
    msg = (f"run {run.id} preempted: Slurm requeued job {job} (restart {restart}); it resumes "
           "from its last checkpoint in place, its retries unchanged")
    ctx.journal("run_requeued", msg, host=run.host, data={"job": job, "restart": restart})
    ctx.notice(f"{ctx.item.id}: {msg}", "warning")


def _run_of(ctx) -> Run | None:
    """The run a hook is called for, as recorded (what ``prepare`` stored with it)."""
    return next((r for r in ctx.runs() if r.id == ctx.run_id), None)


async def _uploaded_config(host, run_id: str) -> bytes:
    """The trainer config ``prepare`` uploaded into node 0's run capsule (for the others)."""
    return await host.read_from(f"{jobs.capsule_path(host, run_id)}/train.yaml", 0, 1 << 24)


def recorded_out(run: Run | None) -> str | None:
    """The output dir a run recorded (its resolved config's ``out_dir``), if any."""
    cfg = run.config if run is not None else None
    out = cfg.get("out_dir") if isinstance(cfg, dict) else None
    return out if isinstance(out, str) and out else None


__all__ = ["Train", "TrainParams", "StartChoice", "start_choice", "recorded_out", "Path"]
