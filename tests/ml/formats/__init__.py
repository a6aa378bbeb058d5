"""Tests of core.ml.formats (the wing of the same name): run alone with ``pytest tests/ml/formats``."""
