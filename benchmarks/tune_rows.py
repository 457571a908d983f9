"""Sweep rows-per-program and warps for the row kernels (RMSNorm) on the GPU; prints the best per shape.

Used to choose `row_launch_config`'s heuristic. Run: PYTHONPATH=src python3 benchmarks/tune_rows.py
"""

import functools
import math
import sys

import torch

from fullgraph.bench import measure, tbps
from fullgraph.kernels.rms_norm import _row_norm_fwd_kernel

SHAPES = [(16384, 4096), (4096, 3072), (65536, 128), (8192, 16384)]


def launch(kernel, y, rows, warps, x, w):
    n, c = x.shape
    block = 1 << (c - 1).bit_length()
    kernel[((n + rows - 1) // rows,)](
        x, x, w, x, y, y, n, c, c, c, c, c, 1e-6,
        CENTER=False, HAS_RESIDUAL=False, HAS_WEIGHT=True, HAS_BIAS=False, ROWS=rows, BLOCK_N=block, num_warps=warps,
    )  # fmt: skip


def sweep(kernel, r: int, c: int) -> None:
    block = 1 << (c - 1).bit_length()
    nbytes = 2 * r * c * 2
    n_sets = max(2, math.ceil(240e6 / nbytes))
    sets = [
        (torch.randn(r, c, device="cuda", dtype=torch.bfloat16), torch.randn(c, device="cuda")) for _ in range(n_sets)
    ]
    y = torch.empty(r, c, device="cuda", dtype=torch.bfloat16)
    results = []
    for rows in (1, 2, 4, 8, 16, 32, 64):
        if not 512 <= rows * block <= 32768:
            continue
        for warps in (1, 2, 4, 8, 16, 32):
            if warps * 32 > rows * block:
                continue
            call = functools.partial(launch, kernel, y, rows, warps)
            try:
                t = measure(call, rotate=sets, inner=n_sets, reps=20, graph=True)
            except Exception as e:  # a config that does not compile (registers) is skipped
                print(f"# {r}x{c} rows={rows} warps={warps}: {type(e).__name__}", file=sys.stderr)
                continue
            results.append((t.median_ms, rows, warps))
            print(f"{r}x{c},{rows},{warps},{t.median_ms * 1e3:.1f},{tbps(nbytes, t.median_ms):.3f}")
    best = min(results)
    print(f"# best {r}x{c}: rows={best[1]} warps={best[2]} {tbps(nbytes, best[0]):.3f} TB/s", flush=True)


def main() -> int:
    kernel = _row_norm_fwd_kernel()
    print("shape,rows,warps,us,tbps")
    for r, c in SHAPES:
        sweep(kernel, r, c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
