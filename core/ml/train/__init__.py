"""The reference DFlash trainer, ``python -m core.ml.train`` (docs/training.md).

* :mod:`core.ml.train.config`: the YAML config, its validation and the v4 knobs (pure
  Python: the train action's plan checks import it without torch);
* :mod:`core.ml.train.data`: feature caches and JSONL sources, packing, anchors;
* :mod:`core.ml.train.loss`: the position-decayed hard CE (and the v4 soft KL);
* :mod:`core.ml.train.runtime`: devices, DDP, checkpoints;
* :mod:`core.ml.train.trainer`: the training loop and the command line.

This package's own import loads nothing (no torch): the trainer is imported by
``python -m core.ml.train`` (``__main__``) and by whoever needs it.
"""
