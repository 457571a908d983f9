"""Our ops for a model that checks its own inputs: each op's implementation chosen once per model call.

An eager call of `fullgraph.ops.modulate` checks its arguments and resolves its policy, then runs the native form or
the kernel. Inside a model whose tensors are all its own (made from inputs it checked once), the checks repeat on
every op of every block, and on a host-bound call (a DiT at 1024 tokens on the H200) that host time is the latency.
`direct(device, numel)` returns the implementations every op's policy picks now, for a main input of `numel`
elements on `device`, chosen as `fullgraph.ops` chooses them (`custom_op.choose`, the same size rule) and counted
in `policy.counters` the same way, one count per call. The functions take the ops' own arguments but no checks,
for inference only (`usable()`: autograd not recording). Under torch.compile the same plan is a constant to the
trace (see the section below): the checked ops would put a guard on every function, global and policy key they
read, which Dynamo checks on every call.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from fullgraph import replay
from fullgraph.ops import attention_backends as _backends
from fullgraph.ops import measured
from fullgraph.ops.attention import _resolve as _resolve_attention
from fullgraph.ops.attention import compiled_auto, policy_backend
from fullgraph.ops.custom_op import choose, counters, decided
from fullgraph.ops.linear import linear_gelu_kernel, linear_gelu_native, skinny_linear_kernel, skinny_linear_native
from fullgraph.ops.modulation import (
    gated_residual_kernel,
    gated_residual_native,
    layer_norm_modulate_kernel,
    layer_norm_modulate_native,
    modulate_kernel,
    modulate_native,
)
from fullgraph.ops.norms import layer_norm_kernel, layer_norm_native, rms_norm_kernel, rms_norm_native
from fullgraph.ops.policies import effective, version
from fullgraph.ops.rope import qk_norm_rope_kernel, qk_norm_rope_native, rope_kernel, rope_native


def _rms_norm_native(module, x):
    return rms_norm_native(x, module.weight, module.eps)


def _rms_norm_kernel(module, x):
    return rms_norm_kernel(x, module.weight, module.eps)


def _qk_norm_rope_native(q, k, q_weight, k_weight, cos, sin, eps, interleaved, seq_dim):
    return qk_norm_rope_native(q, k, q_weight, k_weight, cos, sin, eps, eps, interleaved, seq_dim)


def _qk_norm_rope_kernel(q, k, q_weight, k_weight, cos, sin, eps, interleaved, seq_dim):
    return qk_norm_rope_kernel(q, k, q_weight, k_weight, cos, sin, eps, eps, interleaved, seq_dim)


# op -> (native, kernel): the forms `fullgraph.ops`' functional entries run (rms_norm: an `ops.RMSNorm`'s, given it)
FORMS = {
    "layer_norm": (layer_norm_native, layer_norm_kernel),
    "rms_norm": (_rms_norm_native, _rms_norm_kernel),
    "modulate": (modulate_native, modulate_kernel),
    "gated_residual": (gated_residual_native, gated_residual_kernel),
    "rope": (rope_native, rope_kernel),
    "linear_gelu": (linear_gelu_native, linear_gelu_kernel),
    "qk_norm_rope": (_qk_norm_rope_native, _qk_norm_rope_kernel),
    "layer_norm_modulate": (layer_norm_modulate_native, layer_norm_modulate_kernel),
    "skinny_linear": (skinny_linear_native, skinny_linear_kernel),
}


# Attention's form inside a block, decided like the ops above (policy, then in a graph the measurements): torch's
# SDPA as it picks ("native") or pinned to FlashAttention where that serves ("kernel": torch's FlashAttention, not
# ours, as linear_gelu's kernel is cuBLASLt's epilogue). On Hopper torch picks cuDNN's attention, whose host time
# (~50 us a call on the H100 host) a host-bound call in default mode pays in full; under CUDA graphs it is free.
FLASH_OP = "sdpa_flash"

_parsed: dict[str, tuple[tuple[str, int], ...]] = {}


def parse_calls(calls: str) -> tuple[tuple[str, int], ...]:
    """ "layer_norm:2,modulate:2" -> (("layer_norm", 2), ("modulate", 2)): how often a caller calls each op. A
    string, so that compiled code guards on one constant, not on every element of a tuple."""
    found = _parsed.get(calls)
    if found is None:
        found = _parsed[calls] = tuple((op, int(n)) for op, _, n in (c.partition(":") for c in calls.split(",")))
    return found


class Direct(NamedTuple):
    """The chosen forms: layer_norm(x, weight, bias, eps), rms_norm(module, x) for an `ops.RMSNorm`, modulate(x, shift,
    scale), gated_residual(x, h, gate), rope(x, cos, sin, interleaved, seq_dim), linear_gelu(x, weight, bias,
    approximate), qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, interleaved, seq_dim) -> (q, k),
    layer_norm_modulate(x, shift, scale, eps, h=None, gate=None, h2=None, gate2=None, return_sum=True) -> y, or
    (y, s) with h and gate (and return_sum),
    skinny_linear(x, weight, bias), attention(q, k, v) with q, k, v [B, N, H, D] (no mask, not causal; returns
    [B, N, H, D])."""

    layer_norm: object
    rms_norm: object
    modulate: object
    gated_residual: object
    rope: object
    linear_gelu: object
    qk_norm_rope: object
    layer_norm_modulate: object
    skinny_linear: object
    attention: object
    impls: dict  # op -> "native" | "kernel"


_plans: dict[tuple, Direct] = {}
_attention_choice: dict[tuple, tuple[str, bool]] = {}  # key -> (backend, plain SDPA runs its kernel)


def usable() -> bool:
    """May a model call `direct`'s functions now: inference (autograd not recording), eager or traced?"""
    return not torch.is_grad_enabled()


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


def attention_bsnd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, flash: bool = False) -> torch.Tensor:
    """`ops.attention(q, k, v, layout="bsnd")` for a model's own q, k, v (same dtype and device, unit last-dim
    strides, as a QKV projection's views have): its backend resolved once per shape and policy state, and called
    as plain SDPA where torch's own dispatch picks the same kernel. `flash`: op sdpa_flash's kernel form, torch's
    SDPA ("sdpa", attention's native form) pinned to FlashAttention where that serves."""
    qb, kb, vb = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scale = 1.0 / math.sqrt(q.shape[-1])
    key = (version(), q.shape, k.shape, q.dtype, q.device, flash)
    found = _attention_choice.get(key)
    if found is None:
        if len(_attention_choice) >= 64:
            _attention_choice.clear()
        spec = _backends.spec_of(qb, kb, None, False)
        if flash and policy_backend(spec) == "sdpa" and _backends.flash_serves(spec):
            backend = "sdpa-flash-pinned"
            counters[("attention", "eager", backend)] += 1
        else:
            backend = _resolve_attention(qb, kb, vb, None, False, scale, None)  # counts this call
        found = _attention_choice[key] = (backend, _plain_sdpa_serves(backend, qb, kb, vb, scale))
    else:
        counters[("attention", "eager", found[0])] += 1
    if found[1]:
        out = F.scaled_dot_product_attention(qb, kb, vb, scale=scale)
    elif found[0] == "sdpa-flash-pinned":
        out = _backends.flash_pinned(qb, kb, vb, scale)
    else:
        out = _backends.run_backend(found[0], qb, kb, vb, None, False, scale)
    return out.transpose(1, 2)


def attention_bsnd_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`attention_bsnd` with op sdpa_flash's kernel form."""
    return attention_bsnd(q, k, v, True)


def direct(device: torch.device, numel: int, calls: str, policies: tuple[tuple[str, str | None], ...] = (),
           shape: measured.Shape | None = None) -> Direct:  # fmt: skip
    """The forms each op's policy picks now for a main input of `numel` elements on `device` (`policies`: an
    instance's own policy per op, as (op, policy) pairs). `calls` ("layer_norm:2,modulate:2", `parse_calls`) is how
    often the caller will call each op: counted in `policy.counters` as that many eager calls (attention counts its
    own), or under torch.compile as that many traced calls. `shape` (`measured.shape_of` the block's tokens) is what
    compiled `auto` decides from; without it compiled `auto` is the native form."""
    if torch.compiler.is_compiling():
        return _traced(device, calls, policies, shape)
    key = (version(), device.type, measured.eager_size_class(device.type, numel), policies)
    plan = _plans.get(key)
    if plan is None:
        own = dict(policies)
        pays = measured.eager_kernel_pays
        impls = {op: choose(op, own.get(op), device, False, not pays(device.type, numel, op)) for op in FORMS}
        # eager attention under "auto" times its backends itself (FlashAttention among them): pinned only by policy
        flash = effective(FLASH_OP, own.get(FLASH_OP)) == "kernel"
        attention = attention_bsnd_flash if flash else attention_bsnd
        if len(_plans) >= 64:
            _plans.clear()
        plan = _plans[key] = Direct(*(FORMS[op][impl == "kernel"] for op, impl in impls.items()), attention, impls)
    for op, n in parse_calls(calls):
        counters[(op, "eager", plan.impls[op])] += n
    return plan


# ---- under torch.compile ----------------------------------------------------------------------------------------
# Dynamo guards what the code it traces reads: every function it inlines (by its code object), every module global,
# every policy-dict key and table entry looked up, every element of a tuple it iterates. The checked ops trace their
# argument checks and policy lookups on every call, so a compiled DiT of 4 blocks checked ~140 guards more per call
# than its plain twin (2-core CPU: ~30 us more host time per call, ~22 us of it guards; at 1024 tokens in default
# mode the H200 call is host-bound by about as much). Here the plan, attention's backend and the counts are
# constants to the trace, computed in functions it does not enter, guarded by the policy state's number.


@torch.compiler.assume_constant_result
def _compiled_plan(
    device_type: str, device_index: int | None, policies: tuple, state: tuple, key: tuple | None
) -> tuple:
    """Per op of FORMS and FLASH_OP for compiled code: the policy's decision (`custom_op.decided`), for "auto" the
    row spans where the measurements take the kernel at `key` ((dtype, head dim, width, graphed) of
    `measured.Shape`, None without a shape: the native form), for the caller to compare the rows, which may be
    symbolic (`measured.pick`).
    `state`: version(), so a policy change recompiles."""
    own = dict(policies)
    plan = []
    for op in (*FORMS, FLASH_OP):  # FLASH_OP's kernel is torch's: no Triton needed (`decided` asks for it)
        pol = decided(op, own.get(op), device_type) if op in FORMS else effective(op, own.get(op))
        if pol == "auto":
            pol = "native" if key is None or device_type != "cuda" else measured.kernel_rows(op, device_index, *key)
        plan.append(pol)
    return tuple(plan)


@torch.compiler.assume_constant_result
def _count_traced(calls: str, impls: tuple) -> bool:
    """Count `calls` as traced calls of the forms `impls` (per op of FORMS), as the checked ops count theirs."""
    chosen = dict(zip(FORMS, impls, strict=True))
    for op, n in parse_calls(calls):
        counters[(op, "compiled", chosen[op])] += n
    return True


def _traced(device, calls, policies, shape) -> Direct:
    key = None if shape is None else (shape.dtype, shape.head_dim, shape.width, replay.under_graphs())
    plan = _compiled_plan(device.type, device.index, policies, version(), key)
    impls = tuple(p if isinstance(p, str) else measured.pick(p, shape.rows, shape.tokens) for p in plan)
    _count_traced(calls, impls[: len(FORMS)])
    kernel = [impl == "kernel" for impl in impls]
    return Direct(
        layer_norm_kernel if kernel[0] else layer_norm_native,
        _rms_norm_kernel if kernel[1] else _rms_norm_native,
        modulate_kernel if kernel[2] else modulate_native,
        gated_residual_kernel if kernel[3] else gated_residual_native,
        rope_kernel if kernel[4] else rope_native,
        linear_gelu_kernel if kernel[5] else linear_gelu_native,
        _qk_norm_rope_kernel if kernel[6] else _qk_norm_rope_native,
        layer_norm_modulate_kernel if kernel[7] else layer_norm_modulate_native,
        skinny_linear_kernel if kernel[8] else skinny_linear_native,
        _attention_traced_flash if kernel[9] else _attention_traced,
        {},
    )


@torch.compiler.assume_constant_result
def _attention_backend(spec: tuple, state: tuple, graphed_fit: bool, flash: bool = False) -> str:
    """What `ops.attention` resolves for a call described by `spec` (a Spec's fields) while torch.compile traces,
    counted as one traced call; `state`: version(); `graphed_fit`: as in `compiled_auto`; `flash`: op sdpa_flash
    took its kernel form, so torch's SDPA ("sdpa") runs pinned to FlashAttention ("sdpa-flash-pinned") where that
    serves."""
    s = _backends.Spec(*spec)
    backend = policy_backend(s)
    if backend == "auto":
        backend = compiled_auto(s, torch.device(s.device_type, s.device_index), graphed_fit)
    if backend == "sdpa" and flash and _backends.flash_serves(s):
        backend = "sdpa-flash-pinned"
    counters[("attention", "compiled", backend)] += 1
    return backend


def _attention_traced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, flash: bool = False) -> torch.Tensor:
    """`attention_bsnd` for compiled code: the backend resolved as `ops.attention` resolves it while tracing."""
    qb, kb, vb = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scale = 1.0 / math.sqrt(q.shape[-1])
    fit = measured.graphed_kernel_fits("attention", q.device, q.numel())
    backend = _attention_backend(tuple(_backends.spec_of(qb, kb, None, False)), version(), fit, flash)
    if backend == "sdpa-flash-pinned":  # aten SDPA pinned in the graph, not backend sdpa-flash's opaque op
        return _backends.flash_pinned(qb, kb, vb, scale).transpose(1, 2)
    return _backends.run_backend(backend, qb, kb, vb, None, False, scale).transpose(1, 2)


def _attention_traced_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`_attention_traced` with op sdpa_flash's kernel form (`attention_bsnd_flash` for compiled code)."""
    return _attention_traced(q, k, v, True)
