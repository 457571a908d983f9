"""Attention forward with an online softmax (FlashAttention-2 style), never materializing the score matrix.

    out = softmax(q kᵀ · scale [+ causal mask]) v          q: [B, Hq, Nq, D], k, v: [B, Hkv, Nk, D]

Query head h reads key/value head h // (Hq // Hkv) (grouped-query attention; Hkv = 1 is multi-query).
Causal masking keeps key j for query i when j <= i and needs Nq == Nk.

One program owns BLOCK_M query rows of one (batch, head) and walks the keys BLOCK_N at a time, keeping per
row the running max m, the running sum l of exp(s - m) and an fp32 accumulator of p·v; when m grows, l and
the accumulator are rescaled by exp(m_old - m_new). Scores are kept in log2 units (scale · log2 e folded in
once, and fused with the max subtraction) so each element costs one FMA and one exp2. The keys split into a
range needing no mask (every key exists and, when causal, precedes the whole query block) and a short masked
tail (the last partial block, the causal diagonal). On Hopper, loads and the store can go through tensor
descriptors (TMA), and a non-causal call over whole key blocks runs one warp-specialized loop (producer warps
load while consumer warps compute: `WS_TILE`). On Hopper, from GLUON_MIN_QUERIES queries, inputs the Gluon
kernel serves (`_flash_attention_gluon.py`: FlashAttention-3's schedule, 0.93-1.00x cuDNN at 4096-16384 tokens)
go to it instead; traced calls reach it through an opaque op (Inductor builds only Triton kernels). The Triton
code is in `_flash_attention_jit.py`; measured speed in docs/attention-benchmark.md.

FLOPs: 4·B·Hq·Nq·Nk·D (two matmuls), about half that when causal. Memory traffic: q read and out written once
(2·B·Hq·Nq·D·bytes); k and v read once per query block, 2·B·Hq·Nk·D·bytes·ceil(Nq / BLOCK_M) (query heads
sharing a kv head, and query blocks of one head, mostly hit L2 for it).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from fullgraph import env
from fullgraph.errors import UsageError
from fullgraph.kernels._library import kernel_op, launch, require_triton

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
_MAX_GRID_Y = 65535  # CUDA's limit on the grid's second axis, which carries batch · heads
_LOG2E = 1.44269504


@functools.cache
def _flash_attention_fwd_kernel():
    require_triton()
    from fullgraph.kernels._flash_attention_jit import flash_attention_fwd_kernel

    return flash_attention_fwd_kernel


@functools.cache
def _gluon_kernel():
    require_triton()
    try:
        from fullgraph.kernels import _flash_attention_gluon as gluon
    except ImportError as e:
        raise UsageError(f"flash_attention: the Gluon variant needs Triton's Gluon dialect (triton >= 3.6): {e}") from e
    return gluon.flash_attention_fwd_gluon_kernel


class Config(NamedTuple):
    """One launch configuration. `tma`: load q/k/v and store out through tensor descriptors (Hopper's TMA unit;
    used only when every base and row stride is 16-byte aligned). `ws`: warp-specialize the unmasked key loop
    (producer warps load, consumer warps compute); only with `tma`, as Triton's Hopper pass needs descriptor
    loads. `gluon`: run the hand-scheduled Gluon kernel (`_flash_attention_gluon.py`; num_stages = its
    key/value ring slots; BLOCK_M = 16 · warps, or with `ws` two consumer warp groups of 16 · warps rows each
    fed by a loader warp)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False
    ws: bool = False
    gluon: bool = False


# Set by benchmarks/tune_attention.py to time a candidate; None uses `config`.
override: Config | None = None


def config(
    head_dim: int,
    dtype: torch.dtype,
    n_q: int,
    batch_heads: int,
    tma: bool = False,
    ws: bool = False,
    gluon: bool = False,
) -> Config:
    """The launch configuration for a problem (BLOCK_M is a multiple of BLOCK_N: see the kernel). `tma`: tensor
    descriptors can address the inputs (`_tma_fits`); `ws`: warp specialization was measured to work here
    (`_ws_measured`); `gluon`: the Gluon kernel can serve (`_gluon_refusal` of its tile says nothing).

    Where it serves (Hopper, fp16/bf16, head dim 64 or 128) on GLUON_MIN_QUERIES queries or more, the Gluon
    kernel is fastest (results/tune_attention_gluon_h200.csv): head dim 128 with the warp-specialized tile, 625
    TFLOP/s at 1x24x4096 (0.93x cuDNN; the Triton kernel's best 561), 624 at 16384, 485 causal at 4096 (Triton
    405); head dim 64 with one warp group and 128-key blocks, 448 at 1x12x4096 (Triton 393). On short rows its
    per-program start (four tensor descriptors built in the kernel, the partitions) does not pay: `bench attention`
    measured it at 0.68-0.89x the Triton kernel at 197 and 1024 tokens in 7 of 8 points
    (results/attention_h200.csv at d38f058 against bc3a526's), and 1.05-1.20x at 4096 and 16384 in all 8.

    From the H200 sweeps in benchmarks/results/tune_attention_*h200.csv (bf16; `benchmarks/tune_attention.py`):
    head dim 128 with TMA runs best as 128x128 tiles, 4 warps and a warp-specialized key loop (565 TFLOP/s at
    1x24x4096, 569 at 16384; without warp specialization that tile spills, 258). Without TMA: 128-query tiles
    when the grid has at least ~8 waves of programs, else 64-query tiles fill the GPU better. Head dim 64
    prefers 64-query tiles except on short sequences (ViT's 197 tokens: 128-query tiles, 122 against 98).
    """
    if override is not None:
        return override
    if env.triton_interpret():
        # BLOCK_M = 2 · BLOCK_N as on the GPU, so the causal diagonal spans two key blocks in tests too
        return Config(32, 16, 4, 1)
    if gluon and n_q >= GLUON_MIN_QUERIES:
        return gluon_tile(head_dim)
    if dtype == torch.float32:
        # 4-byte tiles and IEEE (non-tensor-core) dots: smaller tiles to fit shared memory and registers
        return Config(64, 32, 4, 2)
    if head_dim <= 64:
        if n_q > 256:
            return Config(64, 64, 4, 3)
        # short rows: 128-query tiles, unless that leaves the grid under ~2 waves, where 64-query tiles halve each
        # program's serial work. This is the tile of the whole-model measurement (ViT-B/16 at batch 4 under
        # perception: 96 programs of 128 on 132 SMs; 0.570 ms, results/vit_h200.txt, sixth session); one call
        # timed alone favoured 128-query tiles there (10.6 against 16.0 us, results/tune_attention_small_h200.csv,
        # launch included): to be compared inside the graph
        return Config(128, 64, 4, 2) if -(-n_q // 128) * batch_heads >= SMALL_GRID else Config(64, 64, 4, 2)
    if head_dim <= 128:
        if tma and ws:
            return WS_TILE
        many = -(-n_q // 128) * batch_heads >= 1024
        return Config(128, 64, 4, 2, tma=True) if many else Config(64, 64, 4, 3)
    return Config(64, 32, 8, 2)


def gluon_tile(head_dim: int) -> Config:
    """The Gluon kernel's tile for a head dim it serves (64 or 128; see `config`)."""
    return GLUON_TILE if head_dim > 64 else Config(64, 128, 4, 2, gluon=True)


SMALL_GRID = 256  # programs of 128-query tiles below which short rows take 64-query tiles (see `config`)
GLUON_TILE = Config(128, 128, 4, 2, ws=True, gluon=True)
# Below this many queries the Triton kernel is faster (see `config`); 2048 itself lies between measured points.
GLUON_MIN_QUERIES = 2048

# Measured correct and fastest with Triton 3.6 on the H200 (results/tune_attention_ws_h200.csv). There, with
# warp specialization, num_stages=3 gave NaNs and causal masking gave wrong outputs (relative error 0.19): the
# launcher never warp-specializes a causal call, and `config` picks this tile only through `_ws_fits`.
WS_TILE = Config(128, 128, 4, 2, tma=True, ws=True)


def _ws_fits(causal: bool, n_k: int, tma_fits: bool, device: torch.device) -> bool:
    """Whether the warp-specialized tile may serve: TMA loads, not causal, whole key blocks (with a partial one
    every block takes the mask, and that measured slower than the plain kernel: 481 against 491 TFLOP/s at
    1x24x4000x128), on a GPU and Triton where it was measured."""
    if not tma_fits or causal or n_k % WS_TILE.block_n or device.type != "cuda":
        return False
    return _ws_measured(env.cuda_capability(device))


@functools.cache
def _ws_measured(capability: tuple[int, int] | None) -> bool:
    """Triton's warp specialization on Hopper was measured with Triton 3.6 only: older releases, and other GPU
    generations (whose warp specialization is a different compiler path), keep the plain loop."""
    return capability is not None and capability[0] == 9 and env.triton_at_least(3, 6)


def _tma_fits(*tensors: torch.Tensor) -> bool:
    """Whether tensor descriptors can address these [B, H, N, D] tensors: every (batch, head) base address and
    row stride 16-byte aligned, unit channel stride, on a GPU with a TMA unit (or under the interpreter)."""
    device = tensors[0].device
    if not env.triton_interpret() and (device.type != "cuda" or (env.cuda_capability(device) or (0, 0)) < (9, 0)):
        return False
    for t in tensors:
        size = t.element_size()
        if _address(t) % 16 or t.stride(-1) != 1 or any(s * size % 16 for s in t.stride()[:3]):
            return False
    return True


def _address(t: torch.Tensor) -> int:
    """The data address, or while torch.compile traces (no storage), the offset into a storage that Inductor
    allocates aligned and checks at run time."""
    try:
        return t.data_ptr()
    except RuntimeError:
        return t.storage_offset() * t.element_size()


def _on_hopper(device: torch.device) -> bool:
    return device.type == "cuda" and not env.triton_interpret() and (env.cuda_capability(device) or (0, 0))[0] == 9


def _gluon_refusal(q: torch.Tensor, scale: float, cfg: Config, tma_fits: bool, on_hopper: bool) -> str:
    """Why the Gluon variant cannot serve these inputs; "" when it can."""
    if not on_hopper:
        return "it runs on Hopper GPUs only (wgmma), not under the interpreter"
    if not env.triton_at_least(3, 6):
        return "it needs triton >= 3.6 (the Gluon API it is written against; built with 3.6 to 3.9)"
    if scale <= 0:
        return "it needs a positive scale"
    if q.shape[-1] not in (64, 128) or q.dtype not in (torch.float16, torch.bfloat16):
        return f"it needs head dim 64 or 128 in float16 or bfloat16, got {q.shape[-1]} in {q.dtype}"
    if not tma_fits:
        return "q, k, v and out need 16-byte aligned bases and row strides (TMA)"
    groups = 2 if cfg.ws else 1  # warp-specialized: two consumer partitions of num_warps each
    if cfg.block_m != 16 * cfg.num_warps * groups:
        return (
            f"BLOCK_M must be 16 · num_warps{' · 2' if cfg.ws else ''} (16 rows per warp), "
            f"got {cfg.block_m} with {cfg.num_warps} warps"
        )
    return ""


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory where the kernel writes its tensor descriptors (triton's allocator hook)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise UsageError(f"flash_attention: {name} must be [B, H, N, D], got shape {tuple(t.shape)}")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise UsageError(
            f"flash_attention: q, k and v must share one dtype of float16, bfloat16 or float32, "
            f"got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    if k.shape != v.shape:
        raise UsageError(
            f"flash_attention: k and v must have the same shape, got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    (b, hq, nq, d), (bk, hkv, nk, dk) = q.shape, k.shape
    if bk != b or dk != d:
        raise UsageError(
            f"flash_attention: k must match q's batch and head dim, got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if d > MAX_HEAD_DIM:
        raise UsageError(f"flash_attention: q's head dim D={d} exceeds this kernel's limit of {MAX_HEAD_DIM}")
    if hkv == 0 or hq % hkv:
        raise UsageError(f"flash_attention: q's {hq} heads must be a multiple of k's and v's {hkv} heads")
    if causal and nq != nk:
        raise UsageError(f"flash_attention: causal needs as many queries as keys, got q with {nq}, k with {nk}")
    if b * hq > _MAX_GRID_Y:
        raise UsageError(f"flash_attention: q's batch · heads = {b * hq} exceeds the kernel's grid limit {_MAX_GRID_Y}")


def _unit_last_stride(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each tensor as it is when its last dim has unit stride (what both kernels need), else a contiguous copy."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def _out_bnhd(q: torch.Tensor) -> torch.Tensor:
    """The output buffer [B, H, N, D], stored [B, N, H, D] in memory as SDPA's flash and cuDNN kernels return it
    for a fused QKV projection's views: the caller's transpose back to [B, N, H·D] is then a view, not a copy
    (ViT-B/16 at batch 4 on the H200: 11 copy kernels per forward with a contiguous output). One fixed order,
    not q's: under torch.compile the real q may be laid out otherwise than the traced one, and the fake must
    state the real strides. The kernels take the output's strides."""
    b, h, n, d = q.shape
    return torch.empty(b, n, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)


def _fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    return _out_bnhd(q)


@kernel_op("flash_attention", fake=_fake)
def flash_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """softmax(q kᵀ · scale) v for q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D]; out is [B, Hq, Nq, D] stored as
    [B, Nq, Hq, D] (`_out_bnhd`).

    Any strides are used in place as long as the last dim has unit stride; otherwise that input is copied.
    """
    _check(q, k, v, causal)
    q, k, v = _unit_last_stride(q, k, v)
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    out = _out_bnhd(q)
    if out.numel() == 0:
        return out
    if nk == 0:
        return out.zero_()  # an empty sum of values, as torch's matmul of empty operands gives
    kernel = _flash_attention_fwd_kernel()  # first, so a missing triton raises its clear error
    import triton

    tma_fits = _tma_fits(q, k, v, out)
    on_hopper = _on_hopper(q.device)
    gluon = not _gluon_refusal(q, scale, gluon_tile(d), tma_fits, on_hopper)
    cfg = config(d, q.dtype, nq, b * hq, tma_fits, _ws_fits(causal, nk, tma_fits, q.device), gluon)
    if cfg.gluon:
        reason = _gluon_refusal(q, scale, cfg, tma_fits, on_hopper)
        if reason:
            raise UsageError(f"flash_attention: the Gluon variant cannot serve these inputs: {reason}")
        if any(type(t) is not torch.Tensor for t in (q, k, v)):
            # traced (torch.compile, export): Inductor cannot build Gluon kernels, so the graph calls an opaque op
            return torch.ops.fullgraph.flash_attention_gluon(q, k, v, causal, scale, list(cfg))
        return _launch_gluon(q, k, v, out, causal, scale, cfg)
    tma = cfg.tma and tma_fits
    if tma and not env.triton_interpret():
        triton.set_allocator(_scratch)
    grid = (triton.cdiv(nq, cfg.block_m), b * hq)
    launch(kernel)[grid](
        q, k, v, out,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        hq, hq // hkv, nq, nk, scale * _LOG2E,
        CAUSAL=causal, NEG_SCALE=scale < 0, HEAD_DIM=d,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
        # fp32 inputs: exact fp32 products rather than TF32's 10-bit mantissa (slower: no tensor cores)
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", USE_TMA=tma,
        WARP_SPECIALIZE=tma and cfg.ws and not causal, MASKED_TAIL=causal or nk % cfg.block_n != 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out


def launch_direct(kernel):
    """A kernel torch never traces (Gluon), launched as it is; tests/kernels/ttir_check.py records it instead."""
    return kernel


def _launch_gluon(q, k, v, out, causal: bool, scale: float, cfg: Config) -> torch.Tensor:
    """Run the Gluon kernel (always directly: torch never traces it, see `flash_attention_gluon`)."""
    import triton

    (b, hq, nq, d), hkv, nk = q.shape, k.shape[1], k.shape[2]
    triton.set_allocator(_scratch)
    launch_direct(_gluon_kernel())[(triton.cdiv(nq, cfg.block_m), b * hq)](
        q, k, v, out, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        hq, hq // hkv, nq, nk, scale * _LOG2E,
        CAUSAL=causal, HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages,
        WS=bool(cfg.ws), num_warps=cfg.num_warps,
    )  # fmt: skip
    return out


@torch.library.custom_op("fullgraph::flash_attention_gluon", mutates_args=())
def flash_attention_gluon(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, cfg: list[int]
) -> torch.Tensor:
    """The Gluon kernel as an opaque op: what a traced `flash_attention` records when its configuration is
    Gluon (Inductor builds only plain Triton kernels). `cfg` is the Config chosen at trace time; inputs that
    turn out unservable at run time (a misaligned view) take the Triton kernel instead."""
    q, k, v = _unit_last_stride(q, k, v)
    out = _out_bnhd(q)
    chosen = Config(*cfg)
    if _gluon_refusal(q, scale, chosen, _tma_fits(q, k, v, out), _on_hopper(q.device)):
        return flash_attention_fwd.launcher(q, k, v, causal, scale)
    return _launch_gluon(q, k, v, out, causal, scale, chosen)


flash_attention_gluon.register_fake(lambda q, k, v, causal, scale, cfg: _fake(q, k, v, causal, scale))
