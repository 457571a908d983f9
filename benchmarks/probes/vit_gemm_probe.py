"""Where can ViT-B/16 at batch 256 still gain? (issue 14: 13,409 img/s measured, 14,000 wanted; 0.626 ms at batch 4,
0.60 wanted.) Each of the block's four GEMMs, alone, the ways a model can feed its residual stream, in bf16:

- `linear`: F.linear(a, W, b), cuBLASLt with its bias epilogue (what the block runs now), then `+ x` as its own
  pass (`linear+add`), the pass Inductor fuses into the next LayerNorm;
- `addmm`: torch.addmm(x, a, W.t()): the residual as cuBLAS's C (beta=1), out of place (ATen copies x first);
- `addmm_`: x.addmm_(a, W.t()): the same in place, no copy: the residual stream updated by the GEMM itself (the
  bias then has to live elsewhere: a constant per block folded into the next norm);
- `inductor`: F.linear under torch.compile(mode="max-autotune-no-cudagraphs"): Inductor's Triton templates against
  cuBLAS for that shape; `inductor-tma` the same with Inductor's persistent TMA templates on
  (`triton.enable_persistent_tma_matmul`, off by default, Hopper only), and for the residual GEMMs
  `inductor-tma+add`, F.linear(a, W, b) + x compiled so, where a Triton template that wins takes the add into its
  epilogue.

- `linear-pad64`, `linear-pad128`: F.linear on the rows padded up to a multiple of 64 or 128 (a model could carry
  pad rows through its row-wise ops): at batch 4 (788 rows) the 2026-12-02 run had proj (788x768x768, 0.9 GFLOP)
  at 16.0 µs and qkv at 17.6 against fc1 (3.7 GFLOP) at 11.5, which looks like the row count's tiling.

Prints µs, TFLOP/s and, for the memory-bound extra passes, GB/s, each variant timed under a CUDA graph of `--inner`
back-to-back calls (the graph's own launch, several µs, spread over them; the 2026-12-02 run had one call per graph,
so its small-batch times include that launch), side by side in interleaved rounds; then attention at the block's
shape per SDPA backend and ours. Needs a GPU.

Run: PYTHONPATH=src python3 benchmarks/probes/vit_gemm_probe.py [--batches 256,4] [--inner 10] [--csv F]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

from fullgraph.bench.results import append_csv, make_rows
from fullgraph.bench.table import format_table
from fullgraph.timing import measure

TOKENS, DIM, HIDDEN, HEADS = 197, 768, 3072, 12
SHAPES = {"qkv": (DIM, 3 * DIM), "proj": (DIM, DIM), "fc1": (DIM, HIDDEN), "fc2": (HIDDEN, DIM)}
RESIDUAL = ("proj", "fc2")  # the GEMMs whose output joins the residual stream
DEV = "cuda"  # --device cpu: a smoke run of the script itself (its figures mean nothing there)
INNER = 10  # calls per timed CUDA graph (--inner)


def median_rounds(fns: dict, rounds: int, reps: int) -> dict[str, float]:
    """Median of per-round medians, every variant timed under a CUDA graph (on a GPU) in each round in turn."""
    got: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            got[k].append(measure(fn, device=DEV, warmup=3, reps=reps, inner=INNER, graph=DEV == "cuda").median_ms)
    return {k: statistics.median(v) for k, v in got.items()}


def gemm_variants(m: int, k: int, n: int, residual: bool) -> dict:
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16) / k**0.5
    b = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    x = torch.randn(m, n, device=DEV, dtype=torch.bfloat16)
    mode = "max-autotune-no-cudagraphs"
    tma = {**torch._inductor.list_mode_options(mode), "triton.enable_persistent_tma_matmul": True}
    compiled = torch.compile(lambda a: F.linear(a, w, b), mode=mode)
    compiled_tma = torch.compile(lambda a: F.linear(a, w, b), options=tma)
    fns = {"linear": lambda: F.linear(a, w, b), "inductor": lambda: compiled(a)}
    for step in (64, 128):
        if m % step:
            padded = torch.randn(-(-m // step) * step, k, device=DEV, dtype=torch.bfloat16)
            fns[f"linear-pad{step}"] = lambda padded=padded: F.linear(padded, w, b)
    fns["inductor-tma"] = lambda: compiled_tma(a)
    if residual:
        with_add = torch.compile(lambda a, x: F.linear(a, w, b) + x, options=tma)
        fns["linear+add"] = lambda: F.linear(a, w, b) + x
        fns["inductor-tma+add"] = lambda: with_add(a, x)
        fns["addmm"] = lambda: torch.addmm(x, a, w.t())
        fns["addmm_"] = lambda: x.addmm_(a, w.t())
    with torch.no_grad():  # compile (and autotune) now, outside the timed rounds
        for fn in fns.values():
            fn()
    return fns


def attention_variants(batch: int) -> dict:
    from fullgraph import ops

    q, k, v = (torch.randn(batch, HEADS, TOKENS, DIM // HEADS, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    fns = {}
    for name in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "triton"):
        try:
            ops.attention(q, k, v, backend=name)
        except Exception as e:  # a backend this machine cannot run
            print(f"attention {name}: skipped ({str(e).splitlines()[0][:120]})", file=sys.stderr)
            continue
        fns[name] = lambda name=name: ops.attention(q, k, v, backend=name)
    return fns


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="256,4")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--inner", type=int, default=10, help="calls per timed CUDA graph")
    p.add_argument("--csv", default=None)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = p.parse_args()
    global DEV, INNER
    DEV, INNER = args.device, args.inner
    if DEV == "cuda" and not torch.cuda.is_available():
        print("vit_gemm_probe.py needs a CUDA GPU (--device cpu runs it as a smoke test)", file=sys.stderr)
        return 2
    table, rows = [], []
    for batch in (int(b) for b in args.batches.split(",")):
        m = batch * TOKENS
        for name, (k, n) in SHAPES.items():
            times = median_rounds(gemm_variants(m, k, n, name in RESIDUAL), args.rounds, args.reps)
            flops = 2 * m * k * n
            base = times["linear"]
            for variant, ms in times.items():
                table.append([f"b{batch}", name, f"{m}x{k}x{n}", variant, ms * 1e3, flops / ms / 1e9, base / ms])
                rows += make_rows("vit_gemm_probe", f"b{batch} {name}", variant,
                                  {"median_ms": (ms, "ms"), "tflops": (flops / ms / 1e9, "TFLOP/s")},
                                  {"batch": batch, "m": m, "k": k, "n": n})  # fmt: skip
        times = median_rounds(attention_variants(batch), args.rounds, args.reps)
        flops = 4 * batch * HEADS * TOKENS**2 * (DIM // HEADS)
        base = times.get("sdpa-cudnn") or min(times.values())
        for variant, ms in times.items():
            table.append([f"b{batch}", "attention", f"{batch}x{HEADS}x{TOKENS}x64", variant, ms * 1e3,
                          flops / ms / 1e9, base / ms])  # fmt: skip
            rows += make_rows("vit_gemm_probe", f"b{batch} attention", variant,
                              {"median_ms": (ms, "ms"), "tflops": (flops / ms / 1e9, "TFLOP/s")},
                              {"batch": batch})  # fmt: skip
    print(format_table(["batch", "op", "shape", "variant", "µs", "TFLOP/s", "linear / this"], table))
    if args.csv:
        append_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
