"""`OpKernelRewrite`: the base of the rewrites that route a pattern to the kernel of one of our ops, decided as that op
is in our own models (one vocabulary: `fullgraph.ops.policy(<op>=...)`)."""

from __future__ import annotations

import abc
from typing import Any

import torch

from fullgraph import env
from fullgraph.compile.rewrites import Context
from fullgraph.kernels._library import ops_fingerprint
from fullgraph.ops import measured
from fullgraph.ops.policies import Policy, effective
from fullgraph.rewrite._fx import PatternRewrite


class OpKernelRewrite(PatternRewrite):
    """The op's policy decides: `native` never, `kernel` wherever the kernel can serve the call (as does a forced
    rewrite), `auto` what `auto_refusal` says. By default the kernel serves wherever Triton runs on the device, and
    `auto` asks the in-graph decision data at this call's shape (`measured.compiled_choice`)."""

    op = ""  # the op whose policy decides (`fullgraph.ops.policy(<op>=...)`)
    decided_as = ""  # the op name of the decision data `auto` reads, when not `op`'s (one op, two kernels)

    @abc.abstractmethod
    def tensor(self, found: Any) -> torch.Tensor:
        """The example value of the rows the kernel reads (x), whose dtype, width and row count key the decision."""

    def head_dim(self, found: Any) -> int:
        """The attention head dim the decision is keyed by: 0 for an op outside our blocks."""
        return 0

    def cannot_serve(self, found: Any) -> str:
        """Why the kernel cannot serve this call ("" when it can)."""
        device = self.tensor(found).device
        runs, why = env.triton_runs_on(device)
        return "" if runs else f"our kernel does not run on {device.type}: {why}"

    def auto_refusal(self, found: Any) -> str | None:
        """`auto`'s reason to leave this call native, or None to take the kernel."""
        x = self.tensor(found)
        width, dim = x.shape[-1], self.head_dim(found)
        shape = measured.Shape(x.dtype, dim, width, x.numel() // width)
        if measured.compiled_choice(self.decided_as or self.op, x.device, shape) == "kernel":
            return None
        at = f"width {width}" + (f", head dim {dim}" if dim else "")
        return (f"auto: no in-graph measurement says our kernel wins at {at} on {x.device.type} "
                f"(fullgraph.ops.policy({self.op}='kernel') forces it; docs/decisions.md)")  # fmt: skip

    def refuse(self, found: Any, context: Context) -> str | None:
        policy = effective(self.op)
        if policy == Policy.NATIVE.value:
            return f"op {self.op}'s policy is native"
        why = self.cannot_serve(found)
        if why:
            return why
        if policy == Policy.KERNEL.value or context.forced:
            return None
        return self.auto_refusal(found)

    def identity(self) -> str:
        """Its source and the decision data `auto` reads (`ops_fingerprint`, which torch's cache keys carry too)."""
        return super().identity() + ops_fingerprint()
