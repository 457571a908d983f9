"""Does our GEMM with the exact GELU (`fullgraph.kernels.gemm_gelu`) beat what a compiled graph runs without it, and
with which tile? At the MLP shapes of ViT-S/B/L/H (fc1: K = width, N = 4 x width) and the row counts of batches 4, 64
and 256 (197 tokens; H/14: 257), bf16, per shape, interleaved rounds of:

- `compiled native`: `torch.compile(lambda x: F.gelu(F.linear(x, w, b)))`, default mode: cuBLAS's GEMM with the
  bias, then Inductor's GELU pass (what timm's MLP runs today; the baseline, 1.00);
- `cuBLASLt tanh`: `torch._addmm_activation(b, x, w.t(), use_gelu=True)`, the tanh form's epilogue (another function:
  the floor a fused epilogue reaches, for scale);
- `ours BMxBNxBK wW sS`: our kernel with each candidate tile (its launcher, outside any graph: one launch).

Prints ms, TFLOP/s and speed against the baseline per variant, each shape's best tile, the CONFIGS table that the best
tiles imply (paste it into `kernels/gemm_gelu.py`), and checks every output against float64 (the run fails past bf16's
tolerance). One kernel alone: the in-model verdict is `fullgraph bench zoo --rewrites patch_gemm,gelu_epilogue`.

Run (H200, ~2-3 min: one Triton compile per tile, ~12 shapes):
  PYTHONPATH=src python3 benchmarks/tune_gemm_gelu.py --csv $OUT/tune_gemm_gelu_h200.csv
CPU smoke run (the interpreter; tiny shapes, fp16):
  TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/tune_gemm_gelu.py --small
"""

from __future__ import annotations

import argparse
import csv
import sys

import torch
import torch.nn.functional as F

import fullgraph.kernels.gemm_gelu as gg
from fullgraph.timing import round_medians

WIDTHS = {"vit_s": 384, "vit_b": 768, "vit_l": 1024, "vit_h": 1280}
BATCHES = (4, 64, 256)
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages): shared memory (BM + BN) x BK x 2 bytes x stages
# stays within the H200's 227 KiB
TILES = (
    (64, 64, 64, 8, 4, 4),
    (64, 128, 64, 8, 4, 4),
    (128, 64, 64, 8, 4, 4),
    (128, 128, 64, 8, 4, 4),
    (128, 128, 64, 8, 8, 4),
    (64, 256, 64, 8, 4, 4),
    (128, 256, 64, 8, 8, 3),
    (256, 128, 64, 8, 8, 3),
    (128, 256, 64, 8, 8, 4),
)
SMALL_TILES = ((16, 16, 16, 2, 4, 1), (32, 32, 32, 4, 4, 1))


def tile_name(t) -> str:
    return f"ours {t[0]}x{t[1]}x{t[2]} w{t[4]} s{t[5]}"


def ours(tile, x, w, b):
    """The library's launcher with `tile` for every row count."""
    saved = gg.CONFIGS
    gg.CONFIGS = ((1 << 62, tile),)
    try:
        return gg.gemm_gelu_fwd.launcher(x, w, b)
    finally:
        gg.CONFIGS = saved


def time_shape(m, k, n, label, tiles, device, dtype, a, failed: list[str]) -> dict[str, float]:
    """Each variant's median of its round medians (ms) at one shape; outputs checked against float64 first."""
    torch.manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
    b = (torch.randn(n, device=device) * 0.1).to(dtype)
    ref = F.gelu(F.linear(x.double(), w.double(), b.double()))
    native = torch.compile(lambda x: F.gelu(F.linear(x, w, b)), dynamic=False)
    fns = {"compiled native": lambda: native(x)}
    if not a.small:
        fns["cuBLASLt tanh"] = lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)
    fns |= {tile_name(t): (lambda t=t: ours(t, x, w, b)) for t in tiles}
    for name, fn in fns.items():  # compile, and check against float64 (the tanh form is another function)
        err = ((fn().double() - ref).norm() / ref.norm()).item()
        if name != "cuBLASLt tanh" and not err < 1e-2:
            failed.append(f"{label} {name}: relative error {err:.2e}")
    medians = round_medians(fns, device=device, rounds=a.rounds, reps=a.reps)
    return {name: sorted(v)[len(v) // 2] for name, v in medians.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(WIDTHS), help="of " + ", ".join(WIDTHS))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--csv")
    ap.add_argument("--small", action="store_true", help="CPU smoke run: tiny shapes, fp16, the interpreter")
    a = ap.parse_args()
    device = "cpu" if a.small else "cuda"
    dtype = torch.float16 if a.small else torch.bfloat16
    tiles = SMALL_TILES if a.small else TILES
    shapes = [(m, 40, 24, "small") for m in (5, 37)] if a.small else [
        (batch * (257 if model == "vit_h" else 197), WIDTHS[model], 4 * WIDTHS[model], f"{model} b{batch}")
        for model in a.models.split(",") for batch in map(int, a.batches.split(","))
    ]  # fmt: skip
    rows, best, failed = [], {}, []
    for m, k, n, label in shapes:
        ms = time_shape(m, k, n, label, tiles, device, dtype, a, failed)
        base = ms["compiled native"]
        for name, t in ms.items():
            tflops = round(2 * m * k * n / t / 1e9, 1)
            rows.append({"shape": label, "m": m, "k": k, "n": n, "variant": name, "median_ms": round(t, 5),
                         "tflops": tflops, "speed_vs_native": round(base / t, 4)})  # fmt: skip
        winner = min(tiles, key=lambda t: ms[tile_name(t)])
        best[(m, label)] = (winner, base / ms[tile_name(winner)])
        speeds = "  ".join(f"{name.removeprefix('ours ')} {base / t:5.2f}x" for name, t in ms.items() if t != base)
        print(f"{label:12} m={m:6} k={k:5} n={n:5}  native {base:8.4f} ms  {speeds}", flush=True)
    print("\nbest tile per shape (speed against compiled native):")
    for (m, label), (tile, speed) in sorted(best.items()):
        print(f"  {label:12} m={m:6}  {tile}  {speed:.3f}x")
    print("\nCONFIGS by row count (each shape's best; rows up to the next measured count take the smaller's):")
    by_rows = sorted({m: tile for (m, _), (tile, _) in best.items()}.items())
    for i, (_, tile) in enumerate(by_rows):
        most = "1 << 62" if i == len(by_rows) - 1 else str(by_rows[i + 1][0] - 1)
        print(f"    ({most}, {tile}),")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
