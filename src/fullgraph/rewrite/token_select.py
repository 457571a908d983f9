"""`token_select`: a model that reads one token of its last tokens (`x[:, 0]`: a ViT's class token, timm's
`global_pool="token"`, torchvision's `x[:, 0]`) computes that token alone through the row-wise layers before it.

A token's LayerNorm, linear layers, activations and residual additions are its own: the rows of the other tokens
feed only the token that the head reads through attention, as keys and values. So where a graph selects one token
at the end, every row-wise node whose result is used only toward that selection is computed for that token alone,
and the selection moves up to where the row-wise region begins (the attention's output, the stream entering the last
block). In a ViT that is the last block's output projection, MLP and norms, and the final norm: for ViT-B/16 about
three quarters of the last block's GEMMs (its fused QKV GEMM stays whole: keys and values need every token), about
6% of the model's. Our own ViT does the same (`fullgraph.models.vit`, `Block.forward(first_only=True)`).

Row-wise, for a [B, N, C] tensor with N tokens in dim 1: `linear`, a LayerNorm or RMSNorm over the last dim,
element-wise activations (GELU, ReLU, SiLU, tanh, sigmoid, dropout), and +, -, * and / whose other operand is a
number, a tensor of at most one dim, another [B, N, C] tensor of the region, or a [B, 1, C] tensor (broadcast along
the tokens). A node joins the region only when every one of its uses is in the region; anything else (attention,
a reshape, a node the graph returns) is where the selection moves to. Values are those of the full computation up
to accumulation order (a GEMM of B rows instead of B x N).

`auto` takes it on CUDA and on the CPU: it removes work and adds none (the same launches, fewer rows each). On the
2-core CPU (torch 2.13, fp32, a ViT-S/16-like model written as timm's, `dev` preset, interleaved rounds, plain again
0.98-1.00x): 12 blocks 1.049x at batch 8 and 1.039x at batch 1, 4 blocks 1.178x at batch 8. On the H200 it comes
with the zoo. `rewrites=[...]` forces it wherever it is sound.
"""

from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from fullgraph.compile.rewrites import Context
from fullgraph.rewrite._fx import Builder, PatternRewrite, call_args, static_ints, value
from fullgraph.rewrite.norms import last_dim_layer_norm

LINEAR = (torch._C._nn.linear, F.linear)
UNARY = {torch._C._nn.gelu, F.gelu, F.relu, torch.relu, F.silu, torch.tanh, torch.sigmoid, F.dropout,
         operator.neg}  # fmt: skip
BINARY = {operator.add, operator.sub, operator.mul, operator.truediv, torch.add, torch.sub, torch.mul}
RMS_NORM = tuple(f for f in (getattr(torch, "rms_norm", None), getattr(F, "rms_norm", None)) if f is not None)


@dataclass
class Found:
    x: fx.Node  # the [B, N, C] tensor one token is read from
    index: int  # the token read
    tokens: int  # N
    region: list[fx.Node]  # the row-wise nodes computed for that token alone, in graph order


def _selected(node: fx.Node) -> tuple[fx.Node, int] | None:
    """(x, i) for `x[:, i]`, `x[:, i, :]` or `x.select(1, i)` of a 3-D x with a static token count; else None."""
    if node.op == "call_function" and node.target is operator.getitem and len(node.args) == 2:
        x, index = node.args
        whole = slice(None, None, None)
        if not isinstance(index, tuple) or len(index) not in (2, 3) or index[0] != whole:
            return None
        if len(index) == 3 and index[2] != whole:
            return None
        i = index[1]
    elif node.op == "call_method" and node.target == "select" and len(node.args) == 3 and node.args[1] == 1:
        x, _, i = node.args
    else:
        return None
    v = value(x)
    if not isinstance(x, fx.Node) or not isinstance(v, torch.Tensor) or v.dim() != 3 or type(i) is not int:
        return None
    return (x, i) if type(v.shape[1]) is int else None


def _has_tokens(arg: Any, n: int) -> bool:
    v = value(arg)
    return isinstance(arg, fx.Node) and isinstance(v, torch.Tensor) and v.dim() == 3 and v.shape[1] == n


def _broadcast_free(arg: Any) -> bool:
    """An operand that a row-wise node may keep as it is: a number, or a tensor of at most one dim."""
    if not isinstance(arg, fx.Node):
        return isinstance(arg, (int, float, bool))
    v = value(arg)
    return isinstance(v, torch.Tensor) and v.dim() <= 1


def _one_token(arg: Any) -> bool:
    """A [B, 1, C] operand, broadcast along the tokens: it loses its token dim with the selection."""
    v = value(arg)
    return isinstance(arg, fx.Node) and isinstance(v, torch.Tensor) and v.dim() == 3 and v.shape[1] == 1


def _token_inputs(node: fx.Node, n: int) -> list[fx.Node] | None:
    """The inputs with N tokens of a row-wise `node` (its row-wise operands); None if `node` is not row-wise over a
    [B, N, C] output."""
    if node.op != "call_function" or not _has_tokens(node, n):
        return None
    target, args = node.target, node.args
    if target in LINEAR:
        a = call_args(node, ("input", "weight", "bias"), {"bias": None})
        ok = a is not None and _has_tokens(a["input"], n) and value(a["weight"]).dim() == 2
        return [a["input"]] if ok else None
    normed = _last_dim_norm_input(node)
    if normed is not None:
        return [normed] if _has_tokens(normed, n) else None
    if target in UNARY:
        extra = [a for a in (*args[1:], *node.kwargs.values()) if isinstance(a, fx.Node)]
        return [args[0]] if args and _has_tokens(args[0], n) and not extra else None
    if target in BINARY and len(args) == 2 and not node.kwargs:
        if not all(_has_tokens(a, n) or _broadcast_free(a) or _one_token(a) for a in args):
            return None
        return [a for a in args if _has_tokens(a, n)]
    return None


def _last_dim_norm_input(node: fx.Node) -> Any:
    """The input of a LayerNorm (`rewrite.norms.last_dim_layer_norm`) or an RMSNorm over its input's last dim; None
    for any other node."""
    a = last_dim_layer_norm(node)
    if a is None and node.target in RMS_NORM:
        a = call_args(node, ("input", "normalized_shape", "weight", "eps"), {"weight": None, "eps": None})
        x = value(a["input"]) if a else None
        width = static_ints(x.shape[-1]) if isinstance(x, torch.Tensor) and x.dim() else None
        a = a if width is not None and static_ints(a["normalized_shape"]) == width else None
    return None if a is None else a["input"]


class TokenSelect(PatternRewrite):
    name = "token_select"
    measured_on = ("cuda", "cpu")

    def match(self, node: fx.Node) -> Found | None:
        sel = _selected(node)
        if sel is None:
            return None
        x, index = sel
        n = value(x).shape[1]
        if n < 2:
            return None
        order = {m: i for i, m in enumerate(node.graph.nodes)}
        region: set[fx.Node] = set()
        heap, seen = [(-order[x], id(x), x)], {x}
        while heap:  # latest first: every use of a node is decided before the node
            _, _, m = heapq.heappop(heap)
            if not all(u is node or u in region for u in m.users):
                continue
            inputs = _token_inputs(m, n)
            if inputs is None:
                continue
            region.add(m)
            for a in inputs:
                if a not in seen:
                    seen.add(a)
                    heapq.heappush(heap, (-order[a], id(a), a))
        if not region:
            return None
        return Found(x, index, n, sorted(region, key=order.__getitem__))

    def refuse(self, found: Found, context: Context) -> str | None:
        return self.not_measured(value(found.x).device, context)

    def replace(self, graph: fx.Graph, node: fx.Node, found: Found) -> None:
        one: dict[fx.Node, fx.Node] = {}  # a node of the region, or a boundary, -> its value for the one token
        i = found.index

        def mapped(arg: Any, anchor: fx.Node) -> Any:
            if not isinstance(arg, fx.Node):
                return arg
            if arg not in one:
                if _has_tokens(arg, found.tokens):  # a boundary: the selection moves here
                    one[arg] = Builder(graph, anchor)(operator.getitem, arg, (slice(None), i))
                elif _one_token(arg):  # broadcast along the tokens: its one row
                    one[arg] = Builder(graph, anchor)(operator.getitem, arg, (slice(None), 0))
                else:
                    return arg
            return one[arg]

        for m in found.region:
            args = tuple(mapped(a, m) for a in m.args)
            kwargs = {k: mapped(v, m) for k, v in m.kwargs.items()}
            one[m] = Builder(graph, m)(m.target, *args, **kwargs)
        Builder(graph, node).replace(one[found.x])

    def detail(self, found: Found, context: Context) -> str:
        linears = sum(m.target in LINEAR for m in found.region)
        return (f"token {found.index} of {found.tokens} computed alone through {len(found.region)} row-wise nodes "
                f"({linears} linear)")  # fmt: skip


REWRITE = TokenSelect()
