"""Where one caller's time goes at small batch: issue 31's run (H100, torch 2.11, 2026-12-06) served timm ViT-S/16 b4
from one thread at 1263 calls/s through `fullgraph.compile(m, "perception")` (p50 0.79 ms) against 1551 through the
precompiled file and 1616 through the package under CUDA graphs (0.60-0.63 ms), where the model's GPU work is short
and every call waits for its output. This probe times, per call and with the stream synchronized after each (as a
server's single caller sees it), the host part apart (the call's return, before the sync):

- `eager`: the model under `torch.no_grad()`;
- `plain RO`: `torch.compile(m, mode="reduce-overhead")` under `torch.no_grad()` (torch's CUDA-graph trees, Dynamo's
  guards and AOTAutograd's runtime wrappers at every call); `plain RO, no trees`: the same with Inductor's
  `triton.cudagraph_trees` off (its older wrapper: a graph per input shape, no shared pool);
- `compiled`: `fullgraph.compile(m, "perception")` (the same, plus fullgraph's guard, checks and copy-out);
- `borrow`: its `borrow()` (no copy);
- `inner`: its compiled function called directly under `torch.no_grad()` (what fullgraph's wrapper adds, by
  difference);
- `precompiled`: `save_precompiled(mode="reduce-overhead")` then `load_precompiled` (one CUDA graph per signature
  through `GraphedCall`: no Dynamo, no trees at a call);
- `graphed default`: `GraphedCall` around `torch.compile(m)` in default mode (what replaying through GraphedCall
  instead of torch's trees would give a compiled model, Dynamo's guards skipped: not a safe design as it stands).

Interleaved rounds (each variant CALLS calls per round, the order rotated), the median over rounds of each round's
median; then cProfile over 300 calls of `compiled` and of `plain RO`, the 12 functions with the most own time.

Run: PYTHONPATH=src python benchmarks/percall_probe.py [--models vit_s16_b4,vit_b16_b4,dit_b_1024] [--rounds 7]
(--small: a tiny MLP on the CPU, to check the script; no CUDA graphs there).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "targets"))

import fullgraph
from fullgraph.compile.graphs import GraphedCall

CALLS = 200


def target(name: str, small: bool):
    if small:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).eval()
        return model, (torch.randn(4, 64),)
    import serve

    if name == "vit_b16_b4":
        model, x = serve._timm("vit_base_patch16_224", 4)
    else:
        model, x = getattr(serve, name)()
    xs = x if isinstance(x, tuple) else (x,)
    return model.cuda(), tuple(t.cuda() for t in xs)


def variants(model: torch.nn.Module, xs: tuple, small: bool, work: str) -> dict:
    from fullgraph.deploy.precompile import load_precompiled, save_precompiled

    found = {}
    eager = copy.deepcopy(model)
    plain = torch.compile(copy.deepcopy(model), mode=None if small else "reduce-overhead")
    cm = fullgraph.compile(copy.deepcopy(model), "dev" if small else "perception")
    inner = cm.__dict__["_compiled"]

    def no_grad(fn):
        def call():
            with torch.no_grad():
                return fn(*xs)

        return call

    def borrowed():
        with cm.borrow(*xs) as out:
            return out

    found["eager"] = no_grad(eager)
    found["plain RO"] = no_grad(plain)
    if not small:  # torch's older CUDA-graph wrapper: one graph per input shape, no trees
        flat = torch.compile(copy.deepcopy(model), options={"triton.cudagraphs": True, "triton.cudagraph_trees": False})
        found["plain RO, no trees"] = no_grad(flat)
    found["compiled"] = lambda: cm(*xs)
    found["borrow"] = borrowed
    found["inner"] = no_grad(inner)
    path = os.path.join(work, "model.fgpre")
    save_precompiled(copy.deepcopy(model), xs, path, mode=None if small else "reduce-overhead")
    found["precompiled"] = (lambda pre: lambda: pre(*xs))(load_precompiled(path, copy.deepcopy(model)))
    if not small:
        found["graphed default"] = no_grad(GraphedCall(torch.compile(copy.deepcopy(model)), name="probe"))
    return found


def sync(small: bool) -> None:
    if not small:
        torch.cuda.synchronize()


def timed(fn, small: bool, calls: int) -> tuple[float, float]:
    """(median host ms, median synchronized ms) over `calls` calls, each after the last one's sync."""
    host, whole = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        sync(small)
        t2 = time.perf_counter()
        del out
        host.append((t1 - t0) * 1e3)
        whole.append((t2 - t0) * 1e3)
    return statistics.median(host), statistics.median(whole)


def profile(fn, calls: int = 300, top: int = 12) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).sort_stats("tottime")
    stats.print_stats(top)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="vit_s16_b4,vit_b16_b4,dit_b_1024")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=CALLS)
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    small = args.small
    if not small and not torch.cuda.is_available():
        sys.exit("percall_probe: needs a GPU (or --small on the CPU)")
    device = "cpu" if small else torch.cuda.get_device_name()
    print(f"# per-call time, one caller, stream synchronized after each call; {device}, torch {torch.__version__}")
    for name in ["mlp"] if small else args.models.split(","):
        model, xs = target(name, small)
        with tempfile.TemporaryDirectory() as work:
            fns = variants(model, xs, small, work)
            for fn in fns.values():  # compile, warm up, record
                for _ in range(5):
                    fn()
                sync(small)
            rounds: dict[str, list[tuple[float, float]]] = {k: [] for k in fns}
            names = list(fns)
            for r in range(args.rounds):
                for k in names[r % len(names) :] + names[: r % len(names)]:
                    rounds[k].append(timed(fns[k], small, args.calls))
            ref = statistics.median(w for _, w in rounds["plain RO"])
            print(f"\n## {name}: median of {args.rounds} rounds of {args.calls} calls")
            print(f"{'variant':18} {'host ms':>9} {'synced ms':>10} {'x plain RO':>11} {'calls/s':>9}")
            for k, vals in rounds.items():
                h, w = statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals)
                print(f"{k:18} {h:9.4f} {w:10.4f} {w / ref:11.3f} {1e3 / w:9.1f}")
            for k in ("compiled", "plain RO"):
                print(f"\n### cProfile, 300 calls of {k} (own time)\n{profile(fns[k])}")
            with contextlib.suppress(Exception):
                torch._dynamo.reset()


if __name__ == "__main__":
    main()
