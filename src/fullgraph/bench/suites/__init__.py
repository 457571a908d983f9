"""Benchmark suites: each module has `run(args) -> (rows, table)`; `fullgraph bench` declares their arguments."""

import torch

from fullgraph.errors import UsageError

# --dtype names shared by the suites
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_sizes(flag: str, spec: str, example: str) -> tuple[int, ...]:
    """`--seqs 197,1024`-style lists of positive ints; anything else is one error naming the flag and an example."""
    try:
        sizes = tuple(int(s) for s in spec.split(",") if s.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise UsageError(f"{flag}: cannot read {spec!r}; write {example}")
    return sizes
