"""The ceilings every speed figure is compared with: memory bandwidth (from memory and from L2) and matrix-multiply
rate.

Measured, not taken from a datasheet: a large device-to-device copy (bytes read plus bytes written) and a
large GEMM on random data (zeros run faster than real data on some GPUs), in the dtype asked for.

`ceilings_for` measures them once per GPU (memory) and math mode (GEMMs) and keeps them in
`$FULLGRAPH_CACHE_DIR/ceilings.json` (default `~/.cache/fullgraph`), so a breakdown or a doctor run does not spend
seconds on them every time. A ceiling is the best the GPU reached, not its median: the fastest of the copies, and
the fastest GEMM of `GEMM_SIZES` (on an H100 the largest GEMM runs below a mid-sized one's rate as its clocks drop).
Beside the copy from memory, a copy whose source and destination fit in L2 together gives the rate of work that
L2 serves (an eager elementwise op reading what the op before it just wrote): a breakdown judges each op's bytes,
up to the L2's size, against that one (`bench.breakdown`). Measure on a GPU nothing else uses: a ceiling measured
beside another process is low, and every rate above it reads as a bug.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from fullgraph import env
from fullgraph._files import write_atomic
from fullgraph.bench.profile_events import duration_us
from fullgraph.bench.roofline import gemm_flops, tbps, tflops
from fullgraph.timing import Timing, measure, resolve_device


@dataclass(frozen=True)
class Ceilings:
    device: str
    copy_bytes: int  # size of the copied buffer; bytes moved per copy is twice this
    copy_timing: Timing
    copy_tbps: float
    gemm_n: int
    gemm_dtype: str
    gemm_timing: Timing
    gemm_tflops: float


def measure_ceilings(
    device: str | torch.device | None = None,
    copy_bytes: int | None = None,
    gemm_n: int | None = None,
    gemm_dtype: torch.dtype | None = None,
    reps: int = 30,
) -> Ceilings:
    """Measure copy bandwidth and GEMM rate on `device` (defaults sized for an H200-class GPU, or a CPU). The rates
    are the best reached (the fastest repetition), as `ceilings_for`'s; the timings hold the spread."""
    device = resolve_device(device)
    gpu = device.type == "cuda"
    copy_bytes = copy_bytes or (2 << 30 if gpu else 64 << 20)
    gemm_n = gemm_n or (8192 if gpu else 1024)
    gemm_dtype = gemm_dtype or (torch.bfloat16 if gpu else torch.float32)

    words = copy_bytes // 4
    copy_t = time_copy(words, device, reps)
    moved = 2 * words * 4
    gemm_t = _time_gemm(gemm_n, gemm_dtype, device, reps)
    return Ceilings(
        device=device.type,
        copy_bytes=moved // 2,
        copy_timing=copy_t,
        copy_tbps=tbps(moved, copy_t.min_ms),
        gemm_n=gemm_n,
        gemm_dtype=str(gemm_dtype).removeprefix("torch."),
        gemm_timing=gemm_t,
        gemm_tflops=tflops(gemm_flops(gemm_n, gemm_n, gemm_n), gemm_t.min_ms),
    )


def time_copy(words: int, device: torch.device, reps: int) -> Timing:
    src = torch.randn(words, device=device)  # float32, random so nothing is special-cased
    dst = torch.empty_like(src)
    return measure(lambda: dst.copy_(src), device=device, warmup=5, reps=reps)


def _time_gemm(n: int, dtype: torch.dtype, device: torch.device, reps: int) -> Timing:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return measure(lambda: torch.mm(a, b), device=device, warmup=5, reps=reps)


# ---- the doctor's ceilings: the best rates, measured once per GPU and math mode, kept on disk ---------------

GEMM_SIZES = (4096, 8192)
CACHE_VERSION = 2  # in each key: version 1 kept median copies and one GEMM size, per math mode


def _best_copy_tbps(device: torch.device, copy_bytes: int, reps: int) -> float:
    words = copy_bytes // 4
    return tbps(2 * words * 4, time_copy(words, device, reps).min_ms)


def l2_copy_tbps(device: torch.device, reps: int = 40) -> tuple[int, float]:
    """(the L2's size in bytes, the best TB/s of a copy whose source and destination together fill a quarter of
    it), timed by the profiler's kernel durations: the clock a breakdown's rates are read from (a copy this small
    lasts a few microseconds, less than the gaps between launches that CUDA events would count). (0, 0.0) where
    the GPU does not say its L2's size."""
    size = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    if size <= 0:
        return 0, 0.0
    words = size // 8 // 4  # source and destination: a quarter of the L2 together
    src = torch.randn(words, device=device)
    dst = torch.empty_like(src)
    for _ in range(5):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                dst.copy_(src)
            torch.cuda.synchronize(device)
    except RuntimeError:  # a profiler of the caller's is running: no L2 figure, memory's judges every byte
        return size, 0.0
    cuda = torch.autograd.DeviceType.CUDA
    durs = [d for k in prof.profiler.kineto_results.events() if k.device_type() == cuda and (d := duration_us(k)) > 0]
    return (size, tbps(2 * words * 4, min(durs) / 1e3)) if durs else (size, 0.0)


def memory_ceilings(device: torch.device, copy_bytes: int = 2 << 30, reps: int = 20) -> dict[str, float]:
    """{"copy_tbps", "l2_tbps", "l2_bytes"}: the best copy from memory, and from L2 (never below the first)."""
    hbm = _best_copy_tbps(device, copy_bytes, reps)
    l2_bytes, l2 = l2_copy_tbps(device)
    out = {"copy_tbps": round(hbm, 3)}
    return out | ({"l2_tbps": round(max(l2, hbm), 3), "l2_bytes": l2_bytes} if l2_bytes and l2 > 0 else {})


def best_gemm_tflops(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...] = GEMM_SIZES, reps: int = 20):
    """The best TFLOP/s of square GEMMs of `sizes` in `dtype` (the fastest repetition of each)."""
    return max(tflops(gemm_flops(n, n, n), _time_gemm(n, dtype, device, reps).min_ms) for n in sizes)


SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}
_memory: dict[tuple[str, str], dict[str, float]] = {}  # (file, key) -> ceilings, this process


def cache_path() -> str:
    root = os.environ.get("FULLGRAPH_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "fullgraph")
    return os.path.join(root, "ceilings.json")


def dtype_tag(dtype: torch.dtype) -> str:
    """The math mode GEMMs (matmul, linear) run in: "bf16", "fp16", "fp32"; "tf32" for float32 while the matmul
    precision lets them use TF32 (a different GEMM ceiling)."""
    tag = SHORT_DTYPES.get(str(dtype).removeprefix("torch."), str(dtype).removeprefix("torch."))
    return "tf32" if tag == "fp32" and torch.get_float32_matmul_precision() != "highest" else tag


def conv_dtype_tag(dtype: torch.dtype) -> str:
    """The math mode convolutions run in: cuDNN follows its own flag, `torch.backends.cudnn.allow_tf32` (on by
    default), not the matmul precision, so a float32 convolution is "tf32" unless that flag is off."""
    tag = SHORT_DTYPES.get(str(dtype).removeprefix("torch."), str(dtype).removeprefix("torch."))
    return "tf32" if tag == "fp32" and torch.backends.cudnn.allow_tf32 else tag


@contextlib.contextmanager
def _matmul_mode(tag: str) -> Iterator[None]:
    """Float32 matmuls in `tag`'s mode ("tf32" or "fp32") inside the block, restored on exit; other tags: as is."""
    before = torch.get_float32_matmul_precision()
    if tag in ("tf32", "fp32"):
        torch.set_float32_matmul_precision("high" if tag == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def ceilings_for(device: str | torch.device | None, dtype: torch.dtype | None = None) -> dict[str, float]:
    """{"copy_tbps", "l2_tbps", "l2_bytes", "gemm_tflops_<tag>": ...} for this GPU and dtype (bf16 if None): the
    memory ceilings (`memory_ceilings`), and one GEMM ceiling per math mode the model's GEMMs and convolutions run
    in (float32: "fp32" and/or "tf32", `dtype_tag` and `conv_dtype_tag`), each measured in that mode; {} on the CPU.

    Measured on the first call for a GPU name (memory) and math mode (GEMMs), then read from the cache file.
    """
    device = resolve_device(device)
    if device.type != "cuda":
        return {}
    dtype = dtype or torch.bfloat16
    name = f"{torch.cuda.get_device_name(device)}|v{CACHE_VERSION}"
    out = cached_ceilings(f"{name}|memory", lambda: memory_ceilings(device))
    for tag in dict.fromkeys((dtype_tag(dtype), conv_dtype_tag(dtype))):

        def measure_now(tag: str = tag) -> dict[str, float]:
            with _matmul_mode(tag):
                return {f"gemm_tflops_{tag}": round(best_gemm_tflops(device, dtype), 1)}

        out |= cached_ceilings(f"{name}|{tag}", measure_now)
    return out


def cached_ceilings(key: str, measure_now: Callable[[], dict[str, float]], path: str | None = None) -> dict[str, float]:
    """The ceilings saved under `key` at `path` (default `cache_path()`), else `measure_now()`, saved there."""
    path = path or cache_path()
    if (path, key) in _memory:
        return dict(_memory[path, key])
    saved = _load(path)
    if key not in saved:
        saved[key] = measure_now()
        write_atomic(path, json.dumps({"version": 1, "ceilings": saved}, indent=1, sort_keys=True))
    _memory[path, key] = saved[key]
    return dict(saved[key])


def _load(path: str) -> dict[str, dict[str, float]]:
    try:
        with open(path) as f:
            data = json.load(f)["ceilings"]
        if not all(isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values()) for v in data.values()):
            raise ValueError("each entry must map names to numbers")
        return data
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        warnings.warn(f"ignoring the ceilings cache {path}: {env.first_line(e)}", stacklevel=3)
        return {}
