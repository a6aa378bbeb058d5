"""State: the SQLite database a plan's runs live in (closing the laptop loses nothing).

``store`` (the only importer of sqlite_utils), ``records`` the frozen records it hands out,
``points`` the numbers it admits, ``statefile`` the checks made before a byte is written.
May import the leaves and ``core.ml``'s formats; nothing above.
"""
