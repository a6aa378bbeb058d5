"""Do the sizes fit? Checks made before anything runs, shared by ``train`` and ``eval``.

* A ``core.ml.train`` config must fit its target and feature cache: taps inside the target and
  present in the cache, hidden size, vocabulary, the final layer when a knob needs it. At
  ``specdeck validate`` the config file itself is checked (types, keys, the sizes it states),
  and, for an item on the local host, against the target's config.json and the cache's
  manifest.json when they are there. On a remote host the trainer's own preflight refuses a
  mismatch before it touches a GPU (exit 2, same messages).
* An ``eval`` whose drafter and baseline were trained with different block sizes is refused
  unless the item says so (``block_size: N`` evaluates both at N; or
  ``allow_block_size_mismatch: true``): tau ranges over 1..B, so different B do not compare.

Pure Python (``core.ml.train.config`` and ``core.ml.formats.drafter_config`` load neither torch nor
transformers). Every message names both sides and the fix.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Any

from core.actions.mlbase import REF, read_json
from core.text import load_yaml, read_json_file


def drafter_block_size(cfg: dict[str, Any] | None) -> int | None:
    """B of a drafter config.json dict (z-lab: top level or ``dflash_config``; speculators)."""
    if not isinstance(cfg, dict):
        return None
    b = cfg.get("block_size") or (cfg.get("dflash_config") or {}).get("block_size")
    return int(b) if isinstance(b, int) else None


def local_path(plan: Any, host: str | None, value: str, base: Path | None = None) -> Path | None:
    """Where ``value`` (a path on plan host ``host``) is on this machine; None for a remote host.

    Relative paths are relative to ``base`` when given, else to the host's workdir.
    """
    spec = plan.hosts.get(host) if host else None
    if spec is None or not spec.local:
        return None
    p = Path(os.path.expanduser(value))
    if p.is_absolute():
        return p
    return (base or Path(os.path.expanduser(spec.workdir))) / p


def read_local_json(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    try:  # bounded size and depth, no NaN: a config.json on a local host is untrusted too
        data = read_json_file(path, "JSON file")
    except ValueError:  # InvalidFile
        return None
    return data if isinstance(data, dict) else None


def config_json_of(path: str) -> str:
    """The config.json of a drafter dir, or the one beside a training checkpoint."""
    if path.endswith((".pt", ".pth", ".bin")):
        return posixpath.join(posixpath.dirname(path), "config.json")
    return posixpath.join(path, "config.json")


def block_size_mismatch(params: Any, drafter_b: int | None, baseline_b: int | None) -> str | None:
    """The refusal when drafter and baseline block sizes differ and the eval item does not say so."""
    if params.baseline is None or params.block_size is not None or params.allow_block_size_mismatch:
        return None
    if drafter_b is None or baseline_b is None or drafter_b == baseline_b:
        return None
    return (f"drafter {params.drafter} was trained with block size {drafter_b} but baseline "
            f"{params.baseline} with {baseline_b}: their tau (1..B) do not compare; set block_size: "
            f"{min(drafter_b, baseline_b)} to evaluate both at that size, or allow_block_size_mismatch: true "
            "to compare them each at its own")


def train_item_block_size(plan: Any, item_id: str) -> int | None:
    """The block size a train item's core.ml.train config gives its drafter (None if unknown)."""
    item = next((it for it in plan.items if it.id == item_id), None)
    params = item.action.params if item is not None and item.action is not None else None
    if params is None or item.action.kind != "train" or params.config is None \
            or getattr(params, "external", False):
        return None  # not a train item, one whose own params are invalid (said there), or
        # one of SpecForge / speculators, whose config is theirs
    doc = load_train_doc(plan, params)
    if doc is None:
        return None
    drafter = doc.get("drafter") or {}
    if drafter.get("init"):
        init = read_local_json(local_path(plan, item.action.host, config_json_of(drafter["init"])))
        return drafter_block_size(init)
    from core.ml.train.config import DrafterSection

    b = drafter.get("block_size", DrafterSection().block_size)
    return b if isinstance(b, int) else None


def deep_set(doc: dict, dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested config dict (an ``overrides:`` key), making the mappings."""
    cur = doc
    parts = dotted.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
        if not isinstance(cur, dict):
            raise ValueError(f"override {dotted!r}: {p!r} is not a mapping in the config")
    cur[parts[-1]] = value


def load_train_doc(plan: Any, params: Any) -> dict[str, Any] | None:
    """A train item's config YAML with its overrides merged (None when unreadable)."""
    import yaml


    try:
        doc = load_yaml((plan.dir / params.config).read_text()) or {}
        for k, v in params.overrides.items():
            deep_set(doc, k, v)
    except (OSError, yaml.YAMLError, ValueError, AttributeError):
        return None
    return doc if isinstance(doc, dict) else None


def trainer_config_problems(plan: Any, item: Any, params: Any, doc: dict[str, Any]) -> list[str]:
    """Why a train item's config cannot run: its own checks, then, on a local host, the sizes
    of the target (config.json), ``drafter.init`` and the feature cache (manifest.json)."""
    from core.ml.train import config as tc

    where = Path(params.config).name
    try:
        cfg = tc.from_dict(doc, where)
    except tc.ConfigError as e:
        return [str(e)]
    host, base = item.action.host, (plan.dir / params.config).parent

    def here(key: str, value: str | None) -> Path | None:
        if value is None:
            return None
        return local_path(plan, host, value, None if key in params.overrides else base)

    init_dir = here("drafter.init", cfg.drafter.init)
    init = read_local_json(init_dir / "config.json") if init_dir is not None else None
    if init is not None:  # whatever the target: a DFlash-2 init cannot be trained
        try:
            tc.refuse_dflash2_init(where, cfg.drafter.init, init)
        except tc.ConfigError as e:
            return [str(e)]
    target = here("target", cfg.target)
    if target is None or not (target / "config.json").is_file():
        return []  # a remote host (or no target here yet): the trainer's preflight checks it there
    try:
        # the tokenizer's <|MASK|> is not read here: a placeholder lets the sizes be checked
        cfg = tc.resolve(cfg, where, tc.read_target_config(target),
                         0 if cfg.drafter.mask_token_id is None else None, init)
    except tc.ConfigError as e:
        return [str(e)]
    manifest = read_local_json(here("data.features", cfg.data.features) / "manifest.json") if cfg.data.features else None
    return tc.cache_problems(cfg, manifest) if manifest else []


def top_k_beyond_vocab(plan: Any, item: Any, params: Any) -> str | None:
    """A ``top_k`` past the vocabulary of a target on a local host (its config.json; a remote
    target: ``core.ml.eval`` refuses the same there, exit 2, before loading it)."""
    from core.ml.models.sampling import top_k_problem

    if not params.top_k:
        return None
    where = local_path(plan, item.action.host, params.target)
    return top_k_problem(params.top_k, read_local_json(where / "config.json" if where else None))


def local_block_size(plan: Any, item: Any, ref: str | None) -> int | None:
    """B of a drafter known at validate time: a train item's config, or a dir on a local host."""
    if ref is None:
        return None
    m = REF.match(ref)
    if m:
        return train_item_block_size(plan, m.group(1))
    return drafter_block_size(read_local_json(local_path(plan, item.action.host, config_json_of(ref))))


async def host_block_size(host: Any, path: str) -> int | None:
    """B of the drafter at ``path`` on ``host`` (dir or checkpoint), None when unreadable."""
    return drafter_block_size(await read_json(host, config_json_of(host.path(path))))
