"""The action kinds a plan may use, by name.

``registry.get(kind)`` returns the class; ``registry.kinds()`` lists the names. This module
imports every kind module; nothing a kind imports imports it back (see core/actions).
"""

from __future__ import annotations

from core.actions.base import Action
from core.actions.eval import Eval
from core.actions.export import Export
from core.actions.extract_hidden import ExtractHidden
from core.actions.extract_weights import ExtractWeights
from core.actions.manual import Manual
from core.actions.relay import Relay
from core.actions.shell import Shell
from core.actions.stop import Stop
from core.actions.train import Train
from core.actions.venv import Venv

KINDS: dict[str, type[Action]] = {cls.kind: cls for cls in (
    Manual, Shell, Stop, Relay, Venv, ExtractWeights, ExtractHidden, Train, Eval, Export)}


def get(kind: str) -> type[Action]:
    """The class of ``kind`` (KeyError for a kind no module defines)."""
    return KINDS[kind]


def kinds() -> list[str]:
    return sorted(KINDS)
