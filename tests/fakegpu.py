"""A fake ``nvidia-smi`` for hosts without a GPU: the one part of host telemetry that cannot
exist here (style: mock only what cannot run).

:func:`install` writes an executable ``nvidia-smi`` into a directory that a test puts first
on a host's PATH (the local host's environment, or the sshd test host's ``path_first``). It
answers the queries specdeck makes the way the real one does (driver 550-580, an HGX H100
node): ``--query-gpu=FIELDS`` and ``--query-compute-apps=FIELDS`` with
``--format=csv[,noheader][,nounits]``: one line per GPU (or process), values joined by
``", "``, the header naming each field with its unit in brackets (``utilization.gpu [%]``,
``memory.used [MiB]``, ``power.draw [W]``; ``used_memory`` is headed ``used_gpu_memory
[MiB]``), units after the values unless ``nounits``, ``[N/A]`` for a value the GPU does not
report (here GPU 3's power draw), and no line at all when no compute process runs. Anything
else gets its error line and exit status 2.

Four GPUs; GPU 2 is busy (91 %) for the first ``idle_after`` GPU queries, then falls to 0 %
(its process still holding memory: a hung collective). The count is kept beside the script.
"""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPT = r'''#!{python}
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
IDLE_AFTER = {idle_after}
GPUS = [
    dict(index=0, name="NVIDIA H100 80GB HBM3", util=87, used=61440, total=81559, power="312.45",
         temp=61, uuid="GPU-0b6a1d2e-5f3c-4a7b-9e1d-2c3b4a5d6e70", pid=41213),
    dict(index=1, name="NVIDIA H100 80GB HBM3", util=93, used=62011, total=81559, power="327.10",
         temp=64, uuid="GPU-1c7b2e3f-6a4d-4b8c-8f2e-3d4c5b6e7f81", pid=41214),
    dict(index=2, name="NVIDIA H100 80GB HBM3", util=91, used=61820, total=81559, power="318.77",
         temp=63, uuid="GPU-2d8c3f4a-7b5e-4c9d-9a3f-4e5d6c7f8a92", pid=41215),
    dict(index=3, name="NVIDIA H100 80GB HBM3", util=89, used=60987, total=81559, power="[N/A]",
         temp=60, uuid="GPU-3e9d4a5b-8c6f-4dae-8b4a-5f6e7d8a9ba3", pid=41216),
]
UNITS = {{"utilization.gpu": "%", "memory.used": "MiB", "memory.total": "MiB",
          "power.draw": "W", "used_memory": "MiB", "used_gpu_memory": "MiB"}}
HEADER = {{"used_memory": "used_gpu_memory"}}


def fail(msg):
    print(msg)
    sys.exit(2)


def main(argv):
    query = fmt = None
    for a in argv:
        if a.startswith("--query-gpu=") or a.startswith("--query-compute-apps="):
            query = a.split("=", 1)
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1].split(",")
        else:
            fail(f'Invalid combination of input arguments. Please run "nvidia-smi -h" for help.')
    if query is None or fmt is None or "csv" not in fmt:
        fail('Invalid combination of input arguments. Please run "nvidia-smi -h" for help.')
    kind, fields = query[0], query[1].split(",")
    units = "nounits" not in fmt
    if kind == "--query-gpu":
        count = HERE / "gpu-queries"
        n = int(count.read_text()) + 1 if count.exists() else 1
        count.write_text(str(n))
        rows = []
        for g in GPUS:
            util = 0 if g["index"] == 2 and n > IDLE_AFTER else g["util"]
            vals = {{"index": g["index"], "name": g["name"], "utilization.gpu": util,
                    "memory.used": g["used"], "memory.total": g["total"],
                    "power.draw": g["power"], "temperature.gpu": g["temp"], "uuid": g["uuid"]}}
            rows.append(vals)
    else:
        rows = [{{"gpu_uuid": g["uuid"], "pid": g["pid"], "used_memory": g["used"] - 512,
                 "process_name": "/usr/bin/python3"}} for g in GPUS]
    for f in fields:
        if rows and f not in rows[0]:
            fail(f'Field "{{f}}" is not a valid field to query.')
    if "noheader" not in fmt:
        print(", ".join(HEADER.get(f, f) + (f" [{{UNITS[f]}}]" if f in UNITS else "")
                        for f in fields))
    for r in rows:
        out = []
        for f in fields:
            v = str(r[f])
            if units and f in UNITS and not v.startswith("["):
                v += " " + UNITS[f]
            out.append(v)
        print(", ".join(out))


main(sys.argv[1:])
'''


def install(bin_dir: Path, *, idle_after: int = 2) -> Path:
    """Write the fake ``nvidia-smi`` into ``bin_dir`` (created); returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "nvidia-smi"
    path.write_text(SCRIPT.format(python=sys.executable, idle_after=idle_after))
    path.chmod(0o755)
    (bin_dir / "gpu-queries").unlink(missing_ok=True)
    return path
