"""What "auto" runs inside a compiled graph, per op: the faster of our kernel and Inductor's code for the
native form, as measured by `fullgraph bench ops` on an H200 (benchmarks/results/ops_h200.csv, summarized
in docs/ops-benchmark.md).

- rms_norm: kernel 8% and 20% faster at 16384x4096 and 4096x3072, 4% slower at 65536x128 -> kernel.
- layer_norm: kernel faster at every shape (up to 17%) -> kernel.
- rope: kernel 15-20% faster on long rows (44% interleaved), equal at 65536x128 -> kernel.
- modulate, gated_residual: equal within 3% standalone; pointwise, so inside a real graph Inductor fuses the
  native form into its neighbours (the norm before it, the projection after it) -> native.
"""

from __future__ import annotations

# op -> "native" | "kernel"
COMPILED_CHOICE: dict[str, str] = {"rms_norm": "kernel", "layer_norm": "kernel", "rope": "kernel"}


def compiled_choice(op: str) -> str:
    """The implementation recorded as faster in a compiled graph; "native" for ops without a measurement."""
    return COMPILED_CHOICE.get(op, "native")
