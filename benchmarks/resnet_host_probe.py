"""Why fullgraph.compile's default mode ran timm ResNet-50 b4 bf16 at 0.66-0.73x plain torch.compile on an H100
(issue 33; `results/zoo_resnet50_h100.*`, `zoo_resnet50_fresh_cache_h100.*`) while reduce-overhead ran at 0.995x: the
GPU work is the same (CUDA graphs hide the host), so the ~1.1 ms a call is host time. Which part of fullgraph's path?

Variants, each its own deep copy of the model, timed in interleaved rounds in one process (`round_medians`):
- `plain`: torch.compile(m);
- `plain+options`: torch.compile(m, options={"epilogue_fusion": True}) (Inductor's default value: any options dict);
- `ours`: fullgraph.compile(m, "dev", mode="default") (rewrites auto: a pre-grad pass installed);
- `ours rewrites=()`: the same without the pass (no options);
- `ours inner`: ours' own torch.compile'd function called directly (fullgraph's wrapper skipped).
Per variant also: the host time of one call with no sync (the enqueue), Dynamo graphs compiled, and, under
torch.profiler, the calls per forward of the CPU ops that cost most (cudaLaunchKernel, the cuDNN convolution, any
sync or allocation), so a difference shows as counts, not only as time.

Usage (GPU): PYTHONPATH=src python3 benchmarks/resnet_host_probe.py [--model resnet50] [--batch 4]
A dry run of the script itself on a CPU (a small conv net, fp32): --device cpu.
"""

from __future__ import annotations

import argparse
import collections
import copy
import statistics
import time

import torch

import fullgraph.compile
from fullgraph.timing import round_medians


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def enqueue_us(fn, x, device: str, calls: int = 50) -> float:
    """Median host time of one call, the device synchronized before each (what the launches cost the host)."""
    out = []
    for _ in range(calls):
        sync(device)
        s = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - s)
    sync(device)
    return 1e6 * statistics.median(out)


def op_counts(fn, x, device: str, calls: int = 5) -> dict[str, tuple[float, float]]:
    """name -> (calls per forward, self CPU us per forward) of the CPU-side events under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device == "cuda" else [])]
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn(x)
        sync(device)
    seen: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for e in prof.key_averages():
        if e.self_cpu_time_total > 0 or e.count:
            seen[e.key][0] += e.count / calls
            seen[e.key][1] += e.self_cpu_time_total / calls
    return {k: (v[0], v[1]) for k, v in seen.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = args.device
    if dev == "cuda":
        import timm

        base = timm.create_model(args.model, pretrained=False).eval().cuda().to(torch.bfloat16)
        x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    else:  # the script's dry run
        conv = [torch.nn.Conv2d(3 if i == 0 else 8, 8, 3, padding=1) for i in range(3)]
        base = torch.nn.Sequential(*[m for c in conv for m in (c, torch.nn.BatchNorm2d(8), torch.nn.ReLU())]).eval()
        x = torch.randn(args.batch, 3, 32, 32)
    ours = fullgraph.compile(copy.deepcopy(base), "dev", mode="default")
    fns = {
        "plain": torch.compile(copy.deepcopy(base)),
        "plain+options": torch.compile(copy.deepcopy(base), options={"epilogue_fusion": True}),
        "ours": ours,
        "ours rewrites=()": fullgraph.compile(copy.deepcopy(base), "dev", mode="default", rewrites=()),
    }
    from torch._dynamo.utils import counters

    graphs = {}
    with torch.no_grad():
        for name, fn in fns.items():
            before = counters["stats"]["unique_graphs"]
            fn(x)
            fn(x)
            graphs[name] = counters["stats"]["unique_graphs"] - before
        fns["ours inner"] = ours.__dict__["_compiled"]
        graphs["ours inner"] = 0
        medians = round_medians({k: (lambda f=f: f(x)) for k, f in fns.items()}, device=dev, rounds=args.rounds,
                                reps=args.reps)  # fmt: skip
        plain = statistics.median(medians["plain"])
        print(f"timm {args.model} b{args.batch} bf16, default mode, {args.rounds} rounds x {args.reps} calls")
        print(f"{'variant':18s} {'ms':>8s} {'x plain':>8s} {'enqueue us':>11s} {'graphs':>6s}")
        for name, fn in fns.items():
            ms = statistics.median(medians[name])
            print(f"{name:18s} {ms:8.3f} {plain / ms:8.3f} {enqueue_us(fn, x, dev):11.1f} {graphs[name]:6d}")
        counts = {name: op_counts(fns[name], x, dev) for name in ("plain", "ours", "ours rewrites=()")}
    keys = sorted(set().union(*counts.values()), key=lambda k: -max(c.get(k, (0, 0))[1] for c in counts.values()))
    print("\nCPU events per forward: calls, self CPU us (plain | ours | ours rewrites=())")
    for k in keys[:30]:
        cells = " | ".join(f"{counts[n].get(k, (0, 0))[0]:6.1f} {counts[n].get(k, (0, 0))[1]:8.1f}" for n in counts)
        print(f"{k[:60]:60s} {cells}")


if __name__ == "__main__":
    main()
