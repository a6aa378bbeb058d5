"""Tests of core.ml.demo (the wing of the same name): run alone with ``pytest tests/ml/demo``."""
