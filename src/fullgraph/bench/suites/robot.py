"""Suite `robot`: issue 14's robot acceptance. A stream of requests whose image resolution and point count change on
every request, served by copies of one `fullgraph.models.robot` model (same weights), each way in WAYS:

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
interleaved request by request; each request timed once by wall clock with a device sync after it (what a caller
waits for; `--reps` does not apply). Reported per way: latency per request (median, p20, p80), frames compiled and
recompiles after warm-up (Dynamo's counters around that way's calls: `fullgraph.compile.stats.Tracker`), compile
seconds (Dynamo's timer, warm-up and stream), the warm-up's wall seconds, and the largest |difference| from eager
over the stream. The ways warm up in the order listed and share this process's Inductor caches, so a later way can
reuse kernels an earlier one built (its compile seconds are then lower than cold); and Dynamo caches per code object,
so "whole declared" compiles next to "whole dynamic"'s entry for `RobotModel.forward`, which Dynamo counts as a
recompile of that code (shown in warm-up, with its reason).

Defaults: on a GPU robot_base and 200 requests; on the CPU robot_tiny and 12 requests; fp32, batch 1.
`benchmarks/robot_stream.py` runs this suite with its own defaults (robot_base, 200 requests on any device).
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import fullgraph.compile
from fullgraph.bench.results import Result, make_rows
from fullgraph.bench.suites import DTYPES
from fullgraph.bench.table import format_table
from fullgraph.compile.options import dynamo_config_name
from fullgraph.compile.stats import CompileStats, Tracker, merge
from fullgraph.errors import UsageError
from fullgraph.models.robot import (
    CONFIGS,
    RobotModel,
    config,
    dynamic_spec,
    example_inputs,
    random_stream,
    recommended_plan,
)
from fullgraph.timing import quantile, resolve_device

WAYS = {"eager": "eager", "dynamic": "whole dynamic", "declared": "whole declared", "plan": "plan"}  # --ways -> way
GPU_N, CPU_N = 200, 12
UNITS = {"median_ms": "ms", "p20_ms": "ms", "p80_ms": "ms", "compile_seconds": "s", "warmup_s": "s"}
RECOMPILE_LIMIT = 64  # the ways share Dynamo's per-code caches: a way that recompiles shows it, never falls back


@dataclass(frozen=True)
class WayResult:
    """One way over the stream."""

    latencies_ms: tuple[float, ...]  # per request, in stream order
    warmup: CompileStats  # what the warm-up compiled
    stream: CompileStats  # what the timed stream compiled (nothing, for a way whose shapes are covered)
    warmup_s: float
    max_abs_diff: float  # against eager, over the stream


def parse_ways(spec: str | None) -> tuple[str, ...]:
    """--ways as keys of WAYS, in the order given (default: all)."""
    if not spec:
        return tuple(WAYS)
    ways = tuple(dict.fromkeys(w.strip() for w in spec.split(",") if w.strip()))
    bad = [w for w in ways if w not in WAYS]
    if bad or not ways:
        raise UsageError(f"--ways: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(WAYS)}")
    return ways


def build_ways(base: RobotModel, keys: tuple[str, ...]) -> dict[str, Callable]:
    """Way name -> callable, each compiled way on its own copy of `base` (the same weights)."""
    cfg = base.cfg
    make = {
        "eager": lambda: base,
        "dynamic": lambda: torch.compile(copy.deepcopy(base), dynamic=True),
        "declared": lambda: fullgraph.compile(copy.deepcopy(base), dynamic=dynamic_spec(cfg)),
        "plan": lambda: fullgraph.compile(copy.deepcopy(base), plan=recommended_plan(cfg)),
    }
    return {WAYS[k]: make[k]() for k in keys}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable, args: tuple, device: torch.device, tracker: Tracker) -> tuple[float, torch.Tensor]:
    """Milliseconds for one request, device work included, and its output (cloned: a CUDA graph's output memory is
    reused by its next replay)."""
    _sync(device)
    tracker.begin()
    t0 = time.perf_counter()
    try:
        out = fn(*args)
        _sync(device)
        ms = (time.perf_counter() - t0) * 1e3
    finally:
        tracker.end()
    return ms, out.clone()


def serve(ways: dict[str, Callable], base: RobotModel, warm: list, stream: list, device: torch.device):
    """Warm each way up, then run the stream through all of them, interleaved: way name -> WayResult."""
    warm_stats, warm_s = {}, {}
    with torch.no_grad():
        for name, fn in ways.items():
            print(f"  [{name}] warm-up: {len(warm)} request(s)", file=sys.stderr, flush=True)
            tracker, t0 = Tracker(), time.perf_counter()
            for x in warm:
                timed(fn, x, device, tracker)
            warm_s[name], warm_stats[name] = time.perf_counter() - t0, tracker.stats
        print(f"  stream: {len(stream)} requests, ways interleaved", file=sys.stderr, flush=True)
        trackers = {name: Tracker() for name in ways}
        lat: dict[str, list[float]] = {name: [] for name in ways}
        err = dict.fromkeys(ways, 0.0)
        for x in stream:
            ref = None if "eager" in ways else base(*x)  # eager, untimed, when it is not a way of its own
            for name, fn in ways.items():
                ms, out = timed(fn, x, device, trackers[name])
                lat[name].append(ms)
                ref = out if ref is None else ref
                err[name] = max(err[name], (out.float() - ref.float()).abs().max().item())
    return {name: WayResult(tuple(lat[name]), warm_stats[name], trackers[name].stats, warm_s[name], err[name])
            for name in ways}  # fmt: skip


def run(args) -> tuple[list[Result], str]:
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    keys = parse_ways(getattr(args, "ways", None))
    n = args.n if args.n is not None else (GPU_N if gpu else CPU_N)
    if n < 1 or args.warmup < 1:
        flag, value = ("--n", n) if n < 1 else ("--warmup", args.warmup)
        raise UsageError(f"{flag} {value}: give at least 1 request")
    name = args.config or ("robot_base" if gpu else "robot_tiny")
    if name not in CONFIGS:
        raise UsageError(f"--config {name!r}: unknown robot config; choose {' or '.join(CONFIGS)}")
    cfg, dtype = config(name), DTYPES[args.dtype]

    torch.manual_seed(args.seed)
    base = RobotModel(cfg).eval().to(device, dtype)
    side = min(cfg.height[1], cfg.width[1])
    warm = [example_inputs(cfg, 1, side, side, cfg.num_points[1], device=device, dtype=dtype)]
    warm += random_stream(cfg, args.warmup - 1, seed=args.seed + 1, device=device, dtype=dtype)
    stream = random_stream(cfg, n, seed=args.seed, device=device, dtype=dtype)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(**{dynamo_config_name("recompile_limit"): RECOMPILE_LIMIT}):
        ways = build_ways(base, keys)
        results = serve(ways, base, warm, stream, device)

    sizes = {(img.shape[2], img.shape[3], pts.shape[1]) for img, pts in stream}
    where = torch.cuda.get_device_name(device) if gpu else "cpu"
    head = (f"{name} ({where}, {args.dtype}, batch 1): {n} requests, {len(sizes)} distinct (H, W, N); H {cfg.height}, "
            f"W {cfg.width}, N {cfg.num_points}; latency per request, wall clock with a sync")  # fmt: skip
    case = f"{name} {args.dtype} stream{n}"
    params = {"config": name, "dtype": args.dtype, "requests": n, "warmup": len(warm), "sizes": len(sizes),
              "seed": args.seed}  # fmt: skip
    rows: list[Result] = []
    table, notes = [], []
    for way, r in results.items():
        s, total = sorted(r.latencies_ms), merge(r.warmup, r.stream)
        v = {"median_ms": quantile(s, 0.5), "p20_ms": quantile(s, 0.2), "p80_ms": quantile(s, 0.8),
             "warmup_frames": r.warmup.frames_compiled, "frames_after_warmup": r.stream.frames_compiled,
             "recompiles_after_warmup": len(r.stream.recompiles), "graph_breaks": total.graph_breaks,
             "compile_seconds": total.compile_seconds, "warmup_s": r.warmup_s,
             "max_abs_diff_vs_eager": r.max_abs_diff}  # fmt: skip
        rows += make_rows("robot", case, way, {k: (float(x), UNITS.get(k, "")) for k, x in v.items()}, params)
        counts = ("warmup_frames", "frames_after_warmup", "recompiles_after_warmup", "graph_breaks", "compile_seconds")
        table.append([way, v["median_ms"], f"{v['p20_ms']:.3f}-{v['p80_ms']:.3f}", *(v[k] for k in counts),
                      r.warmup_s, f"{r.max_abs_diff:.2e}"])  # fmt: skip
        for when, stats in (("in warm-up", r.warmup), ("after warm-up", r.stream)):
            notes += [f"{way}: recompile {when}: {rc.function}: {rc.reason.splitlines()[0][:120]}"
                      for rc in stats.recompiles]  # fmt: skip
    headers = ["way", "median ms", "p20-p80 ms", "warm-up frames", "frames after", "recompiles after", "graph breaks",
               "compile s", "warm-up s", "max |diff|"]  # fmt: skip
    text = "\n".join([head, format_table(headers, table), *notes])
    if "plan" in ways:
        text += "\n\nplan:\n" + ways["plan"].describe()
    return rows, text
