"""``on: console``: specdeck drives the tau evals of a train run (:class:`Watcher`).

While the run trains, the :class:`Watcher` picks up its checkpoints (the artefacts the log
follower records), copies each to the eval host through specdeck, strips it and evaluates it
in a run capsule there (so it survives specdeck too), and stores tau at step S as metrics of
the train run and as eval rows (:meth:`Watcher.result_rows`, the shapes the detached watcher's
results are stored in too). Alerts (:meth:`Watcher.alerts_at`) serve both watchers.

No pile-up: when checkpoints arrive faster than evals finish, only the newest waiting one is
evaluated next and the others are recorded as skipped (``backfill: true``: every waiting one,
oldest first; a checkpoint no longer kept is recorded skipped). Every step's state lives in the
store (``watch_evals``), so after a kill -9 the next specdeck resumes a running eval from its
capsule and continues with the next checkpoint: no duplicate, no missing eval.

A checkpoint is read once whole (:mod:`core.ml.formats.layouts`; the train action records another
trainer's checkpoints only then). A failed eval is recorded only once the checkpoint has stayed
unchanged (its files, sizes, mtimes on the training host) for ``settle_s`` since the read
began; one that changed meanwhile (a stalled save went on) goes back to ``pending`` and is
evaluated again once unchanged for ``settle_s``, and the failed read is not its result.

Each tau point carries its 95 % interval (:mod:`core.tau.stats`, a bootstrap over the eval's
prompts), stored as the metrics ``tau_ci95_lo`` / ``tau_ci95_hi``.

Alerts use the per-prompt taus, so a change inside the noise is not an alert. Drop: tau more
than ``drop_pct`` % below the best so far *and* the paired comparison of this step with the
best one on their shared prompts says ``worse``. Flat (the v3/v4 failure pattern): over
``flat_evals`` evals the loss kept falling while tau did not rise, i.e. the last eval is not
detectably better than the window's first and rose at most ``flat_eps`` x mean. Without
per-prompt figures the point values decide, as before. Both go to the journal and to the
operator as notices.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import TYPE_CHECKING, Any

from core.actions.watch_eval.params import WatchEvalParams, parse_watch
from core.ml.formats import layouts, resultfile
from core.state.records import WatchEntry

if TYPE_CHECKING:
    from core.tau import stats
    from core.actions.base import ActionContext


class Watcher:
    """Evaluates the checkpoints of one train run as they appear (see the module doc)."""

    def __init__(self, ctx: "ActionContext", spec: "WatchEvalParams | dict[str, Any]",
                 poll: float = 0.5):
        self.ctx, self.item, self.run_id = ctx, ctx.item, ctx.run_id
        self.spec = spec = parse_watch(spec)
        self.poll = poll
        self.mode = spec.mode
        self.alerts = dataclasses.asdict(spec.alerts)
        self.steady = layouts.Steady(spec.settle_s)
        self.failing: dict[int, tuple[str, tuple, float]] = {}
        """Failed evals not recorded yet: step -> (the error, the checkpoint's state when the
        read began, when it began)."""
        self.host_sends: tuple[str, ...] = ()
        """Alerts its host sends itself (a detached watcher's drops): not sent from here."""
        self.held: set[int] = set()
        """Pending steps whose checkpoint changed after a failed read: evaluated once steady."""

    # -- queue ---------------------------------------------------------------------------
    def _sync(self) -> None:
        """Queue checkpoints not seen yet (respecting ``every``)."""
        known = {e.step for e in self.ctx.watch_entries()}
        every = self.spec.every
        last = max(known, default=None)
        for a in self.ctx.artefacts(kind="checkpoint"):
            if a.run_id != self.run_id or a.step is None or a.step in known:
                continue
            if isinstance(every, int) and last is not None and a.step - last < every:
                continue
            self.ctx.queue_watch_entry(a.step)
            known.add(a.step)
            last = a.step if last is None else max(last, a.step)

    def _next(self) -> WatchEntry | None:
        """The newest pending checkpoint; older pending ones are recorded as skipped (with
        ``backfill``: the oldest pending one, nothing skipped)."""
        pending = [e for e in self.ctx.watch_entries() if e.state == "pending"
                   and e.step not in self.held]
        if not pending:
            return None
        if self.spec.backfill:
            return pending[0]
        newest = pending[-1]
        for e in pending[:-1]:
            self.ctx.update_watch_entry(e.step, "skipped",
                                        error=f"superseded by step {newest.step}")
            self.ctx.journal("watch_skipped", f"tau eval of step {e.step} skipped: "
                             f"step {newest.step} is newer")
        return newest

    async def run(self, training_done: asyncio.Event) -> None:
        """Evaluate until the run has ended and no checkpoint is waiting."""
        for e in self.ctx.watch_entries():
            if e.state == "running":  # a previous specdeck died while it ran
                await self._evaluate(e, resume=True)
        while True:
            self._sync()
            await self._settle()
            e = self._next()
            if e is not None:
                await self._evaluate(e)
                continue
            if training_done.is_set():
                self._sync()
                waiting = self.failing or self.held
                if not waiting and not any(x.state == "pending" for x in self.ctx.watch_entries()):
                    return
                if not waiting:
                    continue
                await asyncio.sleep(self.poll)  # until the failed and held ones are settled
                continue
            try:
                await asyncio.wait_for(training_done.wait(), self.poll)
            except asyncio.TimeoutError:
                pass

    # -- one eval ------------------------------------------------------------------------
    async def eval_args(self, ev) -> list:
        """``core.ml.eval``'s arguments on the eval host ``ev`` but ``--drafter``/``--out``: the
        same for the checkpoint and the baseline (sampled alike, so the two pair by prompt)."""
        from core.actions.mlbase import prompts_on_host
        from core.ml.models import sampling

        s = self.spec
        common = ["--target", ev.path(s.target), "--mode", self.mode,
                  "--max-new-tokens", s.max_new_tokens, "--dtype", s.dtype]
        if s.max_memory:
            common += ["--max-memory", s.max_memory]
        if self.mode == "offline":
            cache = ev.path(s.cache)
            man = json.loads(await ev.read_from(f"{cache}/manifest.json", 0, 1 << 26) or b"{}")
            if "prompts" not in man:
                raise RuntimeError(f"{ev.name}:{cache} has no extract manifest: run the "
                                   "extract_hidden item first")
            common += ["--cache", cache, "--prompts", man["prompts"]["file"]]
        else:
            ppath, _ = await prompts_on_host(ev, self.ctx.plan, s.prompts, upload=True)
            common += ["--prompts", ppath]
        if s.max_prompts:
            common += ["--limit", s.max_prompts]
        if s.block_size:
            common += ["--block-size", s.block_size]
        return common + sampling.cli_flags(s)

    def _checkpoint(self, step: int):
        """The run's checkpoint artefact at ``step``."""
        return [a for a in self.ctx.artefacts(kind="checkpoint")
                if a.run_id == self.run_id and a.step == step][0]

    async def _state(self, step: int) -> tuple | None:
        """What the checkpoint at ``step`` looks like on the training host now (its files,
        sizes, mtimes: :class:`core.ml.formats.layouts.Entry`'s ``state``); None: it is not there."""
        from core.actions.mlbase import checkpoint_layout, host_entries

        art = self._checkpoint(step)
        layout = checkpoint_layout(art).get("layout", "specdeck")
        host = await self.ctx.connected(self.item.action.host)
        listing = await host_entries(host, layouts.out_dir_of(art.path, layout), layout)
        return next((e.state for e in listing.entries
                     if e.checkpoint.path == art.path.rstrip("/")), None)

    async def _settle(self) -> None:
        """Each failed eval not recorded yet: recorded once its checkpoint has stayed unchanged
        for ``settle_s`` since the read began, back to pending when it changed; each pending
        step held after such a change: evaluated once it has stayed unchanged for ``settle_s``."""
        for step in sorted({*self.failing, *self.held}):
            try:
                now = await self._state(step)
            except Exception:  # noqa: BLE001 - cannot look now (a host away): look again later
                continue
            key = str(step)
            if step in self.held:
                if now is None or self.steady.steady(key, now):
                    self.held.discard(step)  # evaluated now (gone: its eval says so)
                continue
            error, state, began = self.failing[step]
            if now is not None and now != state:
                del self.failing[step]
                self.held.add(step)
                self.steady.forget(key)
                self.steady.steady(key, now)
                self.ctx.update_watch_entry(step, "pending", error=None)
                self.ctx.journal("watch_retry", f"tau eval of step {step} failed ({error}) but "
                                 "its checkpoint changed since: evaluated again once whole")
            elif now is None or time.monotonic() - began >= self.spec.settle_s:
                del self.failing[step]
                self._failed(step, error + (" (the checkpoint is gone since)" if now is None else ""))

    def _failed(self, step: int, error: str) -> None:
        self.ctx.update_watch_entry(step, "failed", error=error[:2000])
        self.ctx.journal("watch_failed", f"tau eval of step {step} failed: {error}")
        self.ctx.notice(f"{self.item.id}: tau eval of step {step} failed: {error}", "error")

    async def _evaluate(self, entry: WatchEntry, resume: bool = False) -> None:
        from core.capsules import jobs
        from core.actions.base import Launch
        from core.actions.mlbase import drafter_command, host_python, py_module
        step = entry.step
        began, state = time.monotonic(), None
        ev = await self.ctx.connected(self.spec.host)
        cap_id = f"{self.run_id}-tau-{step}"
        capsule = jobs.capsule_path(ev, cap_id)
        try:
            state = await self._state(step)
            if not resume or (await jobs.inspect(ev, capsule)).state in ("missing", "nopid"):
                art = self._checkpoint(step)
                ckpt = art.path
                train_host = await self.ctx.connected(self.item.action.host)
                self.ctx.update_watch_entry(step, "running", host=ev.name, capsule=capsule)
                if self.spec.backfill and await train_host.stat(ckpt) is None:
                    gone = f"{train_host.name}:{ckpt} is not kept any more"
                    self.ctx.update_watch_entry(step, "skipped", error=gone)
                    self.ctx.journal("watch_skipped", f"tau eval of step {step} skipped: {gone}")
                    return
                local_ckpt, config = await self._fetch(art, train_host, ev, capsule)
                py = await host_python(ev)
                s = self.spec
                common = await self.eval_args(ev)
                strip = drafter_command(py, local_ckpt, "drafter", art, config=config)
                lines = ["set -e", *([strip] if strip else []),  # a speculators epoch dir is a drafter dir
                         py_module(py, "core.ml.eval", "--drafter", "drafter" if strip else local_ckpt,
                                   "--out", "result.json", *common)]
                if s.baseline and not self._baseline_done():
                    lines.append(py_module(py, "core.ml.eval", "--drafter",
                                           ev.path(s.baseline), "--out", "baseline/result.json",
                                           *common))
                await jobs.start(ev, cap_id, Launch("\n".join(lines), cwd=capsule))
            while (st := await jobs.inspect(ev, capsule)).state == "running":
                await asyncio.sleep(self.poll)
            if st.state != "ended" or st.exit_code != 0:
                tail = (await ev.read_from(f"{capsule}/log", 0, 1 << 16)).decode("utf-8", "replace")
                raise RuntimeError(f"eval capsule {capsule} {st.state} "
                                   f"({st.signal or st.exit_code}): {tail.splitlines()[-3:]}")
            res = json.loads(await ev.read_from(f"{capsule}/result.json", 0, 1 << 28))
            base_raw = await ev.read_from(f"{capsule}/baseline/result.json", 0, 1 << 28)
            base = json.loads(base_raw) if base_raw else None
            for name, doc in (("result.json", res), ("baseline/result.json", base)):
                why = resultfile.problem(doc) if doc is not None else None
                if why or (doc is res and not isinstance(res.get("tau"), (int, float))):
                    raise ValueError(f"{capsule}/{name}: {why or 'no tau (no prompt had a round)'}")
            self._record(step, res, base)
            self.ctx.update_watch_entry(step, "done", tau=res.get("tau"))
            self.ctx.notice(f"{self.item.id}: tau {res.get('tau'):.3f} at step {step} "
                            f"({self.mode}, target {res.get('dtype')}, on {ev.name})")
            self.alerts_at(step)
        except Exception as exc:  # one failed eval must not stop training or the watcher
            if state is None:  # nothing to tell a change by: recorded now
                self._failed(step, str(exc))
            else:  # recorded once the checkpoint has stayed unchanged (_settle)
                self.failing[step] = (str(exc), state, began)

    async def _fetch(self, art, train_host, ev, capsule: str) -> tuple[str, str | None]:
        """The checkpoint ``art`` where the eval host ``ev`` reads it, and the drafter config its
        strip needs there (a SpecForge checkpoint carries none; None: it needs none): copied
        through specdeck into the eval's capsule when the two hosts differ."""
        from core.actions.mlbase import checkpoint_layout
        from core.actions.relay import copy_verified

        layout = checkpoint_layout(art)
        config = layout.get("drafter_config")
        if train_host is ev:
            return art.path, config
        if layout.get("layout") == "speculators":  # an epoch dir: its config and weights
            local = f"{capsule}/ckpt"
            for row in await self._state(art.step) or ():  # regular files only (never a FIFO)
                name = row.path.partition("/")[2]
                if row.kind == "f" and name.endswith((".json", ".safetensors")):
                    await copy_verified(train_host, f"{art.path}/{name}", ev, f"{local}/{name}")
            return local, None
        await copy_verified(train_host, art.path, ev, f"{capsule}/ckpt.pt")
        if config:
            await copy_verified(train_host, config, ev, f"{capsule}/drafter_config.json")
            config = f"{capsule}/drafter_config.json"
        return f"{capsule}/ckpt.pt", config

    def _baseline_done(self) -> bool:
        return any(r.role == "baseline" for r in self.ctx.eval_rows())

    def _record(self, step: int, res: dict, base: dict | None) -> None:
        metrics, rows = self.result_rows(step, res, base)
        self.ctx.record_metrics(metrics)
        self.ctx.record_eval_rows(rows)

    def result_rows(self, step: int, res: dict, base: dict | None
                    ) -> tuple[list[tuple[int, str, float]], list[dict]]:
        """The metrics (tau, its interval, pooled, per-position) and the eval rows (drafter
        ``<item>@<step>``, and the baseline) an eval's result.json at ``step`` is stored as."""
        from core.tau import stats
        from core.actions.eval import eval_rows

        metrics = [(step, "tau", float(res["tau"]))]
        by_prompt: dict[str, list[float]] = {}  # a sampled eval's seeds nest in their prompt
        for p in res.get("per_prompt") or []:
            if p.get("tau") is not None:
                by_prompt.setdefault(str(p.get("id")), []).append(float(p["tau"]))
        ci = stats.mean_ci([sum(v) / len(v) for v in by_prompt.values()],
                           rng=stats.rng_for(self.run_id, step, "tau"))
        if ci is not None:
            metrics += [(step, "tau_ci95_lo", ci[0]), (step, "tau_ci95_hi", ci[1])]
        if res.get("tau_pooled") is not None:
            metrics.append((step, "tau_pooled", float(res["tau_pooled"])))
        for k, v in enumerate(res.get("per_position_acceptance") or []):
            metrics.append((step, f"tau_acc[{k}]", float(v)))
        # compare labels it item@step
        rows = eval_rows(self.run_id, self.item.id, res, self.item.id, "drafter", step)
        if base is not None:
            rows += eval_rows(self.run_id, self.item.id, base, "baseline", "baseline", None)
            metrics.append((step, "tau_baseline", float(base["tau"])))
        return metrics, rows

    def _prompt_taus(self, step: int) -> dict[str, float]:
        """The chain method's per-prompt tau of this run's eval at ``step``."""
        return {r.prompt_id: float(r.tau) for r in self.ctx.eval_rows()
                if r.step == step and r.role == "drafter"
                and (r.settings or {}).get("method", "chain") == "chain"
                and r.tau is not None}

    def _paired(self, a: int, b: int) -> stats.Paired | None:
        """Step ``a``'s per-prompt tau against step ``b``'s (None: under 2 shared prompts)."""
        from core.tau import stats

        ta, tb = self._prompt_taus(a), self._prompt_taus(b)
        shared = [p for p in ta if p in tb]
        if len(shared) < 2:
            return None
        return stats.paired([ta[p] for p in shared], [tb[p] for p in shared],
                            name=f"{self.run_id}:{a}-{b}")

    def alerts_at(self, step: int) -> None:
        from core.tau import stats

        done = [e for e in self.ctx.watch_entries()
                if e.state == "done" and e.step <= step]  # the curve as it was at step
        taus = [(e.step, e.tau) for e in done if e.tau is not None]
        if len(taus) < 2:
            return
        cur = taus[-1][1]
        best_step, best = max(taus[:-1], key=lambda t: t[1])
        msgs = []
        if best > 0 and cur < best * (1 - self.alerts["drop_pct"] / 100):
            pair = self._paired(step, best_step)
            if pair is None:
                msgs.append(("tau_drop", f"tau {cur:.3f} at step {step} is "
                             f"{100 * (1 - cur / best):.0f}% below the best so far ({best:.3f} "
                             f"at step {best_step})"))
            elif pair.verdict == stats.WORSE:
                msgs.append(("tau_drop", f"tau {cur:.3f} at step {step} is "
                             f"{100 * (1 - cur / best):.0f}% below the best so far ({best:.3f} "
                             f"at step {best_step}): "
                             + pair.text(f"step {step}", f"step {best_step}")))
            else:
                self.ctx.journal("watch_noise", f"tau {cur:.3f} at step {step} is below the "
                                 f"best ({best:.3f} at step {best_step}) but inside the noise: "
                                 + pair.text(f"step {step}", f"step {best_step}"))
        k = int(self.alerts["flat_evals"])
        if len(taus) >= k:
            window = taus[-k:]
            vals = [t for _, t in window]
            mean = sum(vals) / len(vals)
            loss = dict(self.ctx.metric_series("loss"))
            l0 = _near(loss, window[0][0])
            l1 = _near(loss, window[-1][0])
            loss_fell = l0 is not None and l1 is not None and l1 < l0 * 0.99
            pair = self._paired(window[-1][0], window[0][0]) if loss_fell else None
            if pair is None:
                flat = max(vals) - min(vals) <= self.alerts["flat_eps"] * mean
                why = ""
            else:
                flat = (pair.verdict != stats.BETTER
                        and vals[-1] - vals[0] <= self.alerts["flat_eps"] * mean)
                why = f"; last vs first {pair.delta:+.3f}, {pair.ci_text()}, {pair.prompts} prompts"
            if flat and loss_fell:
                msgs.append(("tau_flat", f"tau flat at {mean:.3f} over the last {k} evals "
                             f"(steps {window[0][0]}-{window[-1][0]}{why}) while the loss fell "
                             f"{l0:.3f} -> {l1:.3f}: the drafter may be learning the wrong "
                             "thing"))
        for kind, m in msgs:
            self.ctx.journal("alert", m, data={"alert": kind, "step": step,
                                               "sent_by_host": kind in self.host_sends})
            self.ctx.notice(f"ALERT {self.item.id}: {m}", "warning")


def _near(series: dict[int, float], step: int) -> float | None:
    if not series:
        return None
    s = min(series, key=lambda x: abs(x - step))
    return series[s]
