"""What "auto" runs inside a compiled graph, per op: our kernel only where an in-graph measurement shows it
beating Inductor's code for the native form; the native form everywhere else (the safe choice: Inductor fuses
it into its neighbours, and a GPU nobody has measured gets what plain PyTorch gets).

Standalone timings are not the measure. On an H200 our norm and RoPE kernels beat Inductor alone
(docs/ops-benchmark.md: layer_norm up to 17%, rms_norm 8-20%, rope 15-20%), yet inside a compiled DiT stack
(dim 3072, 24 heads, 4 blocks, bf16, torch 2.11; benchmarks/results/dit_inside_a_graph_h200.txt) taking them
made the model slower: at 1024 tokens plain PyTorch 1.882 ms, ours all-native 1.889, ours all-kernel 1.985,
ours with the kernels for norms and RoPE (this table's former entries) 2.052; at 4096 tokens 7.599, 7.633,
7.888 and 7.962. An opaque kernel splits the fusion Inductor makes of a norm with the modulation after it.
So no op takes its kernel in a compiled graph until `fullgraph bench dit` (or a per-pattern in-graph
benchmark) shows a win; entries here are op -> "kernel" with the measurement that justifies each.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from fullgraph import replay

# GPU name (torch.cuda.get_device_name) -> {op: "native" | "kernel"}, each entry with its in-graph measurement on
# that GPU; a GPU not listed runs every op's native form under torch.compile.
COMPILED_CHOICE: dict[str, dict[str, str]] = {
    "NVIDIA H200": {
        # `fullgraph bench dit` (torch 2.11, dim 3072, 24 heads, 4 blocks, bf16, default mode;
        # benchmarks/results/dit_h200.txt): all native but linear_gelu's kernel against all native, 1024 / 4096 /
        # 16384 tokens: 1.033x / 1.046x / 1.016x; the GELU pass leaves the GPU time (elementwise 0.223 -> 0.152 ms,
        # 0.987 -> 0.554, 3.890 -> 2.136 against the plain twin) while the GEMMs keep their time (1.381 -> 1.404 ms,
        # 5.398 -> 5.320, 21.207 -> 21.203)
        "linear_gelu": "kernel",
        # The q/k norms + RoPE in one pass, and the gated residual + LayerNorm + modulation in one pass, each against
        # Inductor's fusion of their native forms: `fullgraph bench dit --policies
        # 'all=auto,+qk_norm_rope,+layer_norm_modulate'` (benchmarks/results/dit_h200.txt, fifth session), default
        # mode, over the plain twin. At 4096 tokens, two calls: auto 1.026x / 1.034x, with qk_norm_rope's kernel
        # 1.037x / 1.044x, with layer_norm_modulate's 1.044x / 1.057x, with both 1.040x / 1.058x (GPU time 7.097 ->
        # 6.726 ms against the plain twin's 7.219). Reduce-overhead at 4096: within the noise of auto (1.042-1.055x
        # all). At 1024 tokens in default mode (benchmarks/results/dit_host_probe_h200.txt, eighth session, two
        # processes of one device call): with both kernels 1.023x / 1.055x over the plain twin against auto without
        # them 0.985x / 1.024x, GPU time 1.625 / 1.694 ms against 1.709 / 1.754 (plain 1.761 / 1.785). (The fifth
        # session's 0.849x for qk_norm_rope's kernel there came from a call whose host ran slow: plain took 2.175 ms
        # in it against 1.78-1.88 in the others; the profiler then also slows Triton's own launcher, which launches
        # these kernels, so its idle share read 24%.)
        "qk_norm_rope": "kernel",
        "layer_norm_modulate": "kernel",
        # skinny_linear (the DiT's adaLN projections, [1, 3072] x [3072, 18432]) has no entry: with its kernel the
        # stack did not beat auto at every point (benchmarks/results/dit_h200.txt, `--policies
        # 'all=auto,+skinny_linear'`, over the plain twin). Default mode: 1.091x against auto's 1.069x at 1024
        # tokens, 1.038x against 1.043x at 4096 (eighth session, first tile 16 x 512); 1.026x against 1.028x at
        # 16384 (ninth, tile 8 x 128). Reduce-overhead (ninth, 8 x 128): 1.003x against 1.042x at 1024, 1.028x
        # against 1.040x at 4096. Standalone it reads the weight at 3.12 TB/s against cuBLAS's 1.95
        # (benchmarks/results/gemv_probe_h200.txt); in the graph the GEMV is ~2% of a call at 4096 tokens.
    },
}

# GPU name -> {op: the main input's element count from which a "kernel" entry above applies}; below it the native
# form. For linear_gelu that input is x, rows x in_features. On the H200 the fused GEMM (cuBLASLt with an epilogue)
# costs more host time per call than addmm + GELU compiled by Inductor: timm-weight ViT-B/16 at batch 4 in default
# mode (x: 788 x 768 = 0.6M elements, host-bound) ran 3.619 ms with it against 2.490 ms without, while under CUDA
# graphs it was faster (0.626 against 0.675 ms; benchmarks/results/vit_probe_h200.txt). The smallest measured win
# in default mode is the DiT's x at 1024 tokens (1024 x 3072 = 3.1M elements: 0.970x against 0.940x plain), so
# the line sits between: 2**21. The floor is host time, which CUDA graphs pay once at capture: code traced for a
# model compiled to replay CUDA graphs (reduce-overhead, `fullgraph.replay`) takes the kernel at every size.
# qk_norm_rope and layer_norm_modulate (input: the block's tokens x, rows x dim): measured winning from 1024 x 3072
# (3.1M elements) up; the line just below the smallest win, 2**21, as linear_gelu's.
COMPILED_KERNEL_MIN_NUMEL: dict[str, dict[str, int]] = {
    "NVIDIA H200": {"linear_gelu": 1 << 21, "qk_norm_rope": 1 << 21, "layer_norm_modulate": 1 << 21}
}


# GPU name -> {op: the main input's element count up to which the op's kernel beats its native form inside a graph
# that replays from CUDA graphs}; only there (`fullgraph.replay`: the launches' host time is paid once, at capture),
# for ops whose native form is the choice otherwise. attention (input: q, B x H x N x D): timm-weight ViT-B/16 at
# batch 4 (q 4x12x197x64 = 605K elements) under perception ran 0.570 ms with our kernel against 0.615 ms with
# torch's SDPA (cuDNN, plus a memset node per call) in the same call, 90 kernels against 102
# (benchmarks/results/vit_h200.txt, sixth session); at batch 256 (38.7M elements) our kernel lost inside the graph
# (2.77 against 2.13 ms of attention). Unmeasured between: the line sits just above the win, 2**20.
GRAPHED_KERNEL_MAX_NUMEL: dict[str, dict[str, int]] = {"NVIDIA H200": {"attention": 1 << 20}}


# Eager `auto` on a GPU takes the kernel only from this many elements of the main input up: below it a call is
# host-bound and the kernel's launch path (a Python launcher, Triton's argument handling) costs more than the GPU
# time it saves. On the H200 host (torch 2.11, triton 3.6; benchmarks/results/eager_overhead_h200.txt) the native
# form was faster per call at every size measured, 4x128 to 4096x3072 bf16 (kernel / native 2.4-2.8x, calls back to
# back); a kernel call costs ~41 us of host time against ~15 us for the native one, so the kernel can only pay once
# the native form's GPU time passes that: about 50M bf16 elements at 4.8 TB/s, hence 2**26. Under the Triton
# interpreter (CPU tests) the kernel always runs, as speed means nothing there.
EAGER_KERNEL_MIN_NUMEL: dict[str, int] = {"cuda": 1 << 26}

# Device type -> {op: its own floor}, replacing the one above for an op whose native form takes several launches
# where its kernel takes one, so that the kernel's one launch costs less host time than the native form's several
# at every size. The two fused ops of a DiT block: native, qk_norm_rope is two RMSNorms and eight elementwise
# launches and layer_norm_modulate up to five, each kernel one launch. The eager DiT stack (dim 3072, 4 blocks,
# bf16) at 1024 tokens on the H200 (benchmarks/results/dit_host_probe_h200.txt, eighth session): auto with the
# device floor alone 1.034x plain eager (2.720 against 2.812 ms, 135 kernels per call against 171), with both fused
# kernels 1.126x (2.497 ms, 60 kernels), with linear_gelu's epilogue too 1.134x (2.480 ms, 56 kernels): its floor
# as in compiled code.
EAGER_KERNEL_MIN_NUMEL_BY_OP: dict[str, dict[str, int]] = {
    "cuda": {"qk_norm_rope": 0, "layer_norm_modulate": 0, "linear_gelu": 1 << 21}
}


def eager_floor(device_type: str, op: str | None = None) -> int:
    """The main input's element count from which eager `auto` takes `op`'s kernel on `device_type`."""
    own = EAGER_KERNEL_MIN_NUMEL_BY_OP.get(device_type)
    if own and op in own:
        return own[op]
    return EAGER_KERNEL_MIN_NUMEL.get(device_type, 0)


def eager_kernel_pays(device_type: str, numel: int, op: str | None = None) -> bool:
    """Is an eager input of `numel` elements on `device_type` big enough for `auto` to take `op`'s kernel (any op's,
    for None: the device's floor)?"""
    return numel >= eager_floor(device_type, op)


def eager_size_class(device_type: str, numel: int) -> int:
    """How many of `device_type`'s eager floors `numel` reaches: inputs of one class get the same eager choices."""
    floors = {EAGER_KERNEL_MIN_NUMEL.get(device_type, 0), *EAGER_KERNEL_MIN_NUMEL_BY_OP.get(device_type, {}).values()}
    return sum(numel >= f for f in floors)


def compiled_choice(op: str, device: torch.device | None = None, numel: int | None = None) -> str:
    """The implementation measured as faster inside a compiled graph on `device`'s GPU for a main input of `numel`
    elements; "native" for ops, devices and sizes without a measurement."""
    if device is None or device.type != "cuda":
        return "native"
    return with_floor(*table_entry(op, device.type, device.index), numel)


def graphed_kernel_fits(op: str, device: torch.device, numel: int | torch.SymInt) -> bool:
    """Does GRAPHED_KERNEL_MAX_NUMEL put `op`'s kernel ahead for a main input of `numel` elements in the code traced
    now? Only when that code replays from CUDA graphs, and only when `numel` is known (without a guard, as in
    `known_at_least`) to be within the entry."""
    if device.type != "cuda" or not replay.under_graphs():
        return False
    cap = GRAPHED_KERNEL_MAX_NUMEL.get(gpu_name(device.index), {}).get(op)
    return cap is not None and bool(statically_known_true(numel <= cap))


def with_floor(choice: str, floor: int | None, numel: int | torch.SymInt | None) -> str:
    """A table entry's choice for a main input of `numel` elements: "native" for a kernel below its size floor,
    unless the code traced now replays from CUDA graphs (the floor is host time, `fullgraph.replay`)."""
    if choice == "kernel" and floor is not None and not known_at_least(numel, floor) and not replay.under_graphs():
        return "native"
    return choice


def table_entry(op: str, device_type: str, index: int | None) -> tuple[str, int | None]:
    """(choice, size floor or None) of `op` on this device from the tables above, the floor not yet applied."""
    if device_type != "cuda":
        return "native", None
    name = gpu_name(index)
    return COMPILED_CHOICE.get(name, {}).get(op, "native"), COMPILED_KERNEL_MIN_NUMEL.get(name, {}).get(op)


def known_at_least(numel: int | torch.SymInt | None, floor: int) -> bool:
    """Is `numel` known to be at least `floor` for every size the graph serves? A symbolic size (a dynamic dim) is
    decided without a guard (`statically_known_true`, which Dynamo evaluates against the dim's range), since a guard
    would specialize the dim: a ConstraintViolationError under a declared range, a recompile per size otherwise.
    When the range does not settle it, the answer is no and the op takes the native form, the safe choice."""
    if numel is None:
        return False
    return bool(statically_known_true(numel >= floor))


_names: dict[int | None, str] = {}


@torch.compiler.assume_constant_result
def gpu_name(index: int | None) -> str:
    """The CUDA device's name (the current device for None), a constant to torch.compile."""
    if index not in _names:
        _names[index] = torch.cuda.get_device_name(index)
    return _names[index]
