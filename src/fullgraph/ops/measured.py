"""What "auto" runs inside a compiled graph, per op: the faster of our kernel and Inductor's code for the
native form, as measured by `fullgraph bench ops` on the H200 (see docs/ops-benchmark.md and the CSV it
cites). Ops not listed fall back to "native", letting Inductor fuse them with their neighbours.
"""

from __future__ import annotations

# op -> "native" | "kernel"
COMPILED_CHOICE: dict[str, str] = {}


def compiled_choice(op: str) -> str:
    return COMPILED_CHOICE.get(op, "native")
