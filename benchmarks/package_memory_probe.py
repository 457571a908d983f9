"""Where does an AOTInductor package's memory grow when new threads call it? (issue 31: `fullgraph bench load` on our
DiT-B package at 1024 tokens, H200, torch 2.11, uncaptured: 361.5 MiB allocated with 1 calling thread, then 33 MiB
more for every further thread: 427.5 / 460.5 MiB after 100 / all calls from 4 threads, 823.5 / 856.5 from 16. The
CUDA-graph form of the same package did not grow.)

Loads PACKAGE, calls it from the main thread, then runs rounds of calls from N fresh threads at once (`--rounds`,
each with new threads, so torch's per-thread library handles are made again or taken from its pool), and prints
`torch.cuda.memory_allocated` after each round with nothing in flight. Then the candidates, each undone in turn:
cuBLAS / cuBLASLt workspaces (`torch._C._cuda_clearCublasWorkspaces`), and the allocator's history of the blocks
still held that were allocated after the main-thread calls (`torch.cuda.memory._record_memory_history`), by size
and innermost Python / C++ frames.

Run: PYTHONPATH=src python benchmarks/package_memory_probe.py PACKAGE.pt2 [--threads 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import collections
import threading

import torch

from fullgraph.deploy import load

MIB = 2**20


def allocated() -> float:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() / MIB


def round_of(fn, inputs, threads: int, calls: int) -> None:
    barrier = threading.Barrier(threads)

    def work() -> None:
        barrier.wait()
        for _ in range(calls):
            fn(*inputs)
        torch.cuda.current_stream().synchronize()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def held_since(snapshot: dict, before: set[int]) -> list[tuple[int, str]]:
    """(size, frames) of the blocks allocated and still held that were not held at `before`."""
    out = []
    for seg in snapshot["segments"]:
        for block in seg["blocks"]:
            if block["state"] != "active_allocated" or block["address"] in before:
                continue
            frames = block.get("frames") or []
            where = " < ".join(f"{f['name']}" for f in frames[:6]) or "(no frames)"
            out.append((block["size"], where))
    return out


def held_addresses(snapshot: dict) -> set[int]:
    return {b["address"] for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("package")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args(argv)
    loaded = load(args.package)
    inputs = []
    for spec in loaded.inputs.split(", "):
        shape, rest = spec.split(":")
        dtype = getattr(torch, rest.split("@")[0])
        inputs.append(torch.randn(*map(int, shape.split("x")), device="cuda", dtype=dtype))
    for _ in range(5):
        loaded(*inputs)
    print(f"after 5 calls in the main thread: {allocated():.1f} MiB")
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    before = held_addresses(torch.cuda.memory._snapshot())
    for r in range(args.rounds):
        round_of(loaded, inputs, args.threads, args.calls)
        print(f"after round {r + 1} ({args.threads} fresh threads x {args.calls} calls): {allocated():.1f} MiB")
    grown = held_since(torch.cuda.memory._snapshot(), before)
    torch.cuda.memory._record_memory_history(enabled=None)
    by_where = collections.defaultdict(list)
    for size, where in grown:
        by_where[where].append(size)
    print(f"blocks held now that were not held after the main-thread calls: {len(grown)}, "
          f"{sum(s for s, _ in grown) / MIB:.1f} MiB")  # fmt: skip
    for where, sizes in sorted(by_where.items(), key=lambda kv: -sum(kv[1]))[:8]:
        print(f"  {len(sizes):3d} x {sizes[0] / MIB:8.2f} MiB  {where[:300]}")
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        torch._C._cuda_clearCublasWorkspaces()
        print(f"after clearing the cuBLAS workspaces: {allocated():.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
