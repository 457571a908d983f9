"""Issue 11's acceptance for "where the time goes", on the GPU.

timm ViT-B/16 (random weights), bf16, batch 256, eager and compiled (default mode): the class totals of
`profile_breakdown` against the GPU time per call measured with CUDA events apart from the profiler (the bar: within
5%), the classes and the flags; a control, 8 x nn.Linear(4096, 4096) at batch 8192 bf16, which must get no flags;
and ViT-B/16 at batch 1, launch-bound in eager, not flagged so once compiled with CUDA graphs (reduce-overhead).
Run: PYTHONPATH=src python3 benchmarks/probes/breakdown_check.py  (writes breakdown_check.json / .csv under $OUT if set)
"""

import csv
import functools
import json
import os
import sys
import time
import traceback

import torch
from torch import nn

from fullgraph.bench.breakdown import profile_breakdown
from fullgraph.bench.ceilings import ceilings_for

RATIO_BAR = 0.05  # class totals within 5% of the CUDA-event time per call


def vit(batch: int = 256) -> tuple[nn.Module, torch.Tensor]:
    import timm

    model = timm.create_model("vit_base_patch16_224", pretrained=False).cuda().eval().to(torch.bfloat16)
    return model, torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)


def control(batch: int = 8192) -> tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(8)]).cuda().eval().to(torch.bfloat16)
    return model, torch.randn(batch, 4096, device="cuda", dtype=torch.bfloat16)


CASES = [  # label, builder, compile mode (None: eager), what must hold: the ratio bar, no flags, or one flag
    ("vit-b16 eager bf16 b256", vit, None, "ratio"),
    ("vit-b16 compile bf16 b256", vit, "default", "ratio"),
    ("control 8xLinear eager bf16 b8192", control, None, "no flags"),
    ("control 8xLinear compile bf16 b8192", control, "default", "no flags"),
    ("vit-b16 eager bf16 b1", functools.partial(vit, 1), None, "launch-bound"),
    ("vit-b16 reduce-overhead bf16 b1", functools.partial(vit, 1), "reduce-overhead", "no launch-bound"),
]


def holds(bar: str, b) -> bool:
    kinds = [f.kind for f in b.flags]
    if bar == "ratio":
        return abs(b.kernel_ms / b.call_ms - 1) <= RATIO_BAR
    if bar == "no flags":
        return not kinds
    if bar == "no launch-bound":
        return "launch-bound" not in kinds
    return bar in kinds


def run(label, build, mode, ceilings):
    model, x = build()
    fn = torch.compile(model, mode=mode) if mode else model
    t0 = time.perf_counter()
    with torch.inference_mode():
        fn(x)  # compiles
        compile_s = time.perf_counter() - t0
        graphs = mode == "reduce-overhead"
        b = profile_breakdown(
            lambda: fn(x), device="cuda", label=label, ceilings=ceilings, model=model, cuda_graphs=graphs
        )
    print(f"# {label}: first call {compile_s:.1f} s, profiled in {time.perf_counter() - t0 - compile_s:.1f} s")
    return b


def show(b) -> None:
    ratio = b.kernel_ms / b.call_ms
    print(
        f"\n{b.label}: call {b.call_ms:.3f} ms (CUDA events), kernels {b.kernel_ms:.3f} ms, ratio {ratio:.3f}, "
        f"idle {100 * b.idle_share:.1f}%"
    )
    for c in b.classes:
        rate = f"{c.rate:8.1f} {c.unit:<7}" if c.rate is not None else " " * 16
        pct = f"{c.pct_of_ceiling:5.1f}%" if c.pct_of_ceiling is not None else ""
        print(f"  {c.name:<12}{c.ms:9.3f} ms {100 * c.share:5.1f}% {c.kernels:5d} launches {rate} {pct}")
    for k in b.top:
        print(f"    {k.ms:8.3f} ms x{k.calls:<4} {k.cls:<11} {k.name[:70]:<70} <- {k.source[:80]}")
    for f in b.flags:
        print(f"  FLAG {f.kind}: {f.message}\n       fix: {f.fix[:110]}")


def main() -> int:
    out = os.environ.get("OUT")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    t0 = time.perf_counter()
    ceilings = ceilings_for("cuda", torch.bfloat16)
    print(f"ceilings {ceilings} ({time.perf_counter() - t0:.1f} s)")
    done, failed = [], []
    for label, build, mode, bar in CASES:
        try:
            b = run(label, build, mode, ceilings)
        except Exception as e:  # one model failing must not hide the others
            traceback.print_exc()
            failed.append(f"{label}: {type(e).__name__}: {e}")
            continue
        finally:
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        show(b)
        ok = holds(bar, b)
        done.append((b, ok))
    print(f"\n{'configuration':<38}{'call ms':>9}{'kernel ms':>10}{'ratio':>7}{'idle':>6}  flags")
    for b, ok in done:
        flags = ", ".join(f.kind for f in b.flags) or "-"
        print(
            f"{b.label:<38}{b.call_ms:9.3f}{b.kernel_ms:10.3f}{b.kernel_ms / b.call_ms:7.3f}"
            f"{100 * b.idle_share:5.1f}%  {flags}  {'ok' if ok else 'FAIL'}"
        )
    for line in failed:
        print(f"ERROR {line}")
    if out:
        with open(os.path.join(out, "breakdown_check.json"), "w") as f:
            json.dump(
                {
                    "torch": torch.__version__,
                    "ceilings": ceilings,
                    "breakdowns": [b.to_dict() for b, _ in done],
                    "errors": failed,
                },
                f,
                indent=1,
            )
        with open(os.path.join(out, "breakdown_check.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                [
                    "label",
                    "call_ms",
                    "kernel_ms",
                    "idle_share",
                    "class",
                    "ms",
                    "share",
                    "launches",
                    "rate",
                    "unit",
                    "pct_of_ceiling",
                    "flags",
                ]
            )
            for b, _ in done:
                flags = " ".join(fl.kind for fl in b.flags)
                for c in b.classes:
                    w.writerow(
                        [
                            b.label,
                            f"{b.call_ms:.4f}",
                            f"{b.kernel_ms:.4f}",
                            f"{b.idle_share:.4f}",
                            c.name,
                            f"{c.ms:.4f}",
                            f"{c.share:.4f}",
                            c.kernels,
                            c.rate,
                            c.unit,
                            c.pct_of_ceiling,
                            flags,
                        ]
                    )
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0 if done and all(ok for _, ok in done) and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
