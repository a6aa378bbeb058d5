"""Action kinds: one module per kind, each registering its class on import.

``registry.get(kind)`` returns the class; ``registry.kinds()`` lists what plans may use.
Kinds register themselves with the :func:`register` decorator from ``core.actions.base``;
importing this package imports every kind module so the registry is complete.
"""

from core.actions.base import registry  # noqa: F401
from core.actions import manual, shell, stop  # noqa: F401  (register themselves)

for _mod in ("relay", "venv", "extract_weights", "extract_hidden", "train", "eval"):
    try:
        __import__(f"core.actions.{_mod}")
    except ModuleNotFoundError as e:  # a kind not built yet
        if e.name != f"core.actions.{_mod}":
            raise
