"""Measurement harness: timing, memory, roofline figures, ceilings and result files."""

from fullgraph.bench.ceilings import Ceilings, measure_ceilings
from fullgraph.bench.results import Result, append_csv, make_rows, read_csv
from fullgraph.bench.roofline import attention_flops, gemm_flops, pct_of, tbps, tensor_bytes, tflops
from fullgraph.timing import Measurement, Timing, benchmark, first_call, measure, peak_memory

__all__ = [
    "Ceilings",
    "Measurement",
    "Result",
    "Timing",
    "append_csv",
    "attention_flops",
    "benchmark",
    "first_call",
    "gemm_flops",
    "make_rows",
    "measure",
    "measure_ceilings",
    "pct_of",
    "peak_memory",
    "read_csv",
    "tbps",
    "tensor_bytes",
    "tflops",
]
