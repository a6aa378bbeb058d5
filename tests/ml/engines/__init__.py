"""Tests of core.ml.engines (the wing of the same name): run alone with ``pytest tests/ml/engines``."""
