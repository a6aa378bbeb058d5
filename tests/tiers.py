"""The suite's tiers and its parallel schedule (a pytest plugin, loaded by tests/conftest.py).

What it does, from measured figures (tests/durations.json, one number per test: seconds of
setup + call + teardown in a serial run; tests/README.md says how to refresh it):

* **Tiers.** A test is ``slow`` when it needs a real external part (sshd, Slurm, llama-server,
  the reference packages, Chromium) or took more than :data:`QUICK_MAX_S` in the recorded run, or is
  marked slow by hand. ``pytest -m "not slow"`` is the quick tier; the whole suite is the
  full tier. A test missing from the file (new) counts as quick until the file is refreshed.
* **Groups.** Under ``pytest-xdist`` with ``--dist loadgroup`` a test that uses a module-,
  class- or package-scoped fixture runs on the worker that runs the rest of its module (the
  fixture is built once, as in a serial run); every other test goes to whichever worker is
  free (session fixtures that cost something are built once per run for all workers:
  tests/shared.py). Tests that must never run side by side share an ``xdist_group`` of their
  own (one Slurm at a time: ``slurm``).
* **Order.** Groups are handed out longest first (the recorded durations), so the last
  worker to finish is not the one that drew the demo at the end.
* ``-n auto`` starts :func:`auto_workers` workers: more than the CPUs, since most tests wait
  on subprocesses, sshd and sleeps rather than compute.
* **One compute thread per process** (:data:`ONE_THREAD`, unless the environment sets one):
  the workers and every process they start (``python -m core.ml.*``, llama-server, the
  reference trainers; through sshd and Slurm too) run torch's and BLAS's kernels on one
  thread. Tiny models gain nothing from a second thread, and with 2 per CPU already busy a
  second OpenMP thread spins waiting for its partner: measured, the drafter fit of
  ``python -m core.ml.tiny`` took 13 CPU-s on an idle machine with 2 threads, 8 with one, and
  91 inside the suite with 2.
* **Ctrl-C reaches the processes the tests start.** A suite started in the background
  (``nohup pytest ... &``, a CI runner's job) inherits SIGINT ignored, and so would every
  process it starts: the tests that press Ctrl-C on a ``specdeck`` or an eval would see it
  ignored (they failed so in a serial run started with ``&``). The run restores the default.
* **Bytecode is written** even where ``PYTHONDONTWRITEBYTECODE`` is set (this sandbox sets it):
  the suite starts about 1,600 Python processes, and without ``__pycache__`` each compiles
  the package again (``specdeck validate``: 0.54 CPU-s, 0.28 with bytecode), and each worker
  its test modules (collection: 21 CPU-s, 13 with bytecode). ``__pycache__`` is gitignored.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parent / "durations.json"
QUICK_MAX_S = 2.0
"""A test that took longer than this in the recorded serial run is ``slow``."""
EXTERNAL = ("integration", "slurm", "engine", "reference", "speculators", "gpu", "browser")
"""Markers of tests that need a real external part: never in the quick tier."""
SHARED_SCOPES = ("module", "class", "package")
"""Fixture scopes that tie a test to the worker running the rest of its module."""
DIST_ENV = "SPECDECK_TEST_DIST"
"""Tells the xdist workers that the controller schedules by group (they parse no --dist)."""
UNKNOWN_S = 0.5
"""The cost assumed for a test the recorded run does not list (new, or under 5 ms)."""
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""Set for the test run and every process it starts, where the environment sets none of them."""


def _children_defaults() -> None:
    """Before any conftest or test module imports torch, and before xdist starts the workers
    (which inherit the environment): see the module docstring."""
    if not any(key in os.environ for key in ONE_THREAD):  # torch lets MKL_NUM_THREADS override OMP's
        os.environ.update(ONE_THREAD)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # inherited by every child: see above
        signal.signal(signal.SIGINT, signal.default_int_handler)


def auto_workers(cpus: int) -> int:
    """Workers for ``-n auto``: ``SPECDECK_TEST_WORKERS`` if set, else 2 per CPU (at most 8):
    measured on 2 CPUs, the suite's tests spend most of their time waiting."""
    if os.environ.get("SPECDECK_TEST_WORKERS", "").isdigit():
        return max(1, int(os.environ["SPECDECK_TEST_WORKERS"]))
    return max(2, min(8, 2 * cpus))


def _recorded() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true", default=False,
                     help="write this run's per-test durations to tests/durations.json "
                          "(serially, -p no:xdist: all of them; in parallel: only tests it lacks)")


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's answer; none without xdist
def pytest_xdist_auto_num_workers(config):
    return auto_workers(os.cpu_count() or 1)


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    recorded = _recorded()
    for item in items:
        external = any(item.get_closest_marker(m) for m in EXTERNAL)
        if external or recorded.get(item.nodeid, 0.0) > QUICK_MAX_S:
            item.add_marker(pytest.mark.slow)
    # a group per module for the tests with module fixtures, one per test otherwise
    cost: dict[str, float] = defaultdict(float)
    group_of: dict[str, str] = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            group = mark.kwargs.get("name") or (mark.args[0] if mark.args else "default")
        elif item.get_closest_marker("slurm"):  # one single-node Slurm at a time
            group = "slurm"
            item.add_marker(pytest.mark.xdist_group(group))
        elif _shares_fixtures(item):
            group = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(group))
        else:
            group = item.nodeid  # xdist's loadgroup: a test without a group is its own unit
        group_of[item.nodeid] = group
        cost[group] += recorded.get(item.nodeid, UNKNOWN_S)
    # longest group first; a group keeps its collection order inside
    first_seen = {g: i for i, g in reversed(list(enumerate(group_of[it.nodeid] for it in items)))}
    items.sort(key=lambda it: (-cost[group_of[it.nodeid]], first_seen[group_of[it.nodeid]]))


def _shares_fixtures(item) -> bool:
    """Whether the test uses a fixture built once for its module, class or package."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in SHARED_SCOPES for defs in info.name2fixturedefs.values() for d in defs)


class _Recorder:
    """Serially, every test's seconds replace the file. In parallel (``-n``) a test's seconds are
    inflated by its neighbours, so only tests the file does not know yet are added."""

    def __init__(self, parallel: bool = False) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.parallel = parallel

    def pytest_runtest_logreport(self, report):
        nodeid = report.nodeid
        if nodeid.rfind("@") > nodeid.rfind("]"):  # xdist's loadgroup suffix: "@<group>"
            nodeid = nodeid[:nodeid.rfind("@")]
        self.seconds[nodeid] += report.duration

    def pytest_sessionfinish(self, session):
        if self.seconds:
            data = {k: round(v, 2) for k, v in sorted(self.seconds.items())}
            if self.parallel and DURATIONS.exists():
                data = {**data, **json.loads(DURATIONS.read_text())}
                data = dict(sorted(data.items()))
            DURATIONS.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Called for ``-p`` plugins before the conftests named by the arguments are imported
    (``pytest tests/ml`` imports tests/ml/conftest.py, and torch, before ``pytest_configure``)."""
    _children_defaults()


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests that must run on one worker, one after another")
    if getattr(config.option, "dist", "no") == "load":  # -n N without --dist: by group
        config.option.dist = "loadgroup"
        os.environ[DIST_ENV] = "loadgroup"  # the workers, started after this, read it below
    if hasattr(config, "workerinput") and os.environ.get(DIST_ENV) == "loadgroup":
        config.option.loadgroup = True  # xdist set it from the command line, which had no --dist
    if hasattr(config.option, "loadscopereorder"):  # keep the longest-first order above
        config.option.loadscopereorder = False
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):
        parallel = bool(getattr(config.option, "numprocesses", None))
        config.pluginmanager.register(_Recorder(parallel), "specdeck-durations")
