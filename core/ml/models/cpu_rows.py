"""Half-precision rows on a CPU without half-precision matrix instructions.

On such a CPU (AVX2, or AVX-512 without BF16; no AMX) torch computes a bf16 or fp16 linear of
R rows as about R one-row products: a speculative round's verify of 16 positions costs 13-15
decode steps' worth of matmul, and a prompt's prefill one decode step per token
(``bench/eval_speed.py`` prints the ratio). Float32 GEMM batches rows well on the same CPU.

:func:`half_rows` makes the ``nn.Linear`` layers of the given modules compute a forward of at
least :data:`MIN_ROWS` rows in float32 over tiles of their weight: each tile of output features
is upcast into a float32 buffer small enough to stay in cache and multiplied by all the rows at
once; each output tile is rounded to the input's dtype, as torch's own bf16 kernel rounds its
float32 accumulator. Nothing is kept: the weights stay in their dtype (no second copy), and the
buffers are a tile's.

Fewer rows (a decode step, one token) keep torch's own kernel, and so does a forward that
builds a graph (training). The accumulation order is another kernel's: about 1 output in 5000
differs from torch's by one bf16 ulp (measured on random weights), so a near-tied argmax can go
the other way, as between any two kernels or devices. ``eval --cpu-matmul torch`` keeps torch's
kernels throughout (bit-identical to results made before).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Below this many rows torch's own kernel is as fast (measured: the crossover is 8 rows).
MIN_ROWS = 8
#: Float32 elements of one weight tile, by the rows multiplied: 2 MiB up to :data:`FEW_ROWS`
#: rows (a verify), 4 MiB above (a prefill). Measured (``bench/eval_speed.py``'s shapes and the
#: 27B's, on a Zen 1: 512 KiB L2 a core, 8 MiB L3): against 1 MiB tiles, 2 MiB took 0.82-1.00 of the time
#: at 16 rows and 4 MiB 0.51-0.80 at 64-256 rows (8 MiB no better).
TILE_ELEMENTS = {True: 1 << 19, False: 1 << 20}
FEW_ROWS = 32

_HALF = (torch.bfloat16, torch.float16)


def native_half(dtype: torch.dtype) -> bool | None:
    """Does this CPU have matrix instructions for ``dtype`` (bf16: AVX512-BF16 or AMX tiles;
    fp16: AMX-FP16)? None when this torch cannot tell."""
    probes = (("_is_avx512_bf16_supported", "_is_amx_tile_supported") if dtype == torch.bfloat16
              else ("_is_amx_fp16_supported",))
    try:
        return any(getattr(torch.cpu, name)() for name in probes)
    except (AttributeError, RuntimeError):
        return None


def needed(dtype: torch.dtype, device: torch.device) -> bool:
    """Would :func:`half_rows` change anything for weights of ``dtype`` on ``device``?"""
    return device.type == "cpu" and dtype in _HALF and native_half(dtype) is False


def tiled_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for half-precision CPU tensors, in float32 over weight tiles,
    each output tile rounded to ``x.dtype``."""
    n_out, k = weight.shape
    cols = x.reshape(-1, k).t().float().contiguous()  # [K, R]: tile @ cols runs twice as fast as rows @ tile.T
    out = torch.empty(cols.shape[1], n_out, dtype=x.dtype)
    step = max(16, TILE_ELEMENTS[cols.shape[1] <= FEW_ROWS] // k)
    tile = torch.empty(min(step, n_out), k, dtype=torch.float32)
    acc = torch.empty(min(step, n_out), cols.shape[1], dtype=torch.float32)
    for i in range(0, n_out, step):
        j = min(i + step, n_out)
        w, a = tile[: j - i], acc[: j - i]
        w.copy_(weight[i:j])
        torch.mm(w, cols, out=a)
        if bias is not None:
            a += bias[i:j, None]
        out[:, i:j].copy_(a.t())
    return out.reshape(*x.shape[:-1], n_out)


def _forward(self: nn.Linear, x: Tensor) -> Tensor:
    w = self.weight
    if (x.dtype == w.dtype and x.dim() >= 2 and x.numel() >= MIN_ROWS * x.shape[-1]
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
        return tiled_linear(x, w, self.bias)
    return F.linear(x, w, self.bias)


@contextlib.contextmanager
def half_rows(*modules: nn.Module | None, enabled: bool = True) -> Iterator[int]:
    """Within the block, the ``nn.Linear`` layers of ``modules`` whose weights are bf16/fp16 on a
    CPU that lacks their matrix instructions compute forwards of many rows in float32 tiles.
    Yields how many layers it changed (0: nothing to do, or ``enabled`` False); they are put back
    when the block ends, however it ends."""
    changed: list[nn.Linear] = []
    seen: set[int] = set()
    try:
        for module in modules if enabled else ():
            for mod in module.modules() if module is not None else ():
                if (isinstance(mod, nn.Linear) and id(mod) not in seen and "forward" not in vars(mod)
                        and needed(mod.weight.dtype, mod.weight.device)):
                    seen.add(id(mod))
                    mod.forward = types.MethodType(_forward, mod)
                    changed.append(mod)
        yield len(changed)
    finally:
        for mod in changed:
            del mod.forward
