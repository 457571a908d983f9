"""Rotary position embedding: `RotaryEmbedding` for a model, `apply_rope` as a function, `rope_tables`; and
`qk_norm_rope`, the q/k RMSNorm of attention with q/k norm followed by RoPE, as one op.

x is [B, H, N, D] (layout "bnsd") or [B, N, H, D] (layout "bsnd"); cos and sin are [N, rotary_dim / 2].
The first rotary_dim channels of each head are rotated in pairs, rotate-half (GPT-NeoX, pairs (i, i + h)) or
interleaved (GPT-J, pairs (2i, 2i + 1)); the rest pass through. Math is in float32; the result has x's dtype.
"""

from __future__ import annotations

import torch

from fullgraph.errors import UsageError
from fullgraph.kernels._library import call_kernel
from fullgraph.kernels.rope import qk_norm_rope_fwd, rope_fwd
from fullgraph.ops._autograd import backward_from_native
from fullgraph.ops._checks import check_float, check_last_dim, check_same_device
from fullgraph.ops.custom_op import CustomOp, eager_inference, run
from fullgraph.ops.norms import rms_norm_native
from fullgraph.ops.policies import KNOWN_OPS

# layout -> the dim of x that indexes positions
SEQ_DIM = {"bnsd": 2, "bsnd": 1}
_SHAPES = {"bnsd": "[B, H, N, D]", "bsnd": "[B, N, H, D]"}


def check_layout(layout: str) -> int:
    """The sequence dim of `layout`, or an error listing the layouts."""
    if layout not in SEQ_DIM:
        raise UsageError(f"layout must be 'bnsd' ([B, H, N, D]) or 'bsnd' ([B, N, H, D]), got {layout!r}")
    return SEQ_DIM[layout]


def check_rotary_dim(rotary_dim: int) -> None:
    if rotary_dim <= 0 or rotary_dim % 2:
        raise UsageError(f"rotary_dim must be a positive even number (channels rotate in pairs), got {rotary_dim}")


def check_x(x: torch.Tensor, layout: str) -> int:
    """x must be a 4-D float tensor in `layout`; returns its sequence dim."""
    seq_dim = check_layout(layout)
    if x.dim() != 4:
        raise UsageError(f"x must be 4-D {_SHAPES[layout]} for layout {layout!r}, got shape {tuple(x.shape)}")
    check_float("x", x)
    return seq_dim


def check_rope_inputs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> int:
    """Every argument of `apply_rope`; returns x's sequence dim."""
    seq_dim = check_x(x, layout)
    for name, t in (("cos", cos), ("sin", sin)):
        if not t.is_floating_point():
            raise UsageError(f"{name} must be a floating-point tensor, got {t.dtype}")
    check_same_device(x, cos=cos, sin=sin)
    n, head_dim = x.shape[seq_dim], x.shape[-1]
    expected = f"[N, rotary_dim / 2] with N = {n} (x's dim {seq_dim}) and 2 <= rotary_dim <= D = {head_dim}"
    if cos.dim() != 2 or cos.shape[0] != n or cos.shape[1] == 0:
        raise UsageError(f"cos must have shape {expected}, got {tuple(cos.shape)}")
    if 2 * cos.shape[1] > head_dim:
        raise UsageError(
            f"cos has shape {tuple(cos.shape)}, so rotary_dim = {2 * cos.shape[1]} exceeds x's head dim D = "
            f"{head_dim}; cos must have shape {expected}"
        )
    if sin.shape != cos.shape:
        raise UsageError(f"sin must have cos's shape {tuple(cos.shape)}, got {tuple(sin.shape)}")
    return seq_dim


def rope_native(x, cos, sin, interleaved: bool = False, seq_dim: int = 2):
    rotary_dim = 2 * cos.shape[-1]
    x32 = x[..., :rotary_dim]  # its own dtype: the float32 tables promote every product to float32
    c, s = cos.float(), sin.float()  # [N, h]
    if seq_dim == 1:
        c, s = c[:, None], s[:, None]  # [N, 1, h]: broadcast over the heads that follow N
    if eager_inference(x, cos, sin):
        return _rope_into(x, x32, c, s, interleaved)
    if interleaved:
        xa, xb = x32[..., 0::2], x32[..., 1::2]
        rotated = torch.stack((xa * c - xb * s, xb * c + xa * s), dim=-1).flatten(-2)
    else:
        # rotate-half as plain code writes it: x·cos + (−xb, xa)·sin with the tables doubled along D (a table op),
        # the concatenation taken of x's own halves in x's dtype. The same float32 products, rounded once, as
        # cat(xa·c − xb·s, xb·c + xa·s); but that form concatenates float32 results, which Inductor stores as two
        # float32 buffers per q/k before casting back (issue 32, item 3: the CPU's generated code for DiT-XL/2)
        xa, xb = x32.chunk(2, dim=-1)
        rotated = x32 * torch.cat((c, c), dim=-1) + torch.cat((-xb, xa), dim=-1) * torch.cat((s, s), dim=-1)
    rotated = rotated.to(x.dtype)
    return rotated if rotary_dim == x.shape[-1] else torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def _rope_into(x, xr, c, s, interleaved: bool):
    """rope_native's math written into a new tensor of x's dtype, half by half (`addcmul out=`): four launches and
    float32 temporaries of half the rotated channels, where the differentiable form takes nine and writes the whole
    rotation in float32 before casting it back. Each half: (xa·c) − xb·s, and (xb·c) + xa·s, in float32, rounded
    once."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rotary_dim = xr.shape[-1]
    o = out[..., :rotary_dim]
    if interleaved:
        xa, xb, oa, ob = xr[..., 0::2], xr[..., 1::2], o[..., 0::2], o[..., 1::2]
    else:
        (xa, xb), (oa, ob) = xr.chunk(2, dim=-1), o.chunk(2, dim=-1)
    torch.addcmul(xa * c, xb, s, value=-1, out=oa)
    torch.addcmul(xb * c, xa, s, out=ob)
    if rotary_dim < x.shape[-1]:
        out[..., rotary_dim:] = x[..., rotary_dim:]
    return out


def rope_kernel(x, cos, sin, interleaved: bool = False, seq_dim: int = 2):
    return call_kernel(rope_fwd, x, cos, sin, interleaved, seq_dim)


backward_from_native(rope_fwd, rope_native)


def apply_rope(x, cos, sin, *, interleaved: bool = False, layout: str = "bnsd"):
    """Rotate x's first 2·cos.shape[-1] channels by position (policy of op `rope`); see the module docstring."""
    seq_dim = check_rope_inputs(x, cos, sin, layout)
    return run("rope", rope_native, rope_kernel, x, cos, sin, interleaved, seq_dim)


def check_qk_norm_rope_inputs(q, k, q_weight, k_weight, cos, sin, layout: str) -> int:
    """Every argument of `qk_norm_rope`; returns the sequence dim."""
    seq_dim = check_rope_inputs(q, cos, sin, layout)
    check_x(k, layout)
    if k.dtype != q.dtype:
        raise UsageError(f"q and k must have one dtype, got {q.dtype} and {k.dtype}")
    check_same_device(q, k=k, q_weight=q_weight, k_weight=k_weight)
    if k.shape[0] != q.shape[0] or k.shape[seq_dim] != q.shape[seq_dim] or k.shape[-1] != q.shape[-1]:
        raise UsageError(
            f"k must match q in batch, sequence length and head dim (heads may differ), got q {tuple(q.shape)} and "
            f"k {tuple(k.shape)} for layout {layout!r}"
        )
    if (q_weight is None) != (k_weight is None):
        raise UsageError("give both q_weight and k_weight, or neither (RMSNorm without a weight)")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if w is not None:
            check_float(name, w)
            check_last_dim(name, w, q.shape[-1])
    return seq_dim


def qk_norm_rope_native(q, k, q_weight, k_weight, cos, sin, q_eps: float, k_eps: float, interleaved: bool,
                        seq_dim: int):  # fmt: skip
    """The plain form: each norm, then each rotation (what Inductor fuses into one pass of its own)."""
    q = rope_native(rms_norm_native(q, q_weight, q_eps), cos, sin, interleaved, seq_dim)
    return q, rope_native(rms_norm_native(k, k_weight, k_eps), cos, sin, interleaved, seq_dim)


def qk_norm_rope_kernel(q, k, q_weight, k_weight, cos, sin, q_eps: float, k_eps: float, interleaved: bool,
                        seq_dim: int):  # fmt: skip
    """One launch for both tensors, one pass each, float32 math rounded once (`kernels/rope.py`)."""
    return call_kernel(qk_norm_rope_fwd, q, k, q_weight, k_weight, cos, sin, q_eps, k_eps, interleaved, seq_dim)


backward_from_native(qk_norm_rope_fwd, qk_norm_rope_native)
KNOWN_OPS.add("qk_norm_rope")  # a functional op without a module: named here so policies may name it


def qk_norm_rope(q, k, q_weight, k_weight, cos, sin, *, eps: float = 1e-6, interleaved: bool = False,
                 layout: str = "bnsd"):  # fmt: skip
    """(RoPE(RMSNorm(q) * q_weight), RoPE(RMSNorm(k) * k_weight)): attention's q/k norm and rotary embedding as one op
    (policy of op `qk_norm_rope`).

    q [B, Hq, N, D] and k [B, Hk, N, D] (layout "bnsd") or [B, N, Hq, D] and [B, N, Hk, D] ("bsnd"), any strides;
    RMSNorm over D with eps, then the rotation of `apply_rope` with cos/sin [N, rotary_dim / 2]. The kernel form
    reads and writes each of q and k once, in one launch; the native form is the two ops' native forms in turn.
    """
    seq_dim = check_qk_norm_rope_inputs(q, k, q_weight, k_weight, cos, sin, layout)
    return run("qk_norm_rope", qk_norm_rope_native, qk_norm_rope_kernel, q, k, q_weight, k_weight, cos, sin, eps, eps,
               interleaved, seq_dim)  # fmt: skip


# (length, rotary_dim, base, device, dtype) -> (cos, sin); shared by every module built with the same key
_tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def rope_tables(
    length: int, rotary_dim: int, base: float = 10000.0, device=None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [length, rotary_dim / 2]: angle[n, i] = n · base^(−2i / rotary_dim).

    Built once per argument set in float64 (on the CPU, so every device gets the same values) and cached:
    the returned tensors are shared, so do not modify them in place.
    """
    check_rotary_dim(rotary_dim)
    if length < 0:
        raise UsageError(f"length must be >= 0, got {length}")
    device = torch.device("cpu" if device is None else device)
    key = (length, rotary_dim, float(base), device, dtype)
    if key not in _tables:
        # outside inference mode, so tables first built under it can still be saved for a later backward
        with torch.inference_mode(False):
            inv_freq = float(base) ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
            angle = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)  # [length, rotary_dim / 2]
            _tables[key] = (angle.cos().to(device, dtype), angle.sin().to(device, dtype))
    return _tables[key]


class RotaryEmbedding(CustomOp):
    """RoPE with tables for up to `max_seq_len` positions built at init; `forward(x)` rotates x's heads.

    Position n is x's index along the sequence dim of `layout`. The tables are non-persistent buffers: they
    follow `.to(device)` but stay out of the state dict. Modules with the same tables share them (`rope_tables`
    caches them), so never modify them in place.
    """

    name = "rope"

    def __init__(
        self,
        rotary_dim: int,
        max_seq_len: int = 4096,
        base: float = 10000.0,
        interleaved: bool = False,
        layout: str = "bnsd",
        policy=None,
    ):
        super().__init__(policy)
        check_rotary_dim(rotary_dim)
        if max_seq_len <= 0:
            raise UsageError(f"max_seq_len must be positive, got {max_seq_len}")
        self.rotary_dim, self.max_seq_len, self.base = rotary_dim, max_seq_len, base
        self.interleaved, self.layout = interleaved, layout
        self.seq_dim = check_layout(layout)
        cos, sin = rope_tables(max_seq_len, rotary_dim, base)
        self.register_buffer("cos", cos, persistent=False)  # [max_seq_len, rotary_dim / 2]
        self.register_buffer("sin", sin, persistent=False)

    def _tables_for(self, x):
        """cos and sin for x's positions, after checking x against them."""
        n = x.shape[check_x(x, self.layout)]
        if n > self.max_seq_len:
            raise UsageError(
                f"x has sequence length N = {n} (dim {self.seq_dim}) but this RotaryEmbedding holds tables for "
                f"max_seq_len = {self.max_seq_len}; build it with a larger max_seq_len"
            )
        cos, sin = self.cos[:n], self.sin[:n]
        check_rope_inputs(x, cos, sin, self.layout)
        return cos, sin

    def forward_native(self, x):
        return rope_native(x, *self._tables_for(x), self.interleaved, self.seq_dim)

    def forward_kernel(self, x):
        return rope_kernel(x, *self._tables_for(x), self.interleaved, self.seq_dim)

    def extra_repr(self) -> str:
        extra = f"rotary_dim={self.rotary_dim}, max_seq_len={self.max_seq_len}, base={self.base}"
        extra += f", interleaved={self.interleaved}, layout={self.layout!r}"
        return extra + (f", {super().extra_repr()}" if self.policy else "")
