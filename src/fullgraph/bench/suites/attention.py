"""Suite `attention`: every attention backend that can serve each point, side by side, and what `auto` chose.

Points follow the two model families of the design: ViT-like (12 heads, head dim 64) and DiT-like (24 heads,
head dim 128), at sequence lengths 197, 1024, 4096 and 16384, causal and not, bf16. Each backend is timed
on the same inputs by CUDA-graph replay (device time, as `auto` measures it: eager dispatch costs, which
torch.compile and CUDA graphs remove, would otherwise decide the short points); TFLOP/s counts attention's
two products (halved when causal), and is compared with the bf16 GEMM ceiling measured in the same run.
Outputs are checked against the math backend in float32 where that fits in memory (N <= 4096).
"""

from __future__ import annotations

import torch

from fullgraph.bench.ceilings import measure_ceilings
from fullgraph.bench.results import Result, make_rows, timing_metrics
from fullgraph.bench.roofline import attention_flops, pct_of, tflops
from fullgraph.bench.suites import DTYPES, parse_sizes, rel_err
from fullgraph.bench.table import format_table
from fullgraph.ops.attention import BACKENDS, attention, attention_choice
from fullgraph.ops.attention_backends import serve_reason, spec_of
from fullgraph.timing import measure, resolve_device

GPU_SEQS = (197, 1024, 4096, 16384)
CPU_SEQS = (77,)
FAMILIES = ((12, 64), (24, 128))  # (heads, head dim)
CHECK_MAX_N = 4096  # the float32 math reference holds B*H*N*N scores
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def batch_for(n: int) -> int:
    """Enough sequences per call to fill the GPU at short lengths (ViT batch ~20 at 197 tokens)."""
    return max(1, 4096 // n)


def parse_seqs(spec: str | None, gpu: bool) -> tuple[int, ...]:
    if not spec:
        return GPU_SEQS if gpu else CPU_SEQS
    return parse_sizes("--seqs", spec, "lengths like 197,1024")


def run(args) -> tuple[list[Result], str]:
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    dtype = DTYPES[args.dtype]
    gemm = measure_ceilings(device, copy_bytes=64 << 20, reps=args.reps).gemm_tflops if gpu else None
    rows: list[Result] = []
    table = []
    for seq in parse_seqs(args.seqs, gpu):
        for heads, dim in FAMILIES:
            for causal in (False, True):
                r, t = _point(batch_for(seq) if gpu else 1, heads, seq, dim, causal, dtype, device, gemm, args.reps)
                rows += r
                table += t
    text = format_table(["point", "backend", "ms", "TFLOP/s", "% gemm", "rel err", "note"], table)
    if gemm:
        text += f"\n\nmeasured bf16 GEMM ceiling: {gemm:.0f} TFLOP/s"
    return rows, text


def _point(b, h, n, d, causal, dtype, device, gemm, reps):
    gpu = device.type == "cuda"
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype) for _ in range(3))
    point = f"{b}x{h}x{n}x{d}{' causal' if causal else ''}"
    flops = attention_flops(b, h, n, n, d, causal)
    ref = attention(q.float(), k.float(), v.float(), causal=causal, backend="sdpa-math") if n <= CHECK_MAX_N else None
    params = {"batch": b, "heads": h, "seq": n, "head_dim": d, "causal": causal, "dtype": str(dtype)[6:]}
    spec = spec_of(q, k, None, causal)
    times: dict[str, float] = {}
    rows, table = [], []
    for name in BACKENDS:
        reason = serve_reason(name, *spec)
        if reason:
            continue  # not installed or cannot serve this point: not a row, say so once in the docs
        try:
            out = attention(q, k, v, causal=causal, backend=name)
            call = lambda name=name: attention(q, k, v, causal=causal, backend=name)  # noqa: E731
            t = measure(call, device=device, reps=reps, inner=4, graph=gpu)  # device time, as `auto` times it
        except Exception as e:  # a backend that refuses at run time is a finding, not a crash
            table.append([point, name, None, None, None, None, f"error: {type(e).__name__}"])
            continue
        err = rel_err(out, ref) if ref is not None else None
        bad = err is not None and not err < TOLERANCE[dtype]
        rate = tflops(flops, t.median_ms)
        metrics = {**timing_metrics(t), "tflops": (rate, "TFLOP/s")}
        if err is not None:
            metrics["rel_err"] = (err, "")
        rows += make_rows("attention", point, name, metrics, params)
        times[name] = t.median_ms
        share = pct_of(rate, gemm) if gemm else None
        table.append([point, name, t.median_ms, rate, share, err, "OVER TOLERANCE" if bad else ""])
    chosen = attention_choice(q, k, v, causal=causal)
    if times:
        best = min(times, key=times.get)
        ratio = times.get(chosen, float("nan")) / times[best]
        rows += make_rows("attention", point, "auto", {"auto_over_best": (ratio, "x")}, {**params, "chose": chosen})
        table.append([point, f"auto -> {chosen}", times.get(chosen), None, None, None, f"{ratio:.3f}x best ({best})"])
    return rows, table
