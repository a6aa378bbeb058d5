"""How serving engines will read a DFlash drafter (docs/serving.md).

Pure Python (no torch): :mod:`core.engines.rules` holds one rule table per engine and the
revision it was read from; :mod:`core.engines.lint` runs them over a drafter config and lists
where an engine's reading differs from specdeck's own (docs/drafter.md §5);
:mod:`core.engines.override` rewrites a drafter config so specdeck runs it under an engine's
rule ("tau as that engine serves it").
"""
