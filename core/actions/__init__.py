"""Action kinds: one module per kind, each registering its class on import.

``registry.get(kind)`` returns the class; ``registry.kinds()`` lists what plans may use.
Kinds register themselves with the :func:`register` decorator from ``core.actions.base``;
importing this package imports every kind module so the registry is complete.
"""

from core.actions.base import registry  # noqa: F401
from core.actions import (eval, extract_hidden, extract_weights, manual, relay,  # noqa: F401
                          shell, stop, train, venv)  # (each registers its kind on import)
