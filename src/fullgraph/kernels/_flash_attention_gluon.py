"""FlashAttention-3-style forward for Hopper in Gluon (Triton's explicit-layout dialect).

Triton's automatic passes serialize each block's work on sm_90 (q·kᵀ, softmax, p·v, one after the other, with a
wgmma wait after every product; `results/tune_attention_ws_h200.csv`), which caps the Triton kernel at ~0.83-0.90x
cuDNN. Here the order is written out, per warp group of 64 query rows and key block j (FA3's intra-warpgroup
pipelining), with P_{j-1} already in registers:

    issue S_j = q·k_jᵀ                      (async wgmma)
    issue acc += P_{j-1}·V_{j-1}            (async wgmma, P from registers)
    wait for S_j (the older group)          then the softmax of S_j -> P_j runs while P_{j-1}·V_{j-1} does
    wait for P_{j-1}·V_{j-1}; acc *= alpha_j

Nothing is in flight across the loop's back edge: when a product's accumulator crosses it (the order S_{j+1}
before the softmax of S_j), ptxas serializes every wgmma of the kernel (its C7514 note; 435 TFLOP/s against 557
for the Triton kernel at 1x24x4096x128). Keys and values stream through a ring of STAGES shared-memory slots
filled by TMA. The kernel has two forms (`WS`), which share the consumer:

- WS (the default on Hopper for head dim 128): a loader warp fills the ring and two consumer partitions of 4
  warps (64 rows each) release each slot with an mbarrier arrive once their product reading it is done; neither
  waits for the other, so one's softmax overlaps the other's products (625 TFLOP/s at 1x24x4096x128, 0.93x
  cuDNN; `results/tune_attention_gluon_h200.csv`).
- Otherwise the warps of the program consume and refill the ring themselves, after a barrier of the whole
  program per block. Used for head dim 64 with one warp group; with two warp groups the barrier keeps them in
  lockstep (468 TFLOP/s at 128x128 tiles, 8 warps).

The key blocks that need a mask (a partial last block, the causal diagonal) take it in the softmax step. Serves
a positive scale, head dim 64 or 128, fp16/bf16, TMA-aligned inputs; the launcher checks. Compiled for sm_90a in
CI (tests/kernels/ttir_check.py); numerics and speed only on a GPU.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
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
def _softmax_block(s, m_i, l_i, start_n, offs_m, offs_n, n_kv, start_m, qk_scale, CAUSAL: gl.constexpr,
                   BLOCK_N: gl.constexpr):  # fmt: skip
    """One key block's online-softmax step: (P, new running max, new running sum, rescale factor for the output).

    Keys past the end (the descriptor reads zeros), and on the causal diagonal future keys, become -inf before
    the max; key 0 is never masked, so every row has a finite max after block 0 (no NaN later)."""
    if (start_n + BLOCK_N > n_kv) | (CAUSAL & (start_n + BLOCK_N > start_m + 1)):
        keep = (start_n + offs_n < n_kv)[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= start_n + offs_n[None, :])
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def _release(empty, desc, smem, ready, block, n_blocks, WS: gl.constexpr, STAGES: gl.constexpr,
             BLOCK_N: gl.constexpr):  # fmt: skip
    """This consumer is done with key or value block `block`. Warp-specialized: say so on the slot's empty
    barrier (the loader refills it). Otherwise: once every warp of the program is done, refill the slot with
    block + STAGES (one thread issues the copy)."""
    if WS:
        mbarrier.arrive(empty.index(block % STAGES))
    else:
        _cta_barrier()
        _load_kv(desc, smem, ready, block + STAGES, block + STAGES < n_blocks, STAGES, BLOCK_N)


@gluon.jit
def _consume(q_smem, q_bar, ring, o_desc, qk_scale, row0, n_kv, n_blocks, CAUSAL: gl.constexpr,
             HEAD_DIM: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             WS: gl.constexpr):  # fmt: skip
    """ROWS query rows from row0 (64 per warp group of the calling warps) over every key block, in the order of
    the module docstring; then the output through this consumer's q tile and a TMA store. `ring`: the key/value
    ring as `_setup` returns it."""
    k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = ring
    NUM_WARPS: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    offs_m = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    _release(k_empty, k_desc, k_smem, k_ready, 0, n_blocks, WS, STAGES, BLOCK_N)
    p, m_i, l_i, alpha = _softmax_block(s, m_i, l_i, 0, offs_m, offs_n, n_kv, row0, qk_scale, CAUSAL, BLOCK_N)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    for j in range(1, n_blocks):
        slot = j % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        prev = j - 1
        mbarrier.wait(v_ready.index(prev % STAGES), (prev // STAGES) & 1)
        acc_tok = warpgroup_mma(p_op, v_smem.index(prev % STAGES), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))  # S_j is done (groups retire in issue order)
        if WS:  # release k_j now; without a loader, k_j and v_{j-1} are refilled together below (one barrier)
            _release(k_empty, k_desc, k_smem, k_ready, j, n_blocks, WS, STAGES, BLOCK_N)
        p, m_i, l_i, alpha = _softmax_block(s, m_i, l_i, j * BLOCK_N, offs_m, offs_n, n_kv, row0, qk_scale,
                                            CAUSAL, BLOCK_N)  # fmt: skip
        p_next = gl.convert_layout(p.to(dtype), p_layout)
        acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))  # P_{j-1} stays alive until its product is done
        _release(v_empty, v_desc, v_smem, v_ready, prev, n_blocks, WS, STAGES, BLOCK_N)
        if not WS:  # the barrier above covered k_j too
            _load_kv(k_desc, k_smem, k_ready, j + STAGES, j + STAGES < n_blocks, STAGES, BLOCK_N)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p_op = p_next
    last = n_blocks - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    acc_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))

    out = acc / gl.convert_layout(l_i, row_o)[:, None]
    q_smem.store(out.to(dtype))  # this consumer's q tile is no longer read: it holds the output for the TMA store
    fence_async_shared()
    _cta_barrier()  # every warp's rows are in shared memory before one thread starts the copy out
    _tma_store(o_desc, [row0, 0], q_smem)
    tma.store_wait(0)


@gluon.jit
def _ws_loader(q_desc, q_smem, q_bars, ring, start_m, n_blocks, STAGES: gl.constexpr, BLOCK_N: gl.constexpr,
               ROWS: gl.constexpr):  # fmt: skip
    """One warp: both consumers' q tiles, then every key/value block into its ring slot once both consumers
    have released the slot's previous block (k and v apart, so q·kᵀ can start before v lands)."""
    k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = ring
    for c in gl.static_range(2):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        _tma_load(q_desc, [start_m + c * ROWS, 0], q_bars.index(c), q_smem.index(c))
    for i in range(n_blocks):
        released = ((i // STAGES) & 1) ^ 1  # the parity of the release of block i - STAGES
        mbarrier.wait(k_empty.index(i % STAGES), released, pred=i >= STAGES)
        _load_kv(k_desc, k_smem, k_ready, i, True, STAGES, BLOCK_N)
        mbarrier.wait(v_empty.index(i % STAGES), released, pred=i >= STAGES)
        _load_kv(v_desc, v_smem, v_ready, i, True, STAGES, BLOCK_N)


@gluon.jit
def _setup(Q, K, V, Out, stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
           stride_vn, stride_ob, stride_oh, stride_on, n_heads, group, n_q, n_kv, CAUSAL: gl.constexpr,
           HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
           CONSUMERS: gl.constexpr):  # fmt: skip
    """This program's tile, tensor descriptors (q and out in tiles of BLOCK_M // CONSUMERS rows), shared memory
    (a q tile per consumer, the key and value rings) and initialized barriers (empty ones count one arrive per
    consumer), and its number of key blocks. The key/value side comes as one tuple, `ring`: (k and v
    descriptors, k and v slots, their ready barriers, their empty barriers)."""
    ROWS: gl.constexpr = BLOCK_M // CONSUMERS
    dtype: gl.constexpr = Q.dtype.element_ty
    start_m, b, h, kv_h = program_tile(n_heads, group, CAUSAL, BLOCK_M)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    q_desc = tma.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, [n_q, HEAD_DIM], [stride_qn, 1],
                                        [ROWS, HEAD_DIM], q_layout)  # fmt: skip
    k_desc = tma.make_tensor_descriptor(K + b * stride_kb + kv_h * stride_kh, [n_kv, HEAD_DIM], [stride_kn, 1],
                                        [BLOCK_N, HEAD_DIM], kv_layout)  # fmt: skip
    v_desc = tma.make_tensor_descriptor(V + b * stride_vb + kv_h * stride_vh, [n_kv, HEAD_DIM], [stride_vn, 1],
                                        [BLOCK_N, HEAD_DIM], kv_layout)  # fmt: skip
    o_desc = tma.make_tensor_descriptor(Out + b * stride_ob + h * stride_oh, [n_q, HEAD_DIM], [stride_on, 1],
                                        [ROWS, HEAD_DIM], q_layout)  # fmt: skip
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, ROWS, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_bars.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    fence_async_shared()
    hi = gl.minimum(start_m + BLOCK_M, n_kv) if CAUSAL else n_kv  # keys past the last query row add nothing
    n_blocks = gl.cdiv(hi, BLOCK_N)
    ring = (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty)
    return start_m, q_desc, o_desc, q_smem, q_bars, ring, n_blocks


@gluon.jit
def flash_attention_fwd_gluon_kernel(
    Q, K, V, Out,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    n_heads, group, n_q, n_kv, qk_scale,
    CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, WS: gl.constexpr,
):  # fmt: skip
    """BLOCK_M query rows per program. WS: two consumer partitions of num_warps (16 rows per warp) and a loader
    warp; otherwise BLOCK_M = 16 · num_warps and the program's warps load and consume the ring themselves."""
    qk_scale = qk_scale.to(gl.float32)  # Inductor passes Python floats as fp64 (see _flash_attention_jit.py)
    CONSUMERS: gl.constexpr = 2 if WS else 1
    ROWS: gl.constexpr = BLOCK_M // CONSUMERS
    start_m, q_desc, o_desc, q_smem, q_bars, ring, n_blocks = _setup(
        Q, K, V, Out, stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
        stride_vn, stride_ob, stride_oh, stride_on, n_heads, group, n_q, n_kv, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N,
        STAGES, CONSUMERS,
    )  # fmt: skip
    if WS:
        gl.warp_specialize(
            [
                (_consume, (q_smem.index(0), q_bars.index(0), ring, o_desc, qk_scale, start_m, n_kv, n_blocks, CAUSAL,
                            HEAD_DIM, ROWS, BLOCK_N, STAGES, True)),
                (_consume, (q_smem.index(1), q_bars.index(1), ring, o_desc, qk_scale, start_m + ROWS, n_kv, n_blocks,
                            CAUSAL, HEAD_DIM, ROWS, BLOCK_N, STAGES, True)),
                (_ws_loader, (q_desc, q_smem, q_bars, ring, start_m, n_blocks, STAGES, BLOCK_N, ROWS)),
            ],
            [gl.num_warps(), 1],  # the consumer partition beside the default one, the loader
            [232, 40],  # registers per thread (setmaxnreg): consumers hold S, P and the accumulator; the loader little
        )  # fmt: skip
    else:
        k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, _, _ = ring  # the empty barriers: WS only
        _cta_barrier()  # the barriers are initialized (by one thread) before any warp waits on them
        mbarrier.expect(q_bars.index(0), q_desc.block_type.nbytes)
        _tma_load(q_desc, [start_m, 0], q_bars.index(0), q_smem.index(0))
        for i in gl.static_range(STAGES):
            _load_kv(k_desc, k_smem, k_ready, i, i < n_blocks, STAGES, BLOCK_N)
            _load_kv(v_desc, v_smem, v_ready, i, i < n_blocks, STAGES, BLOCK_N)
        _consume(q_smem.index(0), q_bars.index(0), ring, o_desc, qk_scale, start_m, n_kv, n_blocks, CAUSAL, HEAD_DIM,
                 ROWS, BLOCK_N, STAGES, False)  # fmt: skip
