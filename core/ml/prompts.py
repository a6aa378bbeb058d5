"""Prompt files: JSON Lines, one ``{"id", "prompt"}`` (text) or ``{"id", "input_ids"}`` per line.

Text prompts go through the target's tokenizer and chat template as one user turn with
``add_generation_prompt=True`` and ``enable_thinking=False`` (Qwen3 drafters were trained and
benchmarked with thinking off; docs/evaluation.md §1). A tokenizer without a chat template encodes the raw
text, with a warning on stderr.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.ml.runio import UsageError, say


@dataclass
class Prompt:
    """One line of a prompts file."""

    id: str
    text: str | None = None
    input_ids: list[int] | None = None


def read_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Parse a prompts file.

    Raises:
        UsageError: missing file, bad JSON, a line without ``id`` or without exactly one of
            ``prompt``/``input_ids``, or duplicate ids (message names file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"prompts file not found: {path}")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{path}:{n}: not valid JSON ({exc})") from exc
        if not isinstance(row, dict) or "id" not in row:
            raise UsageError(f"{path}:{n}: each line needs an \"id\"")
        has_text, has_ids = "prompt" in row, "input_ids" in row
        if has_text == has_ids:
            raise UsageError(f"{path}:{n}: give exactly one of \"prompt\" (text) or \"input_ids\"")
        pid = str(row["id"])
        if pid in seen:
            raise UsageError(f"{path}:{n}: duplicate id {pid!r}")
        seen.add(pid)
        if has_ids:
            ids = row["input_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
                raise UsageError(f"{path}:{n}: input_ids must be a non-empty list of non-negative ints")
            prompts.append(Prompt(pid, input_ids=list(ids)))
        else:
            if not isinstance(row["prompt"], str) or not row["prompt"]:
                raise UsageError(f"{path}:{n}: prompt must be a non-empty string")
            prompts.append(Prompt(pid, text=row["prompt"]))
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise UsageError(f"{path}: no prompts")
    return prompts


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (identifies the prompt set in results)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


_warned = False


def encode(prompt: Prompt, tokenizer: Any | None, vocab_size: int, chat_template: bool = True,
           enable_thinking: bool = False) -> list[int]:
    """Token ids of a prompt.

    Raises:
        UsageError: a text prompt without a tokenizer, or ids outside the target vocabulary.
    """
    global _warned
    if prompt.input_ids is not None:
        ids = prompt.input_ids
    else:
        if tokenizer is None:
            raise UsageError(f"prompt {prompt.id!r} is text but the target directory has no tokenizer; "
                             "give input_ids instead")
        if chat_template and getattr(tokenizer, "chat_template", None):
            enc = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt.text}], add_generation_prompt=True,
                enable_thinking=enable_thinking, tokenize=True,
            )
            ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
            ids = list(ids[0]) if ids and isinstance(ids[0], list) else list(ids)
        else:
            if chat_template and not _warned:
                say("warning: tokenizer has no chat template; encoding raw prompt text")
                _warned = True
            ids = tokenizer(prompt.text)["input_ids"]
    bad = [i for i in ids if not 0 <= int(i) < vocab_size]
    if bad:
        raise UsageError(f"prompt {prompt.id!r}: token ids {bad[:5]} outside the target vocabulary ({vocab_size})")
    return [int(i) for i in ids]
