"""Does the GPU clock the plain twin and ours alike, and how fast could any stack built on the same GEMMs and
attention be? The compiled DiT (dim 3072, 4 blocks, bf16, default mode) runs in rotating phases, one variant per
phase, while `nvidia-smi` samples the SM clock and the power draw every 50 ms; per phase: ms per call, and the median
SM clock and power over the phase's samples; per variant: the median over its phases, its ratio to plain, and the
energy of one call (power x time).

Variants:
  plain          the plain twin (PlainDiT)
  auto           ours, every op's policy auto
  native         ours, every op's policy native
  auto-gelu-off  ours auto but linear_gelu native (fc1 a plain GEMM, the GELU a pass of its own)
  skeleton       the plain twin's GEMMs (adaLN projections included) and attention alone, every other pass removed:
                 no norms, modulation, RoPE, GELU or residuals. The floor of any stack that keeps cuBLAS and cuDNN for
                 those and removes the rest: plain / skeleton bounds what fusing or removing the memory-bound work
                 can give. Its weights are the twin's, each linear scaled once so its output has unit std (as the
                 norms keep a real stack's activations; a GEMM's power depends on the data it multiplies).
  skeleton-gelu  the skeleton with fc1 through cuBLASLt's GELU epilogue (what linear_gelu's kernel form runs): what
                 the epilogue itself costs at the cap

Under the power cap (~690 W on the H200) time per call is energy per call over the cap, so the ratio of energies
says what removing work gives on the wall clock, not the ratio of kernel times.

Usage (GPU): PYTHONPATH=src python3 benchmarks/probes/dit_clocks.py [--tokens 4096] [--variants plain,auto,skeleton]
             [--phases 9] [--seconds 1.5]
CPU check of the skeleton's numerics only: python3 benchmarks/probes/dit_clocks.py --small
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.bench.suites import policy_context

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, where dit_kernels.py lives
from dit_kernels import twins


class Skeleton(nn.Module):
    """The plain twin's linears and attention with nothing between them (see the module docstring)."""

    def __init__(self, plain: nn.Module, x: torch.Tensor, c: torch.Tensor, gelu: bool = False):
        super().__init__()
        self.stack, self.gelu = copy.deepcopy(plain), gelu
        self.heads, self.head_dim = plain.cfg.heads, plain.cfg.head_dim
        scaled = [m for b in self.stack.blocks for m in (b.proj, b.fc1, b.fc2)]
        hooks = [m.register_forward_hook(_unit_std) for m in scaled]
        try:
            with torch.no_grad():
                self(x, c)  # one call scales each linear in turn, so each sees its scaled inputs
        finally:
            for h in hooks:
                h.remove()

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        s = F.silu(c)
        for b in self.stack.blocks:
            ada = b.ada(s)  # [1, 6 dim] (batch 1): joins the QKV bias (9216 elements), so the GEMV stays in the graph
            qkv = F.linear(x, b.qkv.weight, b.qkv.bias + ada[0, : b.qkv.out_features])
            q, k, v = qkv.unflatten(-1, (3, self.heads, self.head_dim)).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            p = b.proj(a.transpose(1, 2).flatten(2))
            x = b.fc2(self._fc1_gelu(b.fc1, p) if self.gelu else b.fc1(p))
        final = self.stack.final
        return F.linear(x, final.weight, final.bias + self.stack.final_ada(s)[0, : final.out_features])

    @staticmethod
    def _fc1_gelu(fc1: nn.Linear, p: torch.Tensor) -> torch.Tensor:
        y = torch._addmm_activation(fc1.bias, p.flatten(0, 1), fc1.weight.t(), use_gelu=True)
        return y.view(*p.shape[:-1], fc1.out_features)


def _unit_std(module: nn.Module, inputs, out: torch.Tensor) -> torch.Tensor:
    k = out.float().std().item()
    module.weight.mul_(1 / k)
    module.bias.mul_(1 / k)
    return out / k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--variants", default="plain,auto,skeleton", help="comma-separated, of those in the docstring")
    ap.add_argument("--phases", type=int, default=9)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--small", action="store_true", help="CPU: check the skeleton's scaling on a small stack, exit")
    args = ap.parse_args()
    if args.small:
        return check_small()
    ours, plain, x, c = twins(args.tokens, "cuda")
    makers = {  # name -> (module, op policies its calls run under, as `bench dit --policies` spells them)
        "plain": lambda: (plain, None),
        "auto": lambda: (ours, "all=auto"),
        "native": lambda: (ours, "none"),
        "auto-gelu-off": lambda: (ours, "all=auto,-linear_gelu"),
        "skeleton": lambda: (Skeleton(plain, x, c), None),
        "skeleton-gelu": lambda: (Skeleton(plain, x, c, gelu=True), None),
    }
    names = args.variants.split(",")
    if unknown := [n for n in names if n not in makers]:
        print(f"error: unknown variant(s) {unknown}; pick from {list(makers)}", file=sys.stderr)
        return 2
    made = {n: makers[n]() for n in names}
    fns = {n: _under(torch.compile(m, fullgraph=True), spec) for n, (m, spec) in made.items()}
    with torch.no_grad():
        for fn in fns.values():
            for _ in range(3):
                fn(x, c)
        torch.cuda.synchronize()
        smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)
        phases = []
        for i in range(args.phases):
            name = names[i % len(names)]
            t0, n = time.time(), 0
            while time.time() - t0 < args.seconds:
                for _ in range(10):
                    fns[name](x, c)
                n += 10
                torch.cuda.synchronize()
            phases.append((name, t0, time.time(), n))
        time.sleep(0.3)
        smi.terminate()
        samples = []
        for line in smi.communicate()[0].splitlines():
            try:
                stamp, clock, power = (p.strip() for p in line.split(","))
                t = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
                samples.append((t, float(clock), float(power)))
            except ValueError:
                continue
    print(f"DiT 3072 x 4 blocks, {args.tokens} tokens, bf16, compiled default mode; {len(samples)} nvidia-smi samples")
    print(f"{'phase':>5} {'variant':10} {'ms/call':>8} {'SM MHz':>7} {'power W':>8} {'samples':>7}")
    rows = []
    for i, (name, t0, t1, n) in enumerate(phases):
        inside = [s for s in samples if t0 + 0.2 <= s[0] <= t1]  # the phase's first 0.2 s: the switch settles
        clock = statistics.median(s[1] for s in inside) if inside else float("nan")
        power = statistics.median(s[2] for s in inside) if inside else float("nan")
        rows.append((name, (t1 - t0) / n * 1e3, clock, power))
        print(f"{i:5d} {name:10} {rows[-1][1]:8.3f} {clock:7.0f} {power:8.1f} {len(inside):7d}")
    print(f"\n{'variant':10} {'ms/call':>8} {'plain/this':>10} {'SM MHz':>7} {'power W':>8} {'J/call':>7}")
    median = {n: [statistics.median(r[k] for r in rows if r[0] == n) for k in (1, 2, 3)] for n in names}
    base = median.get("plain", median[names[0]])[0]
    for n, (ms, clock, power) in median.items():
        print(f"{n:10} {ms:8.3f} {base / ms:10.3f} {clock:7.0f} {power:8.1f} {power * ms / 1e3:7.3f}")
    return 0


def _under(fn, spec: str | None):
    """`fn` called inside its op policies, as `bench dit` calls its variants (each compiles its own graph: Dynamo
    guards on the policy)."""

    def call(*args):
        with policy_context(spec):
            return fn(*args)

    return call


def check_small() -> int:
    """The skeleton on a 2-block dim-128 stack (CPU, fp32), with and without the GELU epilogue: each scaled linear's
    output has unit std, and the epilogue form matches fc1 + GELU (the CPU's `_addmm_activation` computes erf's)."""
    _, plain, x, c = twins(64, "cpu", dim=128, heads=2, depth=2)
    plain, x, c = plain.float(), x.float(), c.float()
    ok = True
    for gelu in (False, True):
        sk = Skeleton(plain, x, c, gelu=gelu)
        seen = []
        hook = sk.stack.blocks[-1].fc2.register_forward_hook(lambda m, i, o, seen=seen: seen.append(o.std().item()))
        with torch.no_grad():
            finite = torch.isfinite(sk(x, c)).all().item()
            p = torch.randn(1, 64, 128)
            fc1 = sk.stack.blocks[0].fc1
            err = (Skeleton._fc1_gelu(fc1, p) - F.gelu(fc1(p))).abs().max().item() if gelu else 0.0
        hook.remove()
        good = finite and abs(seen[0] - 1) < 1e-3 and err < 1e-5
        ok &= good
        print(
            f"skeleton gelu={gelu}: last fc2 output std {seen[0]:.4f}, finite {finite}, epilogue err {err:.1e}: "
            f"{'ok' if good else 'BAD'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
