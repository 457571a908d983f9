"""Issue 15's regional AOT: build seconds, package size, load seconds and steady latency of a whole-model
AOTInductor package against one block's package loaded per layer (`fullgraph.deploy.export_regional`), each build
in a fresh process with an empty Inductor cache, so neither reuses the other's kernels.

Model: our ViT (`fullgraph.models.vit`), or timm's ViT-B/16 with --model timm (the blocks are timm's `Block`).
Run: PYTHONPATH=src python benchmarks/probes/regional_aot.py [--device cuda] [--config vit_b16] [--batch 4]
  [--dtype bf16] [--model ours|timm] [--csv FILE].
  CPU smoke: --config vit_tiny --depth 12 --img 32 (the defaults on the CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def build_model(args):
    import torch

    torch.manual_seed(0)
    if args.model == "timm":
        import timm

        model = timm.create_model("vit_base_patch16_224", pretrained=False)
        shape = (args.batch, 3, 224, 224)
    else:
        from fullgraph.models.vit import ViT, config

        overrides = {"depth": args.depth} if args.depth else {}
        if args.img:
            overrides["img_size"] = args.img
        model = ViT(config(args.config, **overrides))
        shape = (args.batch, 3, *model.cfg.img_size)
    dtype = getattr(torch, DTYPES[args.dtype])
    model = model.eval().to(args.device, dtype)
    return model, torch.randn(*shape, device=args.device, dtype=dtype)


def child(args) -> None:
    """One variant in this fresh process: build (timed), load (timed), run; one JSON line on stdout."""
    import torch

    from fullgraph.deploy import export, load
    from fullgraph.deploy.regional import export_regional, load_regional
    from fullgraph.timing import measure

    model, x = build_model(args)
    with torch.no_grad():
        ref = model(x).float()
    path = os.path.join(args.work, f"{args.variant}.pt2")
    start = time.perf_counter()
    if args.variant == "whole":
        export(model, (x,), path)
    else:
        export_regional(model, (x,), path)
    build_s = time.perf_counter() - start
    # Said before loading: where a load crashes the process (the H200 image's AOTInductor loader), the build stands.
    print(json.dumps({"variant": args.variant, "build_s": build_s, "package_mb": os.path.getsize(path) / 1e6}))
    sys.stdout.flush()
    start = time.perf_counter()
    run = (
        load(path, probe_first=args.probe)
        if args.variant == "whole"
        else load_regional(model, path, probe_first=args.probe)
    )
    load_s = time.perf_counter() - start
    with torch.no_grad():
        out = run(x)
        out = (out[0] if isinstance(out, (list, tuple)) else out).float()
        t = measure(lambda: run(x), device=args.device, warmup=3, reps=args.reps)
    err = ((out - ref).norm() / ref.norm()).item()
    print(json.dumps({"variant": args.variant, "build_s": build_s, "load_s": load_s, "median_ms": t.median_ms,
                      "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "rel_err": err,
                      "package_mb": os.path.getsize(path) / 1e6}))  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", choices=["ours", "timm"], default="ours")
    p.add_argument("--config", default=None)
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--img", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--dtype", default=None, choices=list(DTYPES))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--probe", action="store_true", help="probe each package in a child before loading it")
    p.add_argument("--csv", default=None)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    gpu = args.device.startswith("cuda")
    args.config = args.config or ("vit_b16" if gpu else "vit_tiny")
    args.batch = args.batch or (4 if gpu else 2)
    args.dtype = args.dtype or ("bf16" if gpu else "fp32")
    if not gpu:
        args.depth, args.img = args.depth or 12, args.img or 32
    if args.variant:
        child(args)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for variant in ("whole", "regional"):
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(work, f"inductor-{variant}")}
            argv = [sys.executable, __file__, *sys.argv[1:], "--variant", variant, "--work", work]
            start = time.perf_counter()
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
            wall = time.perf_counter() - start
            said: dict = {}
            for ln in done.stdout.splitlines():
                if ln.startswith("{"):
                    said.update(json.loads(ln))
            row = {"variant": variant, **said, "wall_s": wall}
            if done.returncode != 0 or "median_ms" not in said:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                row["error"] = f"exit {done.returncode}: {tail[0][:200]}"
            rows.append(row)
    what = f"{args.model} {args.config} depth {args.depth or 'cfg'} b{args.batch} {args.dtype} on {args.device}"
    print(f"regional AOT vs whole-model package: {what}")
    print(
        f"{'variant':<10}{'build s':>9}{'load s':>8}{'ms':>9}{'p20-p80':>16}{'MB':>8}{'rel err':>10}{'process s':>11}"
    )
    for r in rows:
        if "error" in r:
            built = f"built in {r['build_s']:.1f} s ({r['package_mb']:.1f} MB), then " if "build_s" in r else ""
            print(f"{r['variant']:<10} {built}failed: {r['error']}")
            continue
        spread = f"{r['p20_ms']:.3f}-{r['p80_ms']:.3f}"
        print(f"{r['variant']:<10}{r['build_s']:>9.1f}{r['load_s']:>8.2f}{r['median_ms']:>9.3f}{spread:>16}"
              f"{r['package_mb']:>8.1f}{r['rel_err']:>10.1e}{r['wall_s']:>11.1f}")  # fmt: skip
    ok = {r["variant"]: r for r in rows if "error" not in r}
    if len(ok) == 2:
        w, g = ok["whole"], ok["regional"]
        build, steady = w["build_s"] / g["build_s"], w["median_ms"] / g["median_ms"]
        print(f"build {build:.2f}x faster regional; steady {steady:.3f}x (whole / regional latency)")
    if args.csv:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
        from fullgraph.bench.results import append_csv, make_rows

        out = []
        for r in rows:
            metrics = {k: (r[k], k.rsplit("_", 1)[-1]) for k in ("build_s", "load_s", "median_ms", "p20_ms", "p80_ms",
                       "package_mb", "rel_err", "wall_s") if k in r}  # fmt: skip
            out += make_rows("regional_aot", what, r["variant"], metrics, {"model": args.model, "config": args.config})
        append_csv(args.csv, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
