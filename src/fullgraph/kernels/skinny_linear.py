"""A linear layer for an input of a few rows: `y = x @ weight.T + bias` with x [M, K], M <= MAX_ROWS.

With so few rows the layer reads its weight once and does little else: its time is the weight's bytes over HBM
bandwidth (a DiT's adaLN projection at batch 1, [1, 3072] x [3072, 18432] bf16, reads 113 MB). Each program owns
BLOCK_N output columns (weight rows) for every row of x, walks K in BLOCK_K chunks with float32 partial sums, and
reduces them once at the end; the weight tile is loaded once per chunk and used for all M rows of x.
No width is padded to a power of two: K is walked in BLOCK_K chunks (only the last chunk of a K that is not a multiple
of BLOCK_K masks lanes: none at 1152, 1280, 1408 or 3072) and N in BLOCK_N columns; only M pads, to 1, 2, 4 or 8 rows.
"""

from __future__ import annotations

import functools

import torch

from fullgraph.kernels._library import kernel_op, launch, require_triton

MAX_ROWS = 8  # rows of x the kernel takes; more rows make a GEMM, cuBLAS's job

# (BLOCK_N, BLOCK_K, num_warps, num_stages) per padded row count; the partial sums hold M_BLOCK x BLOCK_N x BLOCK_K
# floats. One row: the fastest of a sweep on the H200 at [1, 3072] x [3072, 18432] bf16
# (benchmarks/probes/gemv_probe.py, benchmarks/results/gemv_probe_h200.txt: 36.3 us, 3.12 TB/s, against 16 x 512's
# slower entry); more rows keep the same tile (2) or narrow it (4, 8), not measured.
CONFIGS = {1: (8, 128, 8, 3), 2: (8, 128, 8, 3), 4: (4, 128, 8, 3), 8: (4, 128, 8, 3)}


@functools.cache
def _kernel():
    require_triton()
    from fullgraph.kernels._skinny_linear_jit import fullgraph_skinny_gemv

    return fullgraph_skinny_gemv


def _fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@kernel_op("skinny_linear", fake=_fake)
def skinny_linear_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x of at most MAX_ROWS rows (checked by `fullgraph.ops.linear.skinny_linear`)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    m, n = x2.shape[0], w.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m and n:
        m_block = 1 << max(0, (m - 1).bit_length())
        block_n, block_k, warps, stages = CONFIGS[m_block]
        launch(_kernel())[((n + block_n - 1) // block_n,)](
            x2, w, w if bias is None else bias, out, m, n, k, x2.stride(0), w.stride(0),
            HAS_BIAS=bias is not None, M_BLOCK=m_block, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
            num_stages=stages,
        )  # fmt: skip
    return out.view(*x.shape[:-1], n)
