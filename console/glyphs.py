"""The glyph of each item status, one table for both faces (the CLI's lines and the console's
plan pane): the help's legend, ``status`` and the plan list read it from here."""

from core.plans.plan import STATUSES

GLYPHS = dict(zip(STATUSES, "○◐●✗□⊘", strict=True))
