"""``specdeck engines``: how each engine will read a drafter, against specdeck's own reading.

Pure Python (no torch), like :mod:`core.ml.engines.rules`, whose rule tables it runs.

:func:`lint` reads a drafter's ``config.json`` with every rule table of
:mod:`core.ml.engines.rules` and with specdeck's own semantics
(:class:`~core.ml.formats.drafter_config.DFlashConfig`, docs/drafter.md §5), and adds a ``differs``
finding wherever an engine will run another mask, tap other layers, or fill the block with
another token than specdeck measured: a tau specdeck reports is then not the tau that engine
serves. ``export`` runs it too (docs/serving.md §2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from core.errors import InvalidFile
from core.ml.formats.drafter_config import DFlashConfig, read_config_file, read_target_config
from core.ml.engines.rules import ENGINES, EngineReading, Finding, LayerReading


@dataclass(frozen=True)
class Lint:
    """A drafter's readings: specdeck's (None when specdeck refuses the config) and each engine's."""

    path: str
    raw: dict[str, Any]
    specdeck: DFlashConfig | None
    specdeck_error: str | None
    readings: tuple[EngineReading, ...]
    target_findings: tuple[Finding, ...] = ()

    def differences(self) -> list[tuple[str, Finding]]:
        """(engine, finding) for every ``differs``, ``missing`` or ``refused`` finding."""
        return [(r.engine, f) for r in self.readings for f in r.findings
                if f.kind in ("differs", "missing", "refused")]

    def to_dict(self) -> dict[str, Any]:
        spec = None
        if self.specdeck is not None:
            spec = {**self.specdeck.attention_summary(), "target_layer_ids": self.specdeck.target_layer_ids,
                    "mask_token_id": self.specdeck.mask_token_id, "block_size": self.specdeck.block_size}
        return {"drafter": self.path, "specdeck": spec, "specdeck_error": self.specdeck_error,
                "engines": [r.to_dict() for r in self.readings],
                "target": [{"kind": f.kind, "field": f.field, "message": f.message} for f in self.target_findings]}


def read_config(path: str | Path) -> tuple[str, dict[str, Any]]:
    """``(shown path, config dict)`` of a drafter directory or a ``config.json``, every field an
    engine or specdeck reads checked (:func:`~core.ml.formats.drafter_config.read_config_file`); a
    directory's weights are checked too (their header against the file: a copy cut short is
    refused, as every engine would refuse it).

    Raises:
        InvalidFile: no config there, or a value of the wrong type, not finite, out of range or
            nested too deeply; weights cut short or not safetensors (names the file and key).
    """
    from core.ml.formats.safetensors_header import check_dir

    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    if not file.exists():
        raise InvalidFile(file, "no drafter config there (a drafter directory holds config.json)",
                          hint="give a drafter directory (config.json + model.safetensors) or its config.json")
    raw = read_config_file(file)
    if p.is_dir():
        check_dir(p)
    return str(file), raw


def target_config(path: str | Path) -> dict[str, Any]:
    """A target's text config (``text_config`` of a multimodal one), from its directory, the
    fields specdeck reads checked (:func:`~core.ml.formats.drafter_config.read_target_config`)."""
    return read_target_config(path)


def spec_layers(cfg: DFlashConfig) -> tuple[LayerReading, ...]:
    return tuple(LayerReading(i, t, r.causal, r.window)
                 for i, (t, r) in enumerate(zip(cfg.layer_types, cfg.attention_rules())))


def span_text(layers: list[int]) -> str:
    runs, start = [], None
    for i, x in enumerate(layers):
        if start is None:
            start = x
        if i + 1 == len(layers) or layers[i + 1] != x + 1:
            runs.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(runs)


def compare(reading: EngineReading, cfg: DFlashConfig) -> list[Finding]:
    """The ways ``reading`` departs from specdeck's reading ``cfg``, with what they do."""
    out = []
    mine = spec_layers(cfg)
    by_change: dict[tuple[LayerReading, LayerReading], list[int]] = {}
    for a, b in zip(mine, reading.layers):
        if (a.causal, a.window) != (b.causal, b.window):
            key = (replace(a, layer=0), replace(b, layer=0))
            by_change.setdefault(key, []).append(a.layer)
    for (a, b), idx in by_change.items():
        what = []
        if a.causal != b.causal:
            what.append("block slots see later slots (bidirectional)" if not b.causal
                        else "block slots no longer see later slots")
        if a.window != b.window:
            what.append(f"window {b.window or 'none'} instead of {a.window or 'none'}")
        out.append(Finding("differs", "attention", f"{span_text(idx)} ({a.type}): {reading.engine} runs "
                           f"{b.describe()} (causality from {reading.causality_from}); specdeck measured "
                           f"{a.describe()}: {'; '.join(what)}, so drafts and tau differ from specdeck's"))
    if len(reading.layers) != len(mine):
        out.append(Finding("differs", "num_hidden_layers", f"{reading.engine} builds {len(reading.layers)} "
                           f"layers, specdeck {len(mine)}"))
    if reading.target_layer_ids is not None and list(reading.target_layer_ids) != list(cfg.target_layer_ids):
        out.append(Finding("differs", "target_layer_ids", f"{reading.engine} taps target layers "
                           f"{list(reading.target_layer_ids)}, specdeck {cfg.target_layer_ids}: the drafter "
                           "is fed other features than it was trained on"))
    if reading.mask_token_id is not None and reading.mask_token_id != cfg.mask_token_id:
        out.append(Finding("differs", "mask_token_id", f"{reading.engine} fills the block with "
                           f"{reading.mask_token_id}, specdeck with {cfg.mask_token_id}"))
    if reading.block_size is not None and reading.block_size != cfg.block_size:
        out.append(Finding("differs", "block_size", f"{reading.engine} drafts blocks of {reading.block_size} "
                           f"({reading.block_from}), specdeck {cfg.block_size}"))
    return out


def check_target(raw: dict[str, Any], spec: DFlashConfig | None, target: dict[str, Any]) -> list[Finding]:
    """What the target's config says about the drafter: sizes, taps in range, the final layer."""
    if spec is None:
        return []
    out = [Finding("refused", name, why) for name, why in spec.target_problems(target)]
    n = target.get("num_hidden_layers")
    if n is not None and not any(f.field == "target_layer_ids" for f in out) and n - 1 in spec.target_layer_ids:
        out.append(Finding("note", "target_layer_ids", f"taps the target's last layer {n - 1}: speculators' "
                           "DFlashConverter drops it (it feeds the last layer separately); specdeck's own "
                           "speculators export keeps it"))
    return sorted(out, key=lambda f: ["hidden_size", "target_layer_ids", "mask_token_id"].index(f.field))


def lint(path: str | Path, target: str | Path | None = None, engines: list[str] | None = None) -> Lint:
    """Read the drafter at ``path`` with every engine's table (or ``engines``).

    Raises:
        InvalidFile: the config cannot be read at all, or holds a value no reader may take
            (names the file and the key).
    """
    shown, raw = read_config(path)
    try:
        spec, error = DFlashConfig.from_dict(raw), None
    except ValueError as exc:  # a refusal of what the config means (its values were checked above)
        spec, error = None, str(exc)
    readings = []
    for name in engines or list(ENGINES):
        reading = ENGINES[name].read(raw)
        if spec is not None:
            reading = replace(reading, findings=(*compare(reading, spec), *reading.findings))
        readings.append(reading)
    found = tuple(check_target(raw, spec, target_config(target))) if target is not None else ()
    return Lint(shown, raw, spec, error, tuple(readings), found)


def render(result: Lint) -> str:
    """The lint as text: specdeck's reading, then each engine's, differences first."""
    lines = [f"drafter {result.path}"]
    spec = result.specdeck
    if spec is None:
        lines.append(f"  specdeck refuses this config: {result.specdeck_error}")
    else:
        lines.append(f"  specdeck (docs/drafter.md §5): {spec.attention_text()}; taps {spec.target_layer_ids}; "
                     f"mask {spec.mask_token_id}; block {spec.block_size}")
    for f in result.target_findings:
        lines.append(f"  target {f.kind}: {f.message}")
    order = {"refused": 0, "differs": 1, "missing": 2, "ignored": 3, "note": 4}
    for r in result.readings:
        lines.append(f"{r.engine} ({r.revision})")
        groups: dict[str, list[int]] = {}
        for layer in r.layers:
            groups.setdefault(f"{layer.type}: {layer.describe()}", []).append(layer.layer)
        attn = "; ".join(f"{span_text(idx)} {text}" for text, idx in groups.items())
        lines.append(f"  reads: {attn} (causality from {r.causality_from})")
        lines.append(f"  taps {list(r.target_layer_ids) if r.target_layer_ids is not None else 'none'} "
                     f"[{r.taps}]; mask {r.mask_token_id if r.mask_token_id is not None else '?'} [{r.mask_from}]; "
                     f"block {r.block_size if r.block_size is not None else '-'} [{r.block_from}]")
        same = spec is not None and not any(f.kind == "differs" for f in r.findings)
        if same:
            lines.append("  same as specdeck: attention, taps, mask token"
                         + (", block size" if r.block_size is not None else ""))
        for f in sorted(r.findings, key=lambda f: order.get(f.kind, 9)):
            lines.append(f"  {f.kind.upper() if f.kind in ('differs', 'refused', 'missing') else f.kind}"
                         f" {f.field}: {f.message}")
    return "\n".join(lines) + "\n"
