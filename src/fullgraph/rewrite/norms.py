"""`layer_norm_kernel`: a LayerNorm over the last dim (`F.layer_norm`, `nn.LayerNorm`) in a third-party graph, run by
our Triton kernel (`torch.ops.fullgraph.layer_norm`, `fullgraph.kernels.layer_norm`) where op `layer_norm`'s policy
says so: one vocabulary with our own ops (`fullgraph.ops.policy(layer_norm=...)`).

- policy `kernel`: rewritten wherever the kernel can run (the input's last dim contiguous; a GPU, or the CPU under
  Triton's interpreter).
- policy `native`: never.
- `auto` (the default): where the in-graph decision data (`fullgraph.ops.measured`, docs/decisions.md) holds a
  point close to this call (GPU, torch, dtype, the row width, the row count within 2x; head dim 0: a norm outside
  our blocks) saying the kernel won. No shipped point speaks for a third-party norm yet, so `auto` leaves them
  all, with the reason in `stats.rewrites_skipped`, until `fullgraph bench sweep` measures such shapes.

The policy is read when the graph compiles: a policy changed afterwards reaches this model at its next compile.
Our kernel computes mean and variance in float32 over the row held in registers and writes x's dtype, as
`torch.layer_norm` does: results equal up to rounding.
"""

from __future__ import annotations

import abc
from typing import Any

import torch
from torch import fx

import fullgraph.kernels.layer_norm  # noqa: F401 - registers torch.ops.fullgraph.layer_norm
from fullgraph import env
from fullgraph.compile.rewrites import Context
from fullgraph.kernels._library import ops_fingerprint
from fullgraph.ops import measured
from fullgraph.ops.policies import Policy, effective
from fullgraph.rewrite._fx import Builder, PatternRewrite, call_args, static_ints, value

LAYER_NORM = (torch.layer_norm, torch.nn.functional.layer_norm)
NAMES = ("input", "normalized_shape", "weight", "bias", "eps")
DEFAULTS = {"weight": None, "bias": None, "eps": 1e-5}
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
Found = dict[str, Any]


class OpKernelRewrite(PatternRewrite):
    """A rewrite to the kernel of one of our ops (`op`), decided as that op is in our own models: its policy
    (`native` never, `kernel` wherever the kernel runs, as does a forced rewrite) and, under `auto`, the in-graph
    decision data at this call's shape (`measured.compiled_choice`)."""

    op = ""

    @abc.abstractmethod
    def tensor(self, found: Any) -> torch.Tensor:
        """The example value of the rows the kernel reads (x), whose dtype, width and row count key the decision."""

    def head_dim(self, found: Any) -> int:
        """The attention head dim the decision is keyed by: 0 for an op outside our blocks."""
        return 0

    def refuse(self, found: Any, context: Context) -> str | None:
        x = self.tensor(found)
        policy = effective(self.op)
        if policy == Policy.NATIVE.value:
            return f"op {self.op}'s policy is native"
        runs, why = env.triton_runs_on(x.device)
        if not runs:
            return f"our kernel does not run on {x.device.type}: {why}"
        if policy == Policy.KERNEL.value or context.forced:
            return None
        width, dim = x.shape[-1], self.head_dim(found)
        shape = measured.Shape(x.dtype, dim, width, x.numel() // width)
        if measured.compiled_choice(self.op, x.device, shape) == "kernel":
            return None
        at = f"width {width}" + (f", head dim {dim}" if dim else "")
        return (f"auto: no in-graph measurement says our kernel wins at {at} on {x.device.type} "
                f"(fullgraph.ops.policy({self.op}='kernel') forces it; docs/decisions.md)")  # fmt: skip

    def identity(self) -> str:
        """Its source and the decision data `auto` reads (`ops_fingerprint`, which torch's cache keys carry too)."""
        return super().identity() + ops_fingerprint()


class LayerNormKernel(OpKernelRewrite):
    name = "layer_norm_kernel"
    op = "layer_norm"

    def match(self, node: fx.Node) -> Found | str | None:
        if node.op != "call_function" or node.target not in LAYER_NORM:
            return None
        a = call_args(node, NAMES, DEFAULTS)
        if a is None:
            return None
        x = value(a["input"])
        if not isinstance(x, torch.Tensor) or x.dtype not in FLOATS or x.dim() < 1:
            return None
        width = static_ints(x.shape[-1])
        if width is None or static_ints(a["normalized_shape"]) != width:
            return None  # normalized over more than the last dim, or a symbolic width
        for name in ("weight", "bias"):
            t = value(a[name])
            if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != x.dtype or t.dim() != 1):
                return f"{name} is not a 1-D {x.dtype} tensor: the kernel takes x's dtype"
        if not isinstance(a["eps"], float):
            return None
        if x.stride(-1) != 1:
            return "the rows are not contiguous (the kernel reads each row as one block)"
        return a

    def tensor(self, found: Found) -> torch.Tensor:
        return value(found["input"])

    def replace(self, graph: fx.Graph, node: fx.Node, found: Found) -> None:
        b = Builder(graph, node)
        op = torch.ops.fullgraph.layer_norm.default
        b.replace(b(op, found["input"], found["weight"], found["bias"], float(found["eps"])))

    def detail(self, found: Found, context: Context) -> str:
        x = value(found["input"])
        return f"LayerNorm over {x.shape[-1]} ({str(x.dtype).removeprefix('torch.')}) -> fullgraph's kernel"


REWRITE = LayerNormKernel()
