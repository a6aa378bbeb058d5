"""specdeck's headless core.

Nothing under ``core`` imports Textual; only ``core.store`` imports sqlite_utils, only
``core.hosts.ssh`` imports asyncssh, and only ``core.ml`` imports torch or transformers.
``tests/test_import_hygiene.py`` enforces this in fresh subprocesses.
"""

__version__ = "0.1.0"
