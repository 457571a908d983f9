"""Benchmark suites: each module has `run(args) -> (rows, table)`; `fullgraph bench` declares their arguments."""

import torch

# --dtype names shared by the suites
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
