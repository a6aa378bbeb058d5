"""Tests of core.ml.measure (the wing of the same name): run alone with ``pytest tests/ml/measure``."""
