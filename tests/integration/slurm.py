"""A real single-node Slurm cluster (munged, slurmctld, slurmd) for the launcher tests.

Each cluster gets its own ``slurm.conf`` and state under a temp dir (exported as SLURM_CONF
for the daemons and the clients); munged is shared (one per machine). Daemons are stopped
by PID. See ../shared/docs/environment.md, "Slurm on one machine".
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def missing() -> str | None:
    for tool in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"):
        if not os.path.exists(tool):
            return f"{tool} not found (apt-get install slurm-wlm munge)"
    if shutil.which("sbatch") is None:
        return "sbatch not found (apt-get install slurm-wlm)"
    if os.geteuid() != 0:
        return "the single-node Slurm fixture needs root (SlurmUser=root)"
    return None


def ensure_munged() -> None:
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
        return
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    if not os.path.exists("/etc/munge/munge.key"):
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/mungekey", "-c"], check=False)
    started = subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], capture_output=True,
                             text=True)
    # another test process may have started it a moment ago (a parallel suite): fine if it runs
    if started.returncode != 0 and subprocess.run(["pgrep", "-x", "munged"],
                                                  capture_output=True).returncode != 0:
        raise RuntimeError(f"munged did not start: {started.stderr.strip()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, root: Path, *, preempting: bool = False):
        self.root = root
        self.preempting = preempting
        """Partitions ``low`` (the default, preempted: PreemptMode=CANCEL) and ``high`` on the
        one node instead of ``debug``: a job in ``high`` takes the CPUs of one in ``low``."""
        self.host = socket.gethostname()
        self.conf = root / "slurm.conf"
        self.procs: list[subprocess.Popen] = []

    def write_conf(self) -> None:
        r = self.root
        (r / "state").mkdir(parents=True, exist_ok=True)
        (r / "spool").mkdir(exist_ok=True)
        self.conf.write_text(f"""ClusterName=specdeck
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={r}/jobcomp.txt
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
ReturnToService=2
MinJobAge=300
KillWait=5
NodeName={self.host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=20000
{self.partitions()}""")

    def partitions(self) -> str:
        if not self.preempting:
            return f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP\n"
        part = f"Nodes={self.host} MaxTime=INFINITE State=UP"
        return ("PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n"
                f"PartitionName=low {part} Default=YES PriorityTier=1 PreemptMode=CANCEL\n"
                f"PartitionName=high {part} PriorityTier=2 PreemptMode=OFF\n")

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 30.0) -> None:
        ensure_munged()
        self.write_conf()
        env = {**os.environ, **self.env}
        for daemon in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd"):
            self.procs.append(subprocess.Popen([daemon, "-D"], env=env, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                 text=True)
            if out.returncode == 0 and out.stdout.strip() in ("idle", "mix", "alloc"):
                return
            time.sleep(0.2)
        self.stop()
        logs = "".join((self.root / f).read_text()[-2000:] for f in ("slurmctld.log", "slurmd.log")
                       if (self.root / f).exists())
        raise RuntimeError(f"single-node Slurm did not come up:\n{logs}")

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], env={**os.environ, **self.env},
                       capture_output=True)
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()
