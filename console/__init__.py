"""specdeck's Textual console. Imports core; core never imports it.

Importing this package loads nothing heavy: Textual comes in with ``console.app``.
"""
