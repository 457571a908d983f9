"""A doctor's report with every schema-2 field filled, fresh numbers each call, and hostile text in every kind of
string a user's code or a library can put there. Shared by the HTML and terminal renderers' tests."""

from __future__ import annotations

import os
import random

from fullgraph.bench.breakdown import Breakdown, ClassTime, Flag, KernelTime
from fullgraph.diagnose.report import (
    ChecklistItem,
    ConfigResult,
    Finding,
    FixCapture,
    FixOffer,
    GraphBreak,
    Recommendation,
    Recompile,
    Report,
)

HOSTILE = """<script>alert(1)</script> & "quoted" 'single'"""
# A source line longer than any column: it must be shown whole, never cut or squeezed into a narrow cell.
LONG_SOURCE = "if torch.any(x > threshold) and " + " and ".join(f"flags[{i}] > 0" for i in range(24)) + ":  # <&>"
NOISY = "compile reduce-overhead bf16"
RECOMMENDED = "compile max-autotune bf16"
WRONG = "compile max-autotune fp16 <fast>"
FAILED = "compile max-autotune-no-cudagraphs bf16"


def model_path() -> str:
    """An absolute path under the current folder: the report must show it relative."""
    return os.path.join(os.getcwd(), "examples", "model.py")


def _timed(name: str, dtype: str, median: float, rel_err: float, tol: float, noisy: bool = False) -> ConfigResult:
    spread = random.uniform(0.02, 0.15) * median
    return ConfigResult(
        name,
        name.split()[0] if name.startswith("eager") else name.split()[1],
        dtype,
        median_ms=median,
        p20_ms=median - spread,
        p80_ms=median + random.uniform(0.5, 1.5) * spread,
        compile_s=None if name.startswith("eager") else random.uniform(5, 90),
        peak_memory_bytes=random.randrange(2**28, 2**33),
        rel_err=rel_err,
        tolerance=tol,
        rounds=random.randint(3, 7),
        spread=random.uniform(0.15, 0.4) if noisy else random.uniform(0.005, 0.03),
        noisy=noisy,
    )


def _breakdown(label: str, device: str, call_ms: float, idle: float | None) -> Breakdown:
    names = ["gemm", "attention", "elementwise", "copy", "other"]
    weights = [random.uniform(0.5, 6) for _ in names]
    busy = call_ms * (1 - (idle or 0.0))
    ms = [busy * w / sum(weights) for w in weights]
    classes = [
        ClassTime(
            n,
            t,
            t / busy,
            random.randint(1, 60),
            rate=random.uniform(50, 700) if n in ("gemm", "attention") else random.uniform(0.5, 3.5),
            unit="TFLOP/s" if n in ("gemm", "attention") else "TB/s",
            pct_of_ceiling=random.uniform(20, 95),
        )
        if n != "other"
        else ClassTime(n, t, t / busy, random.randint(1, 9))
        for n, t in zip(names, ms, strict=True)
    ]
    top = [
        KernelTime("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "gemm",
                   ms[0] * 0.7, 48, "aten::addmm <- model.py:41 self.fc1(x)"),
        KernelTime(f"triton_poi_fused_add_gelu_{HOSTILE}", "elementwise", ms[2] * 0.5, 12, ""),
        KernelTime("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention", ms[1], 12, "aten::_scaled_dot"),
    ]  # fmt: skip
    flags = [
        Flag("layout-conversion", f"NCHW->NHWC copies before the patch embedding {HOSTILE}", ms[3] * 0.8,
             "write the patch embedding as reshape + F.linear"),
        Flag("epilogue-candidate", "a standalone GELU pass after fc1", ms[2] * 0.3,
             "torch._addmm_activation(..., use_gelu=True)"),
    ]  # fmt: skip
    return Breakdown(label, device, call_ms, busy, idle, classes, top, flags, {"copy_tbps": 4.27, "gemm_tflops": 760})


def full_report() -> Report:
    """Six configurations: the fastest in-tolerance one recommended, tied with a noisy one; one faster but wrong,
    one failed. Two breaks (one with a long source line), two recompile causes (five guard failures)."""
    eager = random.uniform(8, 40)
    fast = eager / random.uniform(2.0, 3.5)
    configs = [
        _timed("eager fp32", "float32", eager, 0.0, 1e-3),
        _timed("compile default fp32", "float32", eager / random.uniform(1.1, 1.5), 3e-7, 1e-3),
        _timed(NOISY, "bfloat16", fast * random.uniform(1.005, 1.03), 4e-3, 4e-2, noisy=True),
        _timed(RECOMMENDED, "bfloat16", fast, random.uniform(1e-3, 5e-3), 4e-2),
        _timed(WRONG, "float16", fast * 0.8, 0.2, 1e-2),  # faster still but wrong: greyed, never recommended
        ConfigResult(FAILED, "max-autotune-no-cudagraphs", "bfloat16", error=f"RuntimeError: {HOSTILE}"),
    ]
    path = model_path()
    line = random.randrange(10, 400)
    breaks = [
        GraphBreak(path, line, "forward", LONG_SOURCE, f"data-dependent branch {HOSTILE}", "GB0170",
                   "Data-dependent branching", "use torch.cond", f"replace the branch with torch.where {HOSTILE}"),
        GraphBreak(path, line + 7, "attend", "print(x.shape)", "Unsupported builtin print() [GB0099]", "GB0099",
                   "builtin print", "", "delete the print"),
    ]  # fmt: skip
    recompiles = [
        Recompile("forward", path, line, "batch", "L['x'].size()[0] == 4", "mark the batch dim dynamic", count=3),
        Recompile("forward (after the break at line 32)", path, line + 3, "dtype",
                  f"L['q'].dtype == torch.float32 {HOSTILE}", "cast once at entry", count=2),
    ]  # fmt: skip
    return Report(
        target="examples/model.py:Net",
        device="cuda:0",
        inputs=["4x3x224x224:float32", "4:int64"],
        environment={"gpu": "NVIDIA H200", "torch": "2.13.0", "triton": "3.6.0", "attention": [{"name": "flash"}]},
        lint=[Finding(path, line, 9, "FG001", "`.item()` syncs the host & breaks graphs", "keep it a tensor")],
        graph_count=4,
        graph_breaks=breaks,
        recompiles=recompiles,
        cudagraph_skips=["mutated inputs in forward (model.py:12)"],
        configs=configs,
        recommendation=Recommendation(
            RECOMMENDED,
            eager / fast,
            'model = torch.compile(model, mode="max-autotune")',
            "eager fp32",
            tie=[NOISY],
            reason=f"fastest within tolerance; {NOISY} is within noise",
        ),
        checklist=[
            ChecklistItem("no graph breaks", "fail", "2 breaks"),
            ChecklistItem("outputs within tolerance", "pass", "rel err 2e-3 <= 1e-2"),
            ChecklistItem("CUDA graphs replay", "not-measured", "reduce-overhead failed"),
        ],
        notes=[f"note with {HOSTILE}"],
        fixes=[FixOffer("nms", f"ours {HOSTILE}", "with fix():\n    y = model(x)", [f"eager bf16 failed: {HOSTILE}"])],
        applied=["nms"],
        applied_breaks=[FixCapture("bf16", 2, breaks[:1])],
        breakdowns=[
            _breakdown("eager fp32", "cuda", eager, random.uniform(0.2, 0.4)),
            _breakdown(RECOMMENDED, "cuda", fast, random.uniform(0.02, 0.1)),
        ],
        output=["printed 3×: torch.Size([4, 3, 224, 224])", f"UserWarning: {HOSTILE}"],
        timing={"threads": 2, "rounds": 5, "method": "CUDA events, interleaved rounds"},
    )
