"""`gelu_epilogue`: a linear layer whose only use is a GELU, as one GEMM with the GELU in its epilogue
(`torch._addmm_activation(bias, x, w.t(), use_gelu=True)`: cuBLASLt's GELU epilogue on CUDA).

Which GELU the epilogue computes depends on the device: the **tanh** form on CUDA, the exact (**erf**) form on the
CPU. So the rewrite is exact for `gelu(approximate="tanh")` on CUDA and for `gelu()` (erf) on the CPU. On CUDA an
exact GELU becomes the tanh form only with `fullgraph.compile(..., approximate_gelu=True)`: a changed function
(|erf GELU - tanh GELU| <= 4.7e-4 over the reals), listed as such in `stats.rewrites`. Elsewhere a skip says why.

Needs a bias (cuBLASLt's epilogue adds it) and a 2-D weight; the input is flattened to 2-D and the output shaped
back, so the leading dims must be static but the first (the batch).

`auto` takes it on CUDA (H200, timm ViT-B/16 bf16, fc1 + GELU by hand: 1.10x at batch 256 and 64 default mode,
1.04x at batch 4 reduce-overhead; issue 33). Not on the CPU, where it was not measured;
`rewrites=["gelu_epilogue"]` forces it anywhere it is exact.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fullgraph.compile.rewrites import Context
from fullgraph.rewrite._fx import Builder, PatternRewrite, call_args, single_user, static_ints, value

GELU = (torch._C._nn.gelu, torch.nn.functional.gelu)
LINEAR = (torch._C._nn.linear, torch.nn.functional.linear)


def epilogue_form(device: torch.device) -> str:
    """The GELU `torch._addmm_activation(use_gelu=True)` computes on `device`: "tanh" (CUDA) or "none" (erf)."""
    return "tanh" if device.type == "cuda" else "none"


Found = tuple[dict[str, Any], fx.Node, str]  # the linear's arguments, the linear node, the model's GELU form


class GeluEpilogue(PatternRewrite):
    name = "gelu_epilogue"

    def match(self, node: fx.Node) -> Found | str | None:
        """(the linear's arguments, the linear node, GELU form) for a GELU whose input is a linear layer used only
        by it; a reason when it is one that cannot be rewritten; None when it is no such pattern."""
        if node.op != "call_function" or node.target not in GELU:
            return None
        g = call_args(node, ("input", "approximate"), {"approximate": "none"})
        lin = g["input"] if g else None
        if not isinstance(lin, fx.Node) or lin.op != "call_function" or lin.target not in LINEAR:
            return None
        if single_user(lin) is not node:
            return None  # the linear's output is used elsewhere too: the GELU cannot take its place
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
        return a, lin, g["approximate"]

    def refuse(self, found: Found, context: Context) -> str | None:
        a, _, form = found
        device = value(a["input"]).device
        computes = epilogue_form(device)
        if form != computes and not (computes == "tanh" and context.approximate_gelu):
            want, has = (_FORMS[f] for f in (form, computes))
            fix = "; approximate_gelu=True accepts the tanh form" if computes == "tanh" else ""
            return f"the {want} GELU, where the epilogue on {device.type} computes the {has} one{fix}"
        return self.not_measured(device, context)

    def replace(self, graph: fx.Graph, node: fx.Node, found: Found) -> None:
        a, lin, _ = found
        x, w = value(a["input"]), value(a["weight"])
        n, k = w.shape
        b = Builder(graph, node)
        flat = b(torch.reshape, a["input"], (-1, k)) if x.dim() != 2 else a["input"]
        y = b(torch._addmm_activation, a["bias"], flat, b(torch.t, a["weight"]), use_gelu=True)
        if x.dim() != 2:
            y = b(torch.reshape, y, (-1, *x.shape[1:-1], n))
        b.replace(y)
        graph.erase_node(lin)

    def detail(self, found: Found, context: Context) -> str:
        a, _, form = found
        text = f"linear {tuple(value(a['weight']).shape)} + GELU ({'tanh' if form == 'tanh' else 'erf'})"
        if form != epilogue_form(value(a["input"]).device):
            text += " -> tanh GELU (approximate_gelu=True: a changed function)"
        return text


_FORMS = {"tanh": "tanh", "none": "exact (erf)"}
REWRITE = GeluEpilogue()
