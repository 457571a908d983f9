"""Does our GEMM with the exact GELU (`fullgraph.kernels.gemm_gelu`) beat what a compiled graph runs without it, with
which tile, and where? Over transformer MLP shapes (fc1: K = the model width, N = 4 x K) and row counts (tokens x
batch), bf16, per shape, interleaved rounds of:

- `compiled native`: `torch.compile(lambda x: F.gelu(F.linear(x, w, b)))`: cuBLAS's GEMM with the bias, then
  Inductor's GELU pass (what timm's, BERT's and ConvNeXt's MLPs run today; the baseline, 1.00);
- `cuBLASLt tanh`: `torch._addmm_activation(b, x, w.t(), use_gelu=True)`, the tanh form's epilogue (another function:
  what a fused epilogue reaches, for scale);
- `ours BMxBNxBK wW sS`: our kernel with each candidate tile.

Each in two modes: `default` (launched one by one: CUDA events over repeated calls) and `graphed` (replayed from a
CUDA graph, as under reduce-overhead: no launch cost). Then:
1. the tile per row count: for each row count, the tile with the best geometric mean of speed over the widths
   (`CONFIGS` in `kernels/gemm_gelu.py` is keyed by rows; printed as a table to paste there);
2. the decision per (width, rows, mode) with that tile: `kernel` where it beats compiled native by more than
   MIN_GAIN, else `native`; `--write-decisions FILE` merges them into a decision file as op `linear_gelu_erf`
   (docs/decisions.md: what `auto` of the `gelu_epilogue` rewrite reads). The GEMM and its GELU are the pattern
   itself, compiled as a graph: the op between its real neighbours.
Every output is checked against float64 first (the run exits 1 past bf16's tolerance).

Run (H200, ~6-8 min for the default grid: 6 widths x 6 row counts, one Triton compile per tile):
  PYTHONPATH=src python3 benchmarks/tune_gemm_gelu.py --csv $OUT/tune_gemm_gelu_h200.csv \\
      --write-decisions $OUT/decisions_gemm_gelu.json
(h200.sh step `gemm-gelu`). Then paste the CONFIGS into `kernels/gemm_gelu.py`, merge the decisions into
`src/fullgraph/ops/data/decisions.json`, and check in a model: `fullgraph bench zoo` (auto takes it where decided).
CPU smoke run (the interpreter; tiny shapes, fp16, default mode only):
  TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/tune_gemm_gelu.py --small
"""

from __future__ import annotations

import argparse
import csv
import math
import sys

import torch
import torch.nn.functional as F

import fullgraph.kernels.gemm_gelu as gg
from fullgraph.bench.suites.sweep import merge_points
from fullgraph.ops import measured
from fullgraph.timing import round_medians

WIDTHS = (96, 192, 384, 768, 1024, 1280)  # ConvNeXt-T's stages, ViT-S, ViT-B / BERT-base, ViT-L, ViT-H
ROWS = (256, 1024, 4096, 16384, 65536, 262144)  # x4 apart: each decision point speaks for rows within 2x
MODES = ("default", "graphed")
MIN_GAIN = 0.01  # our kernel must beat compiled native by this much to be chosen
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


def time_shape(m, k, tiles, device, dtype, a, failed: list[str]) -> dict[tuple[str, str], float]:
    """{(variant, mode): ms} at one shape, each the median of its round medians (`fullgraph.timing.round_medians`);
    outputs checked against float64 first."""
    torch.manual_seed(0)
    n = 4 * k
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
    b = (torch.randn(n, device=device) * 0.1).to(dtype)
    ref = F.gelu(F.linear(x.double(), w.double(), b.double()))
    native = torch.compile(lambda x: F.gelu(F.linear(x, w, b)), dynamic=False)
    fns = {"compiled native": lambda: native(x)}
    if device == "cuda":
        fns["cuBLASLt tanh"] = lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)
    fns |= {tile_name(t): (lambda t=t: ours(t, x, w, b)) for t in tiles}
    for name, fn in fns.items():  # compile, and check against float64 (the tanh form is another function)
        err = ((fn().double() - ref).norm() / ref.norm()).item()
        if name != "cuBLASLt tanh" and not err < 1e-2:
            failed.append(f"{m}x{k} {name}: relative error {err:.2e}")
    ms = {}
    for mode in MODES if device == "cuda" else MODES[:1]:  # variants interleaved per round, each mode apart
        medians = round_medians(fns, device=device, rounds=a.rounds, reps=a.reps, graph=mode == "graphed")
        ms |= {(name, mode): sorted(v)[len(v) // 2] for name, v in medians.items()}
    return ms


def speed(found: dict, variant: str, mode: str) -> float:
    """`variant`'s speed against compiled native at one shape (above 1: faster)."""
    return found[("compiled native", mode)] / found[(variant, mode)]


def choose_tiles(ms: dict, shapes, tiles, mode: str = "default") -> dict[int, tuple]:
    """Per row count, the tile with the best geometric mean of speed against compiled native over the widths."""
    chosen = {}
    for m in sorted({m for m, _ in shapes}):
        widths = [k for mm, k in shapes if mm == m]

        def score(t, m=m, widths=widths):
            return sum(math.log(speed(ms[(m, k)], tile_name(t), mode)) for k in widths)

        chosen[m] = max(tiles, key=score)
    return chosen


def configs_table(chosen: dict[int, tuple]) -> list[tuple[str, tuple]]:
    """CONFIGS rows: each measured row count's tile up to the geometric mean of it and the next."""
    rows = sorted(chosen)
    out = []
    for i, m in enumerate(rows):
        most = "1 << 62" if i == len(rows) - 1 else str(math.isqrt(m * rows[i + 1]))
        out.append((most, chosen[m]))
    return out


def decision_points(ms: dict, shapes, chosen: dict[int, tuple], modes) -> list[dict]:
    points = []
    for m, k in shapes:
        for mode in modes:
            gain = speed(ms[(m, k)], tile_name(chosen[m]), mode) - 1
            points.append({
                "op": "linear_gelu_erf", "dtype": "bf16", "head_dim": 0, "width": k, "rows": m, "mode": mode,
                "choice": "kernel" if gain > MIN_GAIN else "native",
                "source": f"benchmarks/tune_gemm_gelu.py: fc1 {m}x{k} -> {4 * k} + exact GELU, tile {chosen[m]}, "
                          f"{gain:+.1%} against cuBLAS + Inductor's GELU pass, {mode}",
            })  # fmt: skip
    return points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="model widths K (fc1: K -> 4K)")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts M (tokens x batch)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--csv")
    ap.add_argument("--write-decisions", metavar="FILE", help="merge the decisions (op linear_gelu_erf) into FILE")
    ap.add_argument("--small", action="store_true", help="CPU smoke run: tiny shapes, fp16, the interpreter")
    a = ap.parse_args()
    device = "cpu" if a.small else "cuda"
    dtype = torch.float16 if a.small else torch.bfloat16
    tiles = SMALL_TILES if a.small else TILES
    widths, rows = ((16, 32), (5, 37)) if a.small else (
        tuple(map(int, a.widths.split(","))), tuple(map(int, a.rows.split(","))))  # fmt: skip
    shapes = [(m, k) for m in rows for k in widths]
    modes = MODES if device == "cuda" else MODES[:1]
    failed: list[str] = []
    ms: dict[tuple[int, int], dict] = {}
    for i, (m, k) in enumerate(shapes):
        ms[(m, k)] = found = time_shape(m, k, tiles, device, dtype, a, failed)
        best = {mode: min(tiles, key=lambda t, mode=mode: found[(tile_name(t), mode)]) for mode in modes}
        line = "  ".join(f"{mode}: native {found[('compiled native', mode)]:.4f} ms, best "
                         f"{found[('compiled native', mode)] / found[(tile_name(best[mode]), mode)]:.3f}x "
                         f"({tile_name(best[mode]).removeprefix('ours ')})" for mode in modes)  # fmt: skip
        print(f"[{i + 1}/{len(shapes)}] rows {m:7} width {k:5}  {line}", flush=True)
    chosen = choose_tiles(ms, shapes, tiles)
    points = decision_points(ms, shapes, chosen, modes)
    print("\nCONFIGS = (  # (most rows, (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages))")
    for most, tile in configs_table(chosen):
        print(f"    ({most}, {tile}),")
    print(")\n\ndecisions (op linear_gelu_erf, the chosen tile against compiled native):")
    print(f"{'rows':>8} {'width':>6} " + " ".join(f"{mode:>16}" for mode in modes))
    for m, k in shapes:
        cells = [(p["choice"], speed(ms[(m, k)], tile_name(chosen[m]), p["mode"])) for p in points
                 if (p["rows"], p["width"]) == (m, k)]  # fmt: skip
        print(f"{m:8} {k:6} " + " ".join(f"{choice:>7} {x:7.3f}x" for choice, x in cells))
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["rows", "width", "n", "variant", "mode", "median_ms", "tflops", "speed_vs_native"])
            for (m, k), found in ms.items():
                for (name, mode), t in found.items():
                    native = found[("compiled native", mode)]
                    writer.writerow([m, k, 4 * k, name, mode, round(t, 5), round(8 * m * k * k / t / 1e9, 1),
                                     round(native / t, 4)])  # fmt: skip
    if a.write_decisions and not a.small:
        import triton

        key = (measured.gpu_name(None), measured.torch_version())
        merge_points(a.write_decisions, {key: (triton.__version__, points)})
        print(f"\n{len(points)} decision points merged into {a.write_decisions}")
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
