"""Host time per call of `fullgraph.compile`'s wrapper: a small model under a preset against the same model under a
plain `torch.compile`, and against the preset's own compiled function called directly (what the wrapper adds:
the dtype= cast, the input check, stats, the per-call scope). Interleaved rounds; min and median per variant.

Run: PYTHONPATH=src python benchmarks/wrapper_overhead.py [--preset perception] [--device cpu] [--rounds 15]
(2-core CPU, torch 2.13, 2026-12-03, nn.Linear(8, 8), perception, dtype=float32: the wrapper over its compiled
function +106 us per call before 1985ea5, +36 after; plain torch.compile 61 us, the preset's function 76.)
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import fullgraph.compile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="perception")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    model = torch.nn.Linear(8, 8).eval().to(args.device)
    x = torch.randn(2, 8, device=args.device)
    preset = fullgraph.compile(copy.deepcopy(model), args.preset, dtype=torch.float32)
    variants = {
        "plain torch.compile": torch.compile(copy.deepcopy(model)),
        f"fullgraph.compile {args.preset}": preset,
        "  its compiled function alone": preset._compiled,
    }

    def per_call_us(fn) -> float:
        if args.device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.calls):
            fn(x)
        if args.device != "cpu":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / args.calls * 1e6

    with torch.no_grad():
        for fn in variants.values():
            for _ in range(50):
                fn(x)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(per_call_us(fn))
    for name, v in times.items():
        v.sort()
        print(f"{name:34} min {v[0]:7.1f} us   median {v[len(v) // 2]:7.1f} us per call")


if __name__ == "__main__":
    main()
