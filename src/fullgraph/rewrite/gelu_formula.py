"""`gelu_formula`: a GELU written out as arithmetic (transformers' `gelu_new`, `gelu_fast`, GPT-2's activation:
`0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))`; an `erf` form) becomes `F.gelu(x, approximate=...)`,
the one op that the other rewrites and Inductor's own lowering know, so `gelu_epilogue` can put it in its GEMM.

Found by what it computes, not by how it is written: a cone of element-wise nodes over one tensor (every other
operand a number), holding a `tanh` or an `erf`, each inner node used only inside the cone, is evaluated in float64
on 2001 points over [-8, 8] and compared with the tanh and the exact GELU; within 1e-9 (relative, floor 1) it is that
GELU. Written forms that differ only in how the constants are rounded (`gelu_fast`'s 0.7978845608) are the same
function to that tolerance; QuickGELU (`x * sigmoid(1.702 x)`) and others are not, and stay as they are.

The replacement computes the same function in float32 inside its kernel, as Inductor's fused pass of the written
form does: equal up to rounding. `auto` takes it on CUDA, where `gelu_epilogue` then puts it in its GEMM. Not on the
CPU: alone it changes nothing there (transformers' GPT-2 at batch 4 x 128 tokens, fp32, 2-core CPU: 0.996x and
1.005x in two runs, the same error against float64), and the CPU's epilogue computes the exact GELU, not this tanh
one; `rewrites=["gelu_formula"]` forces it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx

from fullgraph.compile.rewrites import Context
from fullgraph.rewrite._fx import Builder, PatternRewrite, value

FUNCTIONS = {operator.mul, operator.add, operator.sub, operator.truediv, operator.neg, operator.pow, torch.mul,
             torch.add, torch.sub, torch.div, torch.pow, torch.tanh, torch.erf, torch.special.erf, torch.exp,
             torch.sqrt, torch.square, torch.sigmoid}  # fmt: skip
METHODS = {"mul", "add", "sub", "div", "neg", "pow", "tanh", "erf", "exp", "sqrt", "square", "sigmoid"}
TELLING = {torch.tanh, torch.erf, torch.special.erf, "tanh", "erf"}  # a GELU holds one of them
MAX_NODES = 16
PROBE = torch.linspace(-8.0, 8.0, 2001, dtype=torch.float64)
TOLERANCE = 1e-9


def _elementwise(n: fx.Node) -> bool:
    return (n.op == "call_function" and n.target in FUNCTIONS) or (n.op == "call_method" and n.target in METHODS)


@dataclass
class Found:
    x: fx.Node  # the tensor the GELU is of
    form: str  # "tanh" or "none" (erf)
    size: int  # element-wise nodes replaced


def _cone(out: fx.Node) -> tuple[list[fx.Node], fx.Node] | None:
    """The element-wise nodes `out` is computed from, and the one tensor they read; None past MAX_NODES nodes, with
    two tensors, or with an inner node used outside the cone."""
    cone: dict[fx.Node, None] = {}
    leaf = None
    stack = [out]
    while stack:
        n = stack.pop()
        if n in cone:
            continue
        cone[n] = None
        if len(cone) > MAX_NODES:
            return None
        for a in (*n.args, *n.kwargs.values()):
            if isinstance(a, fx.Node):
                if _elementwise(a):
                    stack.append(a)
                elif leaf is None or leaf is a:
                    leaf = a
                else:
                    return None  # a second tensor
            elif not isinstance(a, (int, float)):
                return None
    if leaf is None or any(u not in cone for n in cone if n is not out for u in n.users):
        return None
    return list(cone), leaf


def _evaluate(leaf: fx.Node, out: fx.Node) -> torch.Tensor | None:
    """`out` computed on PROBE in place of `leaf`, each node of the cone once (from its operands, depth first: no
    ordering of the whole graph, which this runs for every candidate of it)."""
    vals: dict[fx.Node, torch.Tensor] = {leaf: PROBE}

    def of(a):
        return at(a) if isinstance(a, fx.Node) else a

    def at(n: fx.Node) -> torch.Tensor:
        if n not in vals:
            args, kwargs = [of(a) for a in n.args], {k: of(v) for k, v in n.kwargs.items()}
            fn = n.target if n.op == "call_function" else getattr(args.pop(0), n.target)
            vals[n] = fn(*args, **kwargs)
        return vals[n]

    try:
        y = at(out)
    except Exception:  # not a function of one tensor after all (a shape-dependent method): no match
        return None
    return y if isinstance(y, torch.Tensor) and y.shape == PROBE.shape else None


class GeluFormula(PatternRewrite):
    name = "gelu_formula"
    measured_on = ("cuda",)

    def match(self, node: fx.Node) -> Found | None:
        if not _elementwise(node):
            return None
        found = _cone(node)
        if found is None:
            return None
        nodes, leaf = found
        x = value(leaf)
        if len(nodes) < 4 or not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return None
        if not any(n.target in TELLING for n in nodes):
            return None
        y = _evaluate(leaf, node)
        if y is None:
            return None
        for form in ("tanh", "none"):
            ref = F.gelu(PROBE, approximate=form)
            if ((y - ref).abs() / ref.abs().clamp_min(1.0)).max().item() <= TOLERANCE:
                return Found(leaf, form, len(nodes))
        return None

    def refuse(self, found: Found, context: Context) -> str | None:
        return self.not_measured(value(found.x).device, context)

    def replace(self, graph: fx.Graph, node: fx.Node, found: Found) -> None:
        b = Builder(graph, node)
        b.replace(b(F.gelu, found.x, approximate=found.form))

    def detail(self, found: Found, context: Context) -> str:
        form = "tanh" if found.form == "tanh" else "exact (erf)"
        return f"{found.size} element-wise nodes computing the {form} GELU -> F.gelu"


REWRITE = GeluFormula()
