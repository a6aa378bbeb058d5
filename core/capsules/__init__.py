"""Capsules: detached work on a host that outlives specdeck and any SSH channel.

``jobs`` run capsules (start, poll, reattach, stop), ``slurm`` Slurm as a launcher (sbatch,
squeue/sacct, scancel), ``metrics_sources`` where training curves come from (JSON lines,
TensorBoard, CSV), ``progress`` the one formatter of a task's progress lines, ``telemetry`` a
host's GPUs and disks sampled over its connection (alerts raised once per run). Below the action
kinds, which start capsules; may import ``core.hosts``, ``core.state`` and the leaves.
"""
