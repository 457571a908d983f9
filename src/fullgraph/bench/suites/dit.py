"""Suite `dit`: the DiT stack built from our ops against its plain-PyTorch twin, compiled and eager, side by side.

Per token count, the same weights (`fullgraph.models.dit`: `DiT` and `PlainDiT` load one state dict), ten ways:
plain compiled and eager (`torch.compile(fullgraph=True)`, default mode: what users run), ours compiled with every
op's policy `auto`, `kernel` and `native` (attention included: native is torch's SDPA, kernel our Triton kernel),
ours compiled all native but for one fused op's kernel (`linear_gelu`: the in-graph measurement of that fusion),
ours compiled `auto` but with the two fused norm ops native, `qk_norm_rope` (the q/k norms and RoPE in one pass)
and `layer_norm_modulate` (gated residual, LayerNorm and modulation in one pass), so Inductor fuses their native
forms (what their kernels' `measured.py` entries are measured against), and ours eager with `auto`. Each variant
is called inside its policy context (a policy change recompiles: Dynamo guards on it). Latency: the median of ROUNDS
interleaved rounds, or on a GPU as many more as fit in a few seconds (`TIMING_BUDGET_S`) (CUDA events, or the
CPU clock; `timing.round_medians`, each round starting one variant further along; the compiled variants and the
eager ones in rounds of their own), with the lowest and highest round median; each compiled variant's ratio to plain
compiled is the suite's verdict (issue: our ops must never make a compiled model slower).
Error: against the plain twin in float32. A second instance of the plain twin, compiled apart, gives the noise floor
of a ratio. With --breakdown, where the GPU time goes (torch.profiler, kernel classes) for plain compiled, ours auto
compiled and the fusions' variants.

Defaults: on a GPU the issue's stack (dim 3072, 24 heads, 4 blocks, bf16, batch 1) at 1024, 4096 and 16384 tokens;
on the CPU a small stack (dim 128, 2 heads, 2 blocks) at 64 tokens, fp32.
"""

from __future__ import annotations

import torch

from fullgraph.bench.breakdown import profile_breakdown
from fullgraph.bench.results import Result, make_rows
from fullgraph.bench.suites import (
    DTYPES,
    compile_twin,
    extra_policies,
    parse_sizes,
    policy_context,
    time_interleaved,
    top_kernel_lines,
)
from fullgraph.bench.table import format_table
from fullgraph.env import first_line
from fullgraph.errors import UsageError
from fullgraph.models.dit import DiT, PlainDiT, config
from fullgraph.timing import resolve_device

ROUNDS = 5
VIDEO_FRAME = 32 * 32  # tokens per frame of --rope video
GPU_TOKENS = (1024, 4096, 16384)
CPU_TOKENS = (64,)
# variant label -> policies (FULLGRAPH_OPS syntax): every op's policy, then one op's kernel among native neighbours,
# the in-graph measurement that `ops/measured.py` records per GPU
POLICIES = {
    "auto": "all=auto",
    "kernel": "all",
    "native": "none",
    "native + linear_gelu kernel": "none,+linear_gelu",
    "auto, fused norms native": "all=auto,-qk_norm_rope,-layer_norm_modulate",
}
BREAKDOWN = (
    "plain, compiled",
    "ours auto, compiled",
    "ours native + linear_gelu kernel, compiled",
    "ours auto, fused norms native, compiled",
)


def parse_tokens(spec: str | None, gpu: bool) -> tuple[int, ...]:
    if not spec:
        return GPU_TOKENS if gpu else CPU_TOKENS
    return parse_sizes("--tokens", spec, "counts like 1024,4096")


def build(args, gpu: bool, max_tokens: int):
    name = args.config or ("dit_3072" if gpu else "dit_s")
    overrides = {} if (args.config or gpu) else {"dim": 128, "heads": 2, "depth": 2}
    if args.depth:
        overrides["depth"] = args.depth
    if getattr(args, "rope", None) == "video":  # frames of 32x32 tokens, as a video DiT's latent grid
        overrides.update(rope="video", grid=(max_tokens // VIDEO_FRAME, 32, 32))
    cfg = config(name, **{"rope": "1d", "max_tokens": max(max_tokens, 16), **overrides})
    torch.manual_seed(0)
    ours = DiT(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():  # adaLN-Zero starts at zero: random weights make the error check mean something
            p.normal_(0, 0.02)
    plain = PlainDiT(cfg).eval()
    plain.load_state_dict(ours.state_dict())
    return cfg, ours, plain


def run(args) -> tuple[list[Result], str]:
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    dtype = DTYPES[args.dtype or ("bf16" if gpu else "fp32")]
    tokens = parse_tokens(args.tokens, gpu)
    if getattr(args, "rope", None) == "video" and (len(tokens) != 1 or tokens[0] % VIDEO_FRAME):
        raise UsageError(f"--rope video takes one --tokens count, a multiple of {VIDEO_FRAME} (frames of 32x32 tokens)")
    cfg, ours, plain = build(args, gpu, max(tokens))
    reference = PlainDiT(cfg).eval().to(device)  # float32: the error reference
    reference.load_state_dict(plain.state_dict())
    ours, plain = ours.to(device, dtype), plain.to(device, dtype)
    torch._dynamo.reset()
    mode = compile_mode(args)
    # dynamic=False: each token count is its own static graph, as a model compiled for one resolution runs; without
    # it the second count recompiles every variant with the token dimension symbolic (automatic dynamic shapes)
    ours_c = compile_twin(ours, mode, fullgraph=True, dynamic=False)
    plain_c = compile_twin(plain, mode, fullgraph=True, dynamic=False)
    twin = PlainDiT(cfg).eval().to(device, dtype)  # a second instance of the same weights: the noise floor
    twin.load_state_dict(plain.state_dict())
    twin_c = compile_twin(twin, mode, fullgraph=True, dynamic=False)
    extra = extra_policies(getattr(args, "policies", None))
    base = getattr(args, "base", None)  # the POLICIES kept (a sweep keeps what its decisions and verdicts read)
    kept = {label: spec for label, spec in POLICIES.items() if base is None or label in base}
    variants = {
        "plain, compiled": (plain_c, None),
        "plain again (second instance), compiled": (twin_c, None),
        **{f"ours {label}, compiled": (ours_c, spec) for label, spec in {**kept, **extra}.items()},
    }
    if getattr(args, "eager", True):
        variants |= {"ours auto, eager": (ours, "all=auto"), "plain, eager": (plain, None)}
    rows: list[Result] = []
    table = []
    # every policy of `ours` and every token count is a recompile of one forward: more than Dynamo's default 8
    with torch._dynamo.config.patch(recompile_limit=64):
        _points(args, device, dtype, tokens, cfg, reference, variants, ours, rows, table)
    text = format_table(["point", "variant", "ms", "rounds", "plain compiled / this", "rel err vs fp32"], table)
    return rows, text


def compile_mode(args) -> str | None:
    """--mode as torch.compile takes it (None for the default mode)."""
    return None if getattr(args, "mode", None) in (None, "default") else args.mode


def _points(args, device, dtype, tokens, cfg, reference, variants, ours, rows, table) -> None:
    mode = compile_mode(args)
    for n in tokens:
        torch.manual_seed(n)
        x = torch.randn(args.batch, n, cfg.dim, device=device)
        c = torch.randn(args.batch, cfg.dim, device=device)
        xd, cd = x.to(dtype), c.to(dtype)
        short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
        point = f"{cfg.dim}x{cfg.heads}h x{cfg.depth} b{args.batch} n{n} {short}" + (f" {mode}" if mode else "")
        point += " video" if cfg.rope == "video" else ""
        params = {"dim": cfg.dim, "heads": cfg.heads, "depth": cfg.depth, "batch": args.batch, "tokens": n,
                  "dtype": str(dtype)[6:], "mode": mode or "default", "rope": cfg.rope}  # fmt: skip

        def call(fn, pol, xd=xd, cd=cd):
            with policy_context(pol), torch.no_grad():
                return fn(xd, cd)

        def explain(fn, pol, e, call=call):
            # Dynamo hides what the traced code raised ("Observed exception"); the eager call says it
            try:
                if pol:
                    call(ours, pol)
            except Exception as eager_error:
                return first_line(eager_error, 120)
            return first_line(e, 120)

        with torch.no_grad():
            expected = reference(x, c)
        # compiled and eager variants in rounds of their own: an eager call loads the GPU another way (at 1024
        # tokens it idles half the time), and whatever ran before a timed block can shift it
        got, lines, live = time_interleaved("dit", point, params, variants, call, expected, device, args.reps, ROUNDS,
                                            explain)  # fmt: skip
        rows += got
        table += lines
        if args.breakdown:
            extra = [f"ours {label}, compiled" for label in extra_policies(getattr(args, "policies", None))]
            for name in (n for n in (*BREAKDOWN, *extra) if n in live):
                fn, pol = variants[name]
                b = profile_breakdown(lambda fn=fn, pol=pol: call(fn, pol), device=device, label=name, dtype=dtype)
                # each class's kernel launches too, and the GPU's idle share of the call: the wall time over the
                # kernels' sum is launch gaps, which fewer and fuller kernels close
                classes = ", ".join(
                    f"{k.name} {k.ms:.3f} ({k.kernels})" for k in sorted(b.classes, key=lambda k: -k.ms)[:6]
                )
                idle = "" if b.idle_share is None else f", GPU idle {b.idle_share:.0%} of {b.call_ms:.3f} ms"
                launched = sum(k.kernels for k in b.classes)
                table.append([point, f"  {name}: where the time goes ({launched} kernels{idle})", b.kernel_ms, "",
                              None, None])  # fmt: skip
                table.append([point, f"    {classes}", None, "", None, None])
                table += [[point, line, None, "", None, None] for line in top_kernel_lines(b)]
                metrics = {f"class_ms_{k.name}": (k.ms, "ms") for k in b.classes}
                metrics |= {f"class_kernels_{k.name}": (k.kernels, "") for k in b.classes}
                if b.idle_share is not None:
                    metrics["gpu_idle_share"] = (b.idle_share, "")
                rows += make_rows("dit", point, name, metrics, params)
