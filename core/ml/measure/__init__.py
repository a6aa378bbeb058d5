"""Measure: how tau is counted and compared, pure Python (no torch). ``tau`` the round accounting,
``prompts`` prompt files and templates, ``zlab`` the reference's benchmark sets, ``compare``
two result files, ``parity`` one drafter measured several ways. Imports ``formats`` only.
"""
