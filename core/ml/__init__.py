"""specdeck's ML core: the code that runs on the hosts as ``python -m core.ml.<task>``.

Importing this package is cheap: it loads neither torch nor transformers. The pure-Python
modules (:mod:`core.ml.tau`, :mod:`core.ml.compare`, :mod:`core.ml.runio`, :mod:`core.ml.bounds`,
:mod:`core.ml.strictjson`, :mod:`core.ml.resultfile`) can be used on a laptop without torch; everything else (drafter, features, target, generate, offline, extract,
eval, strip, tiny) imports torch and transformers and is meant for the GPU/CPU hosts.

Entry points:

* ``python -m core.ml.extract``  target greedy continuations + tapped features -> safetensors
* ``python -m core.ml.eval``     online chain / DDTree or offline tau -> result.json
* ``python -m core.ml.strip``    training checkpoint -> drafter config.json + model.safetensors
* ``python -m core.ml.compare``  two result.json files -> per-prompt and overall tau deltas
* ``python -m core.ml.tiny``     tiny random target + drafter directories for demos and tests

From the rest of ``core`` this package imports only the two leaf modules :mod:`core.errors` and
:mod:`core.text` (the standard library and each other only; they ship in the same wheel as this package), so what
runs on a host needs neither the store, the runner nor asyncssh (tests/test_import_graph.py).
"""
