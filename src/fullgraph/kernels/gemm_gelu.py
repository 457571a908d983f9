"""A linear layer with the exact GELU in its epilogue: `y = gelu(x @ weight.T + bias)`, erf form, one GEMM.

cuBLASLt's GELU epilogue (`torch._addmm_activation`, op `linear_gelu`'s kernel form) computes the tanh form only, so
a model with the exact GELU (timm's ViTs, BERT) keeps a separate pass over the MLP's widest activation: compiled,
cuBLAS writes fc1's output, Inductor reads it back for the GELU and writes it again. On the H200 at timm ViT-B/16
batch 256 bf16 that pass is 2.86 ms of a 22.6 ms call, 12 launches at 2.6 TB/s
(`benchmarks/results/vit256_doctor_h200.txt`), against 0.38 ms per fc1 GEMM at cuBLAS's 621 TFLOP/s: a Triton GEMM
that applies the bias and the erf GELU to its tile while it is in registers pays off if it runs fc1 at more than
~62% of cuBLAS's rate (0.38 + 0.24 ms per layer).

The kernel: each program owns a BLOCK_M x BLOCK_N tile of y, walks K in BLOCK_K steps with a float32 accumulator
(`tl.dot`: tensor cores in bf16/fp16; fp32 inputs follow torch's `allow_tf32` for matmuls, off by default, so full
fp32 products unless the user allows TF32), then adds the bias and applies 0.5 z (1 + erf(z / sqrt 2)) in float32
and stores y in x's dtype. Programs are ordered in groups of GROUP_M row tiles (the tiles of a group share weight
columns in L2). Rows and columns past the edges are clamped for loads (`% M`, `% N`, as Triton's matmul tutorial
does) and masked at the store; only a K that is not a multiple of BLOCK_K masks its loads.

Configurations (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) by row count: not yet measured on a GPU;
`benchmarks/tune_gemm_gelu.py` times each candidate against cuBLAS + Inductor's GELU pass over MLP widths and row
counts, prints the table to put here and writes the decision points. Until a measurement says it wins in a graph,
nothing chooses this kernel by itself: the `gelu_epilogue` rewrite takes it under `auto` only where decision data
(op `linear_gelu_erf`, docs/decisions.md) says so, and when forced.
"""

from __future__ import annotations

import functools

import torch

from fullgraph.kernels._library import kernel_op, launch, require_triton

# (most rows, (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)): the first entry whose row bound holds.
# Shared memory per stage: (BLOCK_M + BLOCK_N) x BLOCK_K x 2 bytes (bf16): 48 KiB for 128 x 256 x 64, so 3 stages fit
# the H200's 227 KiB. Not measured yet (module docstring).
CONFIGS = (
    (1024, (64, 128, 64, 8, 4, 4)),
    (8192, (128, 128, 64, 8, 8, 4)),
    (1 << 62, (128, 256, 64, 8, 8, 3)),
)


def config_for(rows: int) -> tuple[int, int, int, int, int, int]:
    """The tile configuration for an input of `rows` rows (CONFIGS)."""
    return next(cfg for most, cfg in CONFIGS if rows <= most)


@functools.cache
def _kernel():
    require_triton()
    from fullgraph.kernels._gemm_gelu_jit import fullgraph_gemm_gelu

    return fullgraph_gemm_gelu


def _fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


def _ieee(dtype: torch.dtype) -> bool:
    """Full fp32 products in `tl.dot`: for fp32 inputs unless torch allows its own matmuls TF32 (half types always
    run tensor cores)."""
    return dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32


@kernel_op("gemm_gelu", fake=_fake)
def gemm_gelu_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`F.gelu(x @ weight.T + bias)` (erf form) for x [M, K], weight [N, K], bias [N], one floating dtype (checked by
    the caller, `fullgraph.rewrite.gelu`). x and weight are read with unit stride along K (copied if not)."""
    x, weight, bias = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, weight, bias))
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m and n:
        triton, _ = require_triton()
        bm, bn, bk, group, warps, stages = config_for(m)
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        launch(_kernel())[grid](
            x, weight, bias, out, m, n, k, x.stride(0), weight.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
            GROUP_M=group, EVEN_K=k % bk == 0, IEEE=_ieee(x.dtype), num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return out
