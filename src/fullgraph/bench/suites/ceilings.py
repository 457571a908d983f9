"""Suite `ceilings`: the measured memory-bandwidth and GEMM ceilings that other suites report against."""

from __future__ import annotations

from fullgraph.bench.ceilings import measure_ceilings
from fullgraph.bench.results import Result, make_rows, timing_metrics
from fullgraph.bench.table import format_table


def run(args) -> tuple[list[Result], str]:
    c = measure_ceilings(
        device=args.device,
        copy_bytes=args.copy_mib << 20 if args.copy_mib else None,
        gemm_n=args.gemm_n,
        reps=args.reps,
    )
    copy_case = f"copy {c.copy_bytes >> 20} MiB"
    gemm_case = f"gemm {c.gemm_n}^3 {c.gemm_dtype}"
    rows = make_rows(
        "ceilings",
        copy_case,
        "torch.copy_",
        {**timing_metrics(c.copy_timing), "tbps": (c.copy_tbps, "TB/s")},
        {"bytes_moved": 2 * c.copy_bytes},
    ) + make_rows(
        "ceilings",
        gemm_case,
        "torch.mm",
        {**timing_metrics(c.gemm_timing), "tflops": (c.gemm_tflops, "TFLOP/s")},
        {"n": c.gemm_n, "dtype": c.gemm_dtype},
    )
    table = format_table(
        ["case", "best ms", "median ms", "p80 ms", "ceiling (best)", "unit"],
        [
            [copy_case, c.copy_timing.min_ms, c.copy_timing.median_ms, c.copy_timing.p80_ms, c.copy_tbps, "TB/s"],
            [gemm_case, c.gemm_timing.min_ms, c.gemm_timing.median_ms, c.gemm_timing.p80_ms, c.gemm_tflops, "TFLOP/s"],
        ],
    )
    return rows, table
