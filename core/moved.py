"""Import paths that moved when ``core`` and ``core.ml`` were regrouped into wings (issue 43).

A script, a notebook or an older plan that imports an old path is refused with the new one
(``ModuleNotFoundError: core.ml.drafter moved to core.ml.models.drafter``) rather than told
that nothing is there. The ``python -m core.ml.<task>`` commands that hosts run did not move:
each task keeps a thin entry where it stood (``core/ml/eval.py`` runs ``core.ml.tasks.eval``).
Standard library only: ``core/__init__.py`` installs the finder before anything else loads.
"""

from __future__ import annotations

import importlib.abc
import sys

MOVED = {
    "core.actions.watch_eval.watcher": "core.actions.watch_eval.on_console",
    "core.adopt": "core.runs.adopt",
    "core.adopt_spec": "core.plans.adopt_spec",
    "core.compare": "core.tau.table",
    "core.events": "core.runs.events",
    "core.jobs": "core.capsules.jobs",
    "core.metrics_sources": "core.capsules.metrics_sources",
    "core.ml.bounds": "core.ml.formats.bounds",
    "core.ml.cpu_rows": "core.ml.models.cpu_rows",
    "core.ml.ddtree": "core.ml.decoding.ddtree",
    "core.ml.drafter": "core.ml.models.drafter",
    "core.ml.drafter_config": "core.ml.formats.drafter_config",
    "core.ml.engine_lint": "core.ml.engines.lint",
    "core.ml.engine_llama": "core.ml.engines.llama",
    "core.ml.engine_rule": "core.ml.engines.served",
    "core.ml.export_swap": "core.ml.formats.export_swap",
    "core.ml.featstore": "core.ml.formats.featstore",
    "core.ml.features": "core.ml.models.features",
    "core.ml.generate": "core.ml.decoding.generate",
    "core.ml.hybrid": "core.ml.models.hybrid",
    "core.ml.layouts": "core.ml.formats.layouts",
    "core.ml.masks": "core.ml.models.masks",
    "core.ml.offline": "core.ml.decoding.offline",
    "core.ml.prompts": "core.ml.measure.prompts",
    "core.ml.resultfile": "core.ml.formats.resultfile",
    "core.ml.runio": "core.ml.formats.runio",
    "core.ml.safetensors_header": "core.ml.formats.safetensors_header",
    "core.ml.safetensors_stream": "core.ml.formats.safetensors_stream",
    "core.ml.sampling": "core.ml.models.sampling",
    "core.ml.spec_sampling": "core.ml.models.sampling_torch",
    "core.ml.strictjson": "core.ml.formats.strictjson",
    "core.ml.target": "core.ml.models.target",
    "core.ml.tau": "core.ml.measure.tau",
    "core.ml.weights": "core.ml.formats.weights",
    "core.ml.zlab": "core.ml.measure.zlab",
    "core.params": "core.plans.params",
    "core.plan": "core.plans.plan",
    "core.planfile": "core.plans.planfile",
    "core.points": "core.state.points",
    "core.progress": "core.capsules.progress",
    "core.records": "core.state.records",
    "core.runner": "core.runs.runner",
    "core.shellvars": "core.plans.shellvars",
    "core.slurm": "core.capsules.slurm",
    "core.statefile": "core.state.statefile",
    "core.stats": "core.tau.stats",
    "core.store": "core.state.store",
    "core.todos": "core.plans.todos",
}
"""Old dotted path -> where it lives now."""


class MovedFinder(importlib.abc.MetaPathFinder):
    """Refuses an old path with its new name; finds nothing else (the next finder goes on)."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        raise ModuleNotFoundError(f"{fullname} moved to {new}: import {new}", name=fullname)


def refuse(package: str, name: str):
    """A package's ``__getattr__``: ``from core import store`` names where ``store`` went."""
    new = MOVED.get(f"{package}.{name}")
    if new is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    raise ImportError(f"{package}.{name} moved to {new}: import {new}", name=f"{package}.{name}")


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
