"""Kernel by kernel: where the DiT built from our ops (compiled, policy `native`) spends GPU time that its plain
twin does not. The `bench dit` breakdown gives kernel classes; this gives each kernel's time per call for the
plain twin and for variants of ours, side by side, so a gap can be traced to the kernel (and aten op) that makes it.

Variants (same weights, torch.compile(fullgraph=True), default mode):
  plain           PlainDiT (F.layer_norm, rotate-half RoPE in the input dtype, SDPA)
  native          DiT with every op's policy native
  native-lowp     native, but RoPE computed in the input dtype from tables in it (as the plain twin does; ours keeps
                  float32 tables and math), to see whether that costs anything inside the graph
  auto            DiT with every op's policy auto (what `bench dit` calls "ours, auto")
  native+OP[+OP]  every op native but OP's kernel (the sweep's one-kernel variants, e.g. native+layer_norm_modulate)

Issue 32 ("all native within 1% of the plain twin"): the sweep's points are DiT stacks of depth 4 by (dim, heads),
batch and tokens; `--shape 1536x24:8:256` selects one (DIMxHEADS:BATCH:TOKENS; the default is the dit_3072 stack at
batch 1 and --tokens), and each variant's line gives its kernel launches per call beside its median, so where
ours-native loses to plain (0.967x at 1536x24 b8 n256 under reduce-overhead, H100) the table shows the kernels it
runs that plain does not.

Run: PYTHONPATH=src python benchmarks/dit_kernels.py [--tokens 1024] [--top 25] [--variants plain,auto]
     [--mode reduce-overhead] [--shape 1536x24:8:256] [--by diff]
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

from fullgraph import ops
from fullgraph.bench import breakdown as bd
from fullgraph.models import dit as _dit  # noqa: F401  (the package exports the function of the same name)
from fullgraph.timing import round_medians

D = sys.modules["fullgraph.models.dit"]


def rope_in_dtype(x, cos, sin, interleaved: bool = False, seq_dim: int = 2):
    """`ops.rope.rope_native` computed as the plain twin computes it: the twin's own `models.dit.rotate_half_rope`
    (tables cast to x's dtype, the products in x's dtype), for the DiT's calls (rotate-half, layout bsnd, every
    channel rotated)."""
    if interleaved or seq_dim != 1 or 2 * cos.shape[-1] != x.shape[-1]:
        raise NotImplementedError("the twin's RoPE covers rotate-half over every channel of a [B, N, H, D] x only")
    return D.rotate_half_rope(x, cos, sin)


@contextlib.contextmanager
def rope_like_plain():
    """RoPE's native form in x's dtype while the context holds (the trace and each call of the variant). The other
    native forms that differed from the twin's (modulate, gated_residual) trace as the twin writes them already."""
    rope = sys.modules["fullgraph.ops.rope"]
    original = rope.rope_native
    rope.rope_native = rope_in_dtype
    try:
        yield
    finally:
        rope.rope_native = original


def variant_policy(name: str) -> dict[str, str] | None:
    """The op policies a variant's calls run under: None for plain, {"all": "auto"} for auto, every op native
    otherwise, and with `native+OP+...` those ops' kernels."""
    if name == "plain":
        return None
    if name == "auto":
        return {"all": "auto"}
    ops_named = name.split("+")[1:] if name.startswith("native+") else []
    return {"all": "native", **{op: "kernel" for op in ops_named}}


def known_variant(name: str) -> bool:
    from fullgraph.ops.policies import KNOWN_OPS

    if name in ("plain", "native", "native-lowp", "auto"):
        return True
    return name.startswith("native+") and all(op in KNOWN_OPS for op in name.split("+")[1:])


def sweep_shape(parser: argparse.ArgumentParser, text: str) -> tuple[int, int, int, int]:
    """--shape DIMxHEADS:BATCH:TOKENS (a sweep point) -> (dim, heads, batch, tokens), or the parser's error."""
    try:
        dims, b, n = text.split(":")
        dim, heads = (int(v) for v in dims.split("x"))
        return dim, heads, int(b), int(n)
    except ValueError:
        parser.error(f"--shape {text!r}: write DIMxHEADS:BATCH:TOKENS, e.g. 1536x24:8:256")


def twins(tokens: int, device: str, batch: int = 1, **overrides):
    """(ours, plain, x, c): the dit_3072 stack (1-D RoPE; `overrides` replace its fields) with random weights and
    its plain twin loaded from it, both bf16 on `device`, and one batch of `batch` inputs."""
    cfg = D.config("dit_3072", rope="1d", max_tokens=tokens, **overrides)
    torch.manual_seed(0)
    ours = D.DiT(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.02)
    plain = D.PlainDiT(cfg).eval()
    plain.load_state_dict(ours.state_dict())
    ours, plain = ours.to(device, torch.bfloat16), plain.to(device, torch.bfloat16)
    x = torch.randn(batch, tokens, cfg.dim, device=device, dtype=torch.bfloat16)
    c = torch.randn(batch, cfg.dim, device=device, dtype=torch.bfloat16)
    return ours, plain, x, c


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--variants", default="plain,native,native-lowp,auto", help="comma-separated, of those above")
    parser.add_argument("--mode", default="default", help="torch.compile mode (default, reduce-overhead, ...)")
    parser.add_argument(
        "--by",
        choices=("time", "diff"),
        default="time",
        help="order the kernels by their longest time, or by the spread between the variants",
    )
    parser.add_argument("--shape", help="DIMxHEADS:BATCH:TOKENS, a sweep point at depth 4 (e.g. 1536x24:8:256)")
    parser.add_argument("--small", action="store_true", help="a 2-block dim-128 stack (a CPU check of this script)")
    args = parser.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shape, batch, tokens = {"dim": 128, "heads": 2, "depth": 2} if args.small else {}, 1, args.tokens
    if args.shape:
        dim, heads, batch, tokens = sweep_shape(parser, args.shape)
        shape = {"dim": dim, "heads": heads, "depth": 4}
    ours, plain, x, c = twins(tokens, dev, batch, **shape)
    point = args.shape or f"{'small' if args.small else 'dit_3072'} b1 n{tokens}"
    gpu = f" {torch.cuda.get_device_name()}" if dev == "cuda" else ""
    print(f"# {point}, mode {args.mode}, {dev}{gpu}, torch {torch.__version__}")
    wanted = args.variants.split(",")
    if unknown := [v for v in wanted if not known_variant(v)]:
        parser.error(f"unknown variant(s) {unknown}; choose from plain, native, native-lowp, auto, native+OP[+OP]")
    fns = {}
    for name in wanted:
        torch._dynamo.reset()  # the same model under another policy: its own compile, not a served cache entry
        model = plain if name == "plain" else ours
        compiled = torch.compile(model, fullgraph=True, mode=None if args.mode == "default" else args.mode)

        def call(compiled=compiled, name=name):
            with torch.no_grad(), ops.policy(**(variant_policy(name) or {})):
                if name == "native-lowp":
                    with rope_like_plain():
                        return compiled(x, c)
                return compiled(x, c)

        fns[name] = call
        for _ in range(3):  # compile, then (reduce-overhead) record the CUDA graph
            call()
    medians = round_medians(fns, device=dev, rounds=5, reps=30)
    bd.TOP_N = 200
    tables = {}
    for name, fn in fns.items():
        b = bd.profile_breakdown(fn, device=dev, label=name, calls=10, dtype=torch.bfloat16)
        tables[name] = {(k.name[:90], k.source[:50]): (k.ms * 1e3, k.calls) for k in b.top}
        launches = sum(k.calls for k in b.top)
        print(f"{name:12} median {sorted(medians[name])[2]:.3f} ms; kernel time {b.kernel_ms:.3f} ms; "
              f"{launches} launches; " + ", ".join(f"{cl.name} {cl.ms:.3f}" for cl in b.classes))  # fmt: skip
    names = list(fns)

    def order(k):
        us = [t.get(k, (0, 0))[0] for t in tables.values()]
        return -(max(us) - min(us)) if args.by == "diff" else -max(us)

    keys = sorted({k for t in tables.values() for k in t}, key=order)
    print(f"\n{'kernel':90} {'source':50} " + " ".join(f"{n + ' us (n)':>18}" for n in names))
    for k in keys[: args.top]:
        cells = " ".join(f"{tables[n].get(k, (0, 0))[0]:10.1f} ({tables[n].get(k, (0, 0))[1]:3d})  " for n in names)
        print(f"{k[0]:90} {k[1]:50} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
