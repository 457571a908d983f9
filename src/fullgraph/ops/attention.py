"""Scaled dot-product attention with backend dispatch: `attention`, `attention_choice` and `Attention`.

out = softmax(q·kᵀ · scale + mask) · v per head, scale = 1/sqrt(D) by default; with GQA (Hq a multiple of
Hkv) query head h reads key/value head h // (Hq / Hkv). `causal=True` lets query i see keys j <= i (SDPA's
top-left alignment). Every backend is a registered torch op (`attention_backends.py`), so `attention`
compiles with `fullgraph=True`; which one runs is the op policy `attention` (native: torch's SDPA, kernel: ours,
auto: measured, see that module) unless `backend=` pins one.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fullgraph.errors import FullgraphError, UsageError
from fullgraph.ops import attention_backends as _backends
from fullgraph.ops import measured
from fullgraph.ops.attention_backends import BACKENDS, run_backend, serve_reason, spec_of
from fullgraph.ops.custom_op import record
from fullgraph.ops.norms import RMSNorm
from fullgraph.ops.policies import KNOWN_OPS, Policy, effective
from fullgraph.ops.rope import RotaryEmbedding, check_layout

__all__ = ["BACKENDS", "Attention", "attention", "attention_choice"]

_SHAPES = {"bnsd": "[B, H, N, D]", "bsnd": "[B, N, H, D]"}


KNOWN_OPS.add("attention")  # so `policy(attention=...)` and FULLGRAPH_OPS may name it
# a model block's attention form (ops/direct.py): torch's SDPA as it picks ("native") or pinned to FlashAttention
# ("kernel"; torch's kernel, not ours), decided per shape inside a graph ("auto")
KNOWN_OPS.add("sdpa_flash")


def _check_backend(backend: str | None) -> None:
    if backend is not None and backend != "auto" and backend not in BACKENDS:
        names = ", ".join(BACKENDS)
        raise UsageError(f"backend must be None (the op policy), 'auto' or one of {names}, got {backend!r}")


def policy_backend(spec) -> str:
    """The backend the op policy `attention` picks: native = "sdpa" (torch's own choice, visible to the compiler),
    kernel = "triton" (ours; an error where it cannot serve), auto = "auto" (measured, see attention_backends)."""
    pol = effective("attention")
    if pol == Policy.NATIVE.value:
        return "sdpa"
    if pol == Policy.KERNEL.value:
        why = serve_reason("triton", *spec)
        if why:
            raise FullgraphError(f"attention: policy 'kernel' but our kernel cannot serve these inputs: {why}")
        return "triton"
    return "auto"


def _to_bnsd(q, k, v, layout: str, backend: str):
    """q, k, v as [B, H, N, D] views (no copy: every backend takes strided inputs), after the checks that
    need no shapes."""
    seq_dim = check_layout(layout)
    _check_backend(backend)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = f"{t.dim()}-D" if isinstance(t, torch.Tensor) else type(t).__name__
            raise UsageError(f"{name} must be 4-D {_SHAPES[layout]} for layout {layout!r}, got {got}")
    if seq_dim == 1:
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return q, k, v


def _check(q, k, v, attn_mask) -> None:
    """The arguments of `attention` that need shapes, with q/k/v already [B, H, N, D]."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_floating_point():
            raise UsageError(f"{name} must be a float tensor (float32, float16 or bfloat16), got {t.dtype}")
        if t.device != q.device:
            raise UsageError(f"{name} is on {t.device} but q is on {q.device}; move q, k and v to one device")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise UsageError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    (b, hq, nq, d), (bk, hkv, nk, dk) = q.shape, k.shape
    if dk != d:
        raise UsageError(f"k's head dim D must equal q's ({d}), got {dk}")
    if v.shape[-1] != dk:
        raise UsageError(f"v's head dim D must equal k's ({dk}), got {v.shape[-1]}")
    if v.shape[2] != nk or v.shape[1] != hkv:
        raise UsageError(f"v must have k's length {nk} and {hkv} heads, got length {v.shape[2]}, {v.shape[1]} heads")
    if bk != b or v.shape[0] != b:
        raise UsageError(f"k and v must have q's batch size {b}, got {bk} and {v.shape[0]}")
    if hq % hkv:
        raise UsageError(
            f"q's heads ({hq}) must be a multiple of k's and v's heads ({hkv}) for grouped-query attention"
        )
    if attn_mask is not None:
        _check_mask(attn_mask, q, (b, hq, nq, nk))


def _check_mask(attn_mask, q, full: tuple) -> None:
    if attn_mask.device != q.device:
        raise UsageError(f"attn_mask is on {attn_mask.device} but q is on {q.device}; move it to q's device")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise UsageError(f"attn_mask must be boolean (True = attend) or an additive float mask, got {attn_mask.dtype}")
    expected = f"broadcastable to [B, Hq, Nq, Nk] = {list(full)}"
    if attn_mask.dim() > 4:
        raise UsageError(f"attn_mask must be {expected}, got shape {tuple(attn_mask.shape)}")
    try:
        ok = torch.broadcast_shapes(tuple(attn_mask.shape), full) == full
    except RuntimeError:
        ok = False
    if not ok:
        raise UsageError(f"attn_mask must be {expected}, got shape {tuple(attn_mask.shape)}")


def _prepare(q, k, v, attn_mask, causal: bool):
    """Unit last-dim strides (all backends need them), a float mask in q's dtype (SDPA needs that), and causal
    folded into a given mask (SDPA refuses both at once). Returns q, k, v, attn_mask, causal."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if attn_mask is None:
        return q, k, v, None, causal
    if attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(q.dtype)
    if causal:
        seen = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()  # [Nq, Nk], top-left
        attn_mask = attn_mask & seen if attn_mask.dtype == torch.bool else attn_mask.masked_fill(~seen, -math.inf)
    return q, k, v, attn_mask, False


def _inputs(q, k, v, layout: str, causal: bool, scale, attn_mask, backend: str):
    """Checked [B, H, N, D] inputs ready for a backend: (q, k, v, attn_mask, causal, scale)."""
    qb, kb, vb = _to_bnsd(q, k, v, layout, backend)
    _check(qb, kb, vb, attn_mask)
    qb, kb, vb, attn_mask, causal = _prepare(qb, kb, vb, attn_mask, bool(causal))
    scale = 1.0 / math.sqrt(qb.shape[-1]) if scale is None else float(scale)
    return qb, kb, vb, attn_mask, causal, scale


def compiled_auto(spec, device: torch.device, graphed_fit: bool = False) -> str:
    """`auto` while torch.compile traces: torch's own SDPA ("sdpa", aten SDPA in the graph, as in plain code) unless
    an in-graph measurement on this GPU picked our kernel (`measured.py`, op `attention`). Not the eager-timed
    choice: that is a standalone timing, and its pinned SDPA sub-backends are opaque ops whose Python dispatch
    runs on every call of the compiled model (H200, timm-weight ViT-B/16 at batch 4, default mode: 12 calls of
    `fullgraph::sdpa_cudnn` cost 567 us of host time per forward, the model 0.80x timm's compiled speed).
    Where "sdpa" cannot serve the call, the eager choice or the preference order (`choose_compiled`).
    `graphed_fit`: `measured.graphed_kernel_fits` for this call's q (our kernel measured ahead at its size in code
    replayed from CUDA graphs), taken in bf16/fp16 only, the precisions it was measured in (in fp32 our kernel's
    exact products run without tensor cores). Never ours at a head dim it was not measured at (`auto_may_pick`):
    those measurements were made at head dim 64 (ViT-B/16) and 128 (the DiT stack)."""
    graphed_fit = graphed_fit and spec.dtype in ("bfloat16", "float16")
    measured_here = measured.compiled_choice("attention", device) == "kernel" or graphed_fit
    if measured_here and _backends.auto_may_pick("triton", spec.d) and not serve_reason("triton", *spec):
        return "triton"
    if not serve_reason("sdpa", *spec):
        return "sdpa"
    return _backends.choose_compiled(*spec)


def _resolve(q, k, v, attn_mask, causal: bool, scale: float, backend: str) -> str:
    """The backend that runs this call, counted in `counters[("attention", "eager"|"compiled", backend)]`."""
    spec = spec_of(q, k, attn_mask, causal)
    compiling = torch.compiler.is_compiling()
    if backend is None:
        backend = policy_backend(spec)
    if backend == "auto":
        if compiling:
            fit = measured.graphed_kernel_fits("attention", q.device, q.numel())
            backend = compiled_auto(spec, q.device, fit)
        else:
            backend = _backends.choose_eager(
                spec, lambda b: run_backend(b, q, k, v, attn_mask, causal, scale), q.device
            )
    else:
        why = serve_reason(backend, *spec)
        if why:
            raise UsageError(f"backend {backend!r} cannot serve these inputs: {why}; or use backend='auto'")
    record("attention", backend, compiling)
    return backend


def attention(q, k, v, *, layout="bnsd", causal=False, scale=None, attn_mask=None, backend=None) -> torch.Tensor:
    """Attention over q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D] (layout "bnsd") or [B, N, H, D] ("bsnd").

    attn_mask: boolean (True = attend) or additive float, broadcastable to [B, Hq, Nq, Nk]. Returns q's
    shape in the input layout. `backend=None` follows the op policy `attention` (`ops.policy(attention=...)`,
    `set_policy(all=...)`, FULLGRAPH_OPS: native = "sdpa", kernel = "triton", auto = measured); a backend name
    pins it, and one that cannot serve the inputs raises `UsageError`.
    """
    qb, kb, vb, attn_mask, causal, scale = _inputs(q, k, v, layout, causal, scale, attn_mask, backend)
    name = _resolve(qb, kb, vb, attn_mask, causal, scale, backend)
    try:
        out = run_backend(name, qb, kb, vb, attn_mask, causal, scale)  # [B, Hq, Nq, D]
    except RuntimeError as e:
        if backend in (None, "auto") or torch.compiler.is_compiling():
            raise
        raise UsageError(f"backend {backend!r} refused these inputs ({e}); use another backend or 'auto'") from e
    return out.transpose(1, 2) if layout == "bsnd" else out


def attention_choice(q, k, v, *, layout="bnsd", causal=False, attn_mask=None) -> str:
    """The backend `attention(..., backend="auto")` would run for these inputs (resolving it now if needed)."""
    qb, kb, vb, attn_mask, causal, scale = _inputs(q, k, v, layout, causal, None, attn_mask, "auto")
    spec = spec_of(qb, kb, attn_mask, causal)
    call = lambda b: run_backend(b, qb, kb, vb, attn_mask, causal, scale)  # noqa: E731
    return _backends.choose_eager(spec, call, qb.device)


class Attention(nn.Module):
    """Multi-head (or grouped-query) self-attention: fused QKV projection, optional q/k RMSNorm and RoPE,
    `attention`, output projection. forward(x [B, N, dim], attn_mask=None) -> [B, N, dim].

    `rope` is a `RotaryEmbedding` with layout "bsnd" over the head dim, applied to q and k after the norm.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        kv_heads: int | None = None,
        qk_norm: bool = False,
        rope: RotaryEmbedding | None = None,
        causal: bool = False,
        backend: str | None = None,
        bias: bool = True,
    ):
        super().__init__()
        kv_heads = heads if kv_heads is None else kv_heads
        if heads <= 0 or dim % heads:
            raise UsageError(f"dim ({dim}) must be a positive multiple of heads ({heads})")
        if kv_heads <= 0 or heads % kv_heads:
            raise UsageError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        _check_backend(backend)
        if rope is not None and rope.layout != "bsnd":
            raise UsageError(f"rope must be built with layout='bsnd' (q and k are [B, N, H, D]), got {rope.layout!r}")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.causal, self.backend = bool(causal), backend
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=bias)
        self.q_norm = RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.rope = rope if rope is not None else nn.Identity()
        self.proj = nn.Linear(heads * self.head_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        hd, kvd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split([hd, kvd, kvd], dim=-1)  # q: [B, N, H·D], k and v: [B, N, Hkv·D]
        q = self.rope(self.q_norm(q.unflatten(-1, (self.heads, self.head_dim))))  # q: [B, N, H, D]
        k = self.rope(self.k_norm(k.unflatten(-1, (self.kv_heads, self.head_dim))))  # k: [B, N, Hkv, D]
        v = v.unflatten(-1, (self.kv_heads, self.head_dim))  # v: [B, N, Hkv, D]
        out = attention(q, k, v, layout="bsnd", causal=self.causal, attn_mask=attn_mask, backend=self.backend)
        return self.proj(out.flatten(2))  # out: [B, N, H, D] -> [B, N, dim]

    def extra_repr(self) -> str:
        return f"heads={self.heads}, kv_heads={self.kv_heads}, head_dim={self.head_dim}, causal={self.causal}, " + (
            f"backend={self.backend!r}"
        )
