"""Host time per eager call on a tiny input (4x128), where launch and dispatch cost dominate the work.

Each of our ops is paired with what a user would call instead (torch's built-in module or function, or the plain
formula) and the two are timed in alternation, 21 rounds of 1000 calls each; the table gives the median per-call
time of each and the median of the per-round ratios (the DiT issue's target: at most 1.5x where torch has a
built-in). Our ops run under each policy in turn: "auto" (below `measured.EAGER_KERNEL_MIN_NUMEL` the native form,
so on these inputs the native form), "native" and, where kernels run, "kernel". On a GPU inputs are bf16 and every
call is followed by nothing (launches are asynchronous: this is host time); the device is synchronized once per
round.

`--sizes` then times rms_norm, layer_norm, qk_norm_rope (heads of 128) and layer_norm_modulate (with the gated
residual) per call at growing sizes, kernel against native, calls back to back:
per call that is the larger of host and GPU time, so the ratio crosses 1 where the kernel starts to pay in eager
mode (where `EAGER_KERNEL_MIN_NUMEL` comes from).

Run: PYTHONPATH=src python3 benchmarks/eager_overhead.py [--device cpu|cuda] [--sizes 4x128,1024x3072]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from fullgraph import ops
from fullgraph.ops import measured
from fullgraph.ops.custom_op import kernel_runs_on


def per_call_us(fn, device: str, n: int = 1000) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def pairs(device: str, dtype: torch.dtype, policy: str) -> dict[str, tuple]:
    x = torch.randn(4, 128, device=device, dtype=dtype)
    w, b = torch.randn(128, device=device, dtype=dtype), torch.randn(128, device=device, dtype=dtype)
    x3 = torch.randn(2, 4, 128, device=device, dtype=dtype)
    shift, scale = torch.randn(2, 128, device=device, dtype=dtype), torch.randn(2, 128, device=device, dtype=dtype)
    ours_rms = ops.RMSNorm(128, policy=policy).to(device, dtype)
    ours_ln = ops.LayerNorm(128, policy=policy).to(device, dtype)
    torch_rms, torch_ln = torch.nn.RMSNorm(128).to(device, dtype), torch.nn.LayerNorm(128).to(device, dtype)

    def functional(fn, *args):
        def call():
            with ops.policy(**{fn.__name__: policy}):
                return fn(*args)

        return call

    return {
        "RMSNorm module / nn.RMSNorm": (lambda: ours_rms(x), lambda: torch_rms(x)),
        "LayerNorm module / nn.LayerNorm": (lambda: ours_ln(x), lambda: torch_ln(x)),
        "rms_norm / F.rms_norm": (lambda: ops.rms_norm(x, w), lambda: F.rms_norm(x, (128,), w, 1e-6)),
        "layer_norm / F.layer_norm": (lambda: ops.layer_norm(x, w, b), lambda: F.layer_norm(x, (128,), w, b)),
        "modulate / x*(1+scale)+shift": (
            lambda: ops.modulate(x3, shift, scale),
            lambda: x3 * (1 + scale[:, None]) + shift[:, None],
        ),
        # the policy block's own cost is in this row: it shows what a `with ops.policy(...)` per call costs
        "rms_norm in a policy block / F.rms_norm": (
            functional(ops.rms_norm, x, w),
            lambda: F.rms_norm(x, (128,), w, 1e-6),
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", default="", help="rows x cols list for the kernel/native sweep, e.g. 4x128,64x3072")
    args = parser.parse_args()
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    policies = ["auto", "native", "kernel"] if kernel_runs_on(device) else ["auto (native here)"]
    print(f"{device}, {str(dtype)[6:]}, 4x128; ours / theirs: median of 21 rounds of 1000 calls, alternating")
    with torch.no_grad():
        for policy in policies:
            with ops.policy(all=policy.split()[0]):  # the functional forms' policy (modules carry their own)
                for name, (ours, theirs) in pairs(device, dtype, policy.split()[0]).items():
                    ratio, a, b = alternate(ours, theirs, device)
                    print(f"{policy:18} {name:42} {ratio:5.2f}x  ({a:6.1f} vs {b:6.1f} us/call)")
        if args.sizes and kernel_runs_on(device):
            sweep(device, dtype, args.sizes)
    return 0


def alternate(ours, theirs, device: str, rounds: int = 21, n: int = 1000) -> tuple[float, float, float]:
    """(median of per-round ratios, median us/call of each), `ours` and `theirs` timed in alternation."""
    for _ in range(200):
        ours(), theirs()
    ratios, a, b = [], [], []
    for _ in range(rounds):
        a.append(per_call_us(ours, device, n))
        b.append(per_call_us(theirs, device, n))
        ratios.append(a[-1] / b[-1])
    return statistics.median(ratios), statistics.median(a), statistics.median(b)


def sweep(device: str, dtype: torch.dtype, sizes: str) -> None:
    print("\nkernel / native per call, calls back to back (the larger of host and GPU time); auto's eager choice")
    for size in sizes.split(","):
        rows, cols = (int(v) for v in size.lower().split("x"))
        x = torch.randn(rows, cols, device=device, dtype=dtype)
        w, b = torch.ones(cols, device=device, dtype=dtype), torch.zeros(cols, device=device, dtype=dtype)
        cases = [("rms_norm", ops.rms_norm, (w,)), ("layer_norm", ops.layer_norm, (w, b))]
        if cols % 128 == 0:  # q/k norm + RoPE of heads of 128 over rows tokens (x as q and as k, [1, N, H, 128])
            hw, (cos, sin) = torch.ones(128, device=device, dtype=dtype), ops.rope_tables(rows, 128, device=device)

            def qk(x, hw=hw, cos=cos, sin=sin):
                q = x.view(1, x.shape[0], -1, 128)
                return ops.qk_norm_rope(q, q, hw, hw, cos, sin, layout="bsnd")

            cases.append(("qk_norm_rope", qk, ()))
        # a DiT block's gated residual + LayerNorm + modulation, one batch element ([1, rows, cols], params [1, 1, C])
        p1 = torch.randn(1, 1, cols, device=device, dtype=dtype)

        def lnm(x, p1=p1):
            return ops.layer_norm_modulate(x[None], p1, p1, h=x[None], gate=p1)

        cases.append(("layer_norm_modulate", lnm, ()))
        for name, fn, extra in cases:

            def under(policy, fn=fn, extra=extra, name=name, x=x):
                def call():
                    with ops.policy(**{name: policy}):
                        return fn(x, *extra)

                return call

            ratio, a, b_ = alternate(under("kernel"), under("native"), device, rounds=11, n=200)
            picks = "kernel" if measured.eager_kernel_pays(device, x.numel()) else "native"
            print(f"{size:>10} {name:11} {ratio:5.2f}x  ({a:7.1f} vs {b_:7.1f} us/call)  auto: {picks}")


if __name__ == "__main__":
    sys.exit(main())
