"""Which class a GPU kernel or a CPU op belongs to, by its name: "gemm" (GEMM and convolution), "attention",
"elementwise" (fused elementwise and reductions: Inductor's, ours, ATen's), "copy" (copies, memsets, layout
conversions) or "other". Data (name rules) first, then the functions that read them; `breakdown` uses them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_GEMM_OPS = "mm addmm bmm baddbmm matmul linear _addmm_activation addmv mv einsum _scaled_mm _int_mm"
_COPY_OPS = r"""copy_ clone contiguous _to_copy to cat stack fill_ zero_ zeros zeros_like ones full _reshape_copy
constant_pad_nd to_mkldnn _to_dense repeat \w+_copy"""
_OTHER_OPS = r"""view _unsafe_view reshape t transpose permute as_strided_? expand squeeze unsqueeze select slice narrow
unbind split\w* chunk detach alias resolve_conj resolve_neg empty\w* new_empty\w* lift_fresh flatten unflatten
_local_scalar_dense item resize_ set_ \w*index\w* gather scatter\w* sort topk nonzero unique\w* embedding randperm"""
# removed from an Inductor kernel's fused-op list, longest first: nothing left means the kernel only moves data
_FUSED_COPIES = ["_to_copy", "_unsafe_view", "constant_pad_nd", "as_strided", "transpose", "unsqueeze", "squeeze"]
_FUSED_COPIES += ["permute", "expand", "select", "slice", "clone", "copy", "view", "cat", "t"]


def _names(words: str) -> str:
    return rf"::({'|'.join(words.split())})$"


OP = re.compile(r"^\w+::[\w.]+$")  # "aten::addmm", "fullgraph::rms_norm": an op, not a kernel's name
_INDUCTOR = re.compile(r"^(?:graph_\d+_)?(?:triton|cpp)_(?:(poi|red|per|tem|for)_)?fused_?(\w*?)(?:_\d+)?$")
_KERNEL_RULES = [  # kernel names (not ops), first match wins
    (cls, re.compile(rule, re.I))
    for cls, rule in (
        ("attention", "sdpa|fmha|flash|attention|attn"),
        ("copy", "memcpy|memset|copy|nchwtonhwc|nhwctonchw|transpose|convert|tensortransform"),
        ("other", "at::native::.*(index|gather|scatter|sort|topk|embedding|nonzero|unique|radix)"),
        ("elementwise", "at::native::"),  # ATen's own kernels: elementwise, reductions, norms, softmax
        ("gemm", r"gemm|gemv|cutlass|cublas|nvjet|xmma|wgmma|conv|fprop|dgrad|wgrad|splitk|sm\d\d_"),
        ("elementwise", "elementwise|reduce|norm|softmax|gelu|silu|relu|rope|modulat|welford"),
    )
]
_OP_RULES = [  # op names ("ns::name"), first match wins
    (cls, re.compile(rule))
    for cls, rule in (
        ("attention", "attention|sdpa|flash|fmha"),
        ("gemm", _names(_GEMM_OPS) + "|conv"),
        ("copy", _names(_COPY_OPS)),
        ("other", _names(_OTHER_OPS)),
        ("elementwise", "^(aten|prims|fullgraph)::"),  # any other op of aten's or ours
        ("other", ""),
    )
]
_REDUCTION = re.compile(r"norm|softmax|sum|mean|var|std|amax|amin|max|min|reduce|welford|cumsum|prod|logsumexp")
_LAYOUT = re.compile(r"nchwtonhwc|nhwctonchw|transpose|convert|tensortransform", re.I)
ATTENTION_OP = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|fullgraph::sdpa")
CONV_OP = re.compile(_names("conv1d conv2d conv3d convolution _convolution"))  # (x, w, b, stride, padding, ...)
ITEMSIZE = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "bool": 1}
ITEMSIZE |= {"short int": 2, "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}


def inductor_kernel(name: str) -> tuple[str, str] | None:
    """(kind, fused ops) of an Inductor kernel name: "triton_poi_fused_add_gelu_3" -> ("poi", "add_gelu")."""
    m = _INDUCTOR.match(name)
    return (m.group(1) or "", m.group(2)) if m else None


def _copy_only(fused: str) -> bool:
    for op in _FUSED_COPIES:
        fused = fused.replace(op, "")
    return not fused.strip("_")


def classify(name: str, ops: Sequence[str] = ()) -> str:
    """The class of a kernel (or op) `name`; `ops` are the ops that launched it, innermost first (a fallback)."""
    if OP.match(name):
        return next(cls for cls, rule in _OP_RULES if rule.search(name))
    if found := inductor_kernel(name):
        kind, fused = found
        if kind == "tem":  # Inductor's templates: GEMM, convolution or flex attention
            return "attention" if re.search("attention|flex", fused) else "gemm"
        return "copy" if fused and _copy_only(fused) else "elementwise"
    for cls, rule in _KERNEL_RULES:
        if rule.search(name):
            return cls
    return next((classify(op) for op in ops if OP.match(op)), "other")


def is_pointwise(name: str, cls: str) -> bool:
    """An elementwise kernel that reduces nothing: what a GEMM epilogue could absorb."""
    if cls != "elementwise":
        return False
    if found := inductor_kernel(name):  # Triton says so in the name; C++ kernels only through their ops
        return found[0] == "poi" or (found[0] == "" and not _REDUCTION.search(found[1]))
    if "elementwise_kernel" in name:  # ATen's TensorIterator kernels (reductions are reduce_kernel)
        return True
    return bool(OP.match(name)) and not _REDUCTION.search(name)


def is_layout_conversion(name: str, cls: str) -> bool:
    found = inductor_kernel(name)
    if found and cls == "copy":
        return bool(re.search("clone|permute|transpose", found[1]))
    return cls == "copy" and bool(_LAYOUT.search(name))


def short_name(name: str) -> str:
    """A kernel's name without `void`, namespaces, template arguments and parameters, for a table:
    `void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>(...)` -> `CatArrayBatchedCopy`."""
    base = name.removeprefix("void ").replace("(anonymous namespace)::", "").split("<")[0].split("(")[0]
    return base.split("::")[-1].strip() or name
