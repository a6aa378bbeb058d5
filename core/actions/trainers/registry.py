"""One object per trainer a train item runs (``trainer: NAME``), registered here by name.

A :class:`Trainer` says everything the train action needs of one trainer:

* its **command**: the ``python`` words that run it on the uploaded ``train.yaml``
  (:meth:`Trainer.module_words`), the config it uploads (:meth:`Trainer.upload_doc`) and what
  is recorded with the run (:meth:`Trainer.prepare`); the launcher around it (process,
  torchrun, Slurm) stays the train action's;
* its **layout**: which entries of its output dir are checkpoints
  (:class:`core.ml.formats.layouts.Layout`, the host-side module the watcher reads too);
* its **metric names**: its log keys and TensorBoard tags -> the curves' names;
* its **stop grace**: seconds a stop waits after SIGTERM, its time to save (None: the stop's);
* its **preflight**: what :meth:`Trainer.preflight` checks on the host before launch;
* its **checkpoint reader**: how strip reads its checkpoints (its layout's ``drafter_dir``:
  none needed; :meth:`Trainer.drafter_config`: the drafter config strip is given).

:func:`register` (a class decorator) adds one to :data:`TRAINERS`; the ``trainer:`` param
validates against :func:`names`. This base is another trainer's own CLI on its own config
(SpecForge's, speculators'); specdeck's trainer (:mod:`.specdeck`) overrides what differs.
"""

from __future__ import annotations

import dataclasses
import posixpath
import shlex
from typing import Any, ClassVar

import yaml

from core.actions.fit import deep_set
from core.actions.mlbase import host_python
from core.capsules import jobs
from core.capsules.metrics_sources import MetricsParams
from core.ml.formats import layouts
from core.text import did_you_mean, load_yaml


class Trainer:
    """One trainer: subclass, set the class attributes, override what differs, :func:`register`."""

    name: ClassVar[str]
    layout: ClassVar[layouts.Layout]
    """Its checkpoints' layout (:mod:`core.ml.formats.layouts`; a new one is registered with it)."""
    config_what: ClassVar[str] = "YAML"
    """What ``config:`` is, in messages (``specforge YAML``)."""
    out_key: ClassVar[str | None] = "output dir"
    """What its config calls its output dir: ``out:`` is required (None: optional, the
    capsule's ``out``)."""
    metric_names: ClassVar[dict[str, str]] = {}
    """Its log keys and TensorBoard tags -> the curves' names (``loss``, ``accuracy``...)."""
    stop_grace_s: ClassVar[float | None] = 300.0
    """Seconds a stop waits after SIGTERM before SIGKILL: its time to save (None: the stop's)."""
    preflight_keys: ClassVar[tuple[tuple[str, str], ...]] = ()
    """``(config key, what)`` of the inputs :meth:`preflight` looks for on the host."""
    prints_checkpoints: ClassVar[bool] = False
    """It prints ``{"event": "checkpoint"}`` lines; else its output dir is scanned while it
    trains (the console's tau watcher)."""
    execs: ClassVar[bool] = True
    """Its command is ``exec``'d: it saves on the stop's SIGTERM and exits as the capsule."""
    resolved_config: ClassVar[str | None] = None
    """The resolved config it writes beside its checkpoints (for ``specdeck diff``)."""
    checkpoint_metrics: ClassVar[str | None] = None
    """A file in each checkpoint entry with that checkpoint's figures (JSON object)."""

    # -- the command -------------------------------------------------------------------
    def module_words(self, out: str | None, recorded: dict) -> list[str]:
        """``-m MODULE ...``: how a launcher's python runs it on ``train.yaml`` in the run
        capsule, its checkpoints going to ``out`` (``recorded``: what prepare recorded)."""
        raise NotImplementedError(self.name)

    def upload_doc(self, doc: dict, host, out: str) -> dict:
        """The ``config`` (``overrides`` merged) as uploaded: paths absolute on ``host``,
        its output dir ``out`` where the config names it."""
        return doc

    # -- what the train action asks of it ----------------------------------------------
    def validate(self, params) -> list[tuple[str, str | None]]:
        """Its own rules on a train item's params (``(field, problem or None)`` checks)."""
        return [("out", f"set out: the {self.name} run's output dir on the host (its "
                        f"{self.out_key}; its attempts share it and resume from it)"
                 if self.out_key and not params.out else None)]

    def plan_problems(self, plan, item, params, doc: dict | None) -> list[tuple[tuple, str]]:
        """What ``specdeck validate`` can tell of its config here (another trainer's config
        is its own schema: its trainer checks it; :meth:`preflight` its paths)."""
        return []

    def metrics_spec(self, params) -> MetricsParams | None:
        """``metrics:`` with its TensorBoard dir (unless ``metrics.tensorboard`` names one)
        and its metric names under the plan's own."""
        spec = params.metrics or MetricsParams()
        rec = {"argv": argv_settings(params.command)} if params.command else {}
        tb = spec.tensorboard or self.tensorboard_dir({**rec, "config": self.tensorboard_on},
                                                      params.out, "")
        return dataclasses.replace(spec, tensorboard=tb or None,
                                   names={**self.metric_names, **spec.names})

    tensorboard_on: ClassVar[dict] = {}
    """A config that turns its TensorBoard files on (where it writes them is asked with it)."""

    def tensorboard_dir(self, rec: dict, out: str | None, base: str) -> str | None:
        """Where the run writes TensorBoard event files, when its config turns them on."""
        return None

    def metric_name(self, tag: str) -> str:
        return self.metric_names.get(tag, tag)

    def checkpoint_metric_rows(self, step: int, doc: Any) -> list[tuple[int, str, float]]:
        """:attr:`checkpoint_metrics`' JSON object as metric points at its checkpoint's step."""
        if not isinstance(doc, dict):
            return []
        return [(step, self.metric_name(k), float(v)) for k, v in doc.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)]

    def drafter_config(self, rec: dict, base: str) -> str | None:
        """The checkpoint reader: the drafter config.json strip is given for its checkpoints
        (None: they carry theirs, or are drafter dirs)."""
        return None

    def start_note(self, params, runs, checkpoints, resume=None) -> str | None:
        """What a new attempt does with the earlier ones (None: as its own config says)."""
        return None

    # -- preflight and prepare (on the host) -------------------------------------------
    def preflight_paths(self, rec: dict, base: str) -> list[tuple[str, str, str]]:
        """``(field, what, path)`` for every input its settings name as a path on the host
        (a Hugging Face id such as ``Qwen/Qwen3-8B`` is not a path: left to the trainer)."""
        out = []
        for key, what in self.preflight_keys:
            path = self.setting(rec, key)
            if isinstance(path, str) and path and self.is_path(key, path):
                out.append((key, what, posixpath.join(base, path)))
        return out

    def setting(self, rec: dict, key: str) -> Any:
        """A setting as launched: ``rec``'s ``config`` (its ``argv`` too, where flags win)."""
        return dotted(rec.get("config"), key)

    def is_path(self, key: str, value: str) -> bool:
        return value.startswith(("/", "./", "../", "~"))

    def launch_doc(self, action, ctx) -> dict:
        """``config`` with ``overrides``, as :meth:`upload_doc` makes it for the host."""
        p = action.params
        doc = load_yaml((ctx.plan.dir / p.config).read_text()) or {}
        for k, v in p.overrides.items():
            deep_set(doc, k, v)
        return self.upload_doc(doc, ctx.host, ctx.host.path(p.out))

    async def preflight(self, action, ctx) -> str | None:
        """What its config names that the host lacks (the target, the data, the caches),
        before a GPU is touched; None when all is there or the config says too little."""
        p, host = action.params, ctx.host
        rec = {"config": self.launch_doc(action, ctx)} if p.config else \
            {"argv": argv_settings(p.command)}
        for key, what, path in self.preflight_paths(rec, host.path(".")):
            if await host.stat(host.path(path)) is None:
                return (f"{ctx.item.id}: the {self.name} config's {key} names {what} {path}, "
                        f"which {host.name} does not have: put it there (a relay or extract "
                        "item) or fix the path")
        return None

    async def prepare(self, action, ctx) -> None:
        """Upload its config into the run capsule; record with the run what it is launched
        with and where it writes (``specdeck diff``, the later hooks)."""
        p, host = action.params, ctx.host
        capsule = jobs.capsule_path(host, ctx.run_id)
        if p.config:
            rec = {"config": self.launch_doc(action, ctx), "config_file": p.config}
        else:
            rec = await command_config(host, capsule, p.command)
        rec = {**rec, "trainer": self.name, "python": await host_python(host),
               "out_dir": host.path(p.out),
               "drafter_config": self.drafter_config(rec, host.path(".")),
               "tensorboard": (self.metrics_spec(p) or MetricsParams()).tensorboard}
        if p.config:
            await host.write_file(f"{capsule}/train.yaml",
                                  yaml.safe_dump(rec["config"], sort_keys=False).encode())
        await ctx.skip_earlier_metrics(self.metrics_spec(p))
        ctx.record_config(rec)

    def resolved(self, doc: Any, recorded: dict) -> Any:
        """What is recorded of its resolved config: beside what it was launched with."""
        return {**recorded, "resolved": doc}


TRAINERS: dict[str, Trainer] = {}
"""The trainers by name (``trainer:``), specdeck's first."""


def register(cls: type[Trainer]) -> type[Trainer]:
    """Class decorator: ``cls()`` becomes the trainer ``cls.name`` (its layout registered
    with :mod:`core.ml.formats.layouts` when that module has none of its name)."""
    if cls.layout.name not in layouts.LAYOUTS:
        layouts.register_layout(cls.layout)
    TRAINERS[cls.name] = cls()
    return cls


def names() -> list[str]:
    return list(TRAINERS)


def get(name: str) -> Trainer:
    """The trainer ``name`` (a KeyError naming the known ones and the closest)."""
    try:
        return TRAINERS[name]
    except KeyError:
        raise KeyError(unknown(name)) from None


def unknown(name: Any) -> str | None:
    """Why ``name`` is no trainer (None: it is one)."""
    if name in TRAINERS:
        return None
    return (f"unknown trainer {name!r} (known: {', '.join(TRAINERS)})"
            f"{did_you_mean(str(name), TRAINERS)}")


def dotted(doc: Any, key: str) -> Any:
    """``doc["a"]["b"]`` for ``"a.b"`` (None where a part is missing)."""
    cur = doc
    for part in key.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


CONFIG_FLAGS = ("--config", "--config-file", "--config_file", "--cfg", "-c")


def argv_settings(command: str) -> dict:
    """``--lr 1e-4 --bf16 --data=x`` -> ``{"lr": "1e-4", "bf16": True, "data": "x"}``;
    positional words under ``args``. A command shlex cannot split is kept whole only."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return {}
    out: dict[str, Any] = {}
    args: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and len(w) > 1 and not _is_number(w):
            key, eq, val = w.lstrip("-").partition("=")
            if eq:
                out[key] = val
            elif i + 1 < len(words) and not (words[i + 1].startswith("-")
                                              and not _is_number(words[i + 1])):
                out[key] = words[i + 1]
                i += 1
            else:
                out[key] = True
        else:
            args.append(w)
        i += 1
    if args:
        out["args"] = args
    return out


def _is_number(w: str) -> bool:
    try:
        float(w)
        return True
    except ValueError:
        return False


async def command_config(host, capsule: str, command: str) -> dict:
    """What a ``command:`` trainer was launched with, for ``specdeck diff``: the command,
    its argv as settings, and the config file it names (``--config F`` or a .yaml/.json
    argument), read from the host (relative: to the run capsule, else the workdir)."""
    argv = argv_settings(command)
    rec: dict[str, Any] = {"command": command, "argv": argv}
    named = next((argv[f.lstrip("-")] for f in CONFIG_FLAGS
                  if isinstance(argv.get(f.lstrip("-")), str)), None)
    if named is None:
        named = next((a for a in argv.get("args", []) if a.endswith((".yaml", ".yml", ".json"))),
                     None)
    if named:
        for path in ([named] if named.startswith("/") else
                     [posixpath.join(capsule, named), host.path(named)]):
            raw = await host.read_from(path, 0, 1 << 22)
            if raw:
                try:
                    rec["config"] = load_yaml(raw)  # JSON is YAML too
                except yaml.YAMLError as e:
                    rec["config_error"] = f"{path}: not YAML/JSON: {e}"
                rec["config_file"] = path
                break
    return rec


__all__ = ["Trainer", "TRAINERS", "register", "names", "get", "unknown", "dotted",
           "argv_settings", "command_config", "CONFIG_FLAGS"]
