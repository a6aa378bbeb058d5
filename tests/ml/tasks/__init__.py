"""Tests of core.ml.tasks (the wing of the same name): run alone with ``pytest tests/ml/tasks``."""
