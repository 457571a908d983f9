"""Suite `vit`: the ViT case study, what users run against ours, per batch size.

The reference is what users run: timm's `vit_base_patch16_224` when timm is installed and the config is `vit_b16`,
otherwise our plain-PyTorch twin (`fullgraph.models.vit.PlainViT`: convolution patch embedding, `nn.LayerNorm`,
SDPA). Ours is `fullgraph.models.vit.ViT` with the same weights and the tanh GELU (fc1 + GELU as one GEMM where
`linear_gelu`'s compiled `auto` takes the kernel, as on the H200). Per batch size: the reference eager in fp32 and
in the compute dtype, then each compile mode for the reference and for ours, then ours through each
`fullgraph.compile` preset of --presets (a copy of ours in the compute dtype, `fullgraph.compile(copy, preset,
dtype=...)`: what the library recommends, next to plain torch.compile). Per variant: first call (compile time for
the compiled ones), peak memory of one call, latency median with p20 / p80 (CUDA events or the CPU clock),
throughput, speed-up over the reference's eager fp32 ("x eager fp32"), and the relative (Frobenius) error of the
logits against the reference's eager fp32 output. With --breakdown, where the GPU time goes (torch.profiler, kernel
classes, then the top kernels) for the reference and ours, compiled in the first mode, and for ours under the first
preset. A progress line per variant goes to stderr (seconds since the start, the batch, what is compiled or timed).

Defaults: on a GPU ViT-B/16 at batch 1, 4 and 256, bf16, modes default and reduce-overhead, presets perception
(reduce-overhead, CUDA graphs, fullgraph=True) and dev; on the CPU a small ViT (dim 192, 2 blocks, 64x64 images)
at batch 2, fp32, default mode, preset dev.
"""

from __future__ import annotations

import copy
import sys
import time

import torch

import fullgraph.compile
from fullgraph.bench.breakdown import profile_breakdown
from fullgraph.bench.results import Result, make_rows, measurement_metrics
from fullgraph.bench.suites import (
    DTYPES,
    compile_twin,
    extra_policies,
    parse_sizes,
    policy_context,
    rel_err,
    time_interleaved,
    top_kernel_lines,
)
from fullgraph.bench.table import format_table
from fullgraph.errors import UsageError
from fullgraph.models.vit import PlainViT, ViT, config, load_timm_state_dict
from fullgraph.timing import benchmark, resolve_device

GPU_BATCHES = (1, 4, 256)
CPU_BATCHES = (2,)
MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
GPU_PRESETS = ("perception", "dev")
CPU_PRESETS = ("dev",)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # a preset in one of these replays CUDA graphs


def parse_modes(spec: str | None, gpu: bool) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in (spec or ("default,reduce-overhead" if gpu else "default")).split(",") if m)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UsageError(f"--modes: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(MODES)}")
    if not gpu and any(m != "default" for m in modes):
        raise UsageError("--modes: reduce-overhead and max-autotune need a GPU; use --modes default on the CPU")
    return modes


def parse_presets(spec: str | None, gpu: bool) -> tuple[str, ...]:
    """--presets as `fullgraph.compile` preset names, in the order given; "none" for no preset rows."""
    if spec is None:
        return GPU_PRESETS if gpu else CPU_PRESETS
    names = tuple(dict.fromkeys(p.strip() for p in spec.split(",") if p.strip()))
    if names == ("none",):
        return ()
    known = fullgraph.compile.PRESETS
    bad = [p for p in names if p not in known]
    if bad or not names:
        raise UsageError(f"--presets: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(known)}, "
                         "or none")  # fmt: skip
    graphs = [p for p in names if known[p].mode in CUDA_GRAPH_MODES]
    if graphs and not gpu:
        raise UsageError(f"--presets: {', '.join(graphs)} replays CUDA graphs and needs a GPU; use --presets dev on "
                         "the CPU")  # fmt: skip
    return names


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
    start = time.monotonic()
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    dtype = DTYPES[args.dtype or ("bf16" if gpu else "fp32")]
    batches = parse_sizes("--batches", args.batches, "sizes like 1,4,256") if args.batches else None
    batches = batches or (GPU_BATCHES if gpu else CPU_BATCHES)
    modes = parse_modes(getattr(args, "modes", None), gpu)
    presets = parse_presets(getattr(args, "presets", None), gpu)
    extra = extra_policies(getattr(args, "policies", None))
    if extra and not presets:
        raise UsageError("--policies runs the first of --presets under each policy; give a preset (not none)")
    cfg, label, ref, ours = build(args, gpu)
    ref32 = ref.to(device)
    low = {label: _copy_to(ref, device, dtype), "ours": ours.to(device, dtype)}
    short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]

    def progress(batch: int, what: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] vit b{batch}: {what}", file=sys.stderr, flush=True)

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
        baseline = f"{label}, eager fp32"
        variants = {baseline: (ref32, x, None)}  # name -> (model, input, compile mode or None for eager)
        if dtype != torch.float32:
            variants[f"{label}, eager {short}"] = (low[label], xd, None)
        for mode in modes:
            for who, model in low.items():
                variants[f"{who}, compiled {mode} {short}"] = (torch.compile(model, mode=_mode(mode)), xd, mode)
        # each preset on its own copy (fullgraph.compile casts the model it is given in place); then the first
        # preset again per --policies spec, its calls under that op policy
        for preset, spec in [(p, None) for p in presets] + [(presets[0], spec) for spec in extra]:
            compiled = fullgraph.compile(copy.deepcopy(low["ours"]), preset, dtype=dtype)
            mode = fullgraph.compile.PRESETS[preset].mode or "default"  # None: a backend without modes
            name = f"ours, fullgraph.compile {preset} {short}" + (f" {spec}" if spec else "")
            variants[name] = (Policied(compiled, spec) if spec else compiled, xd, mode)
        profiled = {f"{who}, compiled {modes[0]} {short}" for who in low} if args.breakdown and gpu else set()
        profiled |= {f"ours, fullgraph.compile {presets[0]} {short}"} if profiled and presets else set()
        profiled |= {f"ours, fullgraph.compile {presets[0]} {short} {spec}" for spec in extra} if profiled else set()
        base_ms = None
        for name, (fn, inp, mode) in variants.items():
            if mode is not None:
                # Each compiled variant starts from empty Dynamo caches, so its first call is its own compile: Dynamo
                # would otherwise serve a copy of ours from another variant's entry when their settings are equal
                # (dev and mode default), and the preset's row would time no compile at all.
                torch._dynamo.reset()
            progress(batch, f"{'timing' if mode is None else 'compiling'} {name}")
            with torch.no_grad():
                m = benchmark(lambda fn=fn, inp=inp: fn(inp), device=device, warmup=3, reps=args.reps)
                err = rel_err(fn(inp), expected)
            med = m.timing.median_ms
            base_ms = med if name == baseline else base_ms  # the baseline is timed first
            metrics = {**measurement_metrics(m), "images_per_s": (batch / med * 1e3, "img/s"), "rel_err": (err, ""),
                       "speedup_vs_eager_fp32": (base_ms / med, "x")}  # fmt: skip
            rows += make_rows("vit", point, name, metrics, params)
            peak = "-" if m.peak_memory_bytes is None else f"{m.peak_memory_bytes / 2**20:.0f}"
            table.append([point, name, med, f"{m.timing.p20_ms:.3f}-{m.timing.p80_ms:.3f}", batch / med * 1e3,
                          f"{base_ms / med:.2f}", m.first_call_s, peak, err])  # fmt: skip
            if name in profiled:  # now, while its caches (and CUDA graphs) are the ones just timed
                progress(batch, f"profiling {name}")
                with torch.no_grad():
                    b = profile_breakdown(lambda fn=fn, inp=inp: fn(inp), device=device, label=name, dtype=dtype,
                                          cuda_graphs=mode in CUDA_GRAPH_MODES)  # fmt: skip
                classes = ", ".join(f"{k.name} {k.ms:.3f}" for k in sorted(b.classes, key=lambda k: -k.ms)[:6])
                launched = sum(k.kernels for k in b.classes)  # under CUDA graphs each one a node: its gap counts
                idle = "" if b.idle_share is None else f", GPU idle {b.idle_share:.0%} of {b.call_ms:.3f} ms"
                table.append([point, f"  where the time goes ({launched} kernels{idle})", b.kernel_ms] + [None] * 6)
                table.append([point, f"    {classes}"] + [None] * 7)
                rates = [k for k in b.classes if k.rate is not None and k.name in ("gemm", "attention")]
                if rates:  # the GEMMs' and attention's achieved rate, and its share of the measured ceiling
                    table.append([point, "    " + ", ".join(_rate_text(k) for k in rates)] + [None] * 7)
                table += [[point, line] + [None] * 7 for line in top_kernel_lines(b)]
                metrics = {f"class_ms_{k.name}": (k.ms, "ms") for k in b.classes}
                metrics |= {f"class_kernels_{k.name}": (k.kernels, "") for k in b.classes}
                if b.idle_share is not None:
                    metrics["gpu_idle_share"] = (b.idle_share, "")
                metrics.update({f"class_rate_{k.name}": (k.rate, k.unit) for k in rates})
                metrics.update({f"class_pct_of_ceiling_{k.name}": (k.pct_of_ceiling, "%") for k in rates
                                if k.pct_of_ceiling is not None})  # fmt: skip
                rows += make_rows("vit", point, name, metrics, params)
    headers = ["point", "variant", "ms", "p20-p80", "img/s", "x eager fp32", "first call s", "peak MiB",
               "rel err vs fp32"]  # fmt: skip
    return rows, f"reference: {label}\n" + format_table(headers, table)


def _rate_text(k) -> str:
    """ "gemm 712 TFLOP/s (90% of the measured ceiling)" for a kernel class with a counted rate."""
    share = f" ({k.pct_of_ceiling:.0f}% of the measured ceiling)" if k.pct_of_ceiling is not None else ""
    return f"{k.name} {k.rate:.0f} {k.unit}{share}"


# The sweep's ViT point (issue 32): ours under these op policies against the reference and its second instance
TWIN_POLICIES = {"ours auto, compiled": "all=auto", "ours native, compiled": "none"}
TWIN_ROUNDS = 5


def twins(args) -> tuple[list[Result], str]:
    """The sweep's ViT point, measured as suite `dit` measures a DiT point: the reference (timm, or the plain twin)
    compiled in --modes' one mode, a second instance of it ("plain again": the noise floor), and ours under `auto`
    and all native, in interleaved rounds in this process, at each batch of --batches; errors against the
    reference's eager fp32 output. The variants carry suite `dit`'s names, so the sweep's summary and noise rule
    read both alike."""
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    dtype = DTYPES[args.dtype or ("bf16" if gpu else "fp32")]
    modes = parse_modes(getattr(args, "modes", None), gpu)
    if len(modes) != 1:
        raise UsageError(f"--modes: the twin comparison takes one mode, got {', '.join(modes)}")
    batches = parse_sizes("--batches", args.batches, "sizes like 4,64") if args.batches else CPU_BATCHES
    cfg, label, ref, ours = build(args, gpu)
    ref32 = ref.to(device)
    short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    mode = _mode(modes[0])
    torch._dynamo.reset()
    compiled = {name: compile_twin(_copy_to(ref, device, dtype), mode)
                for name in ("plain, compiled", "plain again (second instance), compiled")}  # fmt: skip
    ours_c = compile_twin(ours.to(device, dtype), mode)
    variants = {**{name: (fn, None) for name, fn in compiled.items()},
                **{name: (ours_c, spec) for name, spec in TWIN_POLICIES.items()}}  # fmt: skip
    rows: list[Result] = []
    table: list[list] = []
    for batch in batches:
        torch.manual_seed(batch)
        x = torch.randn(batch, cfg.in_chans, *cfg.img_size, device=device)
        xd = x.to(dtype)
        point = f"{cfg.dim}d x{cfg.depth} b{batch} {short}" + (f" {mode}" if mode else "")
        params = {"config": args.config or "", "dim": cfg.dim, "depth": cfg.depth, "batch": batch, "dtype": short,
                  "mode": modes[0], "reference": label}  # fmt: skip

        def call(fn, pol, xd=xd):
            with policy_context(pol), torch.no_grad():
                return fn(xd)

        with torch.no_grad():
            expected = ref32(x).float()
        # each policy of ours is a recompile of one forward, as is each batch
        with torch._dynamo.config.patch(recompile_limit=64):
            got, lines, _ = time_interleaved("vit", point, params, variants, call, expected, device, args.reps,
                                             TWIN_ROUNDS)  # fmt: skip
        rows += got
        table += lines
    headers = ["point", "variant", "ms", "rounds", "plain compiled / this", "rel err vs fp32"]
    return rows, f"reference: {label}\n" + format_table(headers, table)


class Policied:
    """A compiled model whose calls run under an op policy (FULLGRAPH_OPS syntax), for --policies."""

    def __init__(self, model, spec: str):
        self.model, self.spec = model, spec

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with policy_context(self.spec):
            return self.model(x)


def _mode(mode: str) -> str | None:
    return None if mode == "default" else mode


def _copy_to(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A second instance of `model` with its weights, on `device` in `dtype` (the fp32 one stays the reference)."""
    return copy.deepcopy(model).to(device, dtype)
