"""Issue 13's eager target (ours `auto` >= 0.95x plain eager at 1024 tokens, faster at 4096): where an eager forward
of the DiT stack spends its time, ours against the plain twin, side by side.

Per token count and form: aten ops dispatched per forward (a TorchDispatchMode count, by op), device kernels per
forward (torch.profiler), host time per forward (the forward's own wall time with launches left asynchronous, then
one sync outside the clock), and latency (CUDA events around forward + sync: the larger of host and GPU time). On a
GPU, the kernels that take the most time in either form, side by side (torch.profiler). Then the top host-time
functions of ours (cProfile) so the next change aims at the biggest.

Run: PYTHONPATH=src python benchmarks/probes/dit_eager.py [--device cuda] [--tokens 1024,4096] [--config dit_3072]
  [--depth 4]. CPU defaults: dit_s, depth 2, 64 tokens, fp32.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fullgraph.models.dit import dit


class OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def host_us(fn, device: str, n: int) -> float:
    """Median over `n` forwards of the forward's own wall time, device work left to run (synced outside)."""
    times = []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    sync(device)
    return statistics.median(times) * 1e6


def latency_ms(fn, device: str, n: int) -> float:
    from fullgraph.timing import measure

    return measure(fn, device=device, warmup=3, reps=n).median_ms


def kernels(fn, device: str) -> int:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        sync(device)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return sum(1 for e in prof.events() if getattr(e, "device_type", None) and kind in str(e.device_type).lower())


def kernel_times(fn, reps: int = 5) -> dict[str, tuple[int, float]]:
    """GPU kernels of `reps` forwards by name: (launches per forward, µs per forward), from torch.profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if "cuda" not in str(getattr(e, "device_type", "")).lower():
            continue
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        out[e.key] = (e.count // reps, total / reps)
    return out


def print_kernel_table(plain: dict, ours: dict, top: int = 14) -> None:
    """The kernels that take the most GPU time in either form, side by side, and the totals."""
    names = sorted(set(plain) | set(ours), key=lambda k: -max(plain.get(k, (0, 0))[1], ours.get(k, (0, 0))[1]))
    print(f"        {'GPU kernel':<72} {'plain n':>7} {'plain us':>9} {'ours n':>7} {'ours us':>9}")
    for k in names[:top]:
        (pn, pt), (on, ot) = plain.get(k, (0, 0.0)), ours.get(k, (0, 0.0))
        print(f"        {k[:72]:<72} {pn:>7} {pt:>9.1f} {on:>7} {ot:>9.1f}")
    tp, to = sum(t for _, t in plain.values()), sum(t for _, t in ours.values())
    print(f"        {'all kernels':<72} {sum(n for n, _ in plain.values()):>7} {tp:>9.1f} "
          f"{sum(n for n, _ in ours.values()):>7} {to:>9.1f}")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", default=None)
    p.add_argument("--config", default=None)
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    gpu = args.device.startswith("cuda")
    tokens = [int(t) for t in (args.tokens or ("1024,4096" if gpu else "64")).split(",")]
    name, depth = args.config or ("dit_3072" if gpu else "dit_s"), args.depth or (4 if gpu else 2)
    dtype = torch.bfloat16 if gpu else torch.float32
    torch.manual_seed(0)
    ours = dit(name, depth=depth).eval()
    plain = dit(name, plain=True, depth=depth).eval()
    plain.load_state_dict(ours.state_dict())
    ours, plain = ours.to(args.device, dtype), plain.to(args.device, dtype)
    print(f"{name} depth {depth} {dtype} on {args.device}: eager forward, ours (auto) against the plain twin")
    head = f"{'tokens':>7} {'form':<6} {'aten ops':>9} {'kernels':>8} {'host us':>9} {'latency ms':>11}"
    print(f"{head} {'ours/plain':>11}")
    for n in tokens:
        x = torch.randn(1, n, ours.cfg.dim, device=args.device, dtype=dtype)
        c = torch.randn(1, ours.cfg.dim, device=args.device, dtype=dtype)
        res = {}
        with torch.no_grad():
            for form, m in (("plain", plain), ("ours", ours)):
                fn = lambda m=m, x=x, c=c: m(x, c)  # noqa: E731
                for _ in range(3):
                    fn()
                with OpCount() as count:
                    fn()
                res[form] = (sum(count.ops.values()), kernels(fn, args.device), host_us(fn, args.device, args.reps),
                             latency_ms(fn, args.device, args.reps), count.ops)  # fmt: skip
            for form in ("plain", "ours"):
                ops, k, host, lat, _ = res[form]
                ratio = f"{res['plain'][3] / lat:.3f}x" if form == "ours" else ""
                print(f"{n:>7} {form:<6} {ops:>9} {k:>8} {host:>9.0f} {lat:>11.3f} {ratio:>11}")
            if gpu:  # where each form's GPU time goes, kernel by kernel
                print_kernel_table(*(kernel_times(lambda m=m, x=x, c=c: m(x, c)) for m in (plain, ours)))
            extra = res["ours"][4] - res["plain"][4]
            print(f"        ops ours has more of: {dict(extra.most_common(8))}")
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(10):
                ours(x, c)
            prof.disable()
            sync(args.device)
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(8)
            lines = [ln for ln in buf.getvalue().splitlines() if ln.strip() and ("/" in ln or "{" in ln)]
            print("        ours, top host time (cProfile, 10 forwards):")
            for ln in lines[:8]:
                print("         ", ln.strip()[:150])
    return 0


if __name__ == "__main__":
    sys.exit(main())
