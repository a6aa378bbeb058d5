"""specdeck's headless core, in wings (README's layout section is the map):

* ``core.plans``   a plan: the YAML model, its files, typed params, ``${var}``, todowrite interop
* ``core.state``   the state database: the store, its records, the numbers it admits
* ``core.runs``    a run's life: the runner, run capsules, Slurm, adoption, log following
* ``core.tau``     the tau table and its statistics (intervals, paired tests, verdicts)
* ``core.actions`` one module per item kind, bound to the runner through ``actions/base.py``
* ``core.hosts``   local and SSH hosts, bulk copies
* ``core.ml``      what runs on a host as ``python -m core.ml.<task>`` (torch lives only here)

At the root: ``session`` (the front door), ``demo``, and the leaves every wing may use
(``errors``, ``text``, ``faults``, ``versions``, ``selfwheel``, ``moved``).

Nothing under ``core`` imports Textual; only ``core.state.store`` imports sqlite_utils, only
``core.hosts.ssh`` imports asyncssh, and only ``core.ml`` imports torch or transformers.
``tests/test_import_hygiene.py`` enforces this in fresh subprocesses, and
``tests/test_import_graph.py`` the direction between wings.
"""

from core import moved as _moved

_moved.install()


def __getattr__(name: str):
    return _moved.refuse(__name__, name)


__version__ = "0.1.0"
