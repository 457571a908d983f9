"""Attention forward with an online softmax (FlashAttention-2 style), never materializing the score matrix.

    out = softmax(q kᵀ · scale [+ causal mask]) v          q: [B, Hq, Nq, D], k, v: [B, Hkv, Nk, D]

Query head h reads key/value head h // (Hq // Hkv) (grouped-query attention; Hkv = 1 is multi-query).
Causal masking keeps key j for query i when j <= i and needs Nq == Nk.

One program owns BLOCK_M query rows of one (batch, head) and walks the keys BLOCK_N at a time, keeping per
row the running max m, the running sum l of exp(s - m) and an fp32 accumulator of p·v; when m grows, l and
the accumulator are rescaled by exp(m_old - m_new). Scores are kept in log2 units (scale · log2 e folded in
once) so each element costs one exp2.

FLOPs: 4·B·Hq·Nq·Nk·D (two matmuls), about half that when causal. Memory traffic: q read and out written once
(2·B·Hq·Nq·D·bytes); k and v read once per query block, 2·B·Hq·Nk·D·bytes·ceil(Nq / BLOCK_M) (query heads
sharing a kv head, and query blocks of one head, mostly hit L2 for it).
"""

from __future__ import annotations

import functools

import torch

from fullgraph import env
from fullgraph.errors import UsageError
from fullgraph.kernels._library import kernel_op, launch, require_triton

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
_MAX_GRID_Y = 65535  # CUDA's limit on the grid's second axis, which carries batch · heads
_LOG2E = 1.44269504


@functools.cache
def _flash_attention_fwd_kernel():
    triton, tl = require_triton()

    @triton.jit
    def kernel(
        Q, K, V, Out,
        stride_qb, stride_qh, stride_qn, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_on, stride_od,
        n_heads, group, n_q, n_kv, qk_scale,
        CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1)
        b = (bh // n_heads).to(tl.int64)
        h = (bh % n_heads).to(tl.int64)
        kv_h = h // group

        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM  # all true unless D was padded up to a power of two (D = 80 -> 128)
        m_ok = offs_m < n_q

        q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        # k is loaded transposed ([D, BLOCK_N]) so q @ kT is a plain dot
        kt_ptrs = K + b * stride_kb + kv_h * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
        v_ptrs = V + b * stride_vb + kv_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # causal: key blocks wholly past this query block's last row contribute nothing, so stop before them
        hi = tl.minimum(start_m + BLOCK_M, n_kv) if CAUSAL else n_kv
        for start_n in range(0, hi, BLOCK_N):
            n_ok = start_n + offs_n < n_kv
            kt = tl.load(kt_ptrs + start_n * stride_kn, mask=d_ok[:, None] & n_ok[None, :], other=0.0)
            s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
            # padded keys (and, on the diagonal, future keys) must be -inf before the max, not after
            keep = n_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= start_n + offs_n[None, :])
            s = tl.where(keep, s, float("-inf"))
            # every row has a finite m after the first key block (key 0 is always kept), so a row whose keys
            # are all masked in a later block gets p = 0 rather than exp2(-inf - -inf) = NaN
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptrs + start_n * stride_vn, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        out = acc / l_i[:, None]
        o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])

    return kernel


def _config(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). Chosen for Hopper from the usual FlashAttention-2 Triton
    settings, not tuned here; under the interpreter, small blocks keep the CPU tests fast."""
    if env.triton_interpret():
        # BLOCK_M = 2 · BLOCK_N as on the GPU, so the causal diagonal spans two key blocks in tests too
        return 32, 16, 4, 1
    if dtype == torch.float32:
        # 4-byte tiles and IEEE (non-tensor-core) dots: smaller tiles to fit shared memory and registers
        return 64, 32, 4, 2
    if head_dim <= 64:
        return 128, 64, 4, 3
    if head_dim <= 128:
        return 128, 64, 8, 3
    return 64, 32, 8, 2


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise UsageError(f"flash_attention: {name} must be [B, H, N, D], got shape {tuple(t.shape)}")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise UsageError(
            f"flash_attention: q, k and v must share one dtype of float16, bfloat16 or float32, "
            f"got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    if k.shape != v.shape:
        raise UsageError(
            f"flash_attention: k and v must have the same shape, got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    (b, hq, nq, d), (bk, hkv, nk, dk) = q.shape, k.shape
    if bk != b or dk != d:
        raise UsageError(
            f"flash_attention: k must match q's batch and head dim, got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if d > MAX_HEAD_DIM:
        raise UsageError(f"flash_attention: q's head dim D={d} exceeds this kernel's limit of {MAX_HEAD_DIM}")
    if hkv == 0 or hq % hkv:
        raise UsageError(f"flash_attention: q's {hq} heads must be a multiple of k's and v's {hkv} heads")
    if causal and nq != nk:
        raise UsageError(f"flash_attention: causal needs as many queries as keys, got q with {nq}, k with {nk}")
    if b * hq > _MAX_GRID_Y:
        raise UsageError(f"flash_attention: q's batch · heads = {b * hq} exceeds the kernel's grid limit {_MAX_GRID_Y}")


def _fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


@kernel_op("flash_attention", fake=_fake)
def flash_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """softmax(q kᵀ · scale) v for q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D]; out is contiguous [B, Hq, Nq, D].

    Any strides are used in place as long as the last dim has unit stride; otherwise that input is copied.
    """
    _check(q, k, v, causal)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    if nk == 0:
        return out.zero_()  # an empty sum of values, as torch's matmul of empty operands gives
    kernel = _flash_attention_fwd_kernel()  # first, so a missing triton raises its clear error
    import triton

    block_m, block_n, num_warps, num_stages = _config(d, q.dtype)
    grid = (triton.cdiv(nq, block_m), b * hq)
    launch(kernel)[grid](
        q, k, v, out,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        hq, hq // hkv, nq, nk, scale * _LOG2E,
        CAUSAL=causal, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
        # fp32 inputs: exact fp32 products rather than TF32's 10-bit mantissa (slower: no tensor cores)
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
