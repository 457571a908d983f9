"""What Dynamo's guards cost a host-bound DiT call in default mode: ours (`auto`, as the sweep's "ours auto"; with
`--native` every op native, the same Inductor code as the plain twin's, `results/dit_host_h100.txt`) against the
plain twin, each compiled with all its guards, with `fullgraph.trusted_guards` as its guard filter
(`compile/guards.py`; the sweep compiles both twins so) and without any guard (the bound).

On the CPU machine (torch 2.13, depth 4, dim 64: a call that is all host time) ours took 522 us against plain's 471;
without the guards on fullgraph's modules 483, without any guard 421 against plain's 407: the guards that our ops'
dispatch adds were most of the gap. This measures it at a sweep point on the GPU host, where the sweep's default-mode
losses (0.967-0.972, issue 32) were host time.

Each variant is its own class (a copy of `forward`'s code object), so Dynamo keeps one cache entry per variant, and
all run in interleaved rounds (`timing.round_medians`, CUDA events around back-to-back calls).

Usage (GPU): PYTHONPATH=src python3 benchmarks/probes/dit_guard_cost.py [--shape 1280x16:8:256] [--depth 4]
[--dump-guards guards.json] (the guards each variant keeps: what ours checks beyond the plain twin)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import json
import statistics
import types

import torch

from fullgraph import ops
from fullgraph.compile.guards import trusted_code
from fullgraph.timing import round_medians

D = importlib.import_module("fullgraph.models.dit")


def fresh(base: type, tag: str, cfg) -> torch.nn.Module:
    """An instance of a subclass of `base` whose forward has its own code object (its own Dynamo cache entry)."""
    f = base.forward
    code = f.__code__.replace(co_name=f"forward_{tag}")
    forward = types.FunctionType(code, f.__globals__, code.co_name, f.__defaults__, f.__closure__)
    return type(f"{base.__name__}_{tag}", (base,), {"forward": forward})(cfg).eval()


def no_guards(entries) -> list[bool]:
    return [False] * len(entries)


def recording(filt, kept: list):
    """`filt` (None: keep every guard) that also appends what it keeps to `kept`: (guard type, source name)."""

    def record(entries) -> list[bool]:
        keep = filt(entries) if filt else [True] * len(entries)
        kept.extend((e.guard_type, e.name) for e, k in zip(entries, keep, strict=True) if k)
        return keep

    return record


def guard_table(kept: dict[str, list]) -> str:
    """Per guard type, how many guards each variant keeps (one column a variant), and the totals."""
    kinds = sorted({kind for guards in kept.values() for kind, _ in guards})
    counts = {name: collections.Counter(kind for kind, _ in guards) for name, guards in kept.items()}
    rows = [f"{'guard type':30s}" + "".join(f"{name:>22s}" for name in kept)]
    rows += [f"{kind:30s}" + "".join(f"{counts[name][kind]:>22d}" for name in kept) for kind in kinds]
    rows.append(f"{'all':30s}" + "".join(f"{len(guards):>22d}" for guards in kept.values()))
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1280x16:8:256", help="DIMxHEADS:BATCH:TOKENS")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--native", action="store_true", help="ours with every op native (default: auto)")
    parser.add_argument("--dump-guards", metavar="FILE", help="write the guards each variant keeps (JSON)")
    args = parser.parse_args()
    dims, batch, tokens = args.shape.split(":")
    dim, heads = (int(v) for v in dims.split("x"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cfg = D.config("dit_xl", dim=dim, heads=heads, depth=args.depth, max_tokens=int(tokens))
    torch.manual_seed(0)
    src = D.DiT(cfg).eval()
    with torch.no_grad():
        for p in src.parameters():
            p.normal_(0, 0.02)
    x = torch.randn(int(batch), int(tokens), dim, device=device, dtype=dtype)
    c = torch.randn(int(batch), dim, device=device, dtype=dtype)
    specs = {
        "plain": (D.PlainDiT, None),
        "plain again": (D.PlainDiT, None),
        "plain, trusted_code": (D.PlainDiT, trusted_code),
        "ours": (D.DiT, None),
        "ours, trusted_code": (D.DiT, trusted_code),
        "ours, no guards": (D.DiT, no_guards),
        "plain, no guards": (D.PlainDiT, no_guards),
    }
    fns, kept = {}, {}
    policy = ops.policy(all="native") if args.native else contextlib.nullcontext()
    with torch.no_grad(), policy:
        for i, (name, (base, filt)) in enumerate(specs.items()):
            m = fresh(base, f"v{i}", cfg)
            m.load_state_dict(src.state_dict())
            m = m.to(device, dtype)
            if args.dump_guards:
                filt = recording(filt, kept.setdefault(name, []))
            opts = {"options": {"guard_filter_fn": filt}} if filt else {}
            f = torch.compile(m, fullgraph=True, dynamic=False, **opts)
            f(x, c)
            fns[name] = lambda f=f: f(x, c)
        medians = round_medians(fns, device=device, rounds=args.rounds, reps=50)
    plain = statistics.median(medians["plain"])
    print(f"{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"{args.shape} depth {args.depth}, default mode, ours {'native' if args.native else 'auto'}, "
          f"{args.rounds} rounds")  # fmt: skip
    for name, ms in medians.items():
        m = statistics.median(ms)
        spread = f"{min(ms) * 1e3:.1f}-{max(ms) * 1e3:.1f}"
        print(f"  {name:30s} {m * 1e3:8.1f} us  plain / this {plain / m:.3f}  (rounds {spread})")
    if args.dump_guards:
        with open(args.dump_guards, "w") as f:
            json.dump(kept, f, indent=0)
        print(f"guards kept, by guard type ({args.dump_guards}):")
        print(guard_table({name: g for name, g in kept.items() if g}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
