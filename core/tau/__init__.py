"""Tau at the decision: the comparison table of drafters against a baseline (``table``) and
its statistics (``stats``: bootstrap intervals, paired tests, verdicts, Holm's correction), and a
campaign's arms compared as one family (``arms``). Reads ``core.state``
records and ``core.ml``'s pure formats; no host, no runner.
"""
