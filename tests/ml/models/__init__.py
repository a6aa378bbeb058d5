"""Tests of core.ml.models (the wing of the same name): run alone with ``pytest tests/ml/models``."""
