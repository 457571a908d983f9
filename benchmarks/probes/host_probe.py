"""Where the host time of one call goes: ViT-B/16 bf16 at batch 4 under fullgraph.compile's perception preset
against the same model under a plain torch.compile(mode="reduce-overhead"), side by side in one process.

Per variant: the time per call back to back between CUDA events (what `bench vit` reports), latency with a sync
after each call, the host time of a call alone (the enqueue, no sync), and a cProfile of --profile-calls calls of
the preset (top functions by own time). (Its run of 2026-12-03 also had the preset without the
input staging it had then: benchmarks/results/host_probe_staging_h200.txt; the staging went.)
Usage (GPU): PYTHONPATH=src python3 benchmarks/probes/host_probe.py [--batch 4] [--calls 300]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import statistics
import time

import torch

import fullgraph.compile
from fullgraph.models.vit import vit_b16
from fullgraph.timing import measure


def timed(fn, x, calls: int) -> tuple[list[float], list[float]]:
    synced, host = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(x)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        synced.append((t2 - t0) * 1e3)
    return synced, host


def q(v: list[float], p: float) -> float:
    return sorted(v)[min(len(v) - 1, int(p * len(v)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--profile-calls", type=int, default=300)
    args = ap.parse_args()
    torch.manual_seed(0)
    base = vit_b16().eval().cuda().to(torch.bfloat16)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    variants = {
        "torch.compile reduce-overhead": torch.compile(copy.deepcopy(base), mode="reduce-overhead"),
        "fullgraph.compile perception": fullgraph.compile(copy.deepcopy(base), "perception", dtype=torch.bfloat16),
    }
    with torch.no_grad():
        for fn in variants.values():
            for _ in range(5):
                fn(x)
        torch.cuda.synchronize()
        print(f"{'variant':30} {'back to back ms':16} {'synced ms p50 (p20-p80, p95)':34} {'host ms p50 (p95)':20}")
        for _round in range(3):  # interleaved rounds: the host's drift hits all
            for name, fn in variants.items():
                b2b = measure(lambda fn=fn: fn(x), device="cuda", reps=args.calls).median_ms
                s, h = timed(fn, x, args.calls)
                print(
                    f"{name:30} {b2b:<16.4f} {statistics.median(s):.4f} ({q(s, 0.2):.4f}-{q(s, 0.8):.4f}, "
                    f"{q(s, 0.95):.4f}){'':6} {statistics.median(h):.4f} ({q(h, 0.95):.4f})"
                )
        for name, fn in list(variants.items())[1:]:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.profile_calls):
                fn(x)
            prof.disable()
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(22)
            print(f"--- cProfile, {args.profile_calls} calls: {name}")
            print("\n".join(line[:150] for line in buf.getvalue().splitlines()[4:40] if line.strip()))


if __name__ == "__main__":
    main()
