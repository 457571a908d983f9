"""Roofline arithmetic: bytes or FLOPs over a time, as rates and as a share of a measured ceiling."""

from __future__ import annotations

import torch

from fullgraph.errors import UsageError


def _check_ms(ms: float) -> None:
    if not ms > 0:
        raise UsageError(f"time must be positive, got {ms} ms")


def tbps(nbytes: float, ms: float) -> float:
    """Terabytes (1e12 bytes) per second for `nbytes` moved in `ms` milliseconds."""
    _check_ms(ms)
    return nbytes / (ms * 1e-3) / 1e12


def tflops(flops: float, ms: float) -> float:
    """TFLOP/s (1e12 floating-point operations per second) for `flops` done in `ms` milliseconds."""
    _check_ms(ms)
    return flops / (ms * 1e-3) / 1e12


def pct_of(value: float, ceiling: float) -> float:
    """`value` as a percentage of `ceiling` (both in the same unit)."""
    if not ceiling > 0:
        raise UsageError(f"ceiling must be positive, got {ceiling}")
    return 100.0 * value / ceiling


def tensor_bytes(*tensors: torch.Tensor) -> int:
    """Bytes of the given tensors' elements: what a kernel that reads or writes each once must move."""
    return sum(t.numel() * t.element_size() for t in tensors)


def gemm_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m×k) @ (k×n) product: one multiply and one add per term."""
    return 2 * m * n * k


def attention_flops(batch: int, heads: int, q_len: int, kv_len: int, head_dim: int, causal: bool = False) -> float:
    """FLOPs of attention's two products (QKᵀ and PV); a causal mask halves the useful work."""
    flops = 4.0 * batch * heads * q_len * kv_len * head_dim
    return flops / 2 if causal else flops
