"""Prompt files: JSON Lines, one ``{"id", "prompt"}`` (text), ``{"id", "input_ids"}`` or
``{"id", "turns": [TEXT, ...]}`` (a multi-turn conversation) per line.

Text prompts go through the target's tokenizer and chat template with
``add_generation_prompt=True`` and ``enable_thinking=False`` (Qwen3 drafters were trained and
benchmarked with thinking off; docs/evaluation.md §1): the template renders the text, which is
then encoded with ``add_special_tokens=False``, as the z-lab reference's benchmark does. A
tokenizer without a chat template encodes the raw text, with a warning on stderr.

A ``turns`` line becomes one prompt per turn (ids ``ID#1``, ``ID#2``, ...); turn k's messages are
the earlier turns, each followed by the target's own answer to it, which the online eval
records in ``Prompt.answer`` before it encodes the next turn (the reference's multi-turn
mt-bench). An optional header line ``{"prompt_set": {...}}`` describes where the prompts come
from (``core.ml.measure.zlab`` writes one) and is copied into result.json. Where a path is read, a
``zlab:NAME[:PATH]`` spec may stand instead (the reference's sets, built in memory).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.ml.measure import zlab
from core.ml.formats.runio import UsageError, say


@dataclass
class Prompt:
    """One prompt of a prompts file (one turn of a ``turns`` line)."""

    id: str
    text: str | None = None
    input_ids: list[int] | None = None
    prev: "Prompt | None" = None
    """The conversation's previous turn (multi-turn lines)."""
    answer: list[int] | None = None
    """The target's generated ids for this turn (set by the eval; the next turn needs them)."""
    domain: str | None = None
    """The line's ``domain`` (math, code, prose...): ``compare`` splits tau by it."""

    def conversation(self) -> list["Prompt"]:
        """This turn and the ones before it, first turn first."""
        out, p = [], self
        while p is not None:
            out.append(p)
            p = p.prev
        return out[::-1]


def prompt_bytes(spec: str | Path, quiet: bool = False) -> bytes:
    """The bytes of a prompts file, or of the file a ``zlab:`` spec builds (its warnings on
    stderr unless ``quiet``).

    Raises:
        UsageError: a missing file, or a reference set that cannot be built.
    """
    if zlab.is_spec(str(spec)):
        return zlab.build(str(spec), warn=None if quiet else say)
    path = Path(spec)
    if not path.is_file():
        raise UsageError(f"prompts file not found: {path}")
    return path.read_bytes()


def prompt_set(spec: str | Path, data: bytes | None = None) -> dict | None:
    """The header line's ``prompt_set`` of a prompts file (None when it has none)."""
    for line in (prompt_bytes(spec) if data is None else data).decode("utf-8").splitlines():
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError:
                return None
            return row["prompt_set"] if isinstance(row, dict) and "prompt_set" in row else None
    return None


def read_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Parse a prompts file (or a ``zlab:`` spec): its first ``limit`` lines.

    Raises:
        UsageError: missing file, bad JSON, a line without ``id`` or without exactly one of
            ``prompt``/``input_ids``/``turns``, or duplicate ids (message names file and line).
    """
    prompts: list[Prompt] = []
    seen: set[str] = set()
    lines = 0
    for n, line in enumerate(prompt_bytes(path).decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{path}:{n}: not valid JSON ({exc})") from exc
        if isinstance(row, dict) and "prompt_set" in row and "id" not in row:
            continue
        if not isinstance(row, dict) or "id" not in row:
            raise UsageError(f"{path}:{n}: each line needs an \"id\"")
        kinds = [k for k in ("prompt", "input_ids", "turns") if k in row]
        if len(kinds) != 1:
            raise UsageError(f"{path}:{n}: give exactly one of \"prompt\" (text), \"input_ids\" "
                             "or \"turns\" (a list of texts)")
        pid = str(row["id"])
        domain = row.get("domain")
        if domain is not None and not (isinstance(domain, str) and domain):
            raise UsageError(f"{path}:{n}: domain must be a non-empty string")
        if pid in seen:
            raise UsageError(f"{path}:{n}: duplicate id {pid!r}")
        seen.add(pid)
        if kinds[0] == "input_ids":
            ids = row["input_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
                raise UsageError(f"{path}:{n}: input_ids must be a non-empty list of non-negative ints")
            prompts.append(Prompt(pid, input_ids=list(ids), domain=domain))
        elif kinds[0] == "turns":
            turns = row["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise UsageError(f"{path}:{n}: turns must be a non-empty list of non-empty strings")
            prev = None
            for k, text in enumerate(turns, 1):
                prev = Prompt(f"{pid}#{k}", text=text, prev=prev, domain=domain)
                prompts.append(prev)
        else:
            if not isinstance(row["prompt"], str) or not row["prompt"]:
                raise UsageError(f"{path}:{n}: prompt must be a non-empty string")
            prompts.append(Prompt(pid, text=row["prompt"], domain=domain))
        lines += 1
        if limit is not None and lines >= limit:
            break
    if not prompts:
        raise UsageError(f"{path}: no prompts")
    return prompts


def kept_file(spec: str | Path, folder: str | Path) -> Path:
    """A prompts file that stays: the file itself, or a ``zlab:`` spec's built file written
    into ``folder`` (an extract cache records it, and offline evals of the cache read it)."""
    if not zlab.is_spec(str(spec)):
        return Path(spec).resolve()
    out = Path(folder) / f"{zlab.file_stem(str(spec))}.jsonl"
    data = prompt_bytes(spec, quiet=True)
    if not out.is_file() or out.read_bytes() != data:
        out.write_bytes(data)
    return out.resolve()


def single_turn(prompts: list[Prompt], task: str) -> None:
    """Refuse conversations where no target answers each turn before the next is encoded.

    Raises:
        UsageError: a prompt is a later turn of a conversation.
    """
    later = [p.id for p in prompts if p.prev is not None]
    if later:
        raise UsageError(f"{task}: prompts {later[:3]} are later turns of conversations (multi-turn, e.g. "
                         "zlab:mt-bench); each needs the target's own answer to the turn before, which only "
                         "the online eval generates (python -m core.ml.eval --mode online)")


def describe(spec: str | Path, prompts: list[Prompt]) -> dict[str, Any]:
    """result.json's ``prompts`` block: the file (or spec), its sha256, the prompts used and,
    for a described set (``zlab:``), which set, rows, seed, selection and wrapping."""
    data = prompt_bytes(spec, quiet=True)
    out: dict[str, Any] = {"file": str(spec) if zlab.is_spec(str(spec)) else str(Path(spec).resolve()),
                           "sha256": hashlib.sha256(data).hexdigest(), "count": len(prompts),
                           "ids": [p.id for p in prompts]}
    head = prompt_set(spec, data)
    if head is not None:
        out["set"] = {**head, "subset": len({p.conversation()[0].id for p in prompts})}
    domains = {p.id: domain_of(p, head is not None) for p in prompts}
    if any(domains.values()):
        out["domains"] = {k: v for k, v in domains.items() if v}
    return out


def domain_of(p: Prompt, described_set: bool) -> str | None:
    """A prompt's domain: its line's ``domain``, else for a described set (``zlab:``, ids
    ``gsm8k/17``) the set's name before the ``/``; None when neither says."""
    if p.domain:
        return p.domain
    return p.id.split("/", 1)[0] if described_set and "/" in p.id else None


def file_sha256(path: str | Path) -> str:
    """sha256 of a prompts file's bytes, or of a ``zlab:`` spec's (identifies the set in results)."""
    return hashlib.sha256(prompt_bytes(path, quiet=True)).hexdigest()


_warned = False


def encode(prompt: Prompt, tokenizer: Any | None, vocab_size: int, chat_template: bool = True,
           enable_thinking: bool = False) -> list[int]:
    """Token ids of a prompt (for a later turn: of the whole conversation so far).

    Raises:
        UsageError: a text prompt without a tokenizer, ids outside the target vocabulary, or a
            later turn whose earlier turns have no answer yet (only the online eval makes them).
    """
    if prompt.input_ids is not None:
        ids = prompt.input_ids
    else:
        text, templated = render(prompt, tokenizer, chat_template, enable_thinking)
        ids = tokenizer.encode(text, add_special_tokens=False) if templated else tokenizer(text)["input_ids"]
    bad = [i for i in ids if not 0 <= int(i) < vocab_size]
    if bad:
        raise UsageError(f"prompt {prompt.id!r}: token ids {bad[:5]} outside the target vocabulary ({vocab_size})")
    return [int(i) for i in ids]


def render(prompt: Prompt, tokenizer: Any | None, chat_template: bool = True,
           enable_thinking: bool = False) -> tuple[str, bool]:
    """The text a text prompt is encoded from, and whether the chat template made it: what
    :func:`encode` tokenizes, and what a client sends an engine whose API takes no token ids
    (core.ml.engine_clients ``--send text``), so both wrap a prompt alike.

    Raises:
        UsageError: no tokenizer, or a later turn without the chat template or without the
            earlier turns' answers.
    """
    global _warned
    if tokenizer is None:
        raise UsageError(f"prompt {prompt.id!r} is text but the target directory has no tokenizer; "
                         "give input_ids instead")
    if chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(_messages(prompt, tokenizer), add_generation_prompt=True,
                                             enable_thinking=enable_thinking, tokenize=False), True
    if prompt.prev is not None:
        raise UsageError(f"prompt {prompt.id!r} is a later turn of a conversation: it needs the "
                         "target's chat template (drop --no-chat-template / chat_template: false)")
    if chat_template and not _warned:
        say("warning: tokenizer has no chat template; encoding raw prompt text")
        _warned = True
    return prompt.text, False


def _messages(prompt: Prompt, tokenizer: Any) -> list[dict[str, str]]:
    """The chat so far: each earlier turn and the target's answer to it (decoded without
    special tokens, as the reference's benchmark does), then this turn."""
    out = []
    for turn in prompt.conversation():
        out.append({"role": "user", "content": turn.text})
        if turn is prompt:
            break
        if turn.answer is None:
            raise UsageError(f"prompt {prompt.id!r} follows turn {turn.id!r}, which has no answer yet: a "
                             "multi-turn set needs the target's own answer to each turn, which only the "
                             "online eval generates (python -m core.ml.eval --mode online)")
        out.append({"role": "assistant", "content": tokenizer.decode(turn.answer, skip_special_tokens=True)})
    return out
