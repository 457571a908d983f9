"""Issue 12 on the GPU: `fullgraph.compile` presets on timm's ViT-B/16, and bucketing over a stream of sizes.

Part `presets`, per batch size (1, 4, 256 by default), bf16: every preset (dev, perception, planning, edge, fusion)
through `fullgraph.compile(copy, preset, dtype=torch.bfloat16)`; at batch 4 also plain `torch.compile` in each of
its modes (what users write by hand); eager fp32 and eager bf16 as references. Per variant: the first call's wall
seconds (compile included; Inductor's and Triton's caches are whatever this process has built so far, so a later
variant can reuse kernels an earlier one built: the order is in the CSV) and the graphs it compiled (0: Dynamo ran
code compiled for an earlier variant, which shares its code object and backend), the error against eager fp32 (max
|difference| over max |reference|), and the latency: `fullgraph.timing.measure` (CUDA events) in ROUNDS
interleaved rounds, every variant once per round; the median of the round medians, with the lowest and highest
round median as the spread.

Part `bucketed`, bf16, a stream of STREAM random batch sizes in 1..32 (seeded), three ways:
- `bucketed`: `Bucketed(fullgraph.compile(m, "perception"), buckets=(1, 2, 4, 8, 16, 32))`: static shapes per
  bucket, reduce-overhead (CUDA graphs);
- `dynamic`: `fullgraph.compile(m, dynamic=True)` in default mode, what users reach for;
- `per-size`: `fullgraph.compile(m, dynamic=False, recompile_limit=64)`: one graph per exact size.
The first pass over the stream compiles (graphs, recompiles and compile seconds from each model's `stats`); then
PASSES more passes, the three ways interleaved pass by pass, time each request by wall clock with a device sync
after it (what a caller waits for: padding and slicing included). Outputs are checked against eager bf16.

Run: PYTHONPATH=src python benchmarks/compile_presets.py [presets|bucketed ...] [--batches 1,4,256]
  [--model timm:vit_base_patch16_224 | small] [--csv FILE]. Without timm (the CPU), `small` is a 12-block ViT.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regional_compile import ViT, device, sync  # the small model (a CPU smoke run) and the device helpers

import fullgraph
from fullgraph.bench.results import append_csv, make_rows
from fullgraph.compile import Bucketed, CompiledModel
from fullgraph.compile.options import dynamo_config_name
from fullgraph.timing import first_call, quantile, round_medians

PRESETS = tuple(os.environ.get("PRESETS", "perception,dev,planning,edge,fusion").split(","))
PLAIN_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
BUCKETS = (1, 2, 4, 8, 16, 32)
BF16 = torch.bfloat16
ROUNDS = int(os.environ.get("ROUNDS", 5))
STREAM = int(os.environ.get("STREAM", 48))
PASSES = int(os.environ.get("PASSES", 5))


def build(model_name: str) -> tuple[torch.nn.Module, int]:
    """The model in fp32 on the device, eval, and its image side."""
    torch.manual_seed(0)
    if model_name.startswith("timm:"):
        import timm

        return timm.create_model(model_name[5:], pretrained=False).eval().to(device()), 224
    if model_name == "small":
        return ViT().eval().to(device()), 128
    raise SystemExit(f"unknown --model {model_name!r}; give timm:NAME or small")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-12)).item()


def timed_rounds(fns: dict[str, Callable], xs: dict[str, torch.Tensor], reps: int) -> dict[str, tuple]:
    """Median of round medians, lowest and highest round median, every variant once per round on its input."""
    calls = {name: (lambda fn=fn, x=xs[name]: fn(x)) for name, fn in fns.items()}
    with torch.no_grad():
        medians = round_medians(calls, device=device(), rounds=ROUNDS, warmup=3, reps=reps)
    return {n: (statistics.median(m), min(m), max(m)) for n, m in medians.items()}


def part_presets(model_name: str, batches: list[int], csv: str | None) -> list:
    base, side = build(model_name)
    rows = []
    for batch in batches:
        torch._dynamo.reset()
        torch.manual_seed(batch)
        x = torch.randn(batch, 3, side, side, device=device())
        with torch.no_grad():
            ref = base(x)
        xb = x.to(BF16)
        fns: dict[str, Callable] = {"eager fp32": base, "eager bf16": copy.deepcopy(base).to(BF16)}
        info: dict[str, dict] = {n: {"order": i} for i, n in enumerate(fns)}
        info["eager fp32"]["rel_err"] = 0.0
        info["eager bf16"]["rel_err"] = rel_err(fns["eager bf16"](xb), ref)
        variants = [(f"preset {p}", p, None) for p in PRESETS]
        if batch == 4:
            variants += [(f"torch.compile {m}", None, m) for m in PLAIN_MODES]
        for name, preset, mode in variants:
            print(f"  [batch {batch}] {name}: compiling", file=sys.stderr, flush=True)
            try:
                m = copy.deepcopy(base)
                fn = fullgraph.compile(m, preset, dtype=BF16) if preset else torch.compile(m.to(BF16), mode=mode)
                graphs0 = counters["stats"]["unique_graphs"]
                with torch.no_grad():
                    seconds, _ = first_call(lambda fn=fn, xb=xb: fn(xb), device())
                    _, again = first_call(lambda fn=fn, xb=xb: fn(xb), device())
                # 0 graphs: Dynamo ran code compiled for an earlier variant (same code object, same backend).
                meta = {"order": len(info), "first_call_s": seconds, "rel_err": rel_err(again, ref),
                        "graphs": counters["stats"]["unique_graphs"] - graphs0}  # fmt: skip
                if preset:
                    meta |= {"compile_seconds": fn.stats.compile_seconds}
                fns[name], info[name] = fn, meta
            except Exception as e:  # one failing variant is a row, not the end of the run
                traceback.print_exc()
                info[name] = {"order": len(info), "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        reps = 30 if batch <= 4 else 10
        for name, (med, lo, hi) in timed_rounds(fns, {n: x if n == "eager fp32" else xb for n in fns}, reps).items():
            info[name] |= {"median_ms": med, "round_min_ms": lo, "round_max_ms": hi}
        best_plain = min((v["median_ms"], n) for n, v in info.items() if n.startswith("torch.compile") and
                         "median_ms" in v) if batch == 4 else None  # fmt: skip
        print(f"\nbatch {batch} bf16 ({model_name}; error vs eager fp32)")
        print(f"{'variant':36} {'ms':>9} {'rounds':>17} {'img/s':>9} {'first call s':>12} {'rel err':>9} graphs")
        for name, v in sorted(info.items(), key=lambda kv: kv[1]["order"]):
            if "error" in v:
                print(f"{name:36} failed: {v['error']}")
            else:
                rounds = f"{v['round_min_ms']:.3f}-{v['round_max_ms']:.3f}"
                first = f"{v['first_call_s']:.1f}" if "first_call_s" in v else "-"
                print(f"{name:36} {v['median_ms']:9.3f} {rounds:>17} {batch / v['median_ms'] * 1e3:9.0f} "
                      f"{first:>12} {v['rel_err']:9.2e} {v.get('graphs', '-')}")  # fmt: skip
            metrics = {k: (float(val), "ms" if k.endswith("_ms") else "s" if k.endswith("_s") else "")
                       for k, val in v.items() if k not in ("error",)}  # fmt: skip
            rows += make_rows("compile_presets", f"{model_name} b{batch} bf16", name, metrics, {"batch": batch})
        if best_plain:
            p = info.get("preset perception", {})
            b = info[best_plain[1]]
            if "median_ms" in p:
                print(f"perception {p['median_ms']:.3f} ms (rounds {p['round_min_ms']:.3f}-{p['round_max_ms']:.3f})"
                      f" vs best plain {best_plain[1]} {b['median_ms']:.3f} ms "
                      f"(rounds {b['round_min_ms']:.3f}-{b['round_max_ms']:.3f})")  # fmt: skip
        if csv:  # per batch, so a run stopped by its time limit keeps what it measured
            append_csv(csv, rows[-sum(1 for r in rows if r.case == f"{model_name} b{batch} bf16") :])
        del fns
        torch._dynamo.reset()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return rows


def part_bucketed(model_name: str) -> list:
    base, side = build(model_name)
    base = base.to(BF16)
    torch._dynamo.reset()
    rng = random.Random(1234)
    sizes = [rng.randint(1, 32) for _ in range(STREAM)]
    torch.manual_seed(1)
    xs = [torch.randn(n, 3, side, side, device=device(), dtype=BF16) for n in sizes]
    with torch.no_grad():
        refs = [base(x) for x in xs]
    arms: dict[str, tuple[Callable, CompiledModel]] = {}
    cm = fullgraph.compile(copy.deepcopy(base), "perception")
    arms["bucketed"] = (Bucketed(cm, dim=0, buckets=BUCKETS), cm)
    cm = fullgraph.compile(copy.deepcopy(base), dynamic=True, recompile_limit=64)
    arms["dynamic"] = (cm, cm)
    cm = fullgraph.compile(copy.deepcopy(base), dynamic=False, recompile_limit=64)
    arms["per-size"] = (cm, cm)
    info: dict[str, dict] = {}
    for name, (fn, cm) in arms.items():
        print(f"  [stream] {name}: first pass (compiles)", file=sys.stderr, flush=True)
        sync()
        t0 = time.perf_counter()
        err = 0.0
        with torch.no_grad():
            for x, ref in zip(xs, refs, strict=True):
                err = max(err, rel_err(fn(x), ref))
        sync()
        st = cm.stats
        info[name] = {"first_pass_s": time.perf_counter() - t0, "compile_seconds": st.compile_seconds,
                      "graphs": st.graphs, "frames_compiled": st.frames_compiled,
                      "recompiles": len(st.recompiles), "rel_err_vs_eager_bf16": err}  # fmt: skip
    lat: dict[str, list[float]] = {name: [] for name in arms}
    with torch.no_grad():
        for _ in range(PASSES):
            for name, (fn, _cm) in arms.items():
                for x in xs:
                    sync()
                    t0 = time.perf_counter()
                    fn(x)
                    sync()
                    lat[name].append((time.perf_counter() - t0) * 1e3)
    for name, (_fn, cm) in arms.items():
        s = sorted(lat[name])
        after = cm.stats
        info[name] |= {"median_ms": quantile(s, 0.5), "p20_ms": quantile(s, 0.2), "p80_ms": quantile(s, 0.8),
                       "graphs_after_timing": after.graphs}  # fmt: skip
    print(f"\nstream of {STREAM} random batch sizes 1..32 ({len(set(sizes))} distinct), bf16, {model_name}, "
          f"{PASSES} timed passes; latency per request, wall clock with a sync")  # fmt: skip
    print(f"{'way':10} {'median ms':>9} {'p20-p80':>15} {'graphs':>6} {'recompiles':>10} {'compile s':>9} "
          f"{'1st pass s':>10} {'rel err':>9}")  # fmt: skip
    rows = []
    for name, v in info.items():
        print(f"{name:10} {v['median_ms']:9.3f} {v['p20_ms']:7.3f}-{v['p80_ms']:<7.3f} {v['graphs']:6d} "
              f"{v['recompiles']:10d} {v['compile_seconds']:9.1f} {v['first_pass_s']:10.1f} "
              f"{v['rel_err_vs_eager_bf16']:9.2e}")  # fmt: skip
        metrics = {k: (float(val), "ms" if k.endswith("_ms") else "s" if k.endswith("_s") or k.endswith("seconds")
                       else "") for k, val in v.items()}  # fmt: skip
        rows += make_rows("compile_bucketed", f"{model_name} stream{STREAM} 1..32 bf16", name, metrics,
                          {"buckets": list(BUCKETS), "sizes": sizes, "passes": PASSES})  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["presets", "bucketed"], choices=["presets", "bucketed"])
    parser.add_argument("--model", default=None, help="timm:NAME or small (default: timm ViT-B/16 if timm is here)")
    parser.add_argument("--batches", default="1,4,256")
    parser.add_argument("--csv", help="append long-format result rows here")
    args = parser.parse_args()
    model = args.model
    if model is None:
        try:
            import timm  # noqa: F401

            model = "timm:vit_base_patch16_224"
        except ImportError:
            model = "small"
    # Plain torch.compile variants share Dynamo's per-code-object cache with the presets' copies: raise the
    # process-wide limit so none of them falls back to eager (each preset still applies its own around its calls).
    setattr(torch._dynamo.config, dynamo_config_name("recompile_limit"), 64)
    for part in args.parts:
        print(f"=== {part} ({time.strftime('%H:%M:%S')})", flush=True)
        if part == "presets":
            part_presets(model, [int(b) for b in args.batches.split(",")], args.csv)
        else:
            rows = part_bucketed(model)
            if args.csv:
                append_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
