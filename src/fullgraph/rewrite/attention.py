"""`attention_kernel`: `F.scaled_dot_product_attention` in a third-party graph, run by our attention kernel
(`torch.ops.fullgraph.flash_attention`, `fullgraph.kernels.flash_attention`) where op `attention`'s policy and its
measured dispatch say so: one vocabulary with our own ops (`fullgraph.ops.policy(attention=...)`).

- policy `native`: never (also when forced by name).
- policy `kernel`, or `rewrites=["attention_kernel"]`: wherever our kernel can serve the call (`serve_reason`: no
  mask, causal only for square attention, head dim <= 256, a GPU or the CPU under Triton's interpreter).
- `auto` (the default): where `fullgraph.ops.attention`'s compiled dispatch (`compiled_auto`) picks our kernel for
  this call: today only in code replayed from CUDA graphs, in bf16/fp16, at the head dims it was measured at (64,
  128), with q up to 2^20 elements on the H200 (`ops/measured.py`, GRAPHED_KERNEL_MAX_NUMEL: timm-weight ViT-B/16
  at batch 4 under perception, 0.570 ms with it against 0.615 with torch's SDPA), for non-causal attention with
  as many key/value heads as query heads (what was measured: a decoder's causal or grouped-query attention was
  not); everywhere else torch's SDPA stays.

Left alone: dropout (training), an argument that is symbolic or not a plain value, and a q/k/v that requires grad
(our kernel has no backward: call the model under `torch.no_grad()` or `torch.inference_mode()`, as a server does).
Our kernel returns [B, H, N, D] stored as [B, N, H, D], so a model's `.transpose(1, 2).reshape(B, N, H * D)`
after it is a view. The policy is read when the graph compiles.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from fullgraph.compile.rewrites import Context
from fullgraph.ops import measured
from fullgraph.ops.attention import compiled_auto
from fullgraph.ops.attention_backends import Spec, serve_reason
from fullgraph.rewrite._fx import Builder, call_args, static_ints, value
from fullgraph.rewrite._ops import OpKernelRewrite

SDPA = (torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention)
NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
Found = tuple[dict[str, Any], Spec]


def spec_from(q: torch.Tensor, k: torch.Tensor, mask: Any, causal: bool) -> Spec | None:
    """The dispatch's `Spec` for example values q [B, Hq, Nq, D], k [B, Hkv, Nk, D]: lengths -1 where symbolic,
    square when known equal (one symbol for both in self-attention); None when a head count or D is symbolic."""
    heads = static_ints((q.shape[1], k.shape[1], q.shape[3]))
    if heads is None:
        return None
    nq, nk = (n if type(n) is int else -1 for n in (q.shape[2], k.shape[2]))
    square = bool(statically_known_true(q.shape[2] == k.shape[2]))
    kind = "none" if mask is None else "bool" if mask.dtype == torch.bool else "float"
    dtype = str(q.dtype).removeprefix("torch.")
    return Spec(q.device.type, q.device.index, dtype, heads[0], heads[1], heads[2], nq, nk, square, causal, kind)


class AttentionKernel(OpKernelRewrite):
    name = "attention_kernel"
    op = "attention"

    def match(self, node: fx.Node) -> Found | str | None:
        if node.op != "call_function" or node.target not in SDPA:
            return None
        a = call_args(node, NAMES, DEFAULTS)
        if a is None:
            return None
        q, k, v, mask = (value(a[n]) for n in ("query", "key", "value", "attn_mask"))
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
            return None
        if q.dtype not in FLOATS or not (q.dtype == k.dtype == v.dtype):
            return None
        if a["dropout_p"] != 0.0:
            return f"dropout_p={a['dropout_p']}: attention dropout (training) runs in torch's SDPA"
        if not isinstance(a["is_causal"], bool) or not (a["scale"] is None or isinstance(a["scale"], float)):
            return None
        if mask is not None and not isinstance(mask, torch.Tensor):
            return None
        if any(t.requires_grad for t in (q, k, v)):
            return "q, k or v requires grad: our kernel has no backward (call the model under torch.no_grad())"
        if k.shape[1] != q.shape[1] and not a["enable_gqa"]:
            return None  # SDPA itself refuses unequal head counts without enable_gqa
        spec = spec_from(q, k, mask, a["is_causal"])
        if spec is None:
            return "a head count or the head dim is symbolic (dynamic)"
        return a, spec

    def tensor(self, found: Found) -> torch.Tensor:
        return value(found[0]["query"])

    def cannot_serve(self, found: Found) -> str:
        why = serve_reason("triton", *found[1])
        return f"our kernel cannot serve this call: {why}" if why else ""

    def auto_refusal(self, found: Found) -> str | None:
        """The compiled dispatch's own choice (`compiled_auto`), for what was measured in a graph."""
        spec = found[1]
        if spec.causal or spec.hq != spec.hkv:
            return "auto: causal and grouped-query attention were not measured in a graph (policy kernel forces it)"
        q = self.tensor(found)
        fit = measured.graphed_kernel_fits("attention", q.device, q.numel())
        if compiled_auto(spec, q.device, fit) == "triton":
            return None
        return ("auto: torch's SDPA here (our kernel is measured ahead only in code replayed from CUDA graphs, "
                "bf16/fp16, head dim 64 or 128, q up to 2^20 elements, on the H200); policy(attention='kernel') "
                "forces it")  # fmt: skip

    def replace(self, graph: fx.Graph, node: fx.Node, found: Found) -> None:
        import fullgraph.kernels.flash_attention  # noqa: F401 - registers torch.ops.fullgraph.flash_attention

        a, spec = found
        scale = 1.0 / math.sqrt(spec.d) if a["scale"] is None else a["scale"]
        b = Builder(graph, node)
        op = torch.ops.fullgraph.flash_attention.default
        b.replace(b(op, a["query"], a["key"], a["value"], a["is_causal"], scale))

    def detail(self, found: Found, context: Context) -> str:
        _, s = found
        heads = f"{s.hq} heads" if s.hq == s.hkv else f"{s.hq}/{s.hkv} heads (GQA)"
        causal = ", causal" if s.causal else ""
        return f"SDPA {heads} of {s.d} ({s.dtype}{causal}) -> fullgraph's flash attention (Triton)"


REWRITE = AttentionKernel()
