"""`CustomOp`: a module with a pure-PyTorch reference and a kernel, and a policy that picks between them.

Subclasses set `name` and define `forward_native` (always correct, always traceable) and `forward_kernel`
(a registered torch op, so it is traceable too), and `check_inputs`. `forward` resolves the policy (see
`policies.py`) and calls one of them; a subclass may instead write its own `forward` around `choice` (the norms do,
reading each parameter once); the choice is a pure function of the policy state, the input's device and whether
torch.compile is tracing, so compiled graphs bake it in and guard on the policy.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from fullgraph import env
from fullgraph.errors import FullgraphError
from fullgraph.ops import measured
from fullgraph.ops.policies import KNOWN_OPS, Policy, counters, effective, version

_runs: dict[tuple[str, bool], bool] = {}


@torch.compiler.assume_constant_result
def kernel_runs_on(device_type: str) -> bool:
    """Can our Triton kernels run on tensors of `device_type`? A constant to torch.compile."""
    key = (device_type, env.triton_interpret())
    if key not in _runs:
        _runs[key] = env.triton_runs_on(device_type)[0]
    return _runs[key]


_NATIVE, _KERNEL = Policy.NATIVE.value, Policy.KERNEL.value  # plain strings: an Enum's .value costs a lookup
_FUNCTIONAL: dict = {}  # the functional forms' eager choices, as CustomOp instances keep theirs
_CACHE_MAX = 64  # a choice cache holds this many (policy state, device, size class) entries before it starts over


def decided(op: str, instance_policy: str | None, device_type: str) -> str:
    """What the policy alone decides for `op` on `device_type`: "native", "kernel", or "auto" (a kernel runs here and
    the choice is left to measurements). A "kernel" policy where no kernel can run is an error."""
    pol = effective(op, instance_policy)
    if pol == _NATIVE:
        return "native"
    runs = kernel_runs_on(device_type)
    if pol == _KERNEL:
        if not runs:
            why = env.triton_runs_on(device_type)[1]
            raise FullgraphError(f"{op}: policy 'kernel' but no kernel can run on {device_type} ({why})")
        return "kernel"
    return "auto" if runs else "native"


def choose(op: str, instance_policy: str | None, device: torch.device, compiling: bool, small: bool = False) -> str:
    """ "native" or "kernel" for one call of `op` on `device` (`small`: an eager input below the size where a
    kernel pays, `measured.eager_kernel_pays`). Compiled, a checked op's call knows no model shape (head dim, model
    width: `measured.Shape`), so `auto` is the native form; a model's blocks decide through `ops.direct`."""
    pol = decided(op, instance_policy, device.type)
    if pol != "auto":
        return pol
    if compiling:
        return measured.compiled_choice(op, device)
    return "native" if small else "kernel"


def dispatch(op: str, instance_policy: str | None, device: torch.device, cache: dict | None = None,
             numel: int | None = None) -> str:  # fmt: skip
    """`choose` for one call, counted in `policy.counters`. Eager choices are cached per policy state, device and
    size class (in `cache`, an instance's, or one shared by the functional forms), so a steady eager call costs a
    dict lookup; `numel` (the main input's) decides whether eager `auto` is below the size where a kernel pays."""
    if torch.compiler.is_compiling():
        impl = choose(op, instance_policy, device, True)
        count_trace(op, impl)
        return impl
    small = numel is not None and not measured.eager_kernel_pays(device.type, numel, op)
    if cache is None:
        cache, key = _FUNCTIONAL, (version(), op, device.type, instance_policy, small)  # `run` builds it inline too
    else:
        key = (version(), device.type, instance_policy, small)
    impl = cache.get(key)
    if impl is None:
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        impl = cache[key] = choose(op, instance_policy, device, False, small)
    counters[(op, "eager", impl)] += 1  # record()'s eager branch, inline: this runs on every eager call
    return impl


def record(op: str, impl: str, compiling: bool) -> None:
    """Count one call of `op` running `impl` in `counters`: ("eager", per call) or ("compiled", per trace)."""
    if compiling:
        count_trace(op, impl)
    else:
        counters[(op, "eager", impl)] += 1


@torch.compiler.assume_constant_result
def count_trace(op: str, impl: str) -> bool:
    # Runs once per trace, outside the graph: counting compiled *calls* would make the compiled code read the
    # counter, guard on its value and recompile on every call.
    counters[(op, "compiled", impl)] += 1
    return True


def eager_inference(*tensors: torch.Tensor) -> bool:
    """Whether a native form may write its result with `out=` (fewer launches and passes in eager mode): not under
    torch.compile (the plain form is what Inductor fuses) and not when autograd records (`out=` is not
    differentiable)."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def run(op: str, native, kernel, x: torch.Tensor, *args):
    """A functional form's body: `native(x, *args)` or `kernel(x, *args)`, as op `op`'s policy decides.

    `dispatch`'s eager path inlined for the functional forms: the key is built as `dispatch` builds it for
    `cache=None`, written out twice on purpose (with a shared key helper, `layer_norm` against `F.layer_norm` on
    the CPU measured 1.65-1.67x, against 1.56x inline, two A/B runs each; the inlining had taken it from 6.1 to
    5.7 µs). A key that drifted from dispatch's would only miss here and fall through to it; tests check that both
    choose and count alike."""
    if torch.compiler.is_compiling():
        impl = dispatch(op, None, x.device, None, x.numel())
    else:
        device_type = x.device.type
        key = (version(), op, device_type, None, x.numel() < measured.eager_floor(device_type, op))
        impl = _FUNCTIONAL.get(key)
        if impl is None:
            impl = dispatch(op, None, x.device, None, x.numel())
        else:
            counters[(op, "eager", impl)] += 1
    return (kernel if impl == _KERNEL else native)(x, *args)


def _first_device(args: tuple[Any, ...]) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    raise FullgraphError("expected a tensor argument")


class CustomOp(nn.Module):
    """Base of every op with a native and a kernel implementation.

    `policy` ("native", "kernel", "auto" or None to follow the context / class / environment) is this
    instance's own override.
    """

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            KNOWN_OPS.add(cls.name)

    def __init__(self, policy: str | Policy | None = None):
        super().__init__()
        self.policy = None if policy is None else Policy.parse(policy, self.name).value
        self._choices: dict[tuple, str] = {}

    def implementation(self, device: torch.device | str, compiling: bool = False) -> str:
        """Which implementation a call on `device` would run now: "native" or "kernel"."""
        return choose(self.name, self.policy, torch.device(device), compiling)

    def check_inputs(self, *args, **kwargs) -> None:
        """Raise a ValueError naming a bad argument; called once per call, before either implementation."""

    def choice(self, x: torch.Tensor) -> str:
        """This call's implementation for main input `x` ("native" or "kernel"), counted: what `forward` runs. A
        subclass whose forward takes one tensor may write its own forward with it, reading each parameter once
        (an nn.Module parameter read costs a lookup: on a tiny eager call every one shows)."""
        return dispatch(self.name, self.policy, x.device, self._choices, x.numel())

    def forward(self, *args, **kwargs):
        self.check_inputs(*args, **kwargs)
        x = args[0] if args else None
        if isinstance(x, torch.Tensor):  # `choice`'s body, inline: one Python call fewer per eager call
            impl = dispatch(self.name, self.policy, x.device, self._choices, x.numel())
        else:
            impl = dispatch(self.name, self.policy, _first_device((*args, *kwargs.values())), self._choices)
        if impl == "kernel":
            return self.forward_kernel(*args, **kwargs)
        return self.forward_native(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"policy={self.policy}" if self.policy else ""
