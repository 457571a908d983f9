"""The two ceilings every speed figure is compared with: memory bandwidth and matrix-multiply rate.

Measured, not taken from a datasheet: a large device-to-device copy (bytes read plus bytes written) and a
large GEMM on random data (zeros run faster than real data on some GPUs), in the dtype asked for.

`ceilings_for` measures them once per GPU and dtype and keeps them in `$FULLGRAPH_CACHE_DIR/ceilings.json`
(default `~/.cache/fullgraph`), so a breakdown or a doctor run does not spend seconds on them every time.
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
    """Measure copy bandwidth and GEMM rate on `device` (defaults sized for an H200-class GPU, or a CPU)."""
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
        copy_tbps=tbps(moved, copy_t.median_ms),
        gemm_n=gemm_n,
        gemm_dtype=str(gemm_dtype).removeprefix("torch."),
        gemm_timing=gemm_t,
        gemm_tflops=tflops(gemm_flops(gemm_n, gemm_n, gemm_n), gemm_t.median_ms),
    )


def time_copy(words: int, device: torch.device, reps: int) -> Timing:
    src = torch.randn(words, device=device)  # float32, random so nothing is special-cased
    dst = torch.empty_like(src)
    return measure(lambda: dst.copy_(src), device=device, warmup=5, reps=reps)


def _time_gemm(n: int, dtype: torch.dtype, device: torch.device, reps: int) -> Timing:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return measure(lambda: torch.mm(a, b), device=device, warmup=5, reps=reps)


# ---- measured once per GPU and dtype, kept on disk -------------------------------------------------------

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
    """{"copy_tbps": ..., "gemm_tflops_<tag>": ...} for this GPU and dtype (bf16 if None), one GEMM ceiling per
    math mode the model's GEMMs and convolutions run in (float32: "fp32" and/or "tf32", `dtype_tag` and
    `conv_dtype_tag`), each measured in that mode; {} on the CPU.

    Measured on the first call for a GPU name and math mode, then read from the cache file.
    """
    device = resolve_device(device)
    if device.type != "cuda":
        return {}
    dtype = dtype or torch.bfloat16
    out: dict[str, float] = {}
    for tag in dict.fromkeys((dtype_tag(dtype), conv_dtype_tag(dtype))):

        def measure_now(tag: str = tag) -> dict[str, float]:
            with _matmul_mode(tag):
                c = measure_ceilings(device, gemm_dtype=dtype, reps=20)
            return {"copy_tbps": round(c.copy_tbps, 3), f"gemm_tflops_{tag}": round(c.gemm_tflops, 1)}

        out |= cached_ceilings(f"{torch.cuda.get_device_name(device)}|{tag}", measure_now)
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
