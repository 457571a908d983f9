"""FlashAttention-3-style forward for Hopper in Gluon (Triton's explicit-layout dialect): not selected by default.

Triton's automatic passes serialize each block's work on sm_90 (q·kᵀ, softmax, p·v, one after the other, with a
wgmma wait after every product; `results/tune_attention_ws_h200.csv`), which caps the Triton kernel at ~0.83-0.90x
cuDNN. Here the order is written out. Per key block j, with S_j = q·k_jᵀ already in registers:

    issue S_{j+1} = q·k_{j+1}ᵀ            (async wgmma)
    softmax of S_j -> P_j, rescale factor  (overlaps S_{j+1} and P_{j-1}·V_{j-1} on the tensor cores)
    wait for P_{j-1}·V_{j-1}; acc *= alpha
    issue acc += P_j·V_j                   (async wgmma, P from registers)
    wait for S_{j+1}

wgmma groups retire in issue order, so "at most one outstanding" always names the older product. Keys and values
stream through a ring of STAGES shared-memory slots filled by TMA, each slot refilled as soon as the product
reading it has retired. Two warp groups (8 warps) split the 128 query rows. The key blocks that need a mask
(a partial last block, the causal diagonal) take it in the softmax step. Serves a positive scale, head dim 64
or 128, fp16/bf16, TMA-aligned inputs; the launcher checks. Compiled for sm_90a in CI
(tests/kernels/ttir_check.py); numerics and speed only on a GPU.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from fullgraph.kernels._flash_attention_jit import program_tile  # a plain Triton function Gluon can call

# Triton 3.6 names the TMA copies async_copy_global_to_shared / async_copy_shared_to_global, 3.9 only
# async_load / async_store (3.8 has both)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # 3.6: thread_barrier; 3.8 on: barrier


@gluon.jit
def _load_kv(desc, smem, bars, block, pred, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    """Start the TMA load of key/value block `block` into its ring slot when `pred`."""
    slot = block % STAGES
    mbarrier.expect(bars.index(slot), desc.block_type.nbytes, pred=pred)
    _tma_load(desc, [block * BLOCK_N, 0], bars.index(slot), smem.index(slot), pred=pred)


@gluon.jit
def flash_attention_fwd_gluon_kernel(
    Q, K, V, Out,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    n_heads, group, n_q, n_kv, qk_scale,
    CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
):  # fmt: skip
    # Inductor passes Python floats as fp64 (see _flash_attention_jit.py)
    qk_scale = qk_scale.to(gl.float32)
    NUM_WARPS: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = Q.dtype.element_ty
    start_m, b, h, kv_h = program_tile(n_heads, group, CAUSAL, BLOCK_M)

    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    q_desc = tma.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, [n_q, HEAD_DIM], [stride_qn, 1],
                                        [BLOCK_M, HEAD_DIM], q_layout)  # fmt: skip
    k_desc = tma.make_tensor_descriptor(K + b * stride_kb + kv_h * stride_kh, [n_kv, HEAD_DIM], [stride_kn, 1],
                                        [BLOCK_N, HEAD_DIM], kv_layout)  # fmt: skip
    v_desc = tma.make_tensor_descriptor(V + b * stride_vb + kv_h * stride_vh, [n_kv, HEAD_DIM], [stride_vn, 1],
                                        [BLOCK_N, HEAD_DIM], kv_layout)  # fmt: skip
    o_desc = tma.make_tensor_descriptor(Out + b * stride_ob + h * stride_oh, [n_q, HEAD_DIM], [stride_on, 1],
                                        [BLOCK_M, HEAD_DIM], q_layout)  # fmt: skip

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()
    _cta_barrier()  # the barriers are initialized (by one thread) before any warp waits on them

    hi = gl.minimum(start_m + BLOCK_M, n_kv) if CAUSAL else n_kv  # keys past the last query row add nothing
    n_blocks = gl.cdiv(hi, BLOCK_N)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [start_m, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_kv(k_desc, k_smem, k_bars, i, i < n_blocks, STAGES, BLOCK_N)
        _load_kv(v_desc, v_smem, v_bars, i, i < n_blocks, STAGES, BLOCK_N)

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_s)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)

    # the schedule of the module docstring; past the last block the S_{j+1} product reads a stale slot, unused
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    _cta_barrier()  # both warp groups are done reading k_0: its slot may refill
    _load_kv(k_desc, k_smem, k_bars, STAGES, n_blocks > STAGES, STAGES, BLOCK_N)
    acc_tok = warpgroup_mma_init(acc)
    p_op = gl.zeros([BLOCK_M, BLOCK_N], dtype, p_layout)  # P·V reads P from registers: kept alive until it is done
    for j in range(n_blocks):
        nxt = j + 1
        has_next = nxt < n_blocks
        slot_n = nxt % STAGES
        mbarrier.wait(k_bars.index(slot_n), (nxt // STAGES) & 1, pred=has_next)
        s_next_tok = warpgroup_mma(q_smem, k_smem.index(slot_n).permute((1, 0)), s_zero, use_acc=False,
                                   is_async=True)  # fmt: skip

        start_n = j * BLOCK_N
        # keys past the end (the descriptor read zeros), and on the causal diagonal future keys, must be -inf
        # before the max; key 0 is never masked, so every row has a finite max after block 0 (no NaN later)
        if (start_n + BLOCK_N > n_kv) | (CAUSAL & (start_n + BLOCK_N > start_m + 1)):
            keep = (start_n + offs_n < n_kv)[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= start_n + offs_n[None, :])
            s = gl.where(keep, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new

        acc, p_op = warpgroup_mma_wait(1, deps=(acc_tok, p_op))  # this warp group's P_{j-1}·V_{j-1} is done
        _cta_barrier()  # and the other's: v_{j-1}'s slot may refill (one thread issues the copy for the CTA)
        _load_kv(v_desc, v_smem, v_bars, j - 1 + STAGES, (j > 0) & (j - 1 + STAGES < n_blocks), STAGES, BLOCK_N)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        slot = j % STAGES
        mbarrier.wait(v_bars.index(slot), (j // STAGES) & 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc_tok = warpgroup_mma(p_op, v_smem.index(slot), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_next_tok,))  # S_{j+1} is done
        _cta_barrier()  # in both warp groups: k_{j+1}'s slot may refill
        _load_kv(k_desc, k_smem, k_bars, nxt + STAGES, nxt + STAGES < n_blocks, STAGES, BLOCK_N)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    mbarrier.invalidate(q_bar)
    out = acc / gl.convert_layout(l_i, row_o)[:, None]
    q_smem.store(out.to(dtype))  # q is no longer read: its tile holds the output for the TMA store
    fence_async_shared()
    _cta_barrier()  # every warp's rows are in shared memory before one thread starts the copy out
    _tma_store(o_desc, [start_m, 0], q_smem)
    tma.store_wait(0)
