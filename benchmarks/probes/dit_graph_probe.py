"""What a kernel op costs the host inside the compiled DiT: per policy, Inductor's output code, the kernels it
launches, and the host and GPU time of one compiled call (default mode, where the host launches every kernel).

`bench dit` (2026-12-02, 1024 tokens) showed ours with `layer_norm_modulate`'s kernel 79 kernels to auto's 53 and
the GPU idle half the call; with `qk_norm_rope`'s kernel the same 53 kernels but idle 24% of it. This says which
launches and which host work make the difference: the output code of each variant is written to --out, and a table
gives, per variant, the host time of a call (launches only: the GPU is idle when it starts), its GPU time (CUDA
events), the kernels launched (Triton, extern, and fullgraph's own), and the CPU ops that take the host time.

Run: PYTHONPATH=src python benchmarks/probes/dit_graph_probe.py [--tokens 1024]
  [--policies 'all=auto;all=auto,+qk_norm_rope']
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import time

import torch

from fullgraph import ops
from fullgraph.models.dit import DiT, PlainDiT, config
from fullgraph.ops.policies import parse_spec

DEFAULT_POLICIES = "all=auto;all=auto,+layer_norm_modulate;all=auto,+qk_norm_rope"


def build(tokens: int, depth: int, device, dtype):
    cfg = config("dit_3072", rope="1d", max_tokens=tokens, depth=depth)
    torch.manual_seed(0)
    ours = DiT(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.02)
    plain = PlainDiT(cfg).eval()
    plain.load_state_dict(ours.state_dict())
    return cfg, ours.to(device, dtype), plain.to(device, dtype)


def launches(code: str) -> dict[str, int]:
    """Kernel launches in Inductor's wrapper code, by kind."""
    calls = re.findall(r"^\s+(\w+)\.run\(", code, flags=re.M)
    return {
        "triton": len(calls),
        "of which ours": sum(1 for c in calls if "kernel" in c and not c.startswith("triton_")),
        "extern": len(re.findall(r"extern_kernels\.\w+\(", code)),
        "torch.ops": len(re.findall(r"torch\.ops\.\w+\.\w+\.", code)),
    }


def host_and_gpu(fn, reps: int = 20) -> tuple[float, float]:
    """(host ms, GPU ms) medians over `reps` calls, each started with the GPU idle."""
    host, gpu = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        fn()
        end.record()
        host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end))
    return statistics.median(host), statistics.median(gpu)


def cpu_table(fn, top: int) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=70)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--policies", default=DEFAULT_POLICIES, help="FULLGRAPH_OPS specs separated by ';'")
    ap.add_argument("--top", type=int, default=12, help="CPU ops per variant in the host table")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("dit_graph_probe needs a CUDA GPU (the host cost of launches is the question)")
    from torch._inductor.utils import run_and_get_code

    os.makedirs(args.out, exist_ok=True)
    device, dtype = torch.device("cuda"), torch.bfloat16
    cfg, ours, plain = build(args.tokens, args.depth, device, dtype)
    x = torch.randn(1, args.tokens, cfg.dim, device=device, dtype=dtype)
    c = torch.randn(1, cfg.dim, device=device, dtype=dtype)
    variants = {"plain": (plain, None)} | {s.strip(): (ours, s.strip()) for s in args.policies.split(";") if s.strip()}
    rows, tables = [], []
    for i, (label, (model, spec)) in enumerate(variants.items()):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, dynamic=False)

        def call(compiled=compiled, spec=spec):
            ctx = ops.policy(**parse_spec(spec)) if spec else contextlib.nullcontext()
            with ctx, torch.no_grad():
                return compiled(x, c)

        t0 = time.perf_counter()
        _, codes = run_and_get_code(call)
        compile_s = time.perf_counter() - t0
        code = "\n\n".join(codes)
        path = os.path.join(args.out, f"dit_graph_code_{i}.py")
        with open(path, "w") as f:
            f.write(f"# {label}, {args.tokens} tokens, depth {args.depth}\n{code}")
        for _ in range(10):
            call()
        host, gpu = host_and_gpu(call)
        n = launches(code)
        rows.append((label, host, gpu, n, compile_s, path))
        tables.append(f"--- {label}: CPU ops by self time, 5 calls\n{cpu_table(call, args.top)}")
    print("\n".join(tables))
    print(f"\nDiT dim {cfg.dim} x{args.depth} blocks, {args.tokens} tokens, bf16, default mode; medians of 20 calls")
    print(f"{'variant':45} {'host ms':>8} {'GPU ms':>8} {'compile s':>9}  launches in the wrapper")
    for label, host, gpu, n, compile_s, path in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in n.items())
        print(f"{label:45} {host:8.3f} {gpu:8.3f} {compile_s:9.1f}  {kinds}  ({os.path.basename(path)})")


if __name__ == "__main__":
    main()
