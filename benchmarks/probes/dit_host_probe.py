"""Host time of one DiT call, compiled in default mode and eager: where a host-bound call (1024 tokens on the H200
host) spends the CPU time that decides its speed, plain twin against ours.

Per variant: the time per call back to back between CUDA events (what `bench dit` reports), the host time of one
call alone (its enqueue, after a sync, so nothing waits on the GPU), the GPU's kernel count and kernel time
(torch.profiler), and for --profile variants a cProfile of 30 calls (top functions by own time). --code DIR writes
the Inductor output code of each compiled variant there.

Variants (same weights, torch.compile(fullgraph=True), default mode unless eager):
  plain            PlainDiT
  auto             DiT, every op auto
  fused            auto with the two fused kernels (qk_norm_rope, layer_norm_modulate) pinned to "kernel"
  eager-plain, eager-auto   the two twins uncompiled
  eager-fused      eager-auto with the two fused kernels pinned ("fused" uncompiled)
  eager-fused-lg   eager-fused with linear_gelu's kernel form (cuBLASLt's GELU epilogue) pinned too
  native           DiT, every op native (all native: the plain twin's kernels but the RoPE prologue)
  native+OP[+OP]   every op native but OP's kernel (the sweep's one-kernel variants)
  VARIANT@flash, VARIANT@mm, VARIANT@flash@mm   SDPA pinned to FlashAttention; every linear as mm + bias add
  VARIANT@scale    our SDPA calls with an explicit scale= (before 2026-12-07; the twin's call has none)

Issue 32's default-mode sweep points (`--shape DIMxHEADS:BATCH:TOKENS`, depth 4): where plain's default-mode time is
its host time (1152x16 b8 n256: 0.938 ms default against 0.779 under CUDA graphs, H100 2026-12-06), ours auto lost
3% with the same kernels as all native, and native+layer_norm_modulate lost 17-27% to all native in default mode but
2-5% graphed: the host ms and launchers columns say whether a loss is host time.

Usage (GPU): PYTHONPATH=src python3 benchmarks/probes/dit_host_probe.py [--tokens 1024 | --shape 1280x16:8:256]
             [--variants plain,auto,native,native+layer_norm_modulate] [--profile fused,eager-auto] [--code DIR]
With TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 (a fresh process and TORCHINDUCTOR_CACHE_DIR: Inductor
keeps a kernel's launcher with its loaded module) our kernels launch through Inductor's static launcher, as its own
kernels do; the "launchers" line after each compile says which launcher each kernel got.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import logging
import pathlib
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from fullgraph import ops
from fullgraph.bench import breakdown as bd
from fullgraph.timing import round_medians

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # benchmarks/, where dit_kernels.py lives
from dit_kernels import known_variant, sweep_shape, twins, variant_policy

FUSED = {"qk_norm_rope": "kernel", "layer_norm_modulate": "kernel"}
VARIANTS = {  # name -> (plain model?, policy, compiled?)
    "plain": (True, {}, True),
    "auto": (False, {}, True),
    "fused": (False, FUSED, True),
    "eager-plain": (True, {}, False),
    "eager-auto": (False, {}, False),
    "eager-fused": (False, FUSED, False),
    "eager-fused-lg": (False, {**FUSED, "linear_gelu": "kernel"}, False),
}


MODIFIERS = ("flash", "mm", "scale")  # VARIANT@flash: SDPA pinned to flash attention; VARIANT@mm: linear as mm + bias
# add; VARIANT@scale: our SDPA calls pass their scale even where it is SDPA's default (as before 2026-12-07)


@contextlib.contextmanager
def modified(mods: tuple[str, ...]):
    """What a variant's `@` modifiers change, for its trace and every call (Dynamo guards on both, so they stay on):
    `flash` pins SDPA to FlashAttention (cuDNN's attention costs ~50 us of host time a call on the H100 host, its
    cProfile of 2026-12-06); `mm` computes every `F.linear` as a matmul plus a bias add, so Inductor calls mm (cuBLAS)
    and adds the bias in the neighbouring kernel where addmm calls cuBLASLt with a bias epilogue (~20 us a call);
    `scale` makes our SDPA calls pass `scale=` explicitly (`attention_backends.sdpa_scale` as before 2026-12-07)."""
    with contextlib.ExitStack() as stack:
        if "flash" in mods:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([SDPBackend.FLASH_ATTENTION]))
        if "scale" in mods:
            from fullgraph.ops import attention_backends

            stack.callback(setattr, attention_backends, "sdpa_scale", attention_backends.sdpa_scale)
            attention_backends.sdpa_scale = lambda q, scale: scale
        if "mm" in mods:
            original = F.linear
            F.linear = _linear_mm
            stack.callback(setattr, F, "linear", original)
        yield


def _linear_mm(x, weight, bias=None):
    y = torch.matmul(x, weight.t())
    return y if bias is None else y + bias


def host_times(fn, calls: int) -> tuple[float, float]:
    """(median host ms of one call's enqueue, median synced latency ms), each call after a sync."""
    host, synced = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e3)
        synced.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(host), statistics.median(synced)


def code_modules() -> list:
    """The Python modules Inductor has loaded in this process (its output code and kernels)."""
    from torch._inductor.codecache import PyCodeCache

    return list(getattr(PyCodeCache, "modules", None) or [])


def dump_code(directory: pathlib.Path, name: str, before: set) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, m in enumerate(m for m in code_modules() if getattr(m, "__file__", None) not in before):
        path = pathlib.Path(m.__file__)
        text = path.read_text()
        if "def call(" in text:
            (directory / f"{name}_{i}.py").write_text(text)


class _Bypassed(logging.Handler):
    """Inductor's reasons for launching a kernel through Triton's own launcher (its "Bypassing
    StaticallyLaunchedCudaKernel due to ..." info lines), collected while a variant compiles."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.reasons: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "Bypassing" in text:
            reason = text.split(" due to ", 1)[-1][:80]
            self.reasons[reason] = self.reasons.get(reason, 0) + 1


BYPASSED = _Bypassed()


def launcher_kinds(before: set) -> dict[str, int]:
    """How the kernels of the Inductor modules loaded since `before` launch: the runner type behind each launcher
    (StaticallyLaunchedCudaKernel: Inductor's static launcher; anything else: Triton's own), user kernels apart."""
    kinds: dict[str, int] = {}
    for m in code_modules():
        if getattr(m, "__file__", None) in before:
            continue
        for obj in vars(m).values():
            for launcher in getattr(obj, "launchers", None) or []:
                runner = getattr(launcher, "__globals__", {}).get("runner")
                owner = type(getattr(runner, "__self__", runner)).__name__
                user = "user" if "USER" in str(getattr(obj, "heuristic_type", "")) else "inductor"
                kinds[f"{user}:{owner}"] = kinds.get(f"{user}:{owner}", 0) + 1
    return kinds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--shape", help="DIMxHEADS:BATCH:TOKENS, a sweep point at depth 4 (instead of dit_3072 b1)")
    ap.add_argument("--variants", default="plain,auto,fused,eager-plain,eager-auto,eager-fused,eager-fused-lg")
    ap.add_argument("--profile", default="auto,fused,eager-auto,eager-plain,eager-fused")
    ap.add_argument("--code", default=None)
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args()
    heuristics = logging.getLogger("torch._inductor.runtime.triton_heuristics")
    heuristics.addHandler(BYPASSED)
    heuristics.setLevel(min(heuristics.getEffectiveLevel(), logging.INFO))
    wanted = args.variants.split(",")
    bases = {v: v.split("@") for v in wanted}
    if unknown := [v for v, (b, *mods) in bases.items()
                   if (b not in VARIANTS and not (b.startswith("native") and known_variant(b)))
                   or any(m not in MODIFIERS for m in mods)]:  # fmt: skip
        ap.error(
            f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}, native, native+OP[+OP], each with "
            f"optional modifiers {', '.join('@' + m for m in MODIFIERS)}"
        )
    if args.shape:
        dim, heads, batch, tokens = sweep_shape(ap, args.shape)
        ours, plain, x, c = twins(tokens, "cuda", batch, dim=dim, heads=heads, depth=4)
        what = f"DiT {dim} x {heads} heads x 4 blocks, batch {batch}, {tokens} tokens"
    else:
        ours, plain, x, c = twins(args.tokens, "cuda")
        what = f"DiT 3072 x 24 heads x 4 blocks, {args.tokens} tokens"
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 2 * len(wanted))
    with torch.no_grad():
        reference = plain(x, c).float()
    fns, errors = {}, {}
    for name in wanted:
        base, *mods = bases[name]
        is_plain, pol, compiled = VARIANTS.get(base) or (False, variant_policy(base), True)
        model = plain if is_plain else ours
        if compiled:
            torch._dynamo.reset()
            model = torch.compile(model, fullgraph=True)

        def call(model=model, pol=pol, mods=tuple(mods)):
            with torch.no_grad(), ops.policy(**{"all": "auto", **pol}), modified(mods):
                return model(x, c)

        before = {getattr(m, "__file__", None) for m in code_modules()}
        t0 = time.perf_counter()
        out = call()
        call()
        torch.cuda.synchronize()
        print(f"{name}: first two calls {time.perf_counter() - t0:.1f} s", flush=True)
        errors[name] = ((out.float() - reference).norm() / reference.norm()).item()
        if compiled:
            print(f"  launchers: {launcher_kinds(before)}; Triton's launcher because: {BYPASSED.reasons}", flush=True)
            BYPASSED.reasons.clear()
        if args.code and compiled:
            dump_code(pathlib.Path(args.code), name, before)
        fns[name] = call
    medians = round_medians(fns, device="cuda", rounds=5, reps=30)
    print(f"\n{what}, bf16, default mode (eager-*: uncompiled, their ratio against eager-plain)")
    print(f"{'variant':14} {'b2b ms':>8} {'rounds':>13} {'host ms':>8} {'synced':>8} {'kernels':>8} {'kernel ms':>9}"
          f" {'idle':>6} {'plain/this':>10} {'err':>8}")  # fmt: skip
    base = statistics.median(medians[wanted[0]])
    eager_base = statistics.median(medians["eager-plain"]) if "eager-plain" in medians else base
    for name, fn in fns.items():
        host, synced = host_times(fn, args.calls)
        b = bd.profile_breakdown(fn, device="cuda", label=name, calls=10, dtype=torch.bfloat16)
        n = sum(cl.kernels for cl in b.classes)
        med = statistics.median(medians[name])
        ratio = (eager_base if name.startswith("eager") else base) / med
        print(f"{name:14} {med:8.3f} {min(medians[name]):6.3f}-{max(medians[name]):6.3f} {host:8.3f} {synced:8.3f}"
              f" {n:8d} {b.kernel_ms:9.3f} {b.idle_share or 0:6.1%} {ratio:10.3f} {errors[name]:8.5f}",
              flush=True)  # fmt: skip
    for name in args.profile.split(","):
        if name not in fns:
            continue
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(30):
            fns[name]()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
        body = "\n".join(line for line in s.getvalue().splitlines() if line.strip())
        print(f"\n--- cProfile, 30 calls of {name} (by own time)\n{body}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
