"""Tests of core.ml.decoding (the wing of the same name): run alone with ``pytest tests/ml/decoding``."""
