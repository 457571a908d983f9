"""Host time per call of `fullgraph.compile`'s wrapper: a small model under a preset against the same model under a
plain `torch.compile`, and against the preset's own compiled function called directly (what the wrapper adds:
the dtype= cast, the input check, stats, the per-call scope). Interleaved rounds (`timing.round_medians`: on a GPU
CUDA events, which a call this small keeps host-bound); min and median of the rounds' medians per variant.

Run: PYTHONPATH=src python benchmarks/wrapper_overhead.py [--preset perception] [--device cpu] [--rounds 15]
(2-core CPU, torch 2.13, 2026-12-03, nn.Linear(8, 8), perception, dtype=float32, min of the round medians: the
wrapper over its compiled function +93 us per call before 1985ea5, +30 after; plain torch.compile 62 us, the
preset's function 75. 2026-12-06, torch 2.13, 15 rounds, min of the round medians over the compiled function
alone, one process per side: dev +11.7 us before the hold and input-key change, +8.4 after; perception +23.0 before,
+18.0 after: Dynamo's config read once a call (2.2 us a read on torch 2.13), the input checks and the cast skipped
together when the inputs' kinds match the last checked call's and nothing needs a cast. Then, calling the
OptimizedModule's Dynamo-wrapped forward directly and entering no nullcontext: dev +4.8 us (+4.6 over plain
torch.compile), perception +13.0.)
"""

from __future__ import annotations

import argparse
import copy

import torch

import fullgraph.compile
from fullgraph.timing import round_medians


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

    with torch.no_grad():
        for fn in variants.values():
            for _ in range(50):
                fn(x)
        rounds = round_medians(
            {name: lambda fn=fn: fn(x) for name, fn in variants.items()},
            device=args.device, rounds=args.rounds, reps=args.calls,
        )  # fmt: skip
    for name, ms in rounds.items():
        ms.sort()
        print(f"{name:34} min {ms[0] * 1e3:7.1f} us   median {ms[len(ms) // 2] * 1e3:7.1f} us per call (round medians)")


if __name__ == "__main__":
    main()
