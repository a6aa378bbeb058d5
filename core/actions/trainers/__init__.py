"""The trainers a train item runs (``trainer:`` in its params), one object each.

:mod:`.registry` is what a trainer is (:class:`~.registry.Trainer`: its command, layout,
metric names, stop grace, preflight, checkpoint reader) and the registry by name; one module
per trainer registers it: :mod:`.specdeck` (``core.ml.train``, the default),
:mod:`.specforge`, :mod:`.speculators`. Importing this package registers those three.
"""

from core.actions.trainers import specdeck, specforge, speculators  # registers them
from core.actions.trainers.registry import TRAINERS, Trainer, get, names, register, unknown

METRIC_NAMES = {name: t.metric_names for name, t in TRAINERS.items() if t.metric_names}
"""Their TensorBoard tags and log keys -> the curves' names, by trainer."""

__all__ = ["specdeck", "specforge", "speculators", "TRAINERS", "Trainer", "get", "names",
           "register", "unknown", "METRIC_NAMES"]
