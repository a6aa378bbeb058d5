"""Slurm as a launcher: sbatch, squeue/scontrol/sacct, scancel. Slurm schedules; we watch.

The batch script runs the same ``cmd.sh`` a capsule would, writes the job's output to the
capsule's ``log`` and, when the command ends, an ``exit`` file, so a job that Slurm has
already forgotten (``scontrol`` keeps finished jobs for MinJobAge only) still has a state.

Preemption is not failure (:data:`core.runs.life.PREEMPTED`): a job that ends PREEMPTED or
NODE_FAIL is ``preempted``. A job Slurm requeues (``scontrol requeue``, a preempting
partition with PreemptMode=REQUEUE) runs the batch script again under the same id: the log is
opened for appending, the last run's ``exit`` file is dropped, and a ``{"event": "requeued"}``
line in the log (``SLURM_RESTART_COUNT``) tells specdeck, which journals the preemption
(:func:`noting_requeues`); a train item's command then resumes from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Callable

from core.capsules import jobs
from core.capsules.jobs import Launch
from core.state.records import Run
from core.errors import ActionFailed

LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
        "RESIZING", "STAGE_OUT", "SIGNALING", "REQUEUE_HOLD", "REQUEUE_FED", "PREEMPTED"}
"""squeue's states of a job that may still run (PREEMPTED too: it may be requeued next);
once squeue no longer lists it, ``scontrol``'s PREEMPTED is the end."""

_BATCH = """#!/usr/bin/env bash
#SBATCH --job-name={name}
#SBATCH --output={log}
#SBATCH --chdir={capsule}
#SBATCH --open-mode=append
{options}
rm -f {capsule}/exit
if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then
  printf '{{"event": "requeued", "restart": %s, "job": "%s"}}\n' "$SLURM_RESTART_COUNT" "$SLURM_JOB_ID"
fi
bash {cmd}
rc=$?
if [ "$rc" -gt 128 ] && [ "$rc" -lt 193 ]; then r="signal $((rc - 128))"; else r="exit $rc"; fi
echo "$r" > {capsule}/exit.tmp && mv {capsule}/exit.tmp {capsule}/exit
exit $rc
"""


REQUEUED = "requeued"
"""The ``event`` of the line the batch script prints when Slurm runs it again."""


def noting_requeues(on_lines, requeued: Callable[[int, str], None]):
    """``on_lines`` (a log follower's callback, or None), calling ``requeued(restart, job)``
    for each line the batch script printed on a requeue (``SLURM_RESTART_COUNT``)."""
    def lines(ls: list[str]) -> None:
        for ln in ls:
            if ln.startswith('{"event": "requeued"'):
                try:
                    doc = json.loads(ln)
                    requeued(int(doc["restart"]), str(doc["job"]))
                except (ValueError, KeyError, TypeError):
                    continue
        if on_lines is not None:
            on_lines(ls)
    return lines


def _options(sp) -> list[str]:
    opts = []
    for flag, val in (("--partition", sp.partition), ("--nodes", sp.nodes),
                      ("--gpus-per-node", sp.gpus_per_node), ("--cpus-per-task", sp.cpus_per_task),
                      ("--mem", sp.mem), ("--time", sp.time), ("--account", sp.account)):
        if val is not None:
            opts.append(f"{flag}={val}")
    opts.extend(sp.extra)
    return [f"#SBATCH {shlex.quote(o)}" for o in opts]


async def submit(host, run_id: str, launch: Launch, sp) -> jobs.Launched:
    """Write the capsule and batch script, sbatch it; return its capsule and job id."""
    d = jobs.capsule_path(host, run_id)
    await host.makedirs(d)
    await host.write_file(f"{d}/cmd.sh", jobs.cmd_script(launch, host).encode(), mode=0o700)
    script = _BATCH.format(name=shlex.quote(f"specdeck-{run_id}"), log=shlex.quote(f"{d}/log"),
                           capsule=shlex.quote(d), cmd=shlex.quote(f"{d}/cmd.sh"),
                           options="\n".join(_options(sp)))
    await host.write_file(f"{d}/sbatch.sh", script.encode(), mode=0o700)
    res = await host.run(["sbatch", "--parsable", f"{d}/sbatch.sh"], cwd=d)
    if not res.ok:
        raise ActionFailed(f"sbatch on {host.name} refused the job: {res.stderr.strip()}",
                           hint="check the item's slurm: resources against `sinfo`")
    job_id = res.stdout.strip().split(";")[0]
    await host.write_file(f"{d}/job_id", job_id.encode())
    return jobs.Launched(d, job_id=job_id)


def _signame(sig: str) -> str:
    try:
        import signal as _s

        return _s.Signals(int(sig)).name.removeprefix("SIG")
    except (ValueError, TypeError):
        return sig


async def inspect(host, run: "Run") -> jobs.CapsuleState:
    job = run.job_id
    capsule = run.capsule or jobs.capsule_path(host, run.id)
    if not job:
        raw = await host.read_from(f"{capsule}/job_id", 0, 64)
        job = raw.decode().strip()
        if not job:
            return jobs.CapsuleState("nopid")
    q = shlex.quote(job)
    res = await host.run(f"squeue -h -j {q} -o %T 2>/dev/null")
    state = res.stdout.strip().split("\n")[0] if res.ok else ""
    if state in LIVE:
        return jobs.CapsuleState("running")
    res = await host.run(f"scontrol -o show job {q} 2>/dev/null")
    fields = dict(w.split("=", 1) for w in res.stdout.split() if "=" in w) if res.ok else {}
    if not fields.get("JobState"):
        res = await host.run(f"sacct -n -P -X -j {q} -o State,ExitCode 2>/dev/null || "
                             f"sacct -c -n -P -j {q} -o State,ExitCode 2>/dev/null")
        line = res.stdout.strip().splitlines()[0] if res.ok and res.stdout.strip() else ""
        if "|" in line:
            st, code = line.split("|", 1)
            fields = {"JobState": st.split()[0], "ExitCode": code}
    js = fields.get("JobState", "")
    if js in LIVE - {"PREEMPTED"}:
        return jobs.CapsuleState("running")
    code, _, sig = fields.get("ExitCode", "0:0").partition(":")
    if js == "COMPLETED":
        return jobs.CapsuleState("ended", int(code or 0), None)
    if js == "CANCELLED" or js.startswith("CANCELLED"):
        return jobs.CapsuleState("ended", None, "TERM")
    if js in ("FAILED", "OUT_OF_MEMORY", "TIMEOUT", "DEADLINE", "BOOT_FAIL"):
        if sig and sig != "0":
            return jobs.CapsuleState("ended", None, _signame(sig))
        return jobs.CapsuleState("ended", int(code) if code.isdigit() and code != "0" else 1, None)
    if js in ("PREEMPTED", "NODE_FAIL"):
        why = f"Slurm {js} (job {job})"
        if js == "NODE_FAIL":
            return jobs.CapsuleState("lost", preempted=why)
        return jobs.CapsuleState("ended", None, _signame(sig) if sig and sig != "0" else "TERM",
                                 preempted=why)
    # Slurm has forgotten the job: the batch script's exit file tells.
    cap = await jobs.inspect(host, capsule)
    return cap if cap.state == "ended" else jobs.CapsuleState("lost")


async def cancel(host, run: "Run", *, grace_s: float = 30.0) -> jobs.CapsuleState:
    """scancel (Slurm sends SIGTERM, waits KillWait, then SIGKILL); wait for the end."""
    job = run.job_id
    await host.run(["scancel", str(job)], check=True)
    deadline = time.monotonic() + max(grace_s, 5) + 60
    while time.monotonic() < deadline:
        st = await inspect(host, run)
        if st.state != "running":
            return st
        await asyncio.sleep(0.3)
    return await inspect(host, run)
