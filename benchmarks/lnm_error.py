"""Why the DiT's error against fp32 grows 1.04-1.14x with `layer_norm_modulate`'s kernel alone (all other ops
native; H100 sweeps of 2026-12-06, before and after the kernel normalised the float32 residual sum) while the op
alone is nearer float64 than Inductor's fusion of the native ops. Two looks:

1. the op alone (gated residual, LayerNorm, modulation) at widths 1152, 1280 and 3072: y's and s's error against
   float64, kernel and compiled native;
2. the stack under torch.compile: the output's error against the fp32 plain twin for plain, all native and all
   native + the kernel, each with Inductor's `emulate_precision_casts` off (its default) and on (every op's output
   rounded to its dtype, as eager rounds it).

The answer, reproduced on the CPU machine (`--small`: fp16 under Triton's interpreter, a 2-block 256-wide stack,
2026-12-06): compiled all native 0.00036, + the kernel 0.00046, eager all native 0.00054; with
`emulate_precision_casts` all native 0.00061 and + the kernel 0.00046 (unchanged). Inductor recomputes the residual
stream inside its fused kernels (a block's second norm reads x, the ada output and the projection's output and adds
them again in float32, and the next block's first norm adds both branches to the block's input), so the stream is
rounded to bf16 once a block; the kernel, opaque, stores its s rounded at each of its two calls a block, as eager
code does. Not a fault of the kernel (it is nearer the truth than eager and than the op's native form), but a
rounding the fused native graph does not pay. The DiT now hands both branches of a block to the next block's first
norm, one sum (s = x + gate1 · attn + gate2 · mlp): + the kernel 0.00036 there, as all native.

Run: PYTHONPATH=src python benchmarks/lnm_error.py [--shape 1152x16:2:1024] [--small]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from dit_kernels import sweep_shape, twins, variant_policy

from fullgraph import ops
from fullgraph.bench.suites import rel_err
from fullgraph.models import dit as _dit  # noqa: F401

D = sys.modules["fullgraph.models.dit"]


def rel(a, b):
    return rel_err(a, b.double())


def op_level(dev, dtype):
    from fullgraph.kernels.layer_norm import layer_norm_modulate_residual_fwd
    from fullgraph.ops.modulation import layer_norm_modulate_native

    native = torch.compile(lambda x, h, g, sh, sc: layer_norm_modulate_native(x, sh, sc, 1e-6, h, g))
    for width in (1152, 1280, 3072):
        torch.manual_seed(width)
        x, h = (torch.randn(4, 256, width, device=dev, dtype=dtype) for _ in range(2))
        g, sh, sc = (torch.randn(4, 1, width, device=dev, dtype=dtype) * 0.5 for _ in range(3))
        x64, h64, g64, sh64, sc64 = (t.double() for t in (x, h, g, sh, sc))
        s64 = x64 + g64 * h64
        y64 = torch.nn.functional.layer_norm(s64, (width,), eps=1e-6) * (1 + sc64) + sh64
        yk, sk = layer_norm_modulate_residual_fwd(x, h, g, sh, sc, 1e-6)
        yn, sn = native(x, h, g, sh, sc)
        print(
            f"op width {width}: y err kernel {rel(yk, y64):.3e} native {rel(yn, y64):.3e}; "
            f"s err kernel {rel(sk, s64):.3e} native {rel(sn, s64):.3e}; y kernel vs native {rel(yk, yn):.3e}"
        )


def model_level(dev, dtype, shape, dim, heads, batch, tokens):
    ours, plain, x, c = twins(tokens, dev, batch, dim=dim, heads=heads, depth=2 if dev == "cpu" else 4)
    ref = D.PlainDiT(ours.cfg).eval().to(dev)
    ref.load_state_dict(plain.state_dict())
    with torch.no_grad():
        expected = ref(x.float(), c.float())
    ours, plain, x, c = (t.to(dtype) for t in (ours, plain, x, c))
    cfg = torch._inductor.config
    saved = cfg.emulate_precision_casts
    try:
        for emulate in (False, True):
            cfg.emulate_precision_casts = emulate
            for name, variant in (("plain", "plain"), ("all native", "native"),
                                  ("native + lnm kernel", "native+layer_norm_modulate")):  # fmt: skip
                torch._dynamo.reset()
                cm = torch.compile(plain if variant == "plain" else ours, fullgraph=True)
                with torch.no_grad(), ops.policy(**(variant_policy(variant) or {})):
                    got = cm(x, c)
                print(f"model {shape} emulate_precision_casts={emulate}: {name:20} err {rel(got, expected):.5f}")
    finally:
        cfg.emulate_precision_casts = saved


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1152x16:2:1024")
    ap.add_argument("--small", action="store_true", help="CPU, fp16 under the interpreter, a small stack")
    args = ap.parse_args()
    if args.small or not torch.cuda.is_available():
        op_level("cpu", torch.float16)
        model_level("cpu", torch.float16, "256x4:2:64", 256, 4, 2, 64)  # fp16: the interpreter truncates to bf16
        return 0
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    op_level("cuda", torch.bfloat16)
    model_level("cuda", torch.bfloat16, args.shape, *sweep_shape(ap, args.shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
