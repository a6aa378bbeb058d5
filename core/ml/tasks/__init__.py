"""Tasks: the bodies of the commands a host runs. Each stays reachable at its old place, a thin
entry ``core/ml/<task>.py``, so ``python -m core.ml.eval`` (what plans, docs and in-flight
capsules name) still runs. ``eval`` tau -> result.json, ``extract`` target continuations and
features, ``strip`` checkpoint -> drafter, ``export`` drafter -> serving files, ``watcher``
tau at every checkpoint (detached), ``engine_clients`` tau through a vLLM or SGLang server.
May import every wing below it; only ``core.ml.train`` imports a task.
"""
