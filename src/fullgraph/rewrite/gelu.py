"""`gelu_epilogue`: a linear layer whose only use is a GELU, as one GEMM with the GELU in its epilogue.

Two routes, by the GELU's form:
- **cuBLASLt's epilogue** (`torch._addmm_activation(bias, x, w.t(), use_gelu=True)`). Which GELU it computes depends
  on the device: the **tanh** form on CUDA, the exact (**erf**) form on the CPU. So it is exact for
  `gelu(approximate="tanh")` on CUDA and for `gelu()` (erf) on the CPU. On CUDA an exact GELU becomes the tanh form
  only with `fullgraph.compile(..., approximate_gelu=True)`: a changed function (|erf GELU - tanh GELU| <= 4.7e-4
  over the reals), listed as such in `stats.rewrites`.
- **our GEMM with the exact GELU** (`fullgraph.kernels.gemm_gelu`, a Triton kernel) for an exact GELU on CUDA without
  that opt-in, or wherever op `linear_gelu`'s policy is `kernel` and Triton runs (the CPU under TRITON_INTERPRET=1:
  how CI tests it). Under `auto` it follows the decision data of op `linear_gelu_erf` at the call's width and rows
  (docs/decisions.md): none is committed yet, so `auto` leaves the exact GELU alone until a measurement says the
  kernel wins; `rewrites=["gelu_epilogue"]` forces it.

Both routes are op `linear_gelu`'s kernel form: `fullgraph.ops.policy(linear_gelu="native")` stops the rewrite, even
forced.

Needs a bias (both epilogues add it) and a 2-D weight; the input is flattened to 2-D and the output shaped back, so
the leading dims must be static but the first (the batch).

`auto` takes the cuBLASLt route on CUDA (H200, timm ViT-B/16 bf16, fc1 + GELU by hand: 1.10x at batch 256 and 64
default mode, 1.04x at batch 4 reduce-overhead; issue 33). Not on the CPU, where it was not measured;
`rewrites=["gelu_epilogue"]` forces it anywhere it is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

import fullgraph.kernels.gemm_gelu  # noqa: F401 - registers torch.ops.fullgraph.gemm_gelu
from fullgraph.compile.rewrites import Context
from fullgraph.ops.policies import Policy, effective
from fullgraph.rewrite._fx import Builder, call_args, single_user, static_ints, value
from fullgraph.rewrite._ops import OpKernelRewrite

GELU = (torch._C._nn.gelu, torch.nn.functional.gelu)
LINEAR = (torch._C._nn.linear, torch.nn.functional.linear)


def epilogue_form(device: torch.device) -> str:
    """The GELU `torch._addmm_activation(use_gelu=True)` computes on `device`: "tanh" (CUDA) or "none" (erf)."""
    return "tanh" if device.type == "cuda" else "none"


@dataclass
class Found:
    args: dict[str, Any]  # the linear's arguments: input, weight, bias
    linear: tuple[fx.Node, ...]  # the nodes the GEMM replaces, the GELU's input first
    form: str  # the model's GELU: "tanh" or "none" (erf)
    route: str = ""  # set by `refuse`: "epilogue" (torch._addmm_activation) or "gemm" (our exact-GELU GEMM)
    stored: str = "out, in"  # the weight's layout: nn.Linear's [out, in], or Conv1D's [in, out] (`addmm`)
    shape: tuple[int, ...] | None = None  # for `addmm(...).view(shape)`: the output's shape

    def out_in(self) -> tuple[int, int]:
        """The layer's (out, in) features, whichever way its weight is stored."""
        out, k = value(self.args["weight"]).shape
        return (out, k) if self.stored == "out, in" else (k, out)


class GeluEpilogue(OpKernelRewrite):
    name = "gelu_epilogue"
    op = "linear_gelu"  # the exact-GELU GEMM route's policy
    decided_as = "linear_gelu_erf"  # and its decision data (the cuBLASLt route has none: measured_on)

    def match(self, node: fx.Node) -> Found | str | None:
        """A `Found` for a GELU whose input is a linear layer used only by it; a reason when it is one that cannot be
        rewritten; None when it is no such pattern."""
        if node.op != "call_function" or node.target not in GELU:
            return None
        g = call_args(node, ("input", "approximate"), {"approximate": "none"})
        lin = g["input"] if g else None
        if not isinstance(lin, fx.Node) or single_user(lin) is not node:
            return None  # no node, or the linear's output is used elsewhere too: the GELU cannot take its place
        if lin.op == "call_method" and lin.target in ("view", "reshape"):
            return _conv1d(lin, g["approximate"])
        if lin.op != "call_function" or lin.target not in LINEAR:
            return None
        a = call_args(lin, ("input", "weight", "bias"), {"bias": None})
        if a is None:
            return None
        x, w, bias = value(a["input"]), value(a["weight"]), value(a["bias"])
        if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or w.dim() != 2 or x.dim() < 2:
            return None
        if not isinstance(bias, torch.Tensor) or bias.dim() != 1:
            return "no bias: the epilogue adds one (a linear without bias keeps its GELU)"
        if not (x.dtype == w.dtype == bias.dtype) or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return f"dtypes {x.dtype}, {w.dtype}, {bias.dtype}: the epilogue takes one floating dtype"
        if x.dim() > 2 and static_ints(tuple(x.shape[1:-1])) is None:
            return "the input's inner dims are symbolic (dynamic)"
        return Found(a, (lin,), g["approximate"])

    def tensor(self, found: Found) -> torch.Tensor:
        return value(found.args["input"])

    def refuse(self, found: Found, context: Context) -> str | None:
        device = self.tensor(found).device
        computes = epilogue_form(device)
        policy = effective(self.op)
        if policy == Policy.NATIVE.value:  # both routes are op linear_gelu's kernel form
            return f"op {self.op}'s policy is native"
        ours = policy == Policy.KERNEL.value or (device.type == "cuda" and not context.approximate_gelu)
        if found.form == "none" and ours:
            found.route = "gemm"
            if found.stored != "out, in":
                return "the weight is stored [in, out] (Conv1D's addmm): our GEMM reads nn.Linear's [out, in]"
            return super().refuse(found, context)  # the op's policy, the kernel able to serve, the decision data
        if found.form != computes and not (computes == "tanh" and context.approximate_gelu):
            want, has = (_FORMS[f] for f in (found.form, computes))
            return f"the {want} GELU, where the epilogue on {device.type} computes the {has} one"
        found.route = "epilogue"
        return self.not_measured(device, context)

    def cannot_serve(self, found: Found) -> str:
        why = super().cannot_serve(found)
        if not why and static_ints(tuple(self.tensor(found).shape)) is None:
            return "the rows are symbolic (dynamic): our GEMM picks its tile by the row count"
        return why

    def auto_refusal(self, found: Found) -> str | None:
        why = super().auto_refusal(found)
        return why and f"{why}; approximate_gelu=True takes cuBLASLt's epilogue (the tanh GELU) instead"

    def replace(self, graph: fx.Graph, node: fx.Node, found: Found) -> None:
        a = found.args
        x = value(a["input"])
        n, k = found.out_in()
        b = Builder(graph, node)
        flat = b(torch.reshape, a["input"], (-1, k)) if x.dim() != 2 else a["input"]
        if found.route == "gemm":
            y = b(torch.ops.fullgraph.gemm_gelu.default, flat, a["weight"], a["bias"])
        else:
            weight = b(torch.t, a["weight"]) if found.stored == "out, in" else a["weight"]
            y = b(torch._addmm_activation, a["bias"], flat, weight, use_gelu=True)
        if found.shape is not None:
            y = b(torch.reshape, y, found.shape)
        elif x.dim() != 2:
            y = b(torch.reshape, y, (-1, *x.shape[1:-1], n))
        b.replace(y)
        for old in found.linear:
            graph.erase_node(old)

    def detail(self, found: Found, context: Context) -> str:
        out, k = found.out_in()
        text = f"linear {k} -> {out} + GELU ({'tanh' if found.form == 'tanh' else 'erf'})"
        if found.route == "gemm":
            return text + " -> fullgraph's GEMM with the exact GELU"
        if found.form != epilogue_form(self.tensor(found).device):
            text += " -> tanh GELU (approximate_gelu=True: a changed function)"
        return text


def _conv1d(view: fx.Node, form: str) -> Found | str | None:
    """transformers' Conv1D (GPT-2): `torch.addmm(bias, x2d, weight).view(shape)`, weight [in, out], as a Found; a
    reason when it is one that cannot be rewritten; None for any other view."""
    mm = view.args[0] if view.args else None
    if not isinstance(mm, fx.Node) or mm.op != "call_function" or mm.target is not torch.addmm or mm.kwargs:
        return None
    if single_user(mm) is not view or len(mm.args) != 3:
        return None
    bias, x, w = (value(a) for a in mm.args)
    if not all(isinstance(t, torch.Tensor) for t in (bias, x, w)) or x.dim() != 2 or w.dim() != 2:
        return None
    if bias.dim() != 1:
        return "the bias is not one row: the epilogue adds a [out] bias"
    if not (x.dtype == w.dtype == bias.dtype) or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"dtypes {x.dtype}, {w.dtype}, {bias.dtype}: the epilogue takes one floating dtype"
    shape = static_ints(tuple(value(view).shape))
    if shape is None:
        return "the output's shape is symbolic (dynamic)"
    return Found({"input": mm.args[1], "weight": mm.args[2], "bias": mm.args[0]}, (view, mm), form,
                 stored="in, out", shape=shape)  # fmt: skip


_FORMS = {"tanh": "tanh", "none": "exact (erf)"}
REWRITE = GeluEpilogue()
