"""What thread safety costs one caller: `fullgraph.compile(m, "perception")` now (a per-class guard, the copy of the
CUDA graph's outputs) against the same call at an earlier commit (one process lock, the graph's own output tensor
returned), interleaved rounds in one process (`timing.round_medians`, CUDA events), per batch size.

The earlier library is imported under another name: `--prev DIR` is a folder holding `fullgraph_prev/`, made here
with `python benchmarks/serve_overhead.py --make-prev REV DIR` (the package at git revision REV with its name
replaced; the device machine has no git history, so make it here and carry DIR). Also timed: the new model's
`borrow()` (the guard without the copy) and plain `torch.compile(mode="reduce-overhead")`.

Run: PYTHONPATH=src python benchmarks/serve_overhead.py --prev .prev --batches 4,256 [--model vit_base_patch16_224]
(needs timm and a GPU; --small runs a tiny MLP on the CPU to check the script).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import torch

import fullgraph
from fullgraph.timing import round_medians


def make_prev(rev: str, out: Path) -> None:
    """`src/fullgraph` at `rev`, renamed `fullgraph_prev` (its imports and module paths), under `out`."""
    data = subprocess.run(["git", "archive", rev, "src/fullgraph"], check=True, capture_output=True).stdout
    target = out / "fullgraph_prev"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            rel = Path(member.name).relative_to("src/fullgraph")
            text = tar.extractfile(member).read()
            if rel.suffix == ".py":
                text = re.sub(
                    rb"(?<=import )fullgraph\b|(?<=from )fullgraph\b|\bfullgraph(?=\.)", b"fullgraph_prev", text
                )
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            (target / rel).write_bytes(text)
    print(f"wrote {target} (fullgraph at {rev})")


def build(name: str, small: bool) -> torch.nn.Module:
    if small:
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
    import timm

    return timm.create_model(name, pretrained=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make-prev", nargs=2, metavar=("REV", "DIR"))
    ap.add_argument("--prev", default=".prev")
    ap.add_argument("--model", default="vit_base_patch16_224")
    ap.add_argument("--batches", default="4,256")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--small", action="store_true", help="a tiny MLP on the CPU (checks the script)")
    args = ap.parse_args()
    if args.make_prev:
        make_prev(args.make_prev[0], Path(args.make_prev[1]))
        return
    sys.path.insert(0, args.prev)
    prev = importlib.import_module("fullgraph_prev")
    device = "cpu" if args.small else "cuda"
    dtype = torch.float32 if args.small else torch.bfloat16
    print(f"# {args.model if not args.small else 'tiny MLP'}, {dtype}, {device}, torch {torch.__version__}")
    print(f"# {'batch':>5} {'variant':34} {'median ms':>10} {'min':>8} {'max':>8} {'/ earlier':>10}")
    for batch in (int(b) for b in args.batches.split(",")):
        run_batch(prev, args, batch, device, dtype)
        torch._dynamo.reset()


def run_batch(prev, args: argparse.Namespace, batch: int, device: str, dtype: torch.dtype) -> None:
    base = build(args.model, args.small).to(device, dtype).eval()
    shape = (batch, 64) if args.small else (batch, 3, 224, 224)
    x = torch.randn(shape, device=device, dtype=dtype)
    now = fullgraph.compile(copy.deepcopy(base), "perception")
    earlier = prev.compile(copy.deepcopy(base), "perception")
    plain = torch.compile(copy.deepcopy(base), mode="reduce-overhead")

    def borrowed():
        with now.borrow(x) as out:
            return out

    variants = {"earlier commit": lambda: earlier(x), "now (copy-out)": lambda: now(x),
                "now, borrow() (no copy)": borrowed, "plain reduce-overhead": lambda: plain(x)}  # fmt: skip
    with torch.no_grad():
        for fn in variants.values():
            for _ in range(20):
                fn()
        rounds = round_medians(variants, device=device, rounds=args.rounds, reps=args.reps)
    ref = sorted(rounds["earlier commit"])[len(rounds["earlier commit"]) // 2]
    for name, ms in rounds.items():
        ms.sort()
        med = ms[len(ms) // 2]
        print(f"  {batch:5d} {name:34} {med:10.4f} {ms[0]:8.4f} {ms[-1]:8.4f} {med / ref:10.3f}")


if __name__ == "__main__":
    main()
