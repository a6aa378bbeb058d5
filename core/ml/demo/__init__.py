"""The demo's models: ``tiny`` random targets, tokenizer and drafters built from config in code,
and ``codemodel`` a small Qwen3 trained for a minute on Python's sources (``specdeck demo``).
Each is also a command (``python -m core.ml.tiny``, ``python -m core.ml.codemodel``).
"""
