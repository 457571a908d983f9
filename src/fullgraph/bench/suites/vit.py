"""Suite `vit`: the ViT case study, what users run against ours, per batch size.

The reference is what users run: timm's `vit_base_patch16_224` when timm is installed and the config is `vit_b16`,
otherwise our plain-PyTorch twin (`fullgraph.models.vit.PlainViT`: convolution patch embedding, `nn.LayerNorm`,
SDPA). Ours is `fullgraph.models.vit.ViT` with the same weights and the tanh GELU (fc1 + GELU as one GEMM where
`linear_gelu`'s compiled `auto` takes the kernel, as on the H200). Per batch size: the reference eager in fp32 and
in the compute dtype, then each compile mode for the reference and for ours. Per variant: first call (compile
time for the compiled ones), peak memory of one call, latency median with p20 / p80 (CUDA events or the CPU
clock), throughput, and the relative (Frobenius) error of the logits against the reference's eager fp32 output.
With --breakdown, where the GPU time goes (torch.profiler, kernel classes) for the reference and ours, compiled
in the first mode.

Defaults: on a GPU ViT-B/16 at batch 1, 4 and 256, bf16, modes default and reduce-overhead; on the CPU a small
ViT (dim 192, 2 blocks, 64x64 images) at batch 2, fp32, default mode.
"""

from __future__ import annotations

import torch

from fullgraph.bench.breakdown import profile_breakdown
from fullgraph.bench.results import Result, make_rows, measurement_metrics
from fullgraph.bench.suites import DTYPES, parse_sizes
from fullgraph.bench.table import format_table
from fullgraph.errors import UsageError
from fullgraph.models.vit import PlainViT, ViT, config, load_timm_state_dict
from fullgraph.timing import benchmark, resolve_device

GPU_BATCHES = (1, 4, 256)
CPU_BATCHES = (2,)
MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def parse_modes(spec: str | None, gpu: bool) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in (spec or ("default,reduce-overhead" if gpu else "default")).split(",") if m)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UsageError(f"--modes: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(MODES)}")
    if not gpu and any(m != "default" for m in modes):
        raise UsageError("--modes: reduce-overhead and max-autotune need a GPU; use --modes default on the CPU")
    return modes


def reference_model(name: str, cfg) -> tuple[str, torch.nn.Module]:
    """("timm" or "plain", the model users would run) with random weights."""
    if name == "vit_b16":
        try:
            import timm

            return "timm", timm.create_model("vit_base_patch16_224", pretrained=False)
        except ImportError:
            pass
    return "plain", PlainViT(cfg)


def build(args, gpu: bool):
    name = args.config or ("vit_b16" if gpu else "vit_tiny")
    overrides = {} if (args.config or gpu) else {"depth": 2, "img_size": 64, "num_classes": 10}
    cfg = config(name, **overrides)
    torch.manual_seed(0)
    label, ref = reference_model(name, cfg)
    ours = ViT(config(name, **overrides, gelu="tanh"))
    load_timm_state_dict(ours, ref.state_dict())
    return cfg, label, ref.eval(), ours.eval()


def run(args) -> tuple[list[Result], str]:
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    dtype = DTYPES[args.dtype or ("bf16" if gpu else "fp32")]
    batches = parse_sizes("--batches", args.batches, "sizes like 1,4,256") if args.batches else None
    batches = batches or (GPU_BATCHES if gpu else CPU_BATCHES)
    modes = parse_modes(getattr(args, "modes", None), gpu)
    cfg, label, ref, ours = build(args, gpu)
    ref32 = ref.to(device)
    low = {label: _copy_to(ref, device, dtype), "ours": ours.to(device, dtype)}
    short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    rows: list[Result] = []
    table = []
    for batch in batches:
        torch.manual_seed(batch)
        x = torch.randn(batch, cfg.in_chans, *cfg.img_size, device=device)
        xd = x.to(dtype)
        point = f"{cfg.dim}d x{cfg.depth} b{batch}"
        params = {"config": args.config or "", "dim": cfg.dim, "depth": cfg.depth, "batch": batch, "dtype": short}
        with torch.no_grad():
            expected = ref32(x).float()
        variants = {f"{label}, eager fp32": (ref32, x)}
        if dtype != torch.float32:
            variants[f"{label}, eager {short}"] = (low[label], xd)
        torch._dynamo.reset()
        for mode in modes:
            for who, model in low.items():
                variants[f"{who}, compiled {mode} {short}"] = (torch.compile(model, mode=_mode(mode)), xd)
        for name, (fn, inp) in variants.items():
            with torch.no_grad():
                m = benchmark(lambda fn=fn, inp=inp: fn(inp), device=device, warmup=3, reps=args.reps)
                err = _rel_err(fn(inp), expected)
            med = m.timing.median_ms
            metrics = {**measurement_metrics(m), "images_per_s": (batch / med * 1e3, "img/s"), "rel_err": (err, "")}
            rows += make_rows("vit", point, name, metrics, params)
            peak = "-" if m.peak_memory_bytes is None else f"{m.peak_memory_bytes / 2**20:.0f}"
            table.append([point, name, med, f"{m.timing.p20_ms:.3f}-{m.timing.p80_ms:.3f}", batch / med * 1e3,
                          m.first_call_s, peak, err])  # fmt: skip
        if args.breakdown and gpu:
            for who in low:
                fn, inp = variants[f"{who}, compiled {modes[0]} {short}"]
                b = profile_breakdown(lambda fn=fn, inp=inp: fn(inp), device=device, label=who, dtype=dtype)
                classes = ", ".join(f"{k.name} {k.ms:.3f}" for k in sorted(b.classes, key=lambda k: -k.ms)[:6])
                table.append([point, f"  {who}, compiled {modes[0]}: where the time goes", b.kernel_ms] + [None] * 5)
                table.append([point, f"    {classes}"] + [None] * 6)
                rows += make_rows("vit", point, f"{who}, compiled {modes[0]} {short}",
                                  {f"class_ms_{k.name}": (k.ms, "ms") for k in b.classes}, params)  # fmt: skip
    headers = ["point", "variant", "ms", "p20-p80", "img/s", "first call s", "peak MiB", "rel err vs fp32"]
    return rows, f"reference: {label}\n" + format_table(headers, table)


def _mode(mode: str) -> str | None:
    return None if mode == "default" else mode


def _copy_to(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A second instance of `model` with its weights, on `device` in `dtype` (the fp32 one stays the reference)."""
    import copy

    return copy.deepcopy(model).to(device, dtype)


def _rel_err(out: torch.Tensor, expected: torch.Tensor) -> float:
    return ((out.float() - expected).norm() / expected.norm()).item()
