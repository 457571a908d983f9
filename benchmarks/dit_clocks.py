"""Does the GPU clock the plain twin and ours alike? The compiled DiT (dim 3072, 4 blocks, bf16, default mode) run back
to back in alternating phases, plain then ours auto, while `nvidia-smi` samples the SM clock and the power draw every
50 ms; per phase: ms per call, and the median SM clock and power over the phase's samples. If ours (fewer memory-bound
passes between the GEMMs) draws more power and clocks lower, its kernel-time savings shrink on the wall clock.

Usage (GPU): PYTHONPATH=src python3 benchmarks/dit_clocks.py [--tokens 4096] [--phases 8] [--seconds 1.5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from datetime import datetime

import torch
from dit_kernels import twins  # benchmarks/, this script's folder

from fullgraph import ops


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--phases", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1.5)
    args = ap.parse_args()
    ours, plain, x, c = twins(args.tokens, "cuda")
    fns = {"plain": torch.compile(plain, fullgraph=True), "ours auto": torch.compile(ours, fullgraph=True)}
    with torch.no_grad(), ops.policy(all="auto"):
        for fn in fns.values():
            for _ in range(3):
                fn(x, c)
        torch.cuda.synchronize()
        smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)
        phases = []
        for i in range(args.phases):
            name = list(fns)[i % 2]
            t0, n = time.time(), 0
            while time.time() - t0 < args.seconds:
                for _ in range(10):
                    fns[name](x, c)
                n += 10
                torch.cuda.synchronize()
            phases.append((name, t0, time.time(), n))
        time.sleep(0.3)
        smi.terminate()
        samples = []
        for line in smi.communicate()[0].splitlines():
            try:
                stamp, clock, power = (p.strip() for p in line.split(","))
                t = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
                samples.append((t, float(clock), float(power)))
            except ValueError:
                continue
    print(f"DiT 3072 x 4 blocks, {args.tokens} tokens, bf16, compiled default mode; {len(samples)} nvidia-smi samples")
    print(f"{'phase':>5} {'variant':10} {'ms/call':>8} {'SM MHz':>7} {'power W':>8} {'samples':>7}")
    for i, (name, t0, t1, n) in enumerate(phases):
        inside = [s for s in samples if t0 + 0.2 <= s[0] <= t1]  # the phase's first 0.2 s: the switch settles
        clock = statistics.median(s[1] for s in inside) if inside else float("nan")
        power = statistics.median(s[2] for s in inside) if inside else float("nan")
        print(f"{i:5d} {name:10} {(t1 - t0) / n * 1e3:8.3f} {clock:7.0f} {power:8.1f} {len(inside):7d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
