"""Issue 14's robot acceptance: a stream of requests whose image resolution and point count change on every request,
served four ways by copies of one `fullgraph.models.robot` model (same weights):

- `eager`: the model as it is;
- `whole dynamic`: `torch.compile(model, dynamic=True)`, default mode: the whole model compiled one way, what users
  reach for when shapes vary;
- `whole declared`: `fullgraph.compile(model, dynamic=dynamic_spec(cfg))`: the whole model, default mode, with H, W
  and N declared dynamic over the config's ranges (the plan's dims without the split: what the split itself buys);
- `plan`: `fullgraph.compile(model, plan=recommended_plan(cfg))`: vision and points compiled with their H, W and N
  declared dynamic over the config's ranges ("planning", fullgraph=True), fusion eager, the fixed-shape head under
  "perception" (CUDA graphs on a GPU).

Warm-up: the same `--warmup` requests (another seed; the first one square, a common camera crop) through each way.
Then `--n` requests, H and W (multiples of the patch) and N drawn uniformly from the config's ranges, the ways
interleaved request by request; each request timed by wall clock with a device sync after it (what a caller waits
for). Reported per way: latency per request (median, p20, p80), frames compiled and recompiles after warm-up (from
Dynamo's counters around that way's calls: `fullgraph.compile.stats.Tracker`), compile seconds (Dynamo's timer,
warm-up and stream), the warm-up's wall seconds, and the largest |difference| from eager over the stream.
The ways warm up in the order listed and share this process's Inductor caches, so a later way can reuse kernels an
earlier one built (its compile seconds are then lower than cold); and Dynamo caches per code object, so "whole
declared" compiles next to "whole dynamic"'s entry for `RobotModel.forward`, which Dynamo counts as a recompile of
that code (shown in warm-up, with its reason).

Run: PYTHONPATH=src python benchmarks/robot_stream.py [--device cuda] [--n 200] [--config robot_base]
  [--dtype fp32|bf16] [--warmup 2] [--csv FILE]. A CPU smoke run: --device cpu --n 10 --config robot_tiny.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable

import torch

import fullgraph
from fullgraph.bench.results import append_csv, make_rows
from fullgraph.compile.options import dynamo_config_name
from fullgraph.compile.stats import CompileStats, Tracker, merge
from fullgraph.models.robot import config, dynamic_spec, example_inputs, random_stream, recommended_plan
from fullgraph.timing import quantile

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable, args: tuple, device: str, tracker: Tracker) -> tuple[float, torch.Tensor]:
    """Milliseconds for one request, device work included, and its output (cloned: a CUDA graph's output memory is
    reused by its next replay)."""
    sync(device)
    tracker.begin()
    t0 = time.perf_counter()
    try:
        out = fn(*args)
        sync(device)
        ms = (time.perf_counter() - t0) * 1e3
    finally:
        tracker.end()
    return ms, out.clone()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--n", type=int, default=200, help="requests in the timed stream")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up requests per way (the first one square)")
    parser.add_argument("--config", default="robot_base", help="robot_base or robot_tiny")
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", help="append long-format result rows here")
    args = parser.parse_args()
    if args.n < 1 or args.warmup < 1:
        parser.error("--n and --warmup must be at least 1")
    device, dtype, cfg = args.device, DTYPES[args.dtype], config(args.config)
    # The ways share Dynamo's per-code-object caches; raise the process-wide limit so that a way that recompiles
    # shows it instead of falling back to eager (the plan's parts apply their presets' own limits around them).
    setattr(torch._dynamo.config, dynamo_config_name("recompile_limit"), 64)
    torch._dynamo.reset()

    torch.manual_seed(args.seed)
    base = fullgraph.models.RobotModel(cfg).eval().to(device, dtype)
    ways: dict[str, Callable] = {
        "eager": base,
        "whole dynamic": torch.compile(copy.deepcopy(base), dynamic=True),
        "whole declared": fullgraph.compile(copy.deepcopy(base), dynamic=dynamic_spec(cfg)),
        "plan": fullgraph.compile(copy.deepcopy(base), plan=recommended_plan(cfg)),
    }
    side = min(cfg.height[1], cfg.width[1])
    warm = [example_inputs(cfg, 1, side, side, cfg.num_points[1], device=device, dtype=dtype)]
    warm += random_stream(cfg, args.warmup - 1, seed=args.seed + 1, device=device, dtype=dtype)
    stream = random_stream(cfg, args.n, seed=args.seed, device=device, dtype=dtype)

    warm_stats: dict[str, CompileStats] = {}
    warm_seconds: dict[str, float] = {}
    with torch.no_grad():
        for name, fn in ways.items():
            print(f"  [{name}] warm-up: {len(warm)} request(s)", file=sys.stderr, flush=True)
            tracker = Tracker()
            t0 = time.perf_counter()
            for x in warm:
                timed(fn, x, device, tracker)
            warm_seconds[name], warm_stats[name] = time.perf_counter() - t0, tracker.stats
        print(f"  stream: {args.n} requests, ways interleaved", file=sys.stderr, flush=True)
        trackers = {name: Tracker() for name in ways}
        lat: dict[str, list[float]] = {name: [] for name in ways}
        err = dict.fromkeys(ways, 0.0)
        for x in stream:
            ref = None
            for name, fn in ways.items():
                ms, out = timed(fn, x, device, trackers[name])
                lat[name].append(ms)
                ref = out if ref is None else ref
                err[name] = max(err[name], (out.float() - ref.float()).abs().max().item())

    sizes = {(img.shape[2], img.shape[3], pts.shape[1]) for img, pts in stream}
    name0 = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(
        f"\n{args.config} ({name0}, {args.dtype}, batch 1): {args.n} requests, {len(sizes)} distinct (H, W, N); "
        f"H {cfg.height}, W {cfg.width}, N {cfg.num_points}; latency per request, wall clock with a sync"
    )
    print(f"{'way':14} {'median ms':>9} {'p20-p80 ms':>17} {'warm-up frames':>14} {'frames after':>12} "
          f"{'recompiles after':>16} {'compile s':>9} {'warm-up s':>9} {'max |diff|':>10}")  # fmt: skip
    rows = []
    case = f"{args.config} {args.dtype} stream{args.n}"
    for name in ways:
        s, st, total = sorted(lat[name]), trackers[name].stats, merge(warm_stats[name], trackers[name].stats)
        v = {"median_ms": quantile(s, 0.5), "p20_ms": quantile(s, 0.2), "p80_ms": quantile(s, 0.8),
             "warmup_frames": warm_stats[name].frames_compiled, "frames_after_warmup": st.frames_compiled,
             "recompiles_after_warmup": len(st.recompiles),
             "graph_breaks": total.graph_breaks, "compile_seconds": total.compile_seconds,
             "warmup_s": warm_seconds[name], "max_abs_diff_vs_eager": err[name]}  # fmt: skip
        print(f"{name:14} {v['median_ms']:9.3f} {v['p20_ms']:8.3f}-{v['p80_ms']:<8.3f} "
              f"{warm_stats[name].frames_compiled:14d} {st.frames_compiled:12d} {len(st.recompiles):16d} "
              f"{total.compile_seconds:9.1f} {warm_seconds[name]:9.1f} {err[name]:10.2e}")  # fmt: skip
        for when, stats in (("in warm-up", warm_stats[name]), ("after warm-up", st)):
            for r in stats.recompiles:
                print(f"{'':14} recompile {when}: {r.function}: {r.reason.splitlines()[0][:120]}")
        units = {"median_ms": "ms", "p20_ms": "ms", "p80_ms": "ms", "compile_seconds": "s", "warmup_s": "s"}
        rows += make_rows("robot_stream", case, name, {k: (float(x), units.get(k, "")) for k, x in v.items()},
                          {"device": name0, "warmup": len(warm), "sizes": len(sizes), "seed": args.seed})  # fmt: skip
    print(f"\nplan:\n{ways['plan'].describe()}")
    if args.csv:
        append_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
