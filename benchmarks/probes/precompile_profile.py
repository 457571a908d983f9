"""Where does a precompiled model's load go? (issue 15: the 0.5 s mark from load to first output.)

Precompiles a model once (fullgraph.deploy.coldstart's save-precompiled, in a child process), then loads it in a
fresh process under cProfile, with an empty Inductor cache folder as in `fullgraph bench coldstart`, and prints
the child's timings and the functions that took the load and the first call, by cumulative and by own time.

Run: PYTHONPATH=src python benchmarks/probes/precompile_profile.py --work DIR [--device cuda] [--kwargs JSON]
  [--batch 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROFILED_BOOT = """
import cProfile, pstats, sys, time
t0 = time.perf_counter()
profile = cProfile.Profile()
profile.enable()
import torch
t1 = time.perf_counter()
import fullgraph.compile, fullgraph.deploy.coldstart as c
t2 = time.perf_counter()
code = c.main(sys.argv[2:], clock=(t0, t1, t2))
profile.disable()
profile.dump_stats(sys.argv[1])
sys.exit(code)
"""


def child(argv: list[str], env: dict[str, str], log: Path, timeout: float) -> dict:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    log.write_text(f"$ {' '.join(argv)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    report = json.loads(lines[-1]) if lines else {"ok": False, "error": proc.stderr[-600:]}
    report["wall_s"] = time.perf_counter() - start
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--kwargs", default='{"config": "vit_b16"}', help="fullgraph.bench.suites.coldstart:vit's")
    p.add_argument("--size", type=int, default=224, help="image side")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--preset", default="perception")
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--top", type=int, default=45)
    args = p.parse_args()
    import pstats

    import torch

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.save([torch.randn(args.batch, 3, args.size, args.size)], work / "inputs.pt")
    common = [
        "--build", "fullgraph.bench.suites.coldstart:vit", "--build-kwargs", args.kwargs,
        "--inputs", str(work / "inputs.pt"), "--device", args.device, "--dtype", args.dtype,
        "--preset", args.preset, "--precompiled", str(work / "model.fgpre"),
    ]  # fmt: skip
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(work / "inductor-save"))
    from fullgraph.bench.suites.coldstart import BOOT  # the suite's own bootstrap: imports timed

    saved = child([sys.executable, "-c", BOOT, "save-precompiled", *common], env, work / "save.log", args.timeout)
    print("save:", json.dumps(saved), flush=True)
    if not saved.get("ok"):
        return 1
    for name, extra in (("plain", {}), ("again", {})):  # twice: the second shows what a warm OS file cache changes
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(work / f"inductor-{name}"), **extra)
        stats = work / f"load_{name}.prof"
        argv = [sys.executable, "-c", PROFILED_BOOT, str(stats), "load-precompiled", *common, "--reps", "10"]
        report = child(argv, env, work / f"load_{name}.log", args.timeout)
        keys = ("import_torch_s", "import_fullgraph_s", "build_s", "load_s", "first_call_s", "first_output_s",
                "median_ms", "wall_s", "error")  # fmt: skip
        print(f"load[{name}]:", {k: report.get(k) for k in keys}, flush=True)
        if not stats.exists():
            continue
        for order in ("cumulative", "tottime"):
            print(f"--- load[{name}] by {order} (whole child, profiler on)")
            s = pstats.Stats(str(stats))
            s.sort_stats(order).print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
