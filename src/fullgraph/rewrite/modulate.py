"""`layer_norm_modulate_kernel`: adaLN modulation of a LayerNorm in a third-party graph (DiT's `modulate(norm(x),
shift, scale)`, diffusers' `norm(x) * (1 + scale[:, None]) + shift[:, None]`, PixArt's `t2i_modulate`), run as our
one-pass kernel (`torch.ops.fullgraph.layer_norm_modulate`, `fullgraph.ops.layer_norm_modulate`) where op
`layer_norm_modulate`'s policy says so: one vocabulary with our own ops (`fullgraph.ops.policy(...)`).

The pattern: y = LN(x) * (1 + scale) + shift (either operand order in each op), the LayerNorm over the last dim
without weight or bias (`nn.LayerNorm(C, elementwise_affine=False)`, as adaLN uses it), each intermediate used only
by the next op, x [B, N, C] or [B, T, S, C], shift and scale of one shape, [B, 1, C] or [B, T, 1, C] (one row of C
per batch element or frame), all one dtype.

- policy `kernel`, or `rewrites=["layer_norm_modulate_kernel"]`: wherever the kernel runs (a GPU, or the CPU under
  Triton's interpreter).
- policy `native`: never.
- `auto` (the default): where the in-graph decision data (`fullgraph.ops.measured`, docs/decisions.md) holds a
  point close to this call, keyed as our own DiT's: GPU, torch, dtype, the model's attention head dim (read from
  the graph's `scaled_dot_product_attention` calls; 0 when it has none, which no point matches), the width C and
  the row count within 2x. On the H200 the data says kernel for the dim-3072 / head-dim-128 DiT shape and native
  for DiT-XL/2's 1152 / 72 (issue 32); every other shape runs native.

Our kernel computes in float32 and rounds once to x's dtype, where the native ops round after each op: results
equal up to rounding (closer to a float64 reference in bf16).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

import fullgraph.ops.modulation  # noqa: F401 - registers the kernel op and its backward (from the native form)
from fullgraph.compile.rewrites import Context
from fullgraph.rewrite._fx import Builder, single_user, static_ints, value
from fullgraph.rewrite._ops import OpKernelRewrite
from fullgraph.rewrite.attention import SDPA
from fullgraph.rewrite.norms import LAYER_NORM, last_dim_layer_norm

ADD = (operator.add, torch.add)
MUL = (operator.mul, torch.mul)


class Found(dict):
    """x, shift, scale, eps, and the nodes the rewrite replaces (norm, product)."""


def binary(node: Any, targets: tuple) -> tuple[Any, Any] | None:
    """(a, b) of a plain two-operand `a + b` / `a * b` node (no alpha, no out), else None."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target not in targets:
        return None
    if len(node.args) != 2 or node.kwargs:
        return None
    return node.args


def one_plus(node: Any) -> Any:
    """`scale` of a node computing 1 + scale (or scale + 1), else None."""
    pair = binary(node, ADD)
    if pair is None:
        return None
    a, b = pair
    if type(a) in (int, float) and a == 1:
        return b
    if type(b) in (int, float) and b == 1:
        return a
    return None


def same_size(a: Any, b: Any) -> bool:
    return bool(statically_known_true(a == b))


def param_form(p: Any, x: torch.Tensor) -> bool:
    """Is `p` one row of C per batch element ([B, 1, C] for x [B, N, C]) or per frame ([B, T, 1, C] for x
    [B, T, S, C]), decided without a guard on a symbolic batch?"""
    if not isinstance(p, torch.Tensor) or p.dim() != x.dim() or p.dtype != x.dtype:
        return False
    if static_ints(p.shape[-2:]) != (1, x.shape[-1]):  # x's width: static (checked before)
        return False
    return all(same_size(a, b) for a, b in zip(p.shape[:-2], x.shape[:-2], strict=True))


def head_dim(graph: fx.Graph) -> int:
    """The head dim of the graph's attention (its SDPA calls' q), 0 when it has none or several."""
    dims = set()
    for node in graph.nodes:
        if node.op == "call_function" and node.target in SDPA and node.args:
            q = value(node.args[0])
            if isinstance(q, torch.Tensor) and q.dim() == 4:
                dims.add(q.shape[-1])
    return dims.pop() if len(dims) == 1 and type(next(iter(dims))) is int else 0


class LayerNormModulateKernel(OpKernelRewrite):
    name = "layer_norm_modulate_kernel"
    op = "layer_norm_modulate"

    def match(self, node: fx.Node) -> Found | str | None:
        pair = binary(node, ADD)
        if pair is None:
            return None
        for product, shift in (pair, pair[::-1]):
            found = self._match(node, product, shift)
            if found is not None:
                return found
        return None

    def _match(self, node: fx.Node, product: Any, shift: Any) -> Found | str | None:
        factors = binary(product, MUL)
        if factors is None or single_user(product) is not node:
            return None
        for norm, plus in (factors, factors[::-1]):
            scale = one_plus(plus)
            if scale is None or not isinstance(norm, fx.Node) or norm.target not in LAYER_NORM:
                continue
            a = last_dim_layer_norm(norm)
            if a is None or single_user(norm) is not product or not isinstance(a["eps"], float):
                return None
            x = value(a["input"])
            if x.dim() not in (3, 4):
                return None
            if a["weight"] is not None or a["bias"] is not None:
                return "the LayerNorm has a weight or bias: the fused kernel normalizes without affine (adaLN's)"
            if not (param_form(value(shift), x) and param_form(value(scale), x)):
                return None
            if value(shift).shape != value(scale).shape:
                return None
            return Found(x=a["input"], shift=shift, scale=scale, eps=a["eps"], norm=norm, product=product)
        return None

    def tensor(self, found: Found) -> torch.Tensor:
        return value(found["x"])

    def head_dim(self, found: Found) -> int:
        return head_dim(found["norm"].graph)

    def replace(self, graph: fx.Graph, node: fx.Node, found: Found) -> None:
        b = Builder(graph, node)
        op = torch.ops.fullgraph.layer_norm_modulate.default
        b.replace(b(op, found["x"], found["shift"], found["scale"], float(found["eps"])))
        graph.erase_node(found["product"])
        graph.erase_node(found["norm"])

    def detail(self, found: Found, context: Context) -> str:
        x = value(found["x"])
        dtype = str(x.dtype).removeprefix("torch.")
        return f"LayerNorm over {x.shape[-1]} + modulation ({dtype}) -> fullgraph's kernel"


REWRITE = LayerNormModulateKernel()
