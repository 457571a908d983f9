"""Attention backends: each a registered torch op, a capability table, and the cached "auto" choice.

Every backend takes q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D] (any strides with a unit last-dim stride) and
returns [B, Hq, Nq, D], laid out in memory as [B, Nq, Hq, D] (SDPA flash's and flash_attn's natural layout,
contiguous for a "bsnd" caller; "triton" too), except "sdpa-cudnn", which keeps q's memory order as cuDNN
writes it; each op's fake states the real strides. Each is opaque to
torch.compile (a `custom_op` with a fake), so its body may pin an SDPA sub-backend or import a third-party
package without breaking the graph; "triton" is `torch.ops.fullgraph.flash_attention`, which Inductor traces
into on a GPU; "sdpa" is plain `F.scaled_dot_product_attention`, torch's own choice, visible to the compiler.

"auto" keeps the backends that can serve the inputs (the table, then the backend's own runtime refusal),
times them once per shape bucket on CUDA (`fullgraph.timing.measure`) and caches the winner in
memory and in `$FULLGRAPH_CACHE_DIR/attention_choices.json`. On the CPU it takes the first servable backend of a
fixed preference order. Under torch.compile `auto` is "sdpa" (`ops.attention.compiled_auto`); `choose_compiled`
serves only the calls "sdpa" cannot.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import logging
import math
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from fullgraph import env
from fullgraph._files import write_atomic
from fullgraph._paths import cache_dir
from fullgraph.kernels._library import call_kernel
from fullgraph.ops._autograd import backward_from_native
from fullgraph.ops.custom_op import kernel_runs_on
from fullgraph.timing import measure

log = logging.getLogger(__name__)

HALF = (torch.float16, torch.bfloat16)
FLOATS = (torch.float32, *HALF)
_SCHEMA = "(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool causal, float scale) -> Tensor"


@dataclass(frozen=True)
class Capability:
    """What one backend accepts. `gqa`: "native" (takes Hkv < Hq) or "expand" (k/v heads are repeated first)."""

    dtypes: Mapping[str, tuple[torch.dtype, ...]]  # device type ("*": any other) -> dtypes
    max_head_dim: int | None = None
    head_dim_multiple: int = 1
    mask: tuple[str, ...] = ("*",)  # device types where an attn_mask is accepted
    causal_square_only: bool = False  # causal only when Nq == Nk (SDPA's top-left alignment otherwise)
    gqa: str = "native"
    min_capability: tuple[int, int] | None = None
    exact: bool = True  # False for quantized kernels, which "auto" never picks


NO_MASK: tuple[str, ...] = ()
BACKENDS: dict[str, Capability] = {
    # SDPA's CPU flash kernel also serves float32 and masks; the CUDA one neither
    "sdpa-flash": Capability({"cuda": HALF, "cpu": FLOATS}, max_head_dim=256, head_dim_multiple=8, mask=("cpu",)),
    "sdpa-efficient": Capability({"cuda": FLOATS}, head_dim_multiple=8, gqa="expand"),
    "sdpa-cudnn": Capability(
        {"cuda": HALF},
        max_head_dim=128,
        head_dim_multiple=8,
        mask=NO_MASK,
        causal_square_only=True,
        gqa="expand",
        min_capability=(8, 0),
    ),
    "sdpa-math": Capability({"*": FLOATS}),
    "flash_attn": Capability({"cuda": HALF}, max_head_dim=256, mask=NO_MASK, causal_square_only=True),
    "flash_attn_3": Capability({"cuda": HALF}, max_head_dim=256, mask=NO_MASK, causal_square_only=True),
    "sageattention": Capability({"cuda": HALF}, mask=NO_MASK, causal_square_only=True, gqa="expand", exact=False),
    "triton": Capability({"cuda": FLOATS, "cpu": FLOATS}, max_head_dim=256, mask=NO_MASK, causal_square_only=True),
    # SDPA as torch chooses, left visible to torch.compile (aten SDPA, which Inductor lowers as plain PyTorch code
    # gets it): the op policy's "native". Not an "auto" candidate: auto picks among the pinned backends.
    "sdpa": Capability({"*": FLOATS}),
}
# "auto" without timing takes the first servable entry; the interpreter-run "triton" is never preferred on CPU.
PREFERENCE: dict[str, tuple[str, ...]] = {
    "cuda": ("sdpa-cudnn", "sdpa-flash", "flash_attn_3", "flash_attn", "triton", "sdpa-efficient", "sdpa-math"),
    "cpu": ("sdpa-flash", "sdpa-math"),
}
# Head dims at which our kernel ("triton") has been measured against SDPA on a GPU (docs/attention-benchmark.md):
# `auto` never picks it at any other, compiled, cached or eager-timed, since a decision measured at one head dim says
# nothing about another; naming backend="triton" (the kernel policy) still runs it there.
TRITON_AUTO_HEAD_DIMS = (64, 128)


def auto_may_pick(backend: str, d: int) -> bool:
    """May `auto` choose `backend` for head dim `d`? Every backend but ours, and ours at its measured head dims."""
    return backend != "triton" or d in TRITON_AUTO_HEAD_DIMS


_MODULES = dict(env.EXTERNAL_ATTENTION)  # backend -> the module it imports, as `fullgraph env` probes them
_TRITON_MODULE = "fullgraph.kernels.flash_attention"


class Spec(NamedTuple):
    """The facts about one call that decide which backends can serve it (plain values, for compile)."""

    device_type: str
    device_index: int | None
    dtype: str  # "float16", ...
    hq: int
    hkv: int
    d: int
    nq: int  # -1 when symbolic under torch.compile
    nk: int
    square: bool  # Nq == Nk
    causal: bool
    mask: str  # "none", "bool" or "float"


def spec_of(q, k, attn_mask, causal: bool) -> Spec:
    """q [B, Hq, Nq, D], k [B, Hkv, Nk, D]. Every field is a plain value: the constant-result functions that take
    the spec reject a symbolic one, and Dynamo hides whether a size is symbolic (isinstance(n, int) is True for
    one), so while torch.compile traces the lengths are -1 and `square` comes from a branch, which Dynamo resolves
    with a guard (no guard at all when q and k share one symbolic length, as in self-attention)."""
    mask = "none" if attn_mask is None else "bool" if attn_mask.dtype == torch.bool else "float"
    if torch.compiler.is_compiling():
        nq = nk = -1
        square = True if q.shape[2] == k.shape[2] else False  # noqa: SIM210
    else:
        nq, nk = int(q.shape[2]), int(k.shape[2])
        square = nq == nk
    return Spec(
        q.device.type, q.device.index, str(q.dtype).removeprefix("torch."), int(q.shape[1]), int(k.shape[1]),
        int(q.shape[3]), nq, nk, square, bool(causal), mask,
    )  # fmt: skip


# Our ops registered on first use rather than by `import fullgraph.ops` (their module imports Triton): name -> module.
LAZY_OPS = {"fullgraph::flash_attention": _TRITON_MODULE, "fullgraph::flash_attention_gluon": _TRITON_MODULE}


def register_ops(qualnames) -> None:
    """Register those of `qualnames` ("fullgraph::flash_attention", ...) that register on first use, as a process
    that runs a saved program calling them (an AOTInductor package) needs; other names are left alone."""
    for module in sorted({LAZY_OPS[name] for name in qualnames if name in LAZY_OPS}):
        importlib.import_module(module)


def availability(backend: str) -> str:
    """ "" if `backend` is installed, else why not."""
    if backend == "triton":
        try:
            importlib.import_module(_TRITON_MODULE)
        except Exception as e:  # a missing file or a broken kernel module: report it, never crash dispatch
            return f"{_TRITON_MODULE} does not import ({env.first_line(e)})"
        return ""
    module = _MODULES.get(backend)
    if module is not None and importlib.util.find_spec(module) is None:
        return f"it is not installed (import {module} fails)"
    return ""


def _on(table: Mapping, device_type: str):
    return table.get(device_type, table.get("*"))


@torch.compiler.assume_constant_result
def serve_reason(backend: str, *spec) -> str:
    """ "" if `backend` can serve a call described by `spec` (a `Spec`'s fields), else why not.

    A constant to torch.compile: it reads the device's properties and imports packages, neither traceable.
    """
    s = Spec(*spec)
    cap = BACKENDS[backend]
    dtype = getattr(torch, s.dtype)
    why = availability(backend)
    if why:
        return why
    dtypes = _on(cap.dtypes, s.device_type)
    if dtypes is None:
        return f"it does not run on {s.device_type} (runs on {', '.join(cap.dtypes)})"
    if dtype not in dtypes:
        names = "/".join(str(t).removeprefix("torch.") for t in dtypes)
        return f"it cannot serve {s.dtype} inputs on {s.device_type}: use {names}"
    if cap.max_head_dim is not None and s.d > cap.max_head_dim:
        return f"it supports head dim D <= {cap.max_head_dim}, got {s.d}"
    if s.d % cap.head_dim_multiple:
        return f"it needs head dim D divisible by {cap.head_dim_multiple}, got {s.d}"
    if s.mask != "none" and not (s.device_type in cap.mask or "*" in cap.mask):
        return "it takes no attn_mask: drop the mask (causal=True covers causal masks)"
    if s.causal and cap.causal_square_only and not s.square:
        return "it supports causal=True only when q and k have the same length"
    if backend == "triton" and not kernel_runs_on(s.device_type):  # cached: this runs on every eager call
        return f"Triton kernels cannot run here: {env.triton_runs_on(s.device_type)[1]}"
    if cap.min_capability is not None and s.device_type == "cuda":
        have = env.cuda_capability(s.device_index)
        if have is None or have < cap.min_capability:
            return f"it needs compute capability >= {cap.min_capability[0]}.{cap.min_capability[1]}, have {have}"
    return ""


# ---- the backend ops -------------------------------------------------------------------------------------


def _bsnd_memory(out: torch.Tensor) -> torch.Tensor:
    """[B, H, N, D] stored as [B, N, H, D] (the layout every op's fake promises); a no-op when it already is."""
    return out.transpose(1, 2).contiguous().transpose(1, 2)


def _stored_bsnd(q: torch.Tensor) -> bool:
    return q.stride(1) < q.stride(2)


def _q_memory(out: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """out stored in q's order, [B, N, H, D] or [B, H, N, D] (what `_fake_like_q` promises); a no-op when it is."""
    return _bsnd_memory(out) if _stored_bsnd(q) else out.contiguous()


def _expand_kv(q, k, v):
    """k and v with q's head count, stored in q's layout ([B, N, H, D] or [B, H, N, D] in memory)."""
    rep = q.shape[1] // k.shape[1]
    if rep == 1:
        return k, v
    if _stored_bsnd(q):  # q is stored [B, N, H, D]: build the copies that way too (cuDNN wants one layout)
        return tuple(t.transpose(1, 2).repeat_interleave(rep, dim=2).transpose(1, 2) for t in (k, v))
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def attention_native(q, k, v, attn_mask, causal: bool, scale: float):
    """Plain SDPA: the reference every backend's backward differentiates."""
    k, v = _expand_kv(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=sdpa_scale(q, scale))


def sdpa_scale(q: torch.Tensor, scale: float | None) -> float | None:
    """`scale` as SDPA's argument: None where it is SDPA's own default, 1 / sqrt(head dim) (the same float, so the
    same result), so that a compiled call reads as plain PyTorch's. Passed explicitly it was the one difference
    between the Inductor code of our DiT with every op native and its plain twin (cuDNN's attention called with
    `scale=` where the twin's call has none; H100, 2026-12-07, benchmarks/results/dit_host_code_h100.txt)."""
    return None if scale == 1.0 / math.sqrt(q.shape[-1]) else scale


def flash_serves(spec: Spec) -> bool:
    """Does SDPA pinned to FlashAttention serve a call described by `spec` with torch's own kernel (q and k with
    the same heads: `flash_pinned` passes no GQA flag)?"""
    return spec.hq == spec.hkv and not serve_reason("sdpa-flash", *spec)


def flash_pinned(q, k, v, scale: float):
    """Plain SDPA pinned to FlashAttention for q, k, v ([B, H, N, D], no mask, not causal) that it serves (the
    caller checked `flash_serves` when it resolved the call): op `sdpa_flash`'s kernel form (ops/direct.py). Aten
    SDPA in the caller's graph, not an opaque op, so a compiled call pays no custom-op dispatch. Under torch.compile
    the backend is chosen while tracing (Dynamo traces `sdpa_kernel`); cuDNN's attention, torch's pick on Hopper,
    costs ~50 us of host time a call on the H100 host (cProfile of a compiled DiT,
    benchmarks/probes/dit_host_probe.py), which a host-bound call in default mode pays in full."""
    if torch.compiler.is_compiling():  # a context Dynamo traces (env.only_sdpa is cheaper eager, but opaque to it)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, scale=sdpa_scale(q, scale))
    with env.only_sdpa("flash"):
        return F.scaled_dot_product_attention(q, k, v, scale=scale)


def _sdpa(sub_backend: str, gqa_native: bool, out_like_q: bool = False):
    """`out_like_q`: the output keeps q's memory order (cuDNN writes it so: forcing [B, N, H, D] cost a copy,
    10% of the call at 1x24x4096x128 on the H200); otherwise [B, N, H, D] (flash's and efficient's own)."""

    def impl(q, k, v, attn_mask, causal, scale):
        extra = {"enable_gqa": True} if gqa_native and q.shape[1] != k.shape[1] else {}
        if not gqa_native:
            k, v = _expand_kv(q, k, v)
        with env.only_sdpa(sub_backend):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal,
                                                 scale=sdpa_scale(q, scale), **extra)  # fmt: skip
        return _q_memory(out, q) if out_like_q else _bsnd_memory(out)

    return impl


def _flash_attn(module: str):
    def impl(q, k, v, attn_mask, causal, scale):
        flash_attn_func = importlib.import_module(module).flash_attn_func
        out = flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=causal
        )
        out = out[0] if isinstance(out, tuple) else out  # some flash_attn_3 releases also return the log-sum-exp
        return out.transpose(1, 2)  # [B, N, H, D] memory already

    return impl


def _sage(q, k, v, attn_mask, causal, scale):
    from sageattention import sageattn

    k, v = _expand_kv(q, k, v)
    return _bsnd_memory(sageattn(q, k, v, tensor_layout="HND", is_causal=causal, sm_scale=scale))


def _fake(q, k, v, attn_mask, causal, scale):
    b, h, n, d = q.shape
    return q.new_empty(b, n, h, d).transpose(1, 2)


def _fake_like_q(q, k, v, attn_mask, causal, scale):
    b, h, n, d = q.shape
    return _fake(q, k, v, attn_mask, causal, scale) if _stored_bsnd(q) else q.new_empty(b, h, n, d)


def _register(name: str, impl: Callable, fake: Callable = _fake):
    op = torch.library.custom_op(f"fullgraph::{name}", impl, mutates_args=(), schema=_SCHEMA)
    op.register_fake(fake)
    op.launcher = impl  # for `call_kernel`'s eager fast path
    backward_from_native(op, attention_native)
    return op


OPS = {
    "sdpa-flash": _register("sdpa_flash", _sdpa("flash", gqa_native=True)),
    "sdpa-efficient": _register("sdpa_efficient", _sdpa("efficient", gqa_native=False)),
    "sdpa-cudnn": _register("sdpa_cudnn", _sdpa("cudnn", gqa_native=False, out_like_q=True), _fake_like_q),
    "sdpa-math": _register("sdpa_math", _sdpa("math", gqa_native=True)),
    "flash_attn": _register("flash_attn_2", _flash_attn("flash_attn")),
    "flash_attn_3": _register("flash_attn_3", _flash_attn("flash_attn_interface")),
    "sageattention": _register("sageattention", _sage),
}


def run_backend(backend: str, q, k, v, attn_mask, causal: bool, scale: float) -> torch.Tensor:
    """Run one backend's op; in plain eager inference its implementation is called directly (the custom-op
    dispatch layers cost more host time than a short attention kernel takes)."""
    if backend == "sdpa":  # not an opaque op: torch.compile sees aten SDPA, as in plain PyTorch code
        return attention_native(q, k, v, attn_mask, causal, scale)
    if backend == "triton":  # ours, registered on import by the kernel module (`serve_reason` imported it)
        from fullgraph.kernels.flash_attention import flash_attention_fwd

        return call_kernel(flash_attention_fwd, q, k, v, causal, scale)  # its own fake states its strides
    return call_kernel(OPS[backend], q, k, v, attn_mask, causal, scale)


# ---- "auto": choice, timing and the cache ---------------------------------------------------------------

_memory: dict[str, str] = {}  # cache key -> backend, this process
_disk: dict[str, dict[str, str]] = {}  # cache file path -> its choices, read once per path
timings: dict[str, dict[str, float]] = {}  # cache key -> {backend: median ms} of the timings behind a choice


def cache_path() -> str:
    """`attention_choices.json` in fullgraph's cache folder (`fullgraph._paths.cache_dir`: FULLGRAPH_CACHE_DIR, else
    $XDG_CACHE_HOME/fullgraph, else ~/.cache/fullgraph), beside the decision data and the package probes."""
    return os.path.join(cache_dir(), "attention_choices.json")


def _bucket(n: int) -> int:
    return -1 if n < 0 else 1 << max(n - 1, 0).bit_length()  # next power of two


@functools.cache
def _gpu_name(index: int | None) -> str:
    return torch.cuda.get_device_name(index)


def cache_key(s: Spec) -> str:
    """GPU (or "cpu"), torch, dtype, Hq, Hkv, D, Nq and Nk buckets, causal, has_mask."""
    where = _gpu_name(s.device_index) if s.device_type == "cuda" else s.device_type
    parts = (where, torch.__version__, s.dtype, s.hq, s.hkv, s.d, _bucket(s.nq), _bucket(s.nk), s.causal)
    return "|".join(map(str, (*parts, s.mask != "none")))


def load_choices(path: str | None = None) -> dict[str, str]:
    """The choices saved at `path` (default `cache_path()`); a corrupt file warns and counts as empty."""
    path = path or cache_path()
    if path not in _disk:
        _disk[path] = {}
        try:
            with open(path) as f:
                data = json.load(f)
            choices = data["choices"]
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in choices.items()):
                raise ValueError("choices must map strings to strings")
            _disk[path] = choices
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            warnings.warn(f"ignoring the attention choice cache {path}: {env.first_line(e)}", stacklevel=2)
    return _disk[path]


def save_choice(key: str, backend: str, path: str | None = None) -> None:
    """Add one choice to the file, atomically (written beside it, then renamed over it)."""
    path = path or cache_path()
    choices = {**load_choices(path), key: backend}
    _disk[path] = choices
    write_atomic(path, json.dumps({"version": 1, "choices": choices}, indent=1, sort_keys=True))


def clear_memory() -> None:
    """Forget this process's choices and the files read (tests; or after installing a backend)."""
    _memory.clear()
    _disk.clear()
    timings.clear()


def candidates(s: Spec, exact_only: bool = True) -> list[str]:
    """Backends that can serve `s` by the table, in the device's preference order (then the others)."""
    order = PREFERENCE.get(s.device_type, ())
    names = [*order, *(b for b in BACKENDS if b not in order)]
    return [
        b
        for b in names
        if b != "sdpa" and (BACKENDS[b].exact or not exact_only) and auto_may_pick(b, s.d) and not serve_reason(b, *s)
    ]


def _cached(s: Spec, key: str) -> str | None:
    for source in (_memory.get, lambda key: load_choices().get(key)):  # the file only when memory has none
        found = source(key)
        if found in BACKENDS and auto_may_pick(found, s.d) and not serve_reason(found, *s):
            return found
    return None


def _runs(backend: str, call: Callable[[str], object]) -> bool:
    try:
        call(backend)
    except Exception as e:  # SDPA's "No available kernel", a third-party kernel's refusal: cannot serve
        log.info("attention backend %s refused: %s", backend, env.first_line(e))
        return False
    return True


def _timed(names: list[str], call: Callable[[str], object], device) -> dict[str, float]:
    """Median device ms of each backend that runs (CUDA-graph replay, so the host's dispatch cost, which
    torch.compile and CUDA graphs remove, does not decide); the ones that refuse are left out."""
    times = {}
    graph = torch.device(device).type == "cuda"
    for n in (n for n in names if _runs(n, call)):
        try:
            times[n] = measure(lambda n=n: call(n), device=device, warmup=3, reps=15, inner=4, graph=graph).median_ms
        except RuntimeError as e:  # a kernel that cannot be captured in a CUDA graph: timed by events instead
            log.info("attention backend %s not capturable (%s): timed with events", n, env.first_line(e))
            times[n] = measure(lambda n=n: call(n), device=device, warmup=3, reps=15, inner=4).median_ms
    return times


def choose_eager(s: Spec, call: Callable[[str], object], device) -> str:
    """The auto choice for `s`, resolving it now if needed: `call(backend)` runs the real inputs."""
    key = cache_key(s)
    found = _cached(s, key)
    if found is not None:
        return found
    names = candidates(s)
    capturing = s.device_type == "cuda" and torch.cuda.is_current_stream_capturing()
    if s.device_type == "cuda" and len(names) > 1 and not capturing:  # no timing inside someone's graph capture
        timings[key] = times = _timed(names, call, device)
        choice = min(times, key=times.__getitem__)
        log.info("attention auto %s: %s from %s (median ms)", key, choice, times)
        save_choice(key, choice)
    else:  # untimed: the first in preference order that does not refuse (math always runs)
        choice = next((n for n in names[:-1] if _runs(n, call)), names[-1])
    _memory[key] = choice
    return choice


@torch.compiler.assume_constant_result
def choose_compiled(*spec) -> str:
    """The auto choice while torch.compile traces: the cached one, else the preference order (never timed)."""
    s = Spec(*spec)
    key = cache_key(s)
    found = _cached(s, key)
    if found is None:
        found = candidates(s)[0]
        if s.device_type == "cuda":
            log.info("attention auto: %s not timed in eager yet; compiled with %s by preference order", key, found)
    return found
