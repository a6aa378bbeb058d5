"""Formats: the files and numbers that cross a task's edge. The drafter's config, the trainers'
checkpoint layouts, target weights without loading them, safetensors headers and streaming,
the feature cache, an export's swap into place, result.json's schema, strict JSON, the bounds
on numbers, and ``runio`` (a task's flags, progress lines and exit codes). The bottom of
``core.ml``: imports only ``core.errors`` and ``core.text``; the rest of ``core`` may import it.
"""
