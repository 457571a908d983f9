"""The Triton code of `flash_attention` (imported only when a kernel is built, so fullgraph imports without triton).

Helpers live at module level because Triton resolves a jitted function's callees through its globals.
"""

import triton
import triton.language as tl


@triton.jit
def _scores(
    q,
    K,
    start_n,
    n_kv,
    stride_kn,
    stride_kd,
    MASK_KEYS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Raw scores q·kᵀ [BLOCK_M, BLOCK_N] for keys start_n ..; missing keys and padded channels load as 0."""
    if USE_TMA:
        kt = tl.trans(K.load([start_n, 0]))  # K is a descriptor; the TMA unit zero-fills rows past the end
    else:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        ptrs = K + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
        if MASK_KEYS:
            kt = tl.load(ptrs, mask=(offs_n < n_kv)[None, :] & (offs_d < HEAD_DIM)[:, None], other=0.0)
        elif HEAD_DIM == BLOCK_D:
            kt = tl.load(ptrs)
        else:
            kt = tl.load(ptrs, mask=(offs_d < HEAD_DIM)[:, None], other=0.0)
    return tl.dot(q, kt, input_precision=DOT_PRECISION)


@triton.jit
def _fold(
    acc,
    l_i,
    m_i,
    s,
    V,
    start_n,
    offs_m,
    n_kv,
    stride_vn,
    stride_vd,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    NEG_SCALE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Fold one key block (its raw scores s and its values) into the running accumulator, sum and max."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if MASKED:
        # keys past the end (and, on the diagonal, future keys) must be -inf before the max, not after
        keep = (offs_n < n_kv)[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(keep, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
    else:
        # the scale is applied after the row max and fused into the exponent's argument: one FMA an element
        row = tl.min(s, 1) if NEG_SCALE else tl.max(s, 1)
        m_new = tl.maximum(m_i, row * qk_scale)
    # every row has a finite m after its first key block (key 0 is never masked), so a row whose keys are all
    # masked in a later block gets p = 0 rather than exp2(-inf - -inf) = NaN
    alpha = tl.exp2(m_i - m_new)
    acc = acc * alpha[:, None]
    l_i = l_i * alpha
    p = tl.exp2(s - m_new[:, None]) if MASKED else tl.exp2(s * qk_scale - m_new[:, None])  # s is scaled if MASKED
    l_i = l_i + tl.sum(p, 1)
    if USE_TMA:
        v = V.load([start_n, 0])
    else:
        offs_d = tl.arange(0, BLOCK_D)
        ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        if MASKED:
            v = tl.load(ptrs, mask=(offs_n < n_kv)[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
        elif HEAD_DIM == BLOCK_D:
            v = tl.load(ptrs)
        else:
            v = tl.load(ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


# fmt: off
@triton.jit
def _attend(acc, l_i, m_i, q, K, V, lo, hi, offs_m, n_kv, stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
            MASKED: tl.constexpr, CAUSAL: tl.constexpr, NEG_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
            WARP_SPECIALIZE: tl.constexpr):
    """Fold the key blocks starting at lo, lo + BLOCK_N, .. below hi into (acc, l, m).

    WARP_SPECIALIZE asks Triton to split the loop between producer warps (the loads) and consumer warps (the
    products and the softmax), so the loads of the next blocks run beside this block's math."""
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        s = _scores(q, K, start_n, n_kv, stride_kn, stride_kd, MASKED, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA,
                    DOT_PRECISION)
        acc, l_i, m_i = _fold(acc, l_i, m_i, s, V, start_n, offs_m, n_kv, stride_vn, stride_vd, qk_scale, MASKED,
                              CAUSAL, NEG_SCALE, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA, DOT_PRECISION)
    return acc, l_i, m_i
# fmt: on


@triton.jit
def program_tile(n_heads, group, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """(first query row, batch, head, kv head) of this program, on grid (query blocks, batch · heads); causal
    query blocks run longest first. The Gluon kernel calls it too."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m  # the query blocks with the most keys start first
    bh = tl.program_id(1)
    h = (bh % n_heads).to(tl.int64)
    return pid_m * BLOCK_M, (bh // n_heads).to(tl.int64), h, h // group


@triton.jit
def flash_attention_fwd_kernel(
    Q,
    K,
    V,
    Out,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_on,
    stride_od,
    n_heads,
    group,
    n_q,
    n_kv,
    qk_scale,
    CAUSAL: tl.constexpr,
    NEG_SCALE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    MASKED_TAIL: tl.constexpr,
):
    # Inductor's wrapper passes Python floats as fp64 (a direct launch as fp32): fp64 here would turn the
    # running max and sum into fp64 and break the loop's types
    qk_scale = tl.cast(qk_scale, tl.float32)
    start_m, b, h, kv_h = program_tile(n_heads, group, CAUSAL, BLOCK_M)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = Q + b * stride_qb + h * stride_qh
    o_base = Out + b * stride_ob + h * stride_oh
    if USE_TMA:
        # one descriptor per [N, D] matrix of a (batch, head); the launcher checked the 16-byte alignments
        q_desc = tl.make_tensor_descriptor(q_base, [n_q, HEAD_DIM], [stride_qn, 1], [BLOCK_M, BLOCK_D])
        k_src = tl.make_tensor_descriptor(
            K + b * stride_kb + kv_h * stride_kh, [n_kv, HEAD_DIM], [stride_kn, 1], [BLOCK_N, BLOCK_D]
        )
        v_src = tl.make_tensor_descriptor(
            V + b * stride_vb + kv_h * stride_vh, [n_kv, HEAD_DIM], [stride_vn, 1], [BLOCK_N, BLOCK_D]
        )
        q = q_desc.load([start_m, 0])
    else:
        k_src = K + b * stride_kb + kv_h * stride_kh
        v_src = V + b * stride_vb + kv_h * stride_vh
        q_mask = (offs_m < n_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
        q = tl.load(q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # keys [0, n_full) need no mask: all exist and, when causal, all precede this block's first query (BLOCK_M
    # is a multiple of BLOCK_N); keys [n_full, hi) are masked
    if CAUSAL:
        n_full = start_m
        hi = tl.minimum(start_m + BLOCK_M, n_kv)  # key blocks past the last query row contribute nothing
    else:
        n_full = n_kv - n_kv % BLOCK_N
        hi = n_kv
    # fmt: off
    if WARP_SPECIALIZE:
        # one loop, as Triton's Hopper warp specialization needs (it fails to compile two): every key block takes
        # the mask when any needs one. Never causal: Triton 3.6 splits the query rows between consumer warp
        # groups and got the causal mask wrong there
        tl.static_assert(not CAUSAL, "the warp-specialized loop is for non-causal attention only")
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_src, v_src, 0, hi, offs_m, n_kv, stride_kn, stride_kd, stride_vn,
                                stride_vd, qk_scale, MASKED_TAIL, CAUSAL, NEG_SCALE, HEAD_DIM, BLOCK_N, BLOCK_D,
                                USE_TMA, DOT_PRECISION, True)
    else:
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_src, v_src, 0, n_full, offs_m, n_kv, stride_kn, stride_kd,
                                stride_vn, stride_vd, qk_scale, False, CAUSAL, NEG_SCALE, HEAD_DIM, BLOCK_N, BLOCK_D,
                                USE_TMA, DOT_PRECISION, False)
        if MASKED_TAIL:  # compiled out when every key block is whole and none crosses the causal diagonal
            acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_src, v_src, n_full, hi, offs_m, n_kv, stride_kn, stride_kd,
                                    stride_vn, stride_vd, qk_scale, True, CAUSAL, NEG_SCALE, HEAD_DIM, BLOCK_N,
                                    BLOCK_D, USE_TMA, DOT_PRECISION, False)
    # fmt: on

    out = (acc / l_i[:, None]).to(Out.dtype.element_ty)
    if USE_TMA:
        o_desc = tl.make_tensor_descriptor(o_base, [n_q, HEAD_DIM], [stride_on, 1], [BLOCK_M, BLOCK_D])
        o_desc.store([start_m, 0], out)  # rows past n_q and channels past D are clipped
    else:
        o_mask = (offs_m < n_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
        tl.store(o_base + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od, out, mask=o_mask)
