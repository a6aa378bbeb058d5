"""Tau over training: evaluate each new checkpoint of a live train run, in one room.

The train action (:mod:`core.actions.train`) imports this package, downward; everything here
gets the train run's :class:`~core.actions.base.ActionContext`, never the runner or the
store, and records through its tau verbs (the watcher row, the watched steps, journal,
metrics and eval rows of the run).

* :mod:`.params`: ``watch_eval`` typed (:class:`~.params.WatchEvalParams`), its checks.
* :mod:`.watcher`: ``on: console``, specdeck drives the evals (:class:`~.watcher.Watcher`).
* :mod:`.detached`: ``on: train`` / ``on: eval``, a detached watcher on a host
  (``python -m core.ml.watcher``), started, ingested, restarted and stopped from here.
* :mod:`.status`: a watcher's state read from the store for ``status`` and the item pane.

With ``on: train`` / ``on: eval`` the evals run in a detached watcher that keeps going while
no specdeck runs; with ``on: console`` specdeck drives them while it follows the run. Either
way tau at step S is stored as metrics of the train run (``tau``, its 95 % interval,
``tau_pooled``, ``tau_acc[k]``) and as eval rows (drafter ``<item>@<S>``, ``step`` S) for the
tau pane and ``specdeck compare --step``; alerts (a drop, a flat curve) go to the journal
and to the operator.
"""
