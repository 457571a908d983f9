"""The DiT's adaLN projection at batch 1 is a GEMV that reads the whole weight once ([1, 3072] x [3072, 18432] bf16:
113 MB per block), so its floor is HBM bandwidth. cuBLAS (`F.linear`) ran it at ~3.3 TB/s on the H200 inside the
compiled DiT (34.5 us a block, benchmarks/results/dit_kernels_1024_default_h200.txt). This probe times a plain Triton
GEMV (one program per BLOCK_N output rows, the K loop in BLOCK_K chunks, float32 accumulation, optional SiLU of x on
load) over a sweep of tile shapes against `F.linear` on the same weights, and checks its output against float64.
Weights rotate over enough copies to exceed the L2 cache. A probe, not yet an op: it says whether the op would pay.

Usage (GPU): PYTHONPATH=src python3 benchmarks/gemv_probe.py [--shapes 3072x18432,3072x6144] [--reps 50]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F

from fullgraph.bench.ceilings import ceilings_for
from fullgraph.timing import measure


def build():
    import triton
    import triton.language as tl

    @triton.jit
    def gemv(x_ptr, w_ptr, b_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SILU: tl.constexpr):
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
            if SILU:
                x = x * tl.sigmoid(x)
            w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
            acc += w.to(tl.float32) * x[None, :]
        y = tl.sum(acc, axis=1) + tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)

    def run(x, w, b, block_n, block_k, warps, stages, silu=False):
        n, k = w.shape
        y = torch.empty(n, device=x.device, dtype=x.dtype)
        grid = (triton.cdiv(n, block_n),)
        gemv[grid](x, w, b, y, n, k, BLOCK_N=block_n, BLOCK_K=block_k, SILU=silu, num_warps=warps, num_stages=stages)
        return y

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="3072x18432,3072x6144", help="KxN: in_features x out_features")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    run = build()
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
