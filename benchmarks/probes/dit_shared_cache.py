"""Does "ours native" pay for sharing one compiled object with the sweep's other policies? The sweep's DiT suite
compiles `ours` once and calls it under each variant's op policy (auto, all native, five one-kernel variants): one
forward code object, one Dynamo cache entry per policy. `dit_guard_cost.py` gave each variant a class of its own and
read all native within 1% of plain at 1280x16 b8 n256 on an H100, where the sweep read 0.94 on a quiet host
(results/sweep_dit_default_paired_h100.*). Here, in one process, built as the sweep builds (`suites.dit.build`,
`compile_twin`): plain and plain again; all native and auto on the shared object compiled under the sweep's seven
policies; all native and auto each on a class of its own; and all native with RoPE's native form computed in x's
dtype, as the plain twin's `rotate_half_rope` does (ours computes it in float32: the one difference of op or dtype
between the twins' post-grad graphs on the CPU, 2026-12-07), to see whether that is what all native pays at head
dims 72 and 80. Speeds paired round by round (`suites.paired_speed`).

Usage (GPU): PYTHONPATH=src python3 benchmarks/probes/dit_shared_cache.py [--shape 1280x16:8:256] [--depth 4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: dit_kernels.py
from dit_guard_cost import fresh
from dit_kernels import rope_like_plain

from fullgraph.bench.suites import compile_twin, paired_speed, policy_context
from fullgraph.bench.suites.dit import build
from fullgraph.models.dit import CONFIGS, DiT, DiTConfig
from fullgraph.timing import round_medians

SWEEP_POLICIES = ["all=auto", "none"] + [f"none,+{op}" for op in
                                         ("linear_gelu", "qk_norm_rope", "layer_norm_modulate", "skinny_linear",
                                          "sdpa_flash")]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1280x16:8:256", help="DIMxHEADS:BATCH:TOKENS")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--budget", type=float, default=8.0, help="seconds of timed rounds")
    args = parser.parse_args()
    dims, batch, tokens = args.shape.split(":")
    dim, heads = (int(v) for v in dims.split("x"))
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    CONFIGS["probe"] = DiTConfig(dim=dim, heads=heads, depth=args.depth)
    ns = argparse.Namespace(config="probe", depth=args.depth, rope="1d")
    cfg, ours, plain = build(ns, gpu, int(tokens))
    twin = type(plain)(cfg).eval()
    twin.load_state_dict(plain.state_dict())
    own = {name: fresh(DiT, name, cfg) for name in ("native", "auto", "bf16rope")}
    for m in own.values():
        m.load_state_dict(ours.state_dict())
    ours, plain, twin = (m.to(device, dtype) for m in (ours, plain, twin))
    own = {k: m.to(device, dtype) for k, m in own.items()}
    torch.manual_seed(1)
    x = torch.randn(int(batch), int(tokens), dim, device=device, dtype=dtype)
    c = torch.randn(int(batch), dim, device=device, dtype=dtype)
    shared = compile_twin(ours, None, fullgraph=True, dynamic=False)
    variants = {
        "plain": (compile_twin(plain, None, fullgraph=True, dynamic=False), None),
        "plain again": (compile_twin(twin, None, fullgraph=True, dynamic=False), None),
        "native, shared (7 policies)": (shared, "none"),
        "auto, shared (7 policies)": (shared, "all=auto"),
        "native, own class": (compile_twin(own["native"], None, fullgraph=True, dynamic=False), "none"),
        "auto, own class": (compile_twin(own["auto"], None, fullgraph=True, dynamic=False), "all=auto"),
        "native, own, RoPE in bf16": (compile_twin(own["bf16rope"], None, fullgraph=True, dynamic=False), "none"),
    }

    def context(name: str, pol: str | None):
        if "RoPE in bf16" not in name:
            return policy_context(pol)
        stack = contextlib.ExitStack()
        stack.enter_context(policy_context(pol))
        stack.enter_context(rope_like_plain())
        return stack

    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=64):
        for pol in SWEEP_POLICIES:  # the shared object compiled under every policy of the sweep, as it is there
            try:
                with policy_context(pol):
                    shared(x, c)
            except Exception as e:  # a kernel that cannot run here (the CPU without Triton's interpreter)
                print(f"  {pol}: skipped ({str(e).splitlines()[0][:80]})")
        errors = {}
        for name, (fn, pol) in variants.items():
            with context(name, pol):
                errors[name] = fn(x, c).float()
        errors = {k: ((v - errors["plain"]).norm() / errors["plain"].norm()).item() for k, v in errors.items()}
        fns = {name: (lambda fn=fn: fn(x, c)) for name, (fn, _) in variants.items()}
        around = {name: (lambda name=name, pol=pol: context(name, pol)) for name, (_, pol) in variants.items()}
        medians = round_medians(fns, device=device, rounds=5, reps=20, budget_s=args.budget, most_rounds=40,
                                around=around)  # fmt: skip
    print(f"{torch.cuda.get_device_name() if gpu else 'cpu'}, torch {torch.__version__}, {args.shape} depth "
          f"{args.depth}, default mode, {len(medians['plain'])} rounds")  # fmt: skip
    for name, ms in medians.items():
        m = statistics.median(ms)
        print(f"  {name:30s} {m * 1e3:8.1f} us  paired plain / this {paired_speed(medians['plain'], ms):.3f}  "
              f"(rounds {min(ms) * 1e3:.1f}-{max(ms) * 1e3:.1f})  differs from plain's output by "
              f"{errors[name]:.2e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
