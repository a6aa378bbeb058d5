"""Runs: a run's life, from claimed to ended, stopped, lost or adopted.

``life`` the states and their transitions (the rules every face enforces: the store refuses a
move it lacks, the console and CLI take the names from it), the item status each end makes,
what a reconcile decides from a capsule against the store (and what an end or a reconcile
writes: the runner hands it the store and its ``emit``), the stop's grace; ``runner``
executes items on their hosts through the kinds, asking ``life``; ``adopt`` finds runs
specdeck did not start; ``events`` what the runner emits (life's moves too, through it; plain
dataclasses). Above ``core.actions``: the runner drives the kinds, the kinds never import it.
"""
