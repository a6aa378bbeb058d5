"""Pieces of the ML plans the ssh integration tests write as JSON (train on one host, tau on
another): each test's plan reads as what it changes, not as a copy of the host and feature
entries every such plan has."""

from __future__ import annotations

import sys


def ssh_host(server, workdir) -> dict:
    """A plan host reached through ``server``'s ssh alias, running this interpreter."""
    return {"ssh": server.alias, "workdir": str(workdir), "python": sys.executable}


def extract_item(item_id: str, content: str, host: str, *, prompts: str, layers: list[int],
                 out: str, max_new_tokens: int) -> dict:
    """An ``extract_hidden`` item of the tiny target (``models/target`` in the host's workdir)."""
    return {"id": item_id, "content": content, "action": {
        "kind": "extract_hidden", "host": host, "params": {
            "target": "models/target", "prompts": prompts, "layers": layers, "out": out,
            "max_new_tokens": max_new_tokens}}}
