"""Issue 35's lean-path acceptance: a whole server process's start on the package route, on a GPU.

Each run is a fresh process that times `import torch`, then, from the moment it returns, `from fullgraph.deploy
import load`, the input on the GPU, `load(PACKAGE, cuda_graphs=True)` and the first call to its synchronized
output (the acceptance: at most 1.0 s after `import torch` returns), then the steady state (the median of --reps
synchronized calls), and which heavy modules it imported (none of torch._dynamo, torch._inductor, triton, sympy,
fullgraph.compile.compiled should be). With --prev DIR (a folder holding the previous commit's `fullgraph` package)
the runs alternate between this tree and that one, for the steady-state comparison (within 2%).

Bytecode: first one process per tree writes bytecode under a private PYTHONPYCACHEPREFIX, then --runs processes
per tree read it; then --runs per tree with no bytecode at all (PYTHONDONTWRITEBYTECODE=1, an empty prefix: every
module compiled from source, as on an image that ships none). FULLGRAPH_CACHE_DIR is one persistent folder per tree
(the package's hash and probe verdict remembered, as a deployment keeps it), filled by the bytecode process.

Run (H200, a ViT-B/16 b4 bf16 package exported first, ~2 min):
  PYTHONPATH=src python3 -m fullgraph export benchmarks/targets/vit.py:vit_b16 --input 4x3x224x224 \
      --dtype bf16 --no-check -o out/vitb4.pt2
  PYTHONPATH=src python3 benchmarks/lean_start.py out/vitb4.pt2 --input 4x3x224x224 --prev .prev/lean \
      --csv $OUT/lean_start_h200.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HEAVY = ("torch._dynamo", "torch._inductor", "triton", "sympy", "fullgraph.compile.compiled")
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from fullgraph.deploy import load
t2 = time.perf_counter()
path, shape, reps = sys.argv[1], [int(n) for n in sys.argv[2].split("x")], int(sys.argv[3])
device, dtype = sys.argv[4], getattr(torch, sys.argv[5])
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
x = torch.randn(*shape, device=device, dtype=dtype)
sync()
t3 = time.perf_counter()
model = load(path, cuda_graphs=device == "cuda")
t4 = time.perf_counter()
y = model(x)
sync()
t5 = time.perf_counter()
heavy = [m for m in HEAVY if m in sys.modules]
for _ in range(20):
    model(x)
sync()
times = []
for _ in range(reps):
    s = time.perf_counter()
    model(x)
    sync()
    times.append(time.perf_counter() - s)
times.sort()
import fullgraph
print(json.dumps({"import_torch_s": t1 - t0, "after_torch_s": t5 - t1, "import_load_s": t2 - t1,
                  "device_s": t3 - t2, "load_s": t4 - t3, "first_call_s": t5 - t4, "heavy": heavy,
                  "median_ms": 1e3 * times[len(times) // 2], "fullgraph": fullgraph.__file__}))
"""


def child(tree: str, args: argparse.Namespace, reps: int, env: dict[str, str]) -> dict:
    code = f"HEAVY = {HEAVY!r}\n{CHILD}"
    full = {**os.environ, **env, "PYTHONPATH": tree}
    argv = [sys.executable, "-c", code, args.package, args.input, str(reps), args.device, args.dtype]
    proc = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"a run under {tree} failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1])


def by_tree(rows: list[dict], tree: str) -> list[dict]:
    return [r for r in rows if r["tree"] == tree]


def steady_ratio(mine: list[dict], prev: list[dict]) -> str:
    """The steady state of this tree against the previous commit's: the median of the paired runs' ratios (each run
    of this tree against the run of the other that followed it, so the pair saw the same machine state), with the
    median of each tree's run medians beside it, which one slow run moves."""
    paired = statistics.median(a["median_ms"] / b["median_ms"] for a, b in zip(mine, prev, strict=True))
    medians = statistics.median(r["median_ms"] for r in mine) / statistics.median(r["median_ms"] for r in prev)
    return f"{paired:.4f} (median of {len(mine)} paired runs; of the run medians {medians:.4f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package")
    ap.add_argument("--input", default="4x3x224x224", help="the input's shape")
    ap.add_argument("--device", default="cuda", help="cuda (loaded with cuda_graphs=True) or cpu (a dry run)")
    ap.add_argument("--dtype", default="bfloat16", help="the input's torch dtype (the package's)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--prev", help="a folder holding the previous commit's fullgraph package")
    ap.add_argument("--csv")
    args = ap.parse_args()
    if not Path(args.package).is_file():
        raise SystemExit(f"{args.package}: no such package; export one first (see this script's docstring)")
    here = str(Path(__file__).resolve().parents[1] / "src")
    trees = {"this": here, **({"prev": str(Path(args.prev).resolve())} if args.prev else {})}
    rows = []
    with tempfile.TemporaryDirectory(prefix="lean-start-") as work:
        caches = {name: os.path.join(work, f"cache-{name}") for name in trees}
        pyc = os.path.join(work, "pyc")
        for name, tree in trees.items():  # bytecode written once per tree; the package hashed and probed once
            child(tree, args, 10, {"PYTHONPYCACHEPREFIX": pyc, "FULLGRAPH_CACHE_DIR": caches[name],
                                   "PYTHONDONTWRITEBYTECODE": ""})  # fmt: skip
        for bytecode in (True, False):
            empty = tempfile.mkdtemp(dir=work)
            env = {"PYTHONPYCACHEPREFIX": pyc if bytecode else empty}
            env["PYTHONDONTWRITEBYTECODE"] = "" if bytecode else "1"
            for run in range(args.runs):
                for name, tree in trees.items():  # alternated: the trees see the same machine state
                    r = child(tree, args, args.reps, {**env, "FULLGRAPH_CACHE_DIR": caches[name]})
                    rows.append({"tree": name, "bytecode": bytecode, "run": run + 1, **r})
                    print(f"{name:5s} bytecode={'yes' if bytecode else 'no ':3s} run {run + 1}: import torch "
                          f"{r['import_torch_s']:.2f} s, then first output {r['after_torch_s']:.3f} s (import "
                          f"{r['import_load_s']:.3f}, device {r['device_s']:.3f}, load {r['load_s']:.3f}, first call "
                          f"{r['first_call_s']:.3f}), steady {r['median_ms']:.4f} ms, heavy imports: "
                          f"{', '.join(r['heavy']) or 'none'}", flush=True)  # fmt: skip
    for bytecode in (True, False):
        mine = [r for r in rows if r["tree"] == "this" and r["bytecode"] == bytecode]
        worst = max(r["after_torch_s"] for r in mine)
        line = f"bytecode={'yes' if bytecode else 'no'}: first output after import torch, worst of {len(mine)}: "
        line += f"{worst:.3f} s" + (f" ({'meets' if worst <= 1.0 else 'misses'} <= 1.0 s)" if bytecode else "")
        prev = [r for r in rows if r["tree"] == "prev" and r["bytecode"] == bytecode]
        if prev:
            line += f"; steady this / prev {steady_ratio(mine, prev)}"
        print(line)
    if "prev" in trees:
        print(f"steady this / prev over every bytecode mode: {steady_ratio(*(by_tree(rows, t) for t in trees))}")
    if args.csv:
        with open(args.csv, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            if f.tell() == 0:
                w.writeheader()
            w.writerows({**r, "heavy": " ".join(r["heavy"])} for r in rows)


if __name__ == "__main__":
    main()
