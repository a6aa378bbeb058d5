"""Measure: how tau is counted and compared, pure Python (no torch). ``tau`` the round accounting,
``prompts`` prompt files and templates, ``zlab`` the reference's benchmark sets, ``compare``
two result files, ``parity`` one drafter measured several ways, ``harness`` how a tau was measured
(harness, decoding, prompt digest, the three aggregations' names), ``sequential`` the settled stop's
anytime-valid verdict (run on the eval host; ``core.tau`` reads its result). Imports ``formats`` only.
"""
