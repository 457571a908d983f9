"""Sweep launch configurations of our Triton flash-attention kernel against SDPA's sub-backends on the GPU.

Used to choose `fullgraph.kernels.flash_attention.config`. Each candidate (BLOCK_M, BLOCK_N, warps, stages,
TMA loads, warp-specialized key loop) is checked against SDPA's output, then timed with CUDA-graph replay beside the
SDPA sub-backends on the same inputs; causal is swept over the best non-causal candidates only.
`--short`: only the tiles `config` picks. `--shape B,H,N,D`: one point, q/k/v as views of a fused QKV
projection's [B, N, 3, H, D] output (what the ViT passes), every tile without TMA plus smaller ones (a short
batch fills the GPU with small tiles only). `--ws`: TMA tiles with and without warp specialization side by
side, and the Gluon kernel's tiles, then stress tests of the WS tile and of the first Gluon tile. `--versus`:
the default configuration against torch's SDPA called directly (cuDNN, flash), through fullgraph's
"sdpa-cudnn" op, and the Gluon kernel, interleaved over several rounds (SDPA's cuDNN speed moves
between runs), then the stress tests.
Run: PYTHONPATH=src python3 benchmarks/tune_attention.py > tune_attention.csv  (lines starting # are the summary)
"""

import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fullgraph.kernels.flash_attention as fa
from fullgraph.bench import measure
from fullgraph.bench.roofline import attention_flops, tflops
from fullgraph.bench.suites.attention import rel_err
from fullgraph.errors import UsageError

# (batch, heads, seq, head dim): the DiT points of issue 5 and the ViT ones
SHAPES = {128: [(1, 24, 4096, 128), (1, 24, 16384, 128)], 64: [(1, 12, 4096, 64), (20, 12, 197, 64)]}
SDPA = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip
TILES = {
    128: [(128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 2), (128, 64, 4, 3),
          (128, 128, 4, 2), (64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2), (128, 32, 8, 3)],
    64: [(128, 64, 4, 2), (128, 64, 4, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 4, 2),
         (128, 128, 4, 3), (64, 64, 4, 3)],
}  # fmt: skip
SHORT_TILES = {128: [(128, 64, 4, 2, True), (64, 64, 4, 3, False)], 64: [(128, 64, 4, 2, False), (64, 64, 4, 3, False)]}
SMALL_TILES = [(64, 64, 4, 2), (64, 32, 4, 2), (64, 64, 4, 1), (32, 32, 4, 2), (32, 32, 2, 2), (64, 32, 2, 2)]
WS_TILES = [(128, 128, 4, 2), (128, 64, 4, 2), (64, 64, 4, 3)]
# the hand-scheduled Gluon kernel: BLOCK_M = 16 · warps (· 2 with ws: two consumer partitions), stages = ring slots
GLUON_TILES = [fa.Config(128, 128, 4, 2, ws=True, gluon=True), fa.Config(64, 64, 4, 2, gluon=True),
               fa.Config(128, 64, 4, 3, ws=True, gluon=True), fa.Config(128, 64, 4, 4, ws=True, gluon=True),
               fa.Config(64, 64, 4, 3, gluon=True), fa.Config(64, 128, 4, 2, gluon=True),
               fa.Config(128, 128, 8, 2, gluon=True)]  # fmt: skip
# --ws: the DiT points, a length that leaves a partial key block (every block masked in the single WS loop), ViT
WS_SHAPES = {
    128: [(1, 24, 4096, 128), (1, 24, 16384, 128), (1, 24, 4000, 128)],
    64: [(1, 12, 4096, 64), (20, 12, 197, 64)],
}


def time_ms(fn) -> float:
    return measure(fn, reps=20, warmup=5, graph=True).median_ms


def ours(q, k, v, causal, cfg):
    fa.override = cfg
    try:
        return fa.flash_attention_fwd(q, k, v, causal, 1 / math.sqrt(q.shape[-1]))
    finally:
        fa.override = None


def sweep_point(shape, causal, candidates, print_row, fused_qkv=False):
    b, h, n, d = shape
    if fused_qkv:
        q, k, v = torch.randn(b, n, 3, h, d, device="cuda", dtype=torch.bfloat16).permute(2, 0, 3, 1, 4)
    else:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = attention_flops(b, h, n, n, d, causal)
    ref = None
    results = {}
    for name, backend in SDPA.items():
        with sdpa_kernel(backend):
            fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
            try:
                out = fn()
                ms = time_ms(fn)
            except RuntimeError as e:
                print(f"# {shape} {name}: {str(e).splitlines()[0][:80]}", file=sys.stderr)
                continue
        ref = out.float() if ref is None else ref
        results[name] = ms
        print_row(shape, causal, name, ms, tflops(flops, ms), 0.0)
    for cfg in candidates:
        try:
            out = ours(q, k, v, causal, cfg)
            err = rel_err(out, ref)
            ms = time_ms(lambda cfg=cfg: ours(q, k, v, causal, cfg))
        except Exception as e:  # a tile that does not fit (shared memory, registers) is skipped
            print(f"# {shape} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:100]}", file=sys.stderr)
            continue
        print_row(shape, causal, "/".join(str(int(x)) for x in cfg), ms, tflops(flops, ms), err)
        if not err < 2e-2:  # NaN included: a wrong candidate is never ranked
            print(f"# {shape} causal={causal} {cfg}: WRONG, relative error {err:.2e}", flush=True)
            continue
        results[cfg] = ms
    return results, flops


def main() -> int:
    print("shape,causal,variant,us,tflops,rel_err")

    def print_row(shape, causal, name, ms, rate, err):
        print(f"{'x'.join(map(str, shape))},{causal},{name},{ms * 1e3:.1f},{rate:.1f},{err:.2e}", flush=True)

    short, ws, gluon = "--short" in sys.argv, "--ws" in sys.argv, "--gluon" in sys.argv
    ws = ws or gluon
    if "--shape" in sys.argv:
        shape = tuple(int(x) for x in sys.argv[sys.argv.index("--shape") + 1].split(","))
        tiles = [(*t, False) for t in TILES.get(shape[3], TILES[128]) + SMALL_TILES]
        candidates = [fa.Config(*t) for t in dict.fromkeys(tiles)]
        default = fa.config(shape[3], torch.bfloat16, shape[2], shape[0] * shape[1])
        print(f"# {shape}: config() picks {default}", flush=True)
        res, flops = sweep_point(shape, False, candidates, print_row, fused_qkv=True)
        _summary(shape, False, res, flops)
        return 0
    if "--versus" in sys.argv:
        versus()
        stress(fa.WS_TILE)
        stress(GLUON_TILES[0])
        compiled_check()
        return 0
    for d, shapes in (WS_SHAPES if ws else SHAPES).items():
        if gluon:
            tiles = []
        elif ws:
            tiles = [(*t, True, on) for t in WS_TILES for on in (False, True)]
        else:
            tiles = SHORT_TILES[d] if short else [(*t, tma) for t in TILES[d] for tma in (False, True)]
        candidates = [fa.Config(*t) for t in tiles] + (GLUON_TILES if ws else [])
        score: dict = {}
        seen: dict = {}
        for shape in shapes:
            res, flops = sweep_point(shape, False, candidates, print_row)
            _summary(shape, False, res, flops)
            for cfg in candidates:
                if cfg in res:
                    score[cfg] = score.get(cfg, 0.0) + math.log(res[cfg])
                    seen[cfg] = seen.get(cfg, 0) + 1
        # the best non-causal candidates over all shapes (geometric mean of times; only those that ran at all)
        top = sorted((c for c in score if seen[c] == len(shapes)), key=score.get)[:6]
        print(f"# d={d} non-causal ranking: {top}", flush=True)
        for shape in shapes:
            res, flops = sweep_point(shape, True, top, print_row)
            _summary(shape, True, res, flops)
    if ws:
        stress(fa.WS_TILE)
        stress(GLUON_TILES[0])
    compiled_check()
    return 0


def versus(rounds=5):
    """Median over interleaved rounds of each contender's rate, and of our kernel's ratio to raw cuDNN."""
    for b, h, n, d in SHAPES[128]:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            _versus_point(q, k, v, causal, rounds)


def _versus_point(q, k, v, causal, rounds):
    from fullgraph.ops.attention import attention

    b, h, n, d = q.shape
    triton_cfg = fa.config(d, q.dtype, n, b * h, True, fa._ws_fits(causal, n, True, q.device), gluon=False)

    def sdpa(backend):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    contenders = {
        "sdpa-cudnn raw": lambda: sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa-flash raw": lambda: sdpa(SDPBackend.FLASH_ATTENTION),
        "fullgraph sdpa-cudnn op": lambda: attention(q, k, v, causal=causal, backend="sdpa-cudnn"),
        "ours": lambda: fa.flash_attention_fwd(q, k, v, causal, 1 / math.sqrt(d)),  # the default: Gluon on Hopper
        "ours triton": lambda: ours(q, k, v, causal, triton_cfg),
    }
    times = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            times[name].append(time_ms(fn))
    flops = attention_flops(b, h, n, n, d, causal)
    med = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    line = f"# versus {b}x{h}x{n}x{d} causal={causal}: " + ", ".join(
        f"{name} {tflops(flops, ms):.0f}" for name, ms in med.items()
    )
    for mine in ("ours", "ours triton"):
        if mine in times:
            ratios = sorted(c / o for c, o in zip(times["sdpa-cudnn raw"], times[mine], strict=True))
            line += f"; {mine} / cuDNN raw: median {ratios[len(ratios) // 2]:.3f}x ({ratios[0]:.3f}-{ratios[-1]:.3f})"
    print(line + f" over {rounds} rounds", flush=True)


def stress(cfg, repeats=5):
    """A configuration against the float32 math reference on fresh inputs, many shapes, repeated: a race in the
    generated code shows as an occasional wrong or NaN output."""
    worst, wrong, runs, refused = 0.0, 0, 0, 0
    shapes = [(1, 24, 4096, 128), (2, 8, 1024, 128), (1, 3, 384, 128), (1, 24, 4000, 128), (3, 5, 77, 80),
              (4, 12, 197, 64), (1, 4, 2048, 96)]  # fmt: skip
    for b, h, n, d in shapes:
        for causal in (False, True):
            for _ in range(repeats):
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                with sdpa_kernel(SDPBackend.MATH):
                    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
                try:
                    out = ours(q, k, v, causal, cfg)
                except UsageError:  # inputs the configuration does not serve (the Gluon variant's limits)
                    refused += 1
                    continue
                err = rel_err(out, ref)
                worst = max(worst, err) if err == err else float("nan")
                wrong += not err < 1e-2
                runs += 1
    print(
        f"# stress {cfg}: {runs} runs ({refused} refused), {wrong} wrong, worst relative error {worst:.2e}",
        flush=True,
    )


def compiled_check():
    """Each kernel variant through torch.compile (Inductor launches the triton_op), plain and CUDA-graphed."""
    from torch._inductor.utils import fresh_inductor_cache

    q, k, v = (torch.randn(1, 24, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for cfg in (None, fa.Config(128, 64, 4, 2, True), fa.Config(64, 64, 4, 3, False)):  # None: the default (Gluon)
        fa.override = cfg
        for mode in ("default", "reduce-overhead"):
            torch._dynamo.reset()
            # the graph is the same for every configuration: without a fresh cache the first one's build is reused
            with fresh_inductor_cache():
                _compiled_point(q, k, v, cfg, mode)
    fa.override = None


def _compiled_point(q, k, v, cfg, mode):
    fn = torch.compile(lambda q, k, v: torch.ops.fullgraph.flash_attention(q, k, v, True, 0.088), mode=mode,
                       fullgraph=True)  # fmt: skip
    try:
        eager = fa.flash_attention_fwd(q, k, v, True, 0.088)
        out = fn(q, k, v).clone()
        out = fn(q, k, v).clone()
        err = rel_err(out, eager.float())
        ms = measure(lambda: fn(q, k, v), reps=20).median_ms
        print(f"# compiled {mode} {cfg}: rel err vs eager {err:.2e}, {ms * 1e3:.1f} us", flush=True)
    except Exception as e:
        print(f"# compiled {mode} {cfg}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)


def _summary(shape, causal, res, flops):
    sdpa = {k: v for k, v in res.items() if isinstance(k, str)}
    mine = {k: v for k, v in res.items() if not isinstance(k, str)}
    if not sdpa or not mine:
        return
    best_sdpa = min(sdpa, key=sdpa.get)
    best = min(mine, key=mine.get)
    print(
        f"# {'x'.join(map(str, shape))} causal={causal}: best ours {best} {tflops(flops, mine[best]):.0f} TFLOP/s = "
        f"{sdpa[best_sdpa] / mine[best]:.3f}x {best_sdpa} ({tflops(flops, sdpa[best_sdpa]):.0f}); "
        + ", ".join(f"{k} {tflops(flops, v):.0f}" for k, v in sdpa.items()),
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
