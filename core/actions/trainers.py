"""What a train item knows of SpecForge's and speculators' runs (``trainer:`` in its params).

specdeck's own trainer (``core.ml.train``) is described in :mod:`core.actions.train`. The two
others are launched through the same launchers and read through their own files:

* **SpecForge** 0.2.0 (``trainer: specforge``): ``config`` is a ``specforge train`` YAML,
  uploaded into the run capsule (``overrides`` merged in, paths made absolute on the host) and
  run as ``python -m specforge.cli train --config train.yaml``; or your own ``command``. Its
  checkpoints are ``{output_dir}/{run_id}-step{N}/training_state.pt``, its best pointer
  ``{run_id}-best`` (``eval/simulated_acc_len``), its TensorBoard files
  ``{output_dir}/runs`` (``tracking.report_to: tensorboard``). The drafter config strip needs
  is the config's ``model.draft_model_config`` (the checkpoint carries none).
* **speculators** 0.9.0 (``trainer: speculators``): ``command`` is its ``speculators train``
  argv (``--config run.yaml`` too). Its checkpoints are ``{save_path}/{epoch}/``, HF drafter
  dirs eval loads as they are, its best pointer ``checkpoint_best``, its per-epoch
  ``val_metrics.json`` (``loss_epoch``...), its TensorBoard files ``{log_dir}/{run_name}``
  (``--logger tensorboard``).

Both save a checkpoint when SIGTERM asks them to stop (SpecForge unwinds through its
``finally`` blocks, speculators' ``graceful_shutdown``): a stop waits :data:`STOP_GRACE_S`
before SIGKILL unless ``stop_grace_s`` says otherwise.
"""

from __future__ import annotations

import posixpath
from typing import Any

STOP_GRACE_S = {"specdeck": None, "specforge": 300.0, "speculators": 300.0}
"""Seconds a stop waits after SIGTERM (None: what the stop asks for): time to save."""

SPECFORGE_PATHS = ("model.target_model_path", "model.draft_model_config",
                   "data.train_data_path", "data.prompts_path", "data.hidden_states_path",
                   "data.eval_hidden_states_path", "data.cache_dir", "output_dir")
"""Paths in a SpecForge config, made absolute on the host before upload."""

SPECFORGE_PREFLIGHT = (("model.target_model_path", "target"),
                       ("model.draft_model_config", "draft model config"),
                       ("data.train_data_path", "training data"),
                       ("data.prompts_path", "prompts"),
                       ("data.hidden_states_path", "hidden-state cache"),
                       ("data.eval_hidden_states_path", "eval hidden-state cache"))
SPECULATORS_PREFLIGHT = (("verifier_name_or_path", "verifier (target)"),
                         ("data_path", "training data"),
                         ("hidden_states_path", "hidden-state cache"))


def dotted(doc: Any, key: str) -> Any:
    """``doc["a"]["b"]`` for ``"a.b"`` (None where a part is missing)."""
    cur = doc
    for part in key.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def find_key(doc: Any, name: str) -> Any:
    """The first value under ``name`` at any depth (speculators' YAML nests its flat flags in
    groups under ``train:``)."""
    if isinstance(doc, dict):
        if name in doc:
            return doc[name]
        for v in doc.values():
            found = find_key(v, name)
            if found is not None:
                return found
    return None


def setting(trainer: str, rec: dict, name: str) -> Any:
    """A speculators setting from its argv (``--save-path``) or its ``--config`` YAML."""
    argv = rec.get("argv") or {}
    for flag in (name.replace("_", "-"), name):
        if isinstance(argv.get(flag), str):
            return argv[flag]
    return find_key(rec.get("config"), name)


def module_words(trainer: str, out: str) -> list[str]:
    """``-m MODULE ...``: how a launcher's python runs the trainer on ``train.yaml`` (its
    output dir set in it, SpecForge's, or by a flag that wins over it, speculators')."""
    if trainer == "specforge":
        return ["-m", "specforge.cli", "train", "--config", "train.yaml"]
    if trainer == "speculators":
        return ["-m", "speculators", "train", "--config", "train.yaml", "--save-path", out]
    raise ValueError(trainer)


def tensorboard_dir(trainer: str, rec: dict, out: str | None, base: str) -> str | None:
    """Where the run writes TensorBoard event files, when its config turns them on."""
    if trainer == "specforge":
        cfg = rec.get("config")
        if dotted(cfg, "tracking.report_to") == "tensorboard" and out:
            return posixpath.join(out, "runs")
    elif trainer == "speculators":
        logger = setting(trainer, rec, "logger") or ""
        if "tensorboard" in str(logger).split(","):
            log_dir = setting(trainer, rec, "log_dir") or "./logs"
            name = setting(trainer, rec, "run_name")
            if name:  # an unnamed run's dir is a generated name: not known before it runs
                return posixpath.normpath(posixpath.join(base, str(log_dir), str(name)))
    return None


def drafter_config(trainer: str, rec: dict, base: str) -> str | None:
    """The drafter config.json strip needs for the run's checkpoints (SpecForge's)."""
    if trainer != "specforge":
        return None
    path = dotted(rec.get("config"), "model.draft_model_config")
    return posixpath.join(base, path) if isinstance(path, str) and path else None


def preflight_paths(trainer: str, rec: dict, base: str) -> list[tuple[str, str, str]]:
    """``(field, what, path)`` for every input the run's config names as a path on its host
    (a Hugging Face id such as ``Qwen/Qwen3-8B`` is not a path: it is left to the trainer)."""
    if trainer == "specforge":
        pairs = [(k, what, dotted(rec.get("config"), k)) for k, what in SPECFORGE_PREFLIGHT]
    elif trainer == "speculators":
        pairs = [(k, what, setting(trainer, rec, k)) for k, what in SPECULATORS_PREFLIGHT]
    else:
        return []
    out = []
    for key, what, path in pairs:
        if isinstance(path, str) and path and (path.startswith(("/", "./", "../", "~"))
                                               or trainer == "specforge" and key != "model.target_model_path"):
            out.append((key, what, posixpath.join(base, path)))
    return out


def metric_name(trainer: str, tag: str) -> str:
    """The curves' name for a trainer's metric: ``loss`` and ``accuracy`` whoever wrote them;
    SpecForge's ``simulated_acc_len`` stays an accuracy figure (``sim_acc_len``), never a
    tau (for DFlash it is computed from the per-position accuracies, not from a decode)."""
    return METRIC_NAMES.get(trainer, {}).get(tag, tag)


METRIC_NAMES = {
    "specforge": {"train/loss": "loss", "train/acc": "accuracy", "eval/loss": "val_loss",
                  "eval/acc": "val_accuracy", "eval/simulated_acc_len": "sim_acc_len",
                  "train/lr": "lr"},
    "speculators": {"train/loss": "loss", "train/full_acc": "accuracy",
                    "loss_epoch": "val_loss", "val/loss_epoch": "val_loss",
                    "full_acc_epoch": "val_accuracy", "val/full_acc_epoch": "val_accuracy",
                    "eal_epoch": "val_eal", "val/eal_epoch": "val_eal", "train/lr": "lr"},
}
"""Their TensorBoard tags and val_metrics.json keys (SpecForge's tracker prefixes ``train/``;
speculators' validation keys end in ``_epoch``) -> the curves' names."""


def val_metrics_rows(step: int, doc: Any) -> list[tuple[int, str, float]]:
    """speculators' ``{epoch}/val_metrics.json`` as metric points at its checkpoint's step
    (the epoch, as its checkpoints and their tau are numbered), names mapped."""
    if not isinstance(doc, dict):
        return []
    return [(step, metric_name("speculators", k), float(v)) for k, v in doc.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)]


__all__ = ["val_metrics_rows", "STOP_GRACE_S", "SPECFORGE_PATHS", "dotted", "find_key", "module_words",
           "tensorboard_dir", "drafter_config", "preflight_paths", "metric_name"]
