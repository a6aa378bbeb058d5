"""eval --speedup says when the host's CPU makes its speed figure no guide (issue 34).

On a CPU without bf16/fp16 matrix instructions a forward of B rows costs about B one-row ones
(bench/eval_speed.py: 13-15x for B = 16 on AVX2), so the speedup measured there is below 1 at
usual tau. The note is decided from what torch reports of the CPU; here the probes are set.
"""

from __future__ import annotations

import json

import pytest
import torch

from core.ml.tasks import eval as eval_mod
from core.ml.formats.runio import run_main
from core.ml.models.target import half_matmul_note

pytestmark = pytest.mark.ml

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _probes(monkeypatch, bf16: bool, amx: bool = False, amx_fp16: bool = False) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: amx_fp16, raising=False)


def test_the_note_names_the_dtype_only_where_the_cpu_lacks_its_instructions(monkeypatch):
    _probes(monkeypatch, bf16=False)
    note = half_matmul_note(CPU, torch.bfloat16)
    assert note is not None and "bfloat16" in note and torch.backends.cpu.get_cpu_capability() in note
    assert "tau is unaffected" in note
    assert "float16 matrix" in half_matmul_note(CPU, torch.float16)
    assert half_matmul_note(CPU, torch.float32) is None  # float32 rows batch well on any CPU
    assert half_matmul_note(CUDA, torch.bfloat16) is None
    _probes(monkeypatch, bf16=True)
    assert half_matmul_note(CPU, torch.bfloat16) is None
    _probes(monkeypatch, bf16=False, amx=True)
    assert half_matmul_note(CPU, torch.bfloat16) is None
    assert half_matmul_note(CPU, torch.float16) is not None  # AMX tiles without AMX-FP16
    _probes(monkeypatch, bf16=False, amx_fp16=True)
    assert half_matmul_note(CPU, torch.float16) is None


def test_a_torch_that_cannot_tell_gives_no_note(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert half_matmul_note(CPU, torch.bfloat16) is None


@pytest.mark.parametrize("native", [False, True])
def test_eval_speedup_carries_the_note_in_bf16(tiny_dirs, tmp_path, capsys, monkeypatch, native):
    _probes(monkeypatch, bf16=native)
    out = tmp_path / "result.json"
    argv = ["--target", str(tiny_dirs["target"]), "--drafter", str(tiny_dirs["drafter"]), "--prompts",
            str(tiny_dirs["prompts"]), "--max-new-tokens", "6", "--ignore-eos", "--limit", "1", "--dtype", "bfloat16",
            "--speedup", "--out", str(out)]
    assert run_main(eval_mod.main, argv) == 0
    res = json.loads(out.read_text())
    assert res["dtype"] == "bfloat16" and res["speedup"]["chain"] > 0
    err = capsys.readouterr().err
    if native:
        assert "note" not in res["speedup"] and "matrix instructions" not in err
    else:
        assert "bfloat16 matrix instructions" in res["speedup"]["note"]
        assert "notice: this CPU" in err
