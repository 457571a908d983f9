"""Sweep rows-per-program and warps for the row kernels (RMSNorm) on the GPU; prints the best per shape.

Used to choose `row_launch_config`'s heuristic. Run: PYTHONPATH=src python3 benchmarks/tune_rows.py

With --dit TOKENS, the DiT's two fused kernels at that token count instead (dim 3072, 24 heads of 128, bf16,
batch 1), through the library's launchers with `row_launch_config` pinned per point: `layer_norm_modulate` with the
gated residual (read x and h, write s and y) and `qk_norm_rope` (q and k as views of the QKV GEMM's output), each
against the measured copy ceiling. The compiled DiT spends 0.358 ms of kernel time in 13 of these at 4096 tokens,
3.49 TB/s (benchmarks/results/dit_h200.txt, ninth session), where the copy ceiling puts the floor at ~0.29 ms.
"""

import math
import sys

import torch

from fullgraph.bench import measure, tbps
from fullgraph.kernels import rms_norm, rope
from fullgraph.kernels._library import row_pieces

SHAPES = [(16384, 4096), (4096, 3072), (65536, 128), (8192, 16384)]


def pinned_config(modules, rows: int, warps: int) -> None:
    """`row_launch_config` of each module pinned to (its row pieces, `rows`, `warps`): the library's launchers then
    run the point being timed."""
    for module in modules:
        module.row_launch_config = lambda n_cols, n_rows: (row_pieces(n_cols), rows, warps)


def sweep(r: int, c: int) -> None:
    block = sum(row_pieces(c))
    nbytes = 2 * r * c * 2
    n_sets = max(2, math.ceil(240e6 / nbytes))
    sets = [
        (torch.randn(r, c, device="cuda", dtype=torch.bfloat16), torch.randn(c, device="cuda", dtype=torch.bfloat16))
        for _ in range(n_sets)
    ]
    rows_options = [rows for rows in (1, 2, 4, 8, 16, 32, 64) if 512 <= rows * block <= 32768]

    def call_for(rows, warps):
        pinned_config([rms_norm], rows, warps)
        return lambda x, w: rms_norm.rms_norm_fwd.launcher(x, w, 1e-6)

    sweep_configs(f"{r}x{c}", call_for, sets, nbytes, block, rows_options, (1, 2, 4, 8, 16, 32))


def sweep_configs(label, call_for, sets, nbytes, block, rows_options, warps_options, copy=None) -> None:
    """Time `call_for(rows, warps)` (a callable taking one input set) at every point that gives each thread a
    column, one CSV row each (label, rows, warps, us, TB/s[, share of the copy ceiling]), then the best point."""
    results = []
    for rows in rows_options:
        for warps in warps_options:
            if warps * 32 > rows * block:
                continue
            try:
                t = measure(call_for(rows, warps), rotate=sets, inner=len(sets), reps=20, graph=True)
            except Exception as e:  # a config that does not compile (registers) is skipped
                print(f"# {label} rows={rows} warps={warps}: {type(e).__name__}", file=sys.stderr)
                continue
            bw = tbps(nbytes, t.median_ms)
            results.append((t.median_ms, rows, warps))
            share = "" if copy is None else f",{bw / copy:.3f}"
            print(f"{label},{rows},{warps},{t.median_ms * 1e3:.1f},{bw:.3f}{share}", flush=True)
    best = min(results)
    print(f"# best {label}: rows={best[1]} warps={best[2]} {tbps(nbytes, best[0]):.3f} TB/s", flush=True)


def main() -> int:
    if "--dit" in sys.argv:
        return sweep_dit(int(sys.argv[sys.argv.index("--dit") + 1]))
    saved = rms_norm.row_launch_config
    print("shape,rows,warps,us,tbps")
    try:
        for r, c in SHAPES:
            sweep(r, c)
    finally:
        rms_norm.row_launch_config = saved
    return 0


def sweep_dit(tokens: int, dim: int = 3072, heads: int = 24) -> int:
    """The two fused kernels at the DiT's shapes, each (rows, warps) pinned through `row_launch_config`."""
    from fullgraph.bench.ceilings import ceilings_for
    from fullgraph.kernels.layer_norm import layer_norm_modulate_residual_fwd
    from fullgraph.kernels.rope import qk_norm_rope_fwd

    dev, bf16 = "cuda", torch.bfloat16
    n_sets = 3  # each set past the 50 MB L2, so every call reads from HBM
    mod_sets = [
        (torch.randn(1, tokens, dim, device=dev, dtype=bf16), torch.randn(1, tokens, dim, device=dev, dtype=bf16),
         *(torch.randn(1, dim, device=dev, dtype=bf16) for _ in range(3)))
        for _ in range(n_sets)
    ]  # fmt: skip
    qkv_sets = [torch.randn(1, tokens, 3, heads, dim // heads, device=dev, dtype=bf16) for _ in range(n_sets)]
    cos, sin = torch.randn(tokens, dim // heads // 2, device=dev), torch.randn(tokens, dim // heads // 2, device=dev)
    w = torch.randn(dim // heads, device=dev, dtype=bf16)

    def modulate(x, h, gate, shift, scale):
        layer_norm_modulate_residual_fwd.launcher(x, h, gate, shift, scale, 1e-6)

    def qk(qkv):
        qk_norm_rope_fwd.launcher(qkv[:, :, 0], qkv[:, :, 1], w, w, cos, sin, 1e-6, 1e-6, False, 1)

    copy = ceilings_for(dev).get("copy_tbps", float("nan"))
    print(f"# copy ceiling {copy:.3f} TB/s; DiT {tokens} tokens, dim {dim}, {heads} heads")
    print("kernel,rows,warps,us,tbps,of_copy")
    cases = [
        ("layer_norm_modulate_residual", rms_norm, modulate, mod_sets, 4 * tokens * dim * 2, dim, (1, 2, 4)),
        ("qk_norm_rope", rope, qk, [(t,) for t in qkv_sets], 4 * tokens * dim * 2, dim // heads, (4, 8, 16, 32, 64)),
    ]
    saved = rms_norm.row_launch_config, rope.row_launch_config
    try:
        for name, module, fn, sets, nbytes, width, rows_options in cases:

            def pinned(rows, warps, module=module, fn=fn):
                pinned_config([module], rows, warps)
                return fn

            sweep_configs(name, pinned, sets, nbytes, sum(row_pieces(width)), rows_options, (1, 2, 4, 8, 16), copy)
    finally:
        rms_norm.row_launch_config, rope.row_launch_config = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
