"""Cold compile time and steady-state latency: whole-model torch.compile against regional compilation.

A small ViT (patch embedding, 12 identical transformer blocks with SDPA attention and a GELU MLP, a head;
dim 192, 3 heads, 64 tokens, batch 2) is compiled with Inductor three ways: the whole model
(`torch.compile(model)`), regional "per-block" and regional "nested" (`fullgraph.compile.regional`).

Cold compile: every measurement runs in a fresh Python process with empty `TORCHINDUCTOR_CACHE_DIR` and
`TRITON_CACHE_DIR` temp dirs and the FX-graph and AOT-autograd caches off, so nothing is reused from disk.
Two numbers per variant:
- `cold_first_call_s`: the model's first call in a fresh process, all of what a cold process pays;
- `compile_s`: the same first call after a tiny unrelated compile in that process (`startup_s`), i.e.
  without the compiler's one-time start (Inductor imports, C++ toolchain and ISA probes, worker pool),
  which costs the same whatever is compiled and which regional compilation cannot cut.
`cpp_modules` counts the C++ modules Inductor built for the model (its code cache keys on the source, so
twelve identical blocks' kernels build once).
Steady state: one process compiles all variants (and keeps an eager copy), checks each against eager,
then times them interleaved with `fullgraph.timing.measure` (rounds of every variant in turn; the median
of the round medians), so load from other processes hits all variants alike.

On a GPU, `--model timm:vit_base_patch16_224` runs timm's ViT-B/16 (12 blocks; batch REGIONAL_BATCH=8, dtype
REGIONAL_DTYPE=bfloat16) instead, timed with CUDA events; `triton_kernels` counts the kernels Triton built.

`--mode reduce-overhead` runs every variant under CUDA graphs: at small batches the GPU waits on launches, so
in default mode the whole model's single graph and per-block's twelve calls differ by launch overhead, not by
kernels. Whole and nested use reduce-overhead's cudagraph trees; per-block compiles its blocks in default mode
and replays the whole call from one captured graph (fullgraph.compile.graphs.GraphedCall).

Run: PYTHONPATH=src python benchmarks/regional_compile.py [--model small|timm:NAME] [--mode MODE] [--csv FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.bench.results import append_csv, make_rows
from fullgraph.compile.graphs import GraphedCall
from fullgraph.compile.regional import compile_regions
from fullgraph.timing import round_medians

VARIANTS = ("whole", "per-block", "nested")
PARAMS = {"dim": 192, "heads": 3, "depth": 12, "tokens": 64, "batch": 2, "dtype": "float32"}
CASE = "vit 12x192 64tok b2 fp32"
MODEL = "small"
MODE = "default"


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # attn: [B, H, N, D]
        x = x + self.proj(attn.transpose(1, 2).reshape(B, N, C))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, dim: int = 192, heads: int = 3, depth: int = 12, tokens: int = 64, classes: int = 1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, kernel_size=16, stride=16)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2) + self.pos  # x: [B, N, C]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(1))


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def configure(model: str) -> None:
    """`small` (the ViT above; the CPU default) or `timm:NAME` (e.g. timm:vit_base_patch16_224, 12 blocks; the
    GPU's), sized by --batch and --dtype."""
    global CASE
    if model.startswith("timm:"):
        PARAMS.clear()
        PARAMS.update(model=model[5:], batch=int(os.environ.get("REGIONAL_BATCH", 8)),
                      dtype=os.environ.get("REGIONAL_DTYPE", "bfloat16"))  # fmt: skip
        CASE = f"{model[5:]} b{PARAMS['batch']} {PARAMS['dtype']} {device()}"


def build() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if "model" in PARAMS:
        import timm

        dtype = getattr(torch, PARAMS["dtype"])
        model = timm.create_model(PARAMS["model"], pretrained=False).eval().to(device(), dtype)
        return model, torch.randn(PARAMS["batch"], 3, 224, 224, device=device(), dtype=dtype)
    side = 16 * int(PARAMS["tokens"] ** 0.5)
    model = ViT(PARAMS["dim"], PARAMS["heads"], PARAMS["depth"], PARAMS["tokens"]).eval()
    return model, torch.randn(PARAMS["batch"], 3, side, side)


def compiled(variant: str, model: nn.Module):
    """`variant` of `model` compiled in torch.compile mode MODE. Under reduce-overhead, per-block compiles its
    blocks in default mode and captures the whole call in one CUDA graph (fullgraph.compile.graphs, what
    `fullgraph.compile(..., regional=True)` does): per-block calls under cudagraph trees overwrite each other."""
    kwargs = {"mode": MODE} if MODE != "default" else {}
    if variant == "whole":
        return torch.compile(model, **kwargs)
    if variant == "per-block" and MODE == "reduce-overhead":
        return GraphedCall(compile_regions(model, mechanism=variant).model)
    return compile_regions(model, mechanism=variant, compile_kwargs=kwargs).model


def child(variant: str, prewarm: bool) -> dict[str, float]:
    """Runs in a fresh process: the first call of `variant`, optionally after a tiny warm-up compile."""
    out = {}
    if prewarm:
        t0 = time.perf_counter()
        tiny = torch.compile(lambda a: (a.sin() + 1) @ a)
        tiny(torch.randn(8, 8, device=device()))
        sync()
        out["startup_s"] = time.perf_counter() - t0
    model, x = build()
    before = _built()
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        fn = compiled(variant, model)
        fn(x)
        sync()
        out["compile_s" if prewarm else "cold_first_call_s"] = time.perf_counter() - t0
    if prewarm:
        out |= {k: float(after - before[k]) for k, after in _built().items()}
    return out


def _built() -> dict[str, int]:
    """Modules Inductor built into this process's (fresh) cache dirs: C++ modules (.so) and Triton kernels (.cubin).
    Identical kernel source is built once, so these count distinct kernels, not kernel calls."""

    def count(var: str, suffix: str) -> int:
        root = os.environ.get(var, "")
        return sum(name.endswith(suffix) for _, _, names in os.walk(root) for name in names) if root else 0

    return {
        "cpp_modules": count("TORCHINDUCTOR_CACHE_DIR", ".so"),
        "triton_kernels": count("TRITON_CACHE_DIR", ".cubin"),
    }


def run_fresh(variant: str, prewarm: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as inductor, tempfile.TemporaryDirectory() as triton:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": inductor,
            "TRITON_CACHE_DIR": triton,
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
        }
        cmd = [sys.executable, __file__, "--child", variant, "--model", MODEL, "--mode", MODE]
        cmd += ["--prewarm"] if prewarm else []
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def steady(variants: tuple[str, ...], rounds: int, reps: int) -> dict[str, dict[str, float]]:
    model, x = build()
    fns = {"eager": model}
    with torch.no_grad():
        expected = model(x)
        out: dict[str, dict[str, float]] = {v: {} for v in ("eager", *variants)}
        for v in variants:
            fns[v] = compiled(v, copy.deepcopy(model))
            out[v]["max_abs_err"] = (fns[v](x) - expected).abs().max().item()
        calls = {v: (lambda fn=fn: fn(x)) for v, fn in fns.items()}
        medians = round_medians(calls, device=device(), rounds=rounds, reps=reps)
    for v in fns:
        out[v]["median_ms"] = statistics.median(medians[v])
        out[v]["spread_ms"] = max(medians[v]) - min(medians[v])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="append long-format result rows here")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--no-raw", action="store_true", help="skip the raw cold first call (faster)")
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-process compile times (steady only)")
    parser.add_argument("--steady-rounds", type=int, default=7, help="0 skips the steady-state timing")
    parser.add_argument("--steady-reps", type=int, default=15)
    parser.add_argument("--model", default="small", help="small (default) or timm:NAME, e.g. timm:vit_base_patch16_224")
    modes = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
    parser.add_argument("--mode", default="default", choices=modes, help="every variant's torch.compile mode")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--prewarm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global MODEL, MODE, CASE
    MODEL, MODE = args.model, args.mode
    configure(MODEL)
    if MODE != "default":
        PARAMS["mode"] = MODE
        CASE += f" {MODE}"
    if args.child:
        print(json.dumps(child(args.child, args.prewarm)))
        return 0
    variants = tuple(args.variants.split(","))
    results: dict[str, dict[str, float]] = {v: {} for v in variants}
    for v in variants if not args.no_cold else ():
        results[v] |= run_fresh(v, prewarm=True)
        if not args.no_raw:
            results[v] |= run_fresh(v, prewarm=False)
        print(v, {k: round(val, 2) for k, val in results[v].items()}, flush=True)
    if args.steady_rounds > 0:
        for v, metrics in steady(variants, args.steady_rounds, args.steady_reps).items():
            results.setdefault(v, {}).update(metrics)
    rows = []
    for v, metrics in results.items():
        units = {k: ("ms" if k.endswith("_ms") else "s" if k.endswith("_s") else "") for k in metrics}
        rows += make_rows("regional_compile", CASE, v, {k: (val, units[k]) for k, val in metrics.items()}, PARAMS)
        if v == "whole":
            continue
        ratios = {
            f"{k}_whole_over_this": (results["whole"][k] / metrics[k], "x")
            for k in ("compile_s", "cold_first_call_s", "median_ms")
            if k in metrics and k in results.get("whole", {})
        }
        rows += make_rows("regional_compile", CASE, v, ratios, PARAMS)
    for r in rows:
        print(f"{r.variant:10} {r.metric:32} {r.value:10.4g} {r.unit}")
    if args.csv:
        append_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
