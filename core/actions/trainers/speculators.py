"""speculators 0.9.0 (``trainer: speculators``).

``command`` is its ``speculators train`` argv (``--config run.yaml`` too), or ``config`` its
run.yaml, run as ``python -m speculators train --config train.yaml --save-path OUT`` (a flag
wins over its YAML). Its checkpoints are ``{save_path}/{epoch}/``, HF drafter dirs eval loads
as they are, its best pointer ``checkpoint_best``, its per-epoch ``val_metrics.json``
(``loss_epoch``...), its resolved ``run.yaml``, its TensorBoard files ``{log_dir}/{run_name}``
(``--logger tensorboard``). On SIGTERM its ``graceful_shutdown`` saves: a stop waits 300 s
unless ``stop_grace_s`` says otherwise.
"""

from __future__ import annotations

import posixpath
from typing import Any, ClassVar

from core.actions.trainers.registry import Trainer, register
from core.ml.formats import layouts


def find_key(doc: Any, name: str) -> Any:
    """The first value under ``name`` at any depth (its YAML nests its flat flags in groups
    under ``train:``)."""
    if isinstance(doc, dict):
        if name in doc:
            return doc[name]
        for v in doc.values():
            found = find_key(v, name)
            if found is not None:
                return found
    return None


@register
class Speculators(Trainer):
    name = "speculators"
    layout = layouts.LAYOUTS["speculators"]
    config_what = "speculators YAML"
    out_key = "save_path"
    metric_names: ClassVar[dict[str, str]] = {
        "train/loss": "loss", "train/full_acc": "accuracy", "loss_epoch": "val_loss",
        "val/loss_epoch": "val_loss", "full_acc_epoch": "val_accuracy",
        "val/full_acc_epoch": "val_accuracy", "eal_epoch": "val_eal", "val/eal_epoch": "val_eal",
        "train/lr": "lr"}
    """Its validation keys end in ``_epoch``."""
    preflight_keys = (("verifier_name_or_path", "verifier (target)"),
                      ("data_path", "training data"), ("hidden_states_path", "hidden-state cache"))
    resolved_config = "run.yaml"
    checkpoint_metrics = "val_metrics.json"

    def module_words(self, out, recorded):
        return ["-m", "speculators", "train", "--config", "train.yaml", "--save-path", out]

    def setting(self, rec, name):
        """A setting from its argv (``--save-path``) or its ``--config`` YAML."""
        argv = rec.get("argv") or {}
        for flag in (name.replace("_", "-"), name):
            if isinstance(argv.get(flag), str):
                return argv[flag]
        return find_key(rec.get("config"), name)

    def tensorboard_dir(self, rec, out, base):
        logger = self.setting(rec, "logger") or ""
        if "tensorboard" in str(logger).split(","):
            log_dir = self.setting(rec, "log_dir") or "./logs"
            name = self.setting(rec, "run_name")
            if name:  # an unnamed run's dir is a generated name: not known before it runs
                return posixpath.normpath(posixpath.join(base, str(log_dir), str(name)))
        return None
