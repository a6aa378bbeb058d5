"""The streaming safetensors writer produces files the safetensors library reads back exactly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from core.ml.formats.safetensors_stream import save_streaming  # noqa: E402


def test_roundtrip_all_dtypes_and_metadata(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "b.f32": torch.randn(3, 5, generator=g), "a.bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "c.i64": torch.arange(4), "d.f16": torch.randn(2, 2, 2, generator=g).half(), "e.bool": torch.tensor([True, False]),
        "f.empty": torch.zeros(0, 3), "g.scalar": torch.tensor(2.5), "h.strided": torch.randn(4, 6, generator=g).t(),
    }
    n = save_streaming(tensors, tmp_path / "x.safetensors", metadata={"format": "pt", "step": 3})
    assert n == (tmp_path / "x.safetensors").stat().st_size
    back = load_file(str(tmp_path / "x.safetensors"))
    assert sorted(back) == sorted(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt", "step": "3"}


def test_cast_on_write_keeps_integer_tensors(tmp_path):
    tensors = {"w": torch.randn(4, 4), "ids": torch.arange(3)}
    save_streaming(tensors, tmp_path / "y.safetensors", dtype=torch.bfloat16)
    back = load_file(str(tmp_path / "y.safetensors"))
    assert back["w"].dtype == torch.bfloat16 and torch.equal(back["w"], tensors["w"].bfloat16())
    assert back["ids"].dtype == torch.int64
