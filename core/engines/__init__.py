"""How serving engines will read a DFlash drafter (docs/serving.md).

The rule tables live in :mod:`core.ml.engines` (pure Python; ``core.ml.eval`` runs a drafter
under one of them through :mod:`core.ml.engine_rule`, and ``core.ml`` imports nothing from the
rest of ``core``); :mod:`core.engines.lint` runs them over a drafter config and lists where an
engine's reading differs from specdeck's own (docs/drafter.md §5).
"""
