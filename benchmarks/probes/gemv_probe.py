"""The DiT's adaLN projection at batch 1 is a GEMV that reads the whole weight once ([1, 3072] x [3072, 18432] bf16:
113 MB per block), so its floor is HBM bandwidth. cuBLAS (`F.linear`) ran it at ~3.3 TB/s on the H200 inside the
compiled DiT (34.5 us a block, benchmarks/results/dit_kernels_1024_default_h200.txt). This probe times the
`skinny_linear` kernel (one program per BLOCK_N output rows, the K loop in BLOCK_K chunks, float32 accumulation) on
one row over a sweep of tile shapes against `F.linear` on the same weights, and checks its output against float64.
Weights rotate over enough copies to exceed the L2 cache. (Its H200 run, benchmarks/results/gemv_probe_h200.txt,
timed a standalone copy of the same one-row kernel, written before the op; `kernels/skinny_linear.py` took its
best tile.)

Usage (GPU): PYTHONPATH=src python3 benchmarks/probes/gemv_probe.py [--shapes 3072x18432,3072x6144] [--reps 50]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F

import fullgraph.kernels.skinny_linear as skinny
from fullgraph.bench.ceilings import ceilings_for
from fullgraph.kernels._library import call_kernel
from fullgraph.timing import measure


def run(x, w, b, block_n, block_k, warps, stages):
    """The library's kernel (`kernels/skinny_linear.py`) on one row of x with this tile for one row."""
    saved = skinny.CONFIGS[1]
    skinny.CONFIGS[1] = (block_n, block_k, warps, stages)
    try:
        return call_kernel(skinny.skinny_linear_fwd, x[None], w, b)[0]  # the eager path: no wrap_triton
    finally:
        skinny.CONFIGS[1] = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="3072x18432,3072x6144", help="KxN: in_features x out_features")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    ceiling = ceilings_for(dev).get("copy_tbps")
    print(f"measured copy ceiling: {ceiling} TB/s")
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        copies = max(2, int(200e6 // (n * k * 2)) + 1)  # > 2x the 50 MB L2 per rotation
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        bs = [torch.randn(n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(k, device=dev, dtype=torch.bfloat16)
        sets = [(x, w, b) for w, b in zip(ws, bs, strict=True)]
        moved = n * k * 2
        ref = F.linear(x[None].double(), ws[0].double(), bs[0].double())[0]
        base = measure(lambda x, w, b: F.linear(x[None], w, b), device=dev, reps=args.reps, rotate=sets).median_ms
        print(f"\n[1, {k}] x [{k}, {n}] bf16 ({moved / 1e6:.0f} MB): F.linear {base * 1e3:.1f} us "
              f"({moved / base / 1e9:.2f} TB/s)")  # fmt: skip
        results = []
        for bn, bk, warps, stages in itertools.product((4, 8, 16, 32), (128, 256, 512), (4, 8), (1, 3)):
            if bn * bk > 16384:
                continue
            try:
                out = run(x, ws[0], bs[0], bn, bk, warps, stages)
            except Exception as e:  # a tile that does not fit: skip it, say why
                print(f"  {bn}x{bk} w{warps} s{stages}: {type(e).__name__}")
                continue
            err = ((out.double() - ref).norm() / ref.norm()).item()
            t = measure(lambda x, w, b, c=(bn, bk, warps, stages): run(x, w, b, *c), device=dev, reps=args.reps,
                        rotate=sets).median_ms  # fmt: skip
            results.append((t, bn, bk, warps, stages, err))
        results.sort()
        for t, bn, bk, warps, stages, err in results[:8]:
            print(f"  BLOCK_N {bn:3d} BLOCK_K {bk:4d} warps {warps} stages {stages}: {t * 1e3:6.1f} us "
                  f"({moved / t / 1e9:.2f} TB/s, {base / t:.2f}x F.linear), rel err {err:.1e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
