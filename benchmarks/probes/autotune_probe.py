"""Where does max-autotune's compile time go? (issue 15: `fullgraph tune`'s edge rows took 307 s on ViT-B/16.)

On the H200 the tune's edge fp32 row spent ~45 s autotuning each GEMM shape, Inductor's summary line saying
"benchmarking takes 45 s and 0.0004 s precompiling for 21 choices": ~2 s per choice. This compiles one Linear
(timm ViT-B/16's QKV at batch 4: [788, 768] x [768, 2304]) in a fresh process per variant, each with an empty
Inductor cache folder, and prints for each: compile seconds, Inductor's autotuning summary lines, how many choices
were precompiled (and in how many seconds in all), how many failed, and the worker count Inductor sees. Variants:
the mode alone, the edge preset's options (freezing, cpp_wrapper) one at a time and together, fp32 and bf16, and
the edge row as `fullgraph tune` builds it (fullgraph.compile inside fullgraph's output capture).

Run: PYTHONPATH=src python benchmarks/probes/autotune_probe.py [--variants a,b] [--timeout 200]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, logging, re, sys, time
spec = json.loads(sys.argv[1])
import torch
from torch import nn
import torch._inductor.select_algorithm as sa
import torch._inductor.async_compile as ac

records = []
class Keep(logging.Handler):
    def emit(self, record):
        try:
            records.append(record.getMessage())
        except Exception:
            pass
for name in ("torch._inductor.select_algorithm", "torch._inductor.async_compile", "torch._inductor"):
    lg = logging.getLogger(name)
    lg.setLevel(logging.DEBUG)
    lg.addHandler(Keep())

dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[spec["dtype"]]
torch.manual_seed(0)
dev = spec["device"]
model = nn.Linear(768, 2304).to(dev, dtype).eval()
x = torch.randn(4, 197, 768, device=dev, dtype=dtype)
info = {"workers": sa.get_num_workers(), "process_pool": ac.AsyncCompile.use_process_pool(),
        "compile_threads": torch._inductor.config.compile_threads,
        "env_threads": __import__("os").environ.get("TORCHINDUCTOR_COMPILE_THREADS")}
t0 = time.perf_counter()
with torch.no_grad():
    if spec.get("fullgraph"):
        import fullgraph
        from fullgraph._capture import capture_output
        with capture_output(stdout=True, stderr=False):
            compiled = fullgraph.compile(model, preset="edge")
            out = compiled(x)
    else:
        mode = "max-autotune-no-cudagraphs"
        if spec["options"]:  # torch.compile takes a mode or options, not both: the mode's options with these
            compiled = torch.compile(model, options={**torch._inductor.list_mode_options(mode), **spec["options"]})
        else:
            compiled = torch.compile(model, mode=mode)
        out = compiled(x)
    if dev == "cuda":
        torch.cuda.synchronize()
info["compile_s"] = time.perf_counter() - t0
info["err"] = float((out.float() - model(x).float()).norm() / model(x).float().norm())
info["summary"] = [m for m in records if "AUTOTUNE benchmarking takes" in m]
pre = [m for m in records if m.startswith("Precompiling benchmark choice")]
info["precompiled"] = len(pre)
took = [re.findall(r"took ([0-9.]+)s", m) for m in pre]
info["precompile_s_sum"] = sum(float(t[0]) for t in took if t)
info["multithreaded"] = [m for m in records if m.startswith("Multithreaded precompilation")]
info["noop"] = [m for m in records if "returning no_op" in m or "returning it" in m]
info["failed"] = sum(1 for m in records if "Exception" in m or "Runtime error during autotuning" in m)
info["first_errors"] = [m[:200] for m in records if "Runtime error" in m or "Exception" in m][:3]
print(json.dumps(info))
"""

VARIANTS = {
    "mode-fp32": {"dtype": "fp32", "options": {}},
    "freezing-fp32": {"dtype": "fp32", "options": {"freezing": True}},
    "cppwrap-fp32": {"dtype": "fp32", "options": {"cpp_wrapper": True}},
    "edge-fp32": {"dtype": "fp32", "options": {"freezing": True, "cpp_wrapper": True}},
    "edge-bf16": {"dtype": "bf16", "options": {"freezing": True, "cpp_wrapper": True}},
    "tune-edge-fp32": {"dtype": "fp32", "options": None, "fullgraph": True},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--timeout", type=float, default=200)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    head = f"{'variant':16} {'compile s':>9} {'workers':>7} {'pool':>5} {'precompiled':>11} {'sum s':>6}"
    print(f"{head} {'failed':>6}  summary")
    for name in args.variants.split(","):
        spec = {**VARIANTS[name], "device": args.device}
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
            start = time.perf_counter()
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", CHILD, json.dumps(spec)],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=args.timeout,
                )
            except subprocess.TimeoutExpired:
                print(f"{name:16} timed out after {args.timeout:g} s")
                continue
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if not lines:
                log_line = re.compile(r"[IWVDE]\d{4} ")  # glog-style lines torch's loggers print
                errors = [line for line in proc.stderr.splitlines() if line.strip() and not log_line.match(line)]
                print(f"{name:16} failed (exit {proc.returncode}): {errors[-1:] or proc.stderr.splitlines()[-1:]}")
                continue
            r = json.loads(lines[-1])
            print(
                f"{name:16} {r['compile_s']:9.1f} {r['workers']:>7} {r['process_pool']!s:>5} {r['precompiled']:>11} "
                f"{r['precompile_s_sum']:6.1f} {r['failed']:>6}  {' | '.join(r['summary'])}"
            )
            print(
                f"{'':16} wall {time.perf_counter() - start:.1f} s, err {r['err']:.2e}, threads {r['compile_threads']} "
                f"(env {r['env_threads']}), {r['multithreaded'][:1]} {r['noop'][:2]} {r['first_errors'][:2]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
