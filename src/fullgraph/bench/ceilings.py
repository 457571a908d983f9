"""The two ceilings every speed figure is compared with: memory bandwidth and matrix-multiply rate.

Measured, not taken from a datasheet: a large device-to-device copy (bytes read plus bytes written) and a
large bf16 GEMM on random data (zeros run faster than real data on some GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fullgraph.bench.roofline import gemm_flops, tbps, tflops
from fullgraph.timing import Timing, measure, resolve_device


@dataclass(frozen=True)
class Ceilings:
    device: str
    copy_bytes: int  # size of the copied buffer; bytes moved per copy is twice this
    copy_timing: Timing
    copy_tbps: float
    gemm_n: int
    gemm_dtype: str
    gemm_timing: Timing
    gemm_tflops: float


def measure_ceilings(
    device: str | torch.device | None = None,
    copy_bytes: int | None = None,
    gemm_n: int | None = None,
    gemm_dtype: torch.dtype | None = None,
    reps: int = 30,
) -> Ceilings:
    """Measure copy bandwidth and GEMM rate on `device` (defaults sized for an H200-class GPU, or a CPU)."""
    device = resolve_device(device)
    gpu = device.type == "cuda"
    copy_bytes = copy_bytes or (2 << 30 if gpu else 64 << 20)
    gemm_n = gemm_n or (8192 if gpu else 1024)
    gemm_dtype = gemm_dtype or (torch.bfloat16 if gpu else torch.float32)

    words = copy_bytes // 4
    copy_t = time_copy(words, device, reps)
    moved = 2 * words * 4
    gemm_t = _time_gemm(gemm_n, gemm_dtype, device, reps)
    return Ceilings(
        device=device.type,
        copy_bytes=moved // 2,
        copy_timing=copy_t,
        copy_tbps=tbps(moved, copy_t.median_ms),
        gemm_n=gemm_n,
        gemm_dtype=str(gemm_dtype).removeprefix("torch."),
        gemm_timing=gemm_t,
        gemm_tflops=tflops(gemm_flops(gemm_n, gemm_n, gemm_n), gemm_t.median_ms),
    )


def time_copy(words: int, device: torch.device, reps: int) -> Timing:
    src = torch.randn(words, device=device)  # float32, random so nothing is special-cased
    dst = torch.empty_like(src)
    return measure(lambda: dst.copy_(src), device=device, warmup=5, reps=reps)


def _time_gemm(n: int, dtype: torch.dtype, device: torch.device, reps: int) -> Timing:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return measure(lambda: torch.mm(a, b), device=device, warmup=5, reps=reps)
