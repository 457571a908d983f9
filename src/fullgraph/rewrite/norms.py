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

from typing import Any

import torch
from torch import fx

import fullgraph.kernels.layer_norm  # noqa: F401 - registers torch.ops.fullgraph.layer_norm
from fullgraph.compile.rewrites import Context
from fullgraph.rewrite._fx import Builder, call_args, static_ints, value
from fullgraph.rewrite._ops import OpKernelRewrite

LAYER_NORM = (torch.layer_norm, torch.nn.functional.layer_norm)
NAMES = ("input", "normalized_shape", "weight", "bias", "eps")
DEFAULTS = {"weight": None, "bias": None, "eps": 1e-5}
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
Found = dict[str, Any]


def last_dim_layer_norm(node: Any) -> Found | None:
    """The arguments of a LayerNorm over its input's last dim (`F.layer_norm`, `nn.LayerNorm`), the input floating
    with a static width; None for any other node."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target not in LAYER_NORM:
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
    return a


class LayerNormKernel(OpKernelRewrite):
    name = "layer_norm_kernel"
    op = "layer_norm"

    def match(self, node: fx.Node) -> Found | str | None:
        a = last_dim_layer_norm(node)
        if a is None:
            return None
        x = value(a["input"])
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
