"""SpecForge 0.2.0 (``trainer: specforge``).

``config`` is a ``specforge train`` YAML, uploaded into the run capsule (``overrides`` merged
in, paths made absolute on the host, ``output_dir`` the item's ``out``) and run as ``python -m
specforge.cli train --config train.yaml``; or your own ``command``. Its checkpoints are
``{output_dir}/{run_id}-step{N}/training_state.pt``, its best pointer ``{run_id}-best``
(``eval/simulated_acc_len``), its TensorBoard files ``{output_dir}/runs``
(``tracking.report_to: tensorboard``). The drafter config strip needs is the config's
``model.draft_model_config`` (the checkpoint carries none). On SIGTERM it unwinds through its
``finally`` blocks and saves: a stop waits 300 s unless ``stop_grace_s`` says otherwise.
"""

from __future__ import annotations

import posixpath
from typing import ClassVar

from core.actions.fit import deep_set
from core.actions.trainers.registry import Trainer, dotted, register
from core.ml.formats import layouts

PATHS = ("model.target_model_path", "model.draft_model_config", "data.train_data_path",
         "data.prompts_path", "data.hidden_states_path", "data.eval_hidden_states_path",
         "data.cache_dir", "output_dir")
"""Paths in a SpecForge config, made absolute on the host before upload."""
TARGET = "model.target_model_path"
"""A path, or a Hugging Face id (left as it is unless it starts like a path)."""


@register
class SpecForge(Trainer):
    name = "specforge"
    layout = layouts.LAYOUTS["specforge"]
    config_what = "specforge YAML"
    out_key = "output_dir"
    metric_names: ClassVar[dict[str, str]] = {
        "train/loss": "loss", "train/acc": "accuracy", "eval/loss": "val_loss",
        "eval/acc": "val_accuracy", "eval/simulated_acc_len": "sim_acc_len", "train/lr": "lr"}
    """Its tracker prefixes ``train/``; ``simulated_acc_len`` stays an accuracy figure
    (``sim_acc_len``), never a tau (for DFlash it is computed from the per-position
    accuracies, not from a decode)."""
    preflight_keys = ((TARGET, "target"), ("model.draft_model_config", "draft model config"),
                      ("data.train_data_path", "training data"), ("data.prompts_path", "prompts"),
                      ("data.hidden_states_path", "hidden-state cache"),
                      ("data.eval_hidden_states_path", "eval hidden-state cache"))
    tensorboard_on: ClassVar[dict] = {"tracking": {"report_to": "tensorboard"}}

    def module_words(self, out, recorded):
        return ["-m", "specforge.cli", "train", "--config", "train.yaml"]  # output_dir: in it

    def upload_doc(self, doc, host, out):
        for key in PATHS:
            val = dotted(doc, key)
            if isinstance(val, str) and val and (key != TARGET or val.startswith((".", "/", "~"))):
                deep_set(doc, key, host.path(val))
        doc["output_dir"] = out
        return doc

    def is_path(self, key, value):
        return key != TARGET or super().is_path(key, value)  # its data paths are paths

    def tensorboard_dir(self, rec, out, base):
        if dotted(rec.get("config"), "tracking.report_to") == "tensorboard" and out:
            return posixpath.join(out, "runs")
        return None

    def drafter_config(self, rec, base):
        path = dotted(rec.get("config"), "model.draft_model_config")
        return posixpath.join(base, path) if isinstance(path, str) and path else None
