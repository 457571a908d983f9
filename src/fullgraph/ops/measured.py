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

# op -> "native" | "kernel", each entry with its in-graph measurement (none yet: see the module docstring)
COMPILED_CHOICE: dict[str, str] = {}


# Eager `auto` on a GPU takes the kernel only from this many elements of the main input up: below it a call is
# host-bound and the kernel's launch path (a Python launcher, Triton's argument handling) costs more than the
# GPU time it saves; the native form is torch's own op there. Measured with benchmarks/eager_overhead.py
# (`--sizes`); under the Triton interpreter (CPU tests) the kernel always runs, as speed means nothing there.
EAGER_KERNEL_MIN_NUMEL: dict[str, int] = {"cuda": 1 << 16}


def eager_kernel_pays(device_type: str, numel: int) -> bool:
    """Is an eager input of `numel` elements on `device_type` big enough for `auto` to take the kernel?"""
    return numel >= EAGER_KERNEL_MIN_NUMEL.get(device_type, 0)


def compiled_choice(op: str) -> str:
    """The implementation measured as faster inside a compiled graph; "native" for ops without a measurement."""
    return COMPILED_CHOICE.get(op, "native")
