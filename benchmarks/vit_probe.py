"""Our ViT-B/16 (fullgraph.models.vit) against timm's vit_base_patch16_224 with the same weights, both compiled.

Per (batch, mode): timm compiled, ours with the exact GELU (its MLP's GELU stays a pass of its own), ours with the
tanh GELU (fc1 + GELU as one GEMM where `linear_gelu`'s compiled auto takes the kernel, as on the H200), all bf16,
timed in interleaved rounds (fullgraph.timing.round_medians); ratio = timm's time / this one. Error: relative
(Frobenius) error of the logits against timm in fp32. Needs timm and a GPU (the H200 image has both).

`--tma` adds each model compiled with max-autotune (CUDA graphs where the point's mode has them) and Inductor's
persistent TMA GEMM templates (`triton.enable_persistent_tma_matmul`): a Triton template that beats cuBLAS also
takes the bias, GELU (the exact one too) and residual add into its epilogue.

`--policies` adds ours (tanh GELU) with one op policy pinned per variant (POLICY_VARIANTS: fc1 + GELU as one
cuBLASLt GEMM at any size, our attention kernel).

Run: PYTHONPATH=src python3 benchmarks/vit_probe.py [--points 256:default,4:reduce-overhead] [--tma] [--policies]
  [--csv F]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from fullgraph import ops
from fullgraph.bench.results import append_csv, make_rows
from fullgraph.bench.table import format_table
from fullgraph.models.vit import load_timm_state_dict, vit_b16
from fullgraph.timing import round_medians

# Op policies pinned for --policies: compiled `auto` leaves linear_gelu native below 2^21 elements of x (host time in
# default mode; under CUDA graphs host time does not count) and takes cuDNN attention at 197 tokens.
POLICY_VARIANTS = {"fc1+GELU kernel": {"linear_gelu": "kernel"}, "attention kernel": {"attention": "kernel"}}


def under(pol: dict, fn):
    """`fn` called under op policies `pol` (read when it traces; the compiled code guards on them)."""

    def call(x):
        with ops.policy(**pol):
            return fn(x)

    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="256:default,4:reduce-overhead", help="batch:mode list")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--csv", default=None)
    tma_help = "also each model under max-autotune with persistent TMA GEMM templates (minutes)"
    parser.add_argument("--tma", action="store_true", help=tma_help)
    parser.add_argument("--policies", action="store_true", help="also ours (tanh) under each of POLICY_VARIANTS")
    args = parser.parse_args()
    try:
        import timm
    except ImportError:
        print("vit_probe.py needs timm: pip install timm", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("vit_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    ref = timm.create_model("vit_base_patch16_224", pretrained=False).eval().cuda()
    theirs = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
    theirs.load_state_dict(ref.state_dict())
    models = {"timm": theirs}
    for gelu in ("erf", "tanh"):
        models[f"ours, {gelu} GELU"] = load_timm_state_dict(vit_b16(gelu=gelu), ref.state_dict()).eval()
    models = {k: m.cuda().to(torch.bfloat16) for k, m in models.items()}
    rows, table = [], []
    for point in args.points.split(","):
        batch, mode = point.split(":")
        batch, compile_mode = int(batch), (None if mode == "default" else mode)
        torch._dynamo.reset()
        compiled = {k: torch.compile(m, mode=compile_mode) for k, m in models.items()}
        if args.policies:  # ours (tanh) again, each under one op policy pinned (its own instance and compile)
            for label, pol in POLICY_VARIANTS.items():
                m = load_timm_state_dict(vit_b16(gelu="tanh"), ref.state_dict()).eval().cuda().to(torch.bfloat16)
                compiled[f"ours, tanh GELU, {label}"] = under(pol, torch.compile(m, mode=compile_mode))
        if args.tma:  # each model again, autotuned with Inductor's persistent TMA templates (off by default)
            base = "max-autotune" if mode == "reduce-overhead" else "max-autotune-no-cudagraphs"
            opts = {**torch._inductor.list_mode_options(base), "triton.enable_persistent_tma_matmul": True}
            compiled |= {f"{k}, autotune+TMA": torch.compile(m, options=opts) for k, m in models.items()}
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        with torch.no_grad():
            expected = ref(x).float()
            errors = {}
            for name, fn in compiled.items():
                out = fn(x.bfloat16()).float()
                errors[name] = ((out - expected).norm() / expected.norm()).item()
            xb = x.bfloat16()
            medians = round_medians({k: (lambda fn=fn, xb=xb: fn(xb)) for k, fn in compiled.items()}, device="cuda",
                                    rounds=5, reps=args.reps)  # fmt: skip
        base = statistics.median(medians["timm"])
        for name, m in medians.items():
            med = statistics.median(m)
            table.append([f"b{batch} {mode}", name, med, batch / med * 1e3, base / med, errors[name]])
            rows += make_rows("vit_probe", f"b{batch} {mode}", name,
                              {"median_ms": (med, "ms"), "over_timm": (med / base, "x"), "rel_err": (errors[name], "")},
                              {"batch": batch, "mode": mode, "dtype": "bfloat16"})  # fmt: skip
    print(format_table(["point", "variant", "ms", "img/s", "timm / this", "rel err vs timm fp32"], table))
    if args.csv:
        append_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
