"""Tests of core.ml.train (the wing of the same name): run alone with ``pytest tests/ml/train``."""
