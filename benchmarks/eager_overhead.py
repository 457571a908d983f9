"""Host time per eager call on a tiny input, where launch and dispatch cost dominate the GPU work.

Compares the kernel through `fullgraph.ops` (launcher called directly in plain inference), the same kernel
through the registered torch op (dispatcher path), the native form, and torch's built-in.
Run: PYTHONPATH=src python3 benchmarks/eager_overhead.py
"""

import sys
import time

import torch
import torch.nn.functional as F

from fullgraph import ops


def per_call_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    x = torch.randn(4, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16)

    native, kernel = ops.RMSNorm(128, policy="native").cuda(), ops.RMSNorm(128, policy="kernel").cuda()
    rows = {
        "F.rms_norm": lambda: F.rms_norm(x, (128,), w, 1e-6),
        "RMSNorm module, native": lambda: native(x),
        "RMSNorm module, kernel (direct launch)": lambda: kernel(x),
        "torch.ops.fullgraph.rms_norm (dispatcher)": lambda: torch.ops.fullgraph.rms_norm(x, w, 1e-6),
        "launcher through wrap_triton (avoided)": lambda: ops.norms.rms_norm_fwd.launcher(x, w, 1e-6),
    }
    with torch.no_grad():
        for name, fn in rows.items():
            print(f"{name:45s} {per_call_us(fn):8.1f} us/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
