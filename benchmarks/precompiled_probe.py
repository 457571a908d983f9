"""Why is a precompiled reduce-overhead model slower per call than the same model under torch.compile? (issue 31:
`fullgraph bench load` measured 3.08 ms per call at timm ViT-S/16 batch 4 against 0.76 for `fullgraph.compile`.)

One process, one model, interleaved rounds (`timing.round_medians`, CUDA events): plain torch.compile
reduce-overhead, fullgraph.compile perception, the precompiled model through `PrecompiledModel` and its compiled
function called bare (no guard, no copy); with `--prev DIR` (see serve_overhead.py) also the earlier commit's
precompiled model. Then one profiled call of each precompiled form: the CPU ops it ran and how many times, the
CUDA-graph launches, and the Inductor counters that moved (cudagraph skips, re-recordings).

Run: PYTHONPATH=src python benchmarks/precompiled_probe.py [--model vit_small_patch16_224] [--batch 4] [--prev .prev]
"""

from __future__ import annotations

import argparse
import collections
import copy
import importlib
import sys
import tempfile
from pathlib import Path

import torch

import fullgraph
from fullgraph.deploy import load_precompiled, save_precompiled
from fullgraph.timing import round_medians


def counters() -> dict[str, int]:
    from torch._dynamo.utils import counters as c

    return {f"{group}.{k}": v for group, d in c.items() for k, v in d.items()}


def profiled(name: str, fn) -> None:
    before = counters()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    ops = collections.Counter()
    for e in prof.events():
        ops[e.name] += 1
    moved = {k: v - before.get(k, 0) for k, v in counters().items() if v != before.get(k, 0)}
    print(f"\n== {name}: 3 calls, CPU events by count (top 14)")
    for op, n in ops.most_common(14):
        print(f"  {n:6d}  {op}")
    print(f"  counters moved: {moved or 'none'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="vit_small_patch16_224")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prev", default=None)
    args = ap.parse_args(argv)
    import timm

    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).eval().to("cuda", torch.bfloat16)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    work = Path(tempfile.mkdtemp())
    save_precompiled(copy.deepcopy(model), (x,), work / "m.pre", mode="reduce-overhead")
    pre = load_precompiled(work / "m.pre", copy.deepcopy(model))
    fns = {
        "torch.compile reduce-overhead": torch.compile(copy.deepcopy(model), mode="reduce-overhead"),
        "fullgraph.compile perception": fullgraph.compile(copy.deepcopy(model), "perception"),
        "precompiled (PrecompiledModel)": pre,
        "precompiled bare (compiled fn)": lambda x, f=pre._compiled, m=pre.model: f(m, x),
    }
    if args.prev:
        sys.path.insert(0, args.prev)
        prev = importlib.import_module("fullgraph_prev.deploy")
        prev.save_precompiled(copy.deepcopy(model), (x,), work / "p.pre", mode="reduce-overhead")
        fns["precompiled at prev"] = prev.load_precompiled(work / "p.pre", copy.deepcopy(model))
    calls = {}
    with torch.no_grad():
        for name, fn in fns.items():
            for _ in range(4):
                fn(x)
            calls[name] = lambda fn=fn: fn(x)
        times = round_medians(calls, device="cuda", rounds=7)
        base = sorted(times["torch.compile reduce-overhead"])[3]
        print(f"{args.model} b{args.batch} bf16, medians of 7 interleaved rounds")
        for name, ms in times.items():
            med = sorted(ms)[len(ms) // 2]
            print(f"  {name:34s} {med:8.4f} ms  {base / med:6.3f}x of torch.compile")
        for name in [n for n in fns if n.startswith("precompiled")]:
            profiled(name, calls[name])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
