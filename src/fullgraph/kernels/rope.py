"""Rotary position embedding (RoPE) on the first rotary_dim channels of each head; the rest pass through.

For position n and pair index i < h = rotary_dim / 2, with (a, b) the pair's two channels:

    out_a = x_a · cos[n, i] − x_b · sin[n, i]
    out_b = x_b · cos[n, i] + x_a · sin[n, i]

    rotate-half (GPT-NeoX, interleaved=False):  (a, b) = (i, i + h)
    interleaved (GPT-J,    interleaved=True):   (a, b) = (2i, 2i + 1)

x is [B, H, N, D] (seq_dim 2) or [B, N, H, D] (seq_dim 1) with any strides (only a channel stride other than 1
costs a copy first); a row is one head vector of D channels. Memory traffic per row: read x, write out, so
2·D·bytes; the cos/sin rows (rotary_dim·4 bytes for float32 tables) are shared by every (batch, head) at a
position and come from L2. Math is in float32 whatever the dtypes; out has x's dtype and is contiguous.

`qk_norm_rope_fwd` is the same kernel with NORM: between a QKV projection and attention, each head vector of q and
of k is RMSNorm-ed over all D channels (its own weight for q and for k) and then rotated, in one pass: read, mean
square in float32, scale by rstd and the weight, rotate, write once. Unfused that is four passes over q and k (each
norm and each rotation reads and writes); Inductor fuses the native forms into one reduction kernel of its own. One
launch serves both tensors (program axis 1: 0 = q, 1 = k); v is not touched (attention reads it as a view).

The rotary pairs are held as up to three power-of-two pieces of pair indices (`_rope_jit.py`: 36 = 32 + 4 at head dim
72), each piece's a and b channels together, where one block of next_power_of_2(rotary_dim / 2) pairs was; HEAD_DIM
and rotary_dim / 2 are constexprs and a power of two dividing x's strides is stated, so a head dim of 72 loads in
16- and 8-byte vectors. Lanes holding a channel (full rotary, rotate-half, 32 rows x 8 warps; a piece smaller than
the program's threads leaves some idle), before and now; bytes moved are the same (2·D·bytes a row):

    D         64    72    80    88    96   112   128
    before  100%   56%   62%   69%   75%   88%  100%
    after   100%   90%  100%   92%  100%  100%  100%

The Hopper build of qk_norm_rope (sm_90 PTX, bf16, q/k views of a [B, N, 3, 16, D] projection): instructions
before -> now at D = 64: 319 -> 310, 72: 763 -> 411, 80: 496 -> 291, 88: 763 -> 373, 96: 323 -> 325, 112: 496 ->
385, 128: 323 -> 312; at 72, 80, 88 and 112 every load and store was one element wide before (a runtime head dim
or half that is not a multiple of 16 hid the rows' alignment), now the large pieces are 8- and 16-byte vectors.
"""

from __future__ import annotations

import functools

import torch

from fullgraph.kernels._library import alignment, kernel_op, launch, require_triton, row_launch_config, row_pieces


@functools.cache
def _rope_fwd_kernel():
    require_triton()
    from fullgraph.kernels._rope_jit import fullgraph_rope

    return fullgraph_rope


def _launch(q, k, q_weight, k_weight, cos, sin, q_eps, k_eps, interleaved, seq_dim, norm: bool):
    """The kernel over q (and k, where given: k None launches one tensor); returns the outputs, contiguous."""
    triton, _ = require_triton()
    tensors = (q,) if k is None else (q, k)
    tensors = tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    outs = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors)
    head_dim, half = q.shape[-1], cos.shape[-1]
    n_rows = [t.shape[0] * t.shape[1] * t.shape[2] for t in tensors]
    if max(n_rows):
        _, rows, num_warps = row_launch_config(head_dim, max(n_rows))
        p_a, p_b, p_c = row_pieces(max(half, 1))
        block_p = triton.next_power_of_2(head_dim - 2 * half) if head_dim > 2 * half else 0
        has_weight = q_weight is not None
        two = len(tensors) == 2
        qt, kt = tensors[0], tensors[-1]  # one tensor: it stands in for k too, and axis 1 never reaches k
        # k's output: with one tensor, x (never written: TWO is false), so no two outputs a kernel may write alias
        ky = outs[1] if two else qt
        per_tensor = []
        for t, n in ((qt, n_rows[0]), (kt, n_rows[-1])):
            per_tensor += [n, t.shape[1], t.shape[2], *t.stride()[:3]]
        launch(_rope_fwd_kernel())[((max(n_rows) + rows - 1) // rows, len(tensors))](
            qt, kt, q_weight if has_weight else qt, k_weight if has_weight else kt, outs[0], ky, cos, sin,
            *per_tensor, cos.stride(0), sin.stride(0), q_eps, k_eps,
            SEQ_DIM=seq_dim, INTERLEAVED=interleaved, NORM=norm, HAS_WEIGHT=has_weight, ROWS=rows,
            HEAD_DIM=head_dim, HALF=half, ALIGN=alignment(*qt.stride()[:3], *kt.stride()[:3]),
            CS_ALIGN=alignment(cos.stride(0), sin.stride(0)), P_A=p_a, P_B=p_b, P_C=p_c, BLOCK_P=block_p,
            TWO=two,
            num_warps=num_warps,
        )  # fmt: skip
    return outs


def _fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, seq_dim: int) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@kernel_op("rope", fake=_fake)
def rope_fwd(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, seq_dim: int) -> torch.Tensor:
    """RoPE on x [B, H, N, D] (seq_dim 2) or [B, N, H, D] (seq_dim 1) with cos/sin [N, rotary_dim / 2].

    Inputs are checked by `fullgraph.ops.rope.apply_rope`.
    """
    return _launch(x, None, None, None, cos, sin, 0.0, 0.0, interleaved, seq_dim, norm=False)[0]


def _qk_fake(q, k, q_weight, k_weight, cos, sin, q_eps, k_eps, interleaved, seq_dim):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device)


@kernel_op("qk_norm_rope", fake=_qk_fake)
def qk_norm_rope_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_eps: float,
    k_eps: float,
    interleaved: bool,
    seq_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RoPE(RMSNorm(q) * q_weight), RoPE(RMSNorm(k) * k_weight)) over the head dim, in one launch.

    q [B, Hq, N, D] and k [B, Hk, N, D] (seq_dim 2), or [B, N, Hq, D] and [B, N, Hk, D] (seq_dim 1), any strides
    with a unit channel stride (else copied first); the weights [D] (both given or neither); cos/sin [N, rotary_dim
    / 2]. Outputs are contiguous in the inputs' dtypes. Inputs are checked by `fullgraph.ops.rope.qk_norm_rope`.
    """
    return _launch(q, k, q_weight, k_weight, cos, sin, q_eps, k_eps, interleaved, seq_dim, norm=True)
