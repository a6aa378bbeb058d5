"""Action kinds: one module per kind (typed params, a side-effect-free check, a run).

:mod:`core.actions.base` is what every kind is; :mod:`core.actions.registry` lists the
kinds plans may use. Dependencies flow one way: the registry imports the kinds, the kinds
import the base, and the base imports neither (nor the plan loader, which imports the
registry). This package's own import loads nothing.
"""
