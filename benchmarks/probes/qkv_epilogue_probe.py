"""Probe (issue 13): the DiT's q/k RMSNorm + RoPE as the epilogue of the QKV GEMM, one kernel of our own, against
what the compiled DiT runs now: cuBLAS's addmm, then `qk_norm_rope`'s kernel over q and k.

At 4096 tokens on the H200 the stack runs at its power cap, where a memory-bound pass costs 2-3x its kernel time
(benchmarks/results/dit_clocks_h200.txt, ninth session). The q/k pass reads and writes 100 MB a block, ~30 us, so
its removal is worth ~60-90 us a block at the cap: the fused GEMM pays if it is at most that much slower than
cuBLAS's GEMM (~319 us per block in the graph at 4096 tokens). This probe times both standalone (CUDA graphs,
inputs and weights rotating past L2) over a few tiles, and checks numerics against float64.

The kernel: one program per (BLOCK_M rows, one head's D = 128 columns) of the [tokens, 3 * heads * D] output, so a
q or k tile holds whole heads: bias, RMSNorm over D, the norm weight and the rotate-half RoPE are applied to the
float32 accumulator, and q, k, v are stored as three contiguous [tokens, heads, D] tensors (attention's layout).

Usage (GPU):  PYTHONPATH=src python3 benchmarks/probes/qkv_epilogue_probe.py [--tokens 4096]
CPU numerics: TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/probes/qkv_epilogue_probe.py --check
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch
import torch.nn.functional as F

from fullgraph import env
from fullgraph.kernels._library import require_triton
from fullgraph.kernels.rope import qk_norm_rope_fwd
from fullgraph.models.dit import rotate_half_rope
from fullgraph.ops import rope_tables

# (BLOCK_M, BLOCK_K, num_warps, num_stages, GROUP_M): the probe's tiles; BLOCK_N is the head dim
TILES = [(128, 64, 8, 3, 8), (128, 64, 8, 4, 8), (128, 64, 4, 4, 8), (256, 64, 8, 3, 8), (64, 64, 4, 4, 8),
         (128, 128, 8, 3, 8)]  # fmt: skip


@functools.cache
def _kernel():
    triton, tl = require_triton()

    @triton.jit
    def fullgraph_qkv_norm_rope(
        X, W, BIAS, QW, KW, COS, SIN, OUT,
        M, K, n_tok, stride_xm, stride_wn, stride_cos, stride_sin, eps,
        HEADS: tl.constexpr, D: tl.constexpr, HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, UPCAST: tl.constexpr,
    ):  # fmt: skip
        # grouped order: GROUP_M row blocks walk all 3 * HEADS column blocks together, so x's rows stay in L2
        pid = tl.program_id(0)
        in_group = GROUP_M * 3 * HEADS
        first_m = (pid // in_group) * GROUP_M
        size_m = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % size_m
        pid_n = (pid % in_group) // size_m
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, D)
        rk = tl.arange(0, BLOCK_K)
        m_ok = rm < M
        x_ptr = X + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
        w_ptr = W + (pid_n * D + cols)[None, :].to(tl.int64) * stride_wn + rk[:, None]
        acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = (k0 + rk) < K
            a = tl.load(x_ptr, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(w_ptr, mask=k_ok[:, None], other=0.0)
            if UPCAST:  # the interpreter's tl.dot multiplies bf16 bit patterns (triton-lang/triton#11584)
                a, b = a.to(tl.float32), b.to(tl.float32)
            acc = tl.dot(a, b, acc)
            x_ptr += BLOCK_K
            w_ptr += BLOCK_K
        if HAS_BIAS:
            acc += tl.load(BIAS + pid_n * D + cols).to(tl.float32)[None, :]
        which = pid_n // HEADS  # 0: q, 1: k, 2: v (v is stored as the GEMM gives it)
        head = pid_n % HEADS
        if which < 2:
            w = tl.load(tl.where(which == 0, QW, KW) + cols).to(tl.float32)
            rstd = tl.rsqrt(tl.sum(acc * acc, axis=1) / D + eps)
            acc = acc * rstd[:, None] * w[None, :]
            # rotate-half RoPE: channel j pairs with j + D / 2, at the token's position in its sequence
            pair = tl.arange(0, D // 2)
            pos = (rm % n_tok).to(tl.int64)
            cos = tl.load(COS + pos[:, None] * stride_cos + pair[None, :], mask=m_ok[:, None], other=0.0)
            sin = tl.load(SIN + pos[:, None] * stride_sin + pair[None, :], mask=m_ok[:, None], other=0.0)
            lo, hi = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, D // 2)), (0, 2, 1)))
            rot = tl.join(lo * cos - hi * sin, hi * cos + lo * sin)  # [BLOCK_M, D / 2, 2]
            acc = tl.reshape(tl.permute(rot, (0, 2, 1)), (BLOCK_M, D))
        out = OUT + (which.to(tl.int64) * M + rm[:, None]) * (HEADS * D) + head * D + cols[None, :]
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=m_ok[:, None])

    return fullgraph_qkv_norm_rope


def fused(x, w, bias, qw, kw, cos, sin, eps, heads, n_tok, tile=TILES[0]):
    """x [M, K], w [3 * heads * D, K] -> out [3, M, heads * D]: q and k normed and rotated, v as is."""
    triton, _ = require_triton()
    m, k = x.shape
    d = w.shape[0] // (3 * heads)
    out = torch.empty((3, m, heads * d), dtype=x.dtype, device=x.device)
    block_m, block_k, warps, stages, group = tile
    _kernel()[(triton.cdiv(m, block_m) * 3 * heads,)](
        x, w, w if bias is None else bias, qw, kw, cos, sin, out, m, k, n_tok, x.stride(0), w.stride(0),
        cos.stride(0), sin.stride(0), eps, HEADS=heads, D=d, HAS_BIAS=bias is not None, BLOCK_M=block_m,
        BLOCK_K=block_k, GROUP_M=group, UPCAST=env.triton_interpret() and x.dtype != torch.float32, num_warps=warps,
        num_stages=stages,
    )  # fmt: skip
    return out


def unfused(x, w, bias, qw, kw, cos, sin, eps, heads, n_tok):
    """What the compiled DiT runs: addmm, then one pass of q/k RMSNorm + RoPE; (q, k, v) as [B, N, heads, D]."""
    qkv = F.linear(x.view(-1, n_tok, x.shape[-1]), w, bias)
    q, k, v = qkv.unflatten(-1, (3, heads, -1)).unbind(2)
    q, k = qk_norm_rope_fwd.launcher(q, k, qw, kw, cos, sin, eps, eps, False, 1)
    return q, k, v


def reference(x, w, bias, qw, kw, cos, sin, eps, heads, n_tok):
    """float64: [3, M, heads * D], the plain twin's norms and rotate-half RoPE over each sequence of n_tok rows."""
    x, w = x.double(), w.double()
    qkv = x @ w.T + (bias.double() if bias is not None else 0)
    m, d = x.shape[0], w.shape[0] // (3 * heads)
    q, k, v = qkv.view(m // n_tok, n_tok, 3, heads, d).unbind(2)  # each [B, N, H, D]: M is whole sequences
    q, k = (
        rotate_half_rope(F.rms_norm(t, (d,), g.double(), eps), cos.double(), sin.double())
        for t, g in ((q, qw), (k, kw))
    )
    return torch.stack([t.reshape(m, heads * d) for t in (q, k, v)])


def rel_err(got, want: torch.Tensor) -> float:
    """Relative (Frobenius) error of `got` ([3, M, heads * D], or the (q, k, v) of `unfused`) against `want`."""
    if isinstance(got, tuple):
        got = torch.stack([t.reshape(want.shape[1], -1) for t in got])
    return ((got.double() - want).norm() / want.norm()).item()


def inputs(m, k, heads, d, n_tok, device, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)

    x, w, bias = rnd(m, k), rnd(3 * heads * d, k, scale=k**-0.5), rnd(3 * heads * d, scale=0.1)
    qw, kw = rnd(d, scale=0.5) + 1, rnd(d, scale=0.5) + 1
    return x, w, bias, qw, kw, *rope_tables(n_tok, d, device=device)


def check() -> int:
    """Numerics on odd shapes (rows not a multiple of BLOCK_M, K not a multiple of BLOCK_K, two sequences)."""
    worst = 0.0
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for m, k, n_tok in ((40, 48, 20), (33, 80, 33)):
            args = inputs(m, k, 2, 32, n_tok, "cpu", dtype)
            want = reference(*args, 1e-6, 2, n_tok)
            err = rel_err(fused(*args, 1e-6, 2, n_tok, tile=(16, 32, 4, 1, 2)), want)
            worst = max(worst, err / tol)
            worst = max(worst, rel_err(unfused(*args, 1e-6, 2, n_tok), want) / tol)  # what the DiT runs now
            print(f"{dtype!s:15} M={m} K={k} tokens/seq={n_tok}: rel err {err:.2e} (tol {tol:.0e})")
    print("ok" if worst <= 1 else "FAILED")
    return 0 if worst <= 1 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--check", action="store_true", help="numerics against float64 (CPU: TRITON_INTERPRET=1)")
    args = ap.parse_args()
    if args.check:
        return check()
    from fullgraph.bench import measure, tflops

    n, dim, heads = args.tokens, 3072, 24
    sets = [inputs(n, dim, heads, dim // heads, n, "cuda", torch.bfloat16, seed=i) for i in range(3)]  # > L2
    eps, flop = 1e-6, 2 * n * dim * 3 * dim
    want = reference(*sets[0], eps, heads, n)
    base_err = rel_err(unfused(*sets[0], eps, heads, n), want)
    print(f"[{n}, {dim}] x [{dim}, {3 * dim}] bf16, {heads} heads of {dim // heads}; 3 input sets rotating")
    rows = {
        "cuBLAS addmm alone": lambda *a: F.linear(a[0], a[1], a[2]),
        "addmm + qk_norm_rope (now)": lambda *a: unfused(*a, eps, heads, n),
    }
    for tile in TILES:
        rows[f"fused {tile}"] = functools.partial(lambda t, *a: fused(*a, eps, heads, n, tile=t), tile)
    times = {}
    for name, fn in rows.items():
        try:
            times[name] = measure(fn, rotate=sets, inner=len(sets), reps=20, graph=True).median_ms
        except Exception as e:  # a tile that does not compile (shared memory, registers)
            print(f"{name:34} {type(e).__name__}: {str(e)[:80]}")
            continue
        err = ""
        if name.startswith("fused"):
            err = f"rel err {rel_err(fn(*sets[0]), want):.2e} (unfused {base_err:.2e})"
        now = times.get("addmm + qk_norm_rope (now)", float("nan"))
        print(f"{name:34} {times[name] * 1e3:7.1f} us {tflops(flop, times[name]):6.0f} TFLOP/s "
              f"now/this {now / times[name]:.3f}  {err}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
