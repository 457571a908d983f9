"""Our ops for a model that checks its own inputs: each op's implementation chosen once per model call.

An eager call of `fullgraph.ops.modulate` checks its arguments and resolves its policy, then runs the native form or
the kernel. Inside a model whose tensors are all its own (made from inputs it checked once), the checks repeat on
every op of every block, and on a host-bound call (a DiT at 1024 tokens on the H200) that host time is the latency.
`direct(device, numel)` returns the implementations every op's policy picks now, for a main input of `numel`
elements on `device`, chosen as `fullgraph.ops` chooses them (`custom_op.choose`, the same size rule) and counted
in `policy.counters` the same way, one count per call. The functions take the ops' own arguments but no checks:
only for eager inference (`usable()`), never under torch.compile (whose graphs must see the checked ops, which
trace) or when autograd records.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from fullgraph.ops import attention_backends as _backends
from fullgraph.ops import measured
from fullgraph.ops.attention import _resolve as _resolve_attention
from fullgraph.ops.custom_op import choose, counters
from fullgraph.ops.linear import linear_gelu_kernel, linear_gelu_native
from fullgraph.ops.modulation import gated_residual_kernel, gated_residual_native, modulate_kernel, modulate_native
from fullgraph.ops.norms import layer_norm_kernel, layer_norm_native, rms_norm_kernel, rms_norm_native
from fullgraph.ops.policies import version
from fullgraph.ops.rope import rope_kernel, rope_native


def _rms_norm_native(module, x):
    return rms_norm_native(x, module.weight, module.eps)


def _rms_norm_kernel(module, x):
    return rms_norm_kernel(x, module.weight, module.eps)


# op -> (native, kernel): the forms `fullgraph.ops`' functional entries run (rms_norm: an `ops.RMSNorm`'s, given it)
FORMS = {
    "layer_norm": (layer_norm_native, layer_norm_kernel),
    "rms_norm": (_rms_norm_native, _rms_norm_kernel),
    "modulate": (modulate_native, modulate_kernel),
    "gated_residual": (gated_residual_native, gated_residual_kernel),
    "rope": (rope_native, rope_kernel),
    "linear_gelu": (linear_gelu_native, linear_gelu_kernel),
}


class Direct(NamedTuple):
    """The chosen forms: layer_norm(x, weight, bias, eps), rms_norm(module, x) for an `ops.RMSNorm`, modulate(x, shift,
    scale), gated_residual(x, h, gate), rope(x, cos, sin, interleaved, seq_dim), linear_gelu(x, weight, bias,
    approximate), attention(q, k, v) with q, k, v [B, N, H, D] (no mask, not causal; returns [B, N, H, D])."""

    layer_norm: object
    rms_norm: object
    modulate: object
    gated_residual: object
    rope: object
    linear_gelu: object
    attention: object
    impls: dict  # op -> "native" | "kernel"


_plans: dict[tuple, Direct] = {}
_attention_choice: dict[tuple, tuple[str, bool]] = {}  # key -> (backend, plain SDPA runs its kernel)


def usable() -> bool:
    """May a model call `direct`'s functions now: eager, and autograd not recording (inference)?"""
    return not torch.compiler.is_compiling() and not torch.is_grad_enabled()


# our SDPA backends -> the SDPBackend value torch's own dispatch reports when it would pick the same kernel
_SDPA_KERNELS = {"sdpa-flash": 1, "sdpa-efficient": 2, "sdpa-cudnn": 3, "sdpa-math": 0}


def _plain_sdpa_serves(backend: str, q, k, v, scale: float) -> bool:
    """Would `F.scaled_dot_product_attention` run `backend`'s kernel for these inputs on its own? Then the call
    needs neither our op nor the backend flags set around it (same kernel, same values)."""
    if backend == "sdpa":
        return True
    choice = getattr(torch, "_fused_sdp_choice", None)
    want = _SDPA_KERNELS.get(backend)
    if choice is None or want is None or q.shape[1] != k.shape[1]:
        return False
    try:
        return int(choice(q, k, v, scale=scale)) == want
    except (RuntimeError, TypeError):
        return False


def attention_bsnd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`ops.attention(q, k, v, layout="bsnd")` for a model's own q, k, v (same dtype and device, unit last-dim
    strides, as a QKV projection's views have): its backend resolved once per shape and policy state, and called
    as plain SDPA where torch's own dispatch picks the same kernel."""
    qb, kb, vb = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scale = 1.0 / math.sqrt(q.shape[-1])
    key = (version(), q.shape, k.shape, q.dtype, q.device)
    found = _attention_choice.get(key)
    if found is None:
        if len(_attention_choice) >= 64:
            _attention_choice.clear()
        backend = _resolve_attention(qb, kb, vb, None, False, scale, None)  # counts this call
        found = _attention_choice[key] = (backend, _plain_sdpa_serves(backend, qb, kb, vb, scale))
    else:
        counters[("attention", "eager", found[0])] += 1
    if found[1]:
        out = F.scaled_dot_product_attention(qb, kb, vb, scale=scale)
    else:
        out = _backends.run_backend(found[0], qb, kb, vb, None, False, scale)
    return out.transpose(1, 2)


def direct(device: torch.device, numel: int, calls: tuple[tuple[str, int], ...],
           policies: tuple[tuple[str, str | None], ...] = ()) -> Direct:  # fmt: skip
    """The forms each op's policy picks now for a main input of `numel` elements on `device` (`policies`: an
    instance's own policy per op, as (op, policy) pairs). `calls`, (op, n) pairs, is how often the caller will
    call each op: counted in `policy.counters` as that many eager calls (attention counts its own)."""
    small = not measured.eager_kernel_pays(device.type, numel)
    key = (version(), device.type, small, policies)
    plan = _plans.get(key)
    if plan is None:
        own = dict(policies)
        impls = {op: choose(op, own.get(op), device, False, small) for op in FORMS}
        if len(_plans) >= 64:
            _plans.clear()
        plan = _plans[key] = Direct(*(FORMS[op][impl == "kernel"] for op, impl in impls.items()), attention_bsnd, impls)
    for op, n in calls:
        counters[(op, "eager", plan.impls[op])] += n
    return plan
