"""`patch_gemm`: a convolution whose stride equals its kernel, without padding, dilation or groups (a ViT's patch
embedding, ConvNeXt's and Swin's stems and downsampling layers) as one GEMM over the image's patches.

`conv2d(x, w, b, stride=k)` with x [B, C, H, W], w [O, C, kh, kw], k = (kh, kw), H and W multiples of kh, kw:

    patches = x.reshape(B, C, H/kh, kh, W/kw, kw).permute(0, 2, 4, 1, 3, 5).reshape(B*H/kh*W/kw, C*kh*kw)
    y = linear(patches, w.reshape(O, C*kh*kw), b).reshape(B, H/kh, W/kw, O).permute(0, 3, 1, 2)

The result has the convolution's shape [B, O, H/kh, W/kw] and values, stored channels-last: the usual next step,
`.flatten(2).transpose(1, 2)`, is then a view. In bf16 / fp16 it equals the convolution up to the order of the
accumulation (both accumulate in fp32).

fp32 on a GPU: cuDNN runs convolutions in TF32 when `torch.backends.cudnn.allow_tf32` is on (the default), a matmul
only when `torch.backends.cuda.matmul.allow_tf32` is (off by default). Rewriting would then trade the TF32
convolution for a full-fp32 GEMM: slower and more accurate, another precision than the user asked for. So in fp32
on a GPU the rewrite applies only where the two settings agree, and says why it skipped otherwise.

`auto` takes it on CUDA where it was measured in kind (issue 33), and `rewrites=["patch_gemm"]` forces it anywhere:
- patch embeddings of images, patches of 4x4 or larger over at most 4 channels: ViT, DeiT, CLIP and torchvision's ViT
  stems (H200, timm ViT-B/16 bf16, applied by hand: 1.09x at batch 256 default mode, 1.14x at 64, 1.16x at batch 4
  reduce-overhead; H100, `bench zoo`: ViT-S/16 and DeiT-S 1.02-1.27x), ConvNeXt's and Swin's 4x4 stems;
- 2x2 downsampling of feature maps of at most 384 channels, ConvNeXt's (H100, torch 2.11, bf16, `bench zoo --rewrites
  patch_gemm`, results/zoo_convnext_swin_patch_forced_h100.csv: convnext_tiny, its stem and three downsamplings,
  1.02-1.13x over batches 4 and 128 and both modes; swin_tiny, its stem only, 0.99-1.03x, within its noise).
Not wider feature maps or larger kernels over them, nor anything on the CPU: not measured.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fullgraph.compile.rewrites import Context
from fullgraph.rewrite._fx import Builder, PatternRewrite, call_args, static_ints, value

CONV2D = (torch.conv2d, torch.nn.functional.conv2d)
NAMES = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def _pair(v: Any) -> tuple[int, ...] | None:
    ints = static_ints(v)
    if ints is None:
        return None
    return ints * 2 if len(ints) == 1 else ints


Found = tuple[dict[str, Any], str]  # the convolution's arguments, what it becomes
# Where `auto` takes it: what was measured in kind (module docstring). An image: at most IMAGE_CHANNELS channels in
# patches of IMAGE_KERNEL or larger. A feature map: 2x2 patches over at most MAP_CHANNELS channels (the patch gather
# is a full copy of it; ConvNeXt-T's 96-384 measured).
IMAGE_CHANNELS, IMAGE_KERNEL = 4, 4
MAP_KERNEL, MAP_CHANNELS = 2, 384


def measured(channels: int, kh: int, kw: int) -> bool:
    """Whether a patch convolution of this kind was measured to win (module docstring)."""
    if channels <= IMAGE_CHANNELS:
        return min(kh, kw) >= IMAGE_KERNEL
    return kh == kw == MAP_KERNEL and channels <= MAP_CHANNELS


def _precision_reason(x: torch.Tensor) -> str | None:
    """Why fp32 on a GPU keeps its convolution (module docstring), or None."""
    if x.dtype != torch.float32 or x.device.type != "cuda":
        return None
    conv_tf32 = torch.backends.cudnn.allow_tf32
    mm_tf32 = torch.backends.cuda.matmul.allow_tf32
    if conv_tf32 == mm_tf32:
        return None
    conv, mm = ("TF32" if conv_tf32 else "full fp32"), ("TF32" if mm_tf32 else "full fp32")
    return (f"fp32: convolutions run {conv} here and matmuls {mm} (torch.backends.cudnn.allow_tf32, "
            "torch.backends.cuda.matmul.allow_tf32); set them alike to rewrite")  # fmt: skip


class PatchGemm(PatternRewrite):
    name = "patch_gemm"

    def match(self, node: fx.Node) -> Found | str | None:
        """(the arguments, a description) where `node` is a patch convolution; a reason when it is one that cannot
        be rewritten soundly; None when it is no patch convolution at all."""
        if node.op != "call_function" or node.target not in CONV2D:
            return None
        a = call_args(node, NAMES, DEFAULTS)
        if a is None:
            return None
        x, w = value(a["input"]), value(a["weight"])
        if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)) or x.dim() != 4 or w.dim() != 4:
            return None
        kernel = static_ints(tuple(w.shape[2:]))
        stride, dilation = _pair(a["stride"]), _pair(a["dilation"])
        padding = a["padding"]
        if kernel is None or stride != kernel or kernel == (1, 1):
            return None
        if padding not in ("valid", 0, (0, 0), [0, 0]) or dilation != (1, 1) or a["groups"] != 1:
            return None
        size = static_ints(tuple(x.shape[1:]))
        if size is None:
            return "the image's channels or size are symbolic (dynamic)"
        c, h, wd = size
        kh, kw = kernel
        if h % kh or wd % kw:
            return f"the image ({h}x{wd}) is not a whole number of {kh}x{kw} patches"
        return a, f"GEMM over {h // kh}x{wd // kw} patches of {c}x{kh}x{kw} -> {w.shape[0]}"

    def refuse(self, found: Found, context: Context) -> str | None:
        x, w = value(found[0]["input"]), value(found[0]["weight"])
        why = _precision_reason(x) or self.not_measured(x.device, context)
        if why or context.forced:
            return why
        kh, kw = w.shape[2:]
        if not measured(x.shape[1], kh, kw):
            return (f"auto: measured on patch embeddings of images (at most {IMAGE_CHANNELS} channels, patches of "
                    f"{IMAGE_KERNEL}x{IMAGE_KERNEL} or larger) and on 2x2 downsampling of at most {MAP_CHANNELS} "
                    f"channels, not on {x.shape[1]} channels in {kh}x{kw} (rewrites=['patch_gemm'] forces "
                    "it)")  # fmt: skip
        return None

    def replace(self, graph: fx.Graph, node: fx.Node, found: Found) -> None:
        a = found[0]
        x, w = value(a["input"]), value(a["weight"])
        c, h, wd = x.shape[1:]
        o, _, kh, kw = w.shape
        hp, wp = h // kh, wd // kw
        b = Builder(graph, node)
        patches = b(torch.reshape, a["input"], (-1, c, hp, kh, wp, kw))
        patches = b(torch.permute, patches, (0, 2, 4, 1, 3, 5))
        patches = b(torch.reshape, patches, (-1, c * kh * kw))
        weight = b(torch.reshape, a["weight"], (o, c * kh * kw))
        y = b(torch._C._nn.linear, patches, weight, a["bias"])
        y = b(torch.reshape, y, (-1, hp, wp, o))
        b.replace(b(torch.permute, y, (0, 3, 1, 2)))

    def detail(self, found: Found, context: Context) -> str:
        return found[1]


REWRITE = PatchGemm()
