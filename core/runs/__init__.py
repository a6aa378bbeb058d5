"""Runs: a run's life, from claimed to ended, stopped, lost or adopted.

``life`` the states and their transitions (the rules every face enforces), ``runner``
executes items on their hosts through the kinds, ``adopt`` finds runs specdeck did not start,
``events`` what the runner emits (plain dataclasses). Above ``core.actions``: the runner drives
the kinds, the kinds never import it.
"""
