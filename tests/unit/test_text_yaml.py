"""core.text.load_yaml: libyaml's C loader gives what yaml.safe_load gives (values and errors)."""

from __future__ import annotations

import pytest
import yaml

from core.text import load_yaml

CONFIG = """\
target: ../models/target   # a comment
drafter: {block_size: 16, num_layers: 5, target_layer_ids: [1, 16, 31]}
train:
  lr: 6.0e-4
  steps: 1_000
  warmup: .5
  flags: [yes, no, on, off, ~, null]
  when: 2026-12-02
  text: |
    two
    lines
anchors: &a {x: 1}
again: *a
"""


def test_same_values_as_safe_load():
    assert yaml.__with_libyaml__  # the dependency ships the C loader: what is compared is it
    assert load_yaml(CONFIG) == yaml.safe_load(CONFIG)
    assert load_yaml("") is None and load_yaml("[1, 2]") == [1, 2]


@pytest.mark.parametrize("text", ["a: [1, 2", "a: !!python/object:os.system x", "a: b: c"])
def test_refuses_what_safe_load_refuses(text):
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(text)
    with pytest.raises(yaml.YAMLError):
        load_yaml(text)
