"""Capability probes: the one place that asks what this machine can do.

Kernels, tests and the CLI all ask here, so "can a Triton kernel run?" has one answer. Cheap probes
(imports, device properties) are cached; the probes that run real work (a Triton kernel, an SDPA call per
backend) run only when asked, from `collect()` or a caller that needs them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import platform
import re
import warnings
from dataclasses import asdict, dataclass, field

import torch

from fullgraph._version import __version__
from fullgraph.errors import UsageError

# Triton's own CUDA backend targets compute capability 8.0 and newer as its first-class path; older
# chips miss bf16 and parts of the language we use.
MIN_TRITON_CAPABILITY = (8, 0)
_TRUE = {"1", "true", "yes", "on"}


@functools.cache
def has_triton() -> bool:
    """True if `import triton` works (the package is installed and loads)."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # a broken install raises anything from ImportError to RuntimeError
        return False
    return True


def triton_version() -> str | None:
    if not has_triton():
        return None
    import triton

    return triton.__version__


def triton_at_least(major: int, minor: int) -> bool:
    """Whether triton is importable at version major.minor or later."""
    parts = (triton_version() or "0.0").split(".")[:2]
    return tuple(int(re.match(r"\d*", p).group() or 0) for p in parts) >= (major, minor)


def has_cuda() -> bool:
    """True if torch sees at least one CUDA device."""
    return torch.cuda.is_available()


def cuda_capability(device: int | str | torch.device | None = None) -> tuple[int, int] | None:
    """Compute capability of a CUDA device, e.g. (9, 0) for an H100/H200; None without CUDA."""
    if not has_cuda():
        return None
    return torch.cuda.get_device_capability(device)


def triton_interpret() -> bool:
    """True if TRITON_INTERPRET is set: Triton kernels built from now on run on the CPU, in the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


def triton_runs_on(device: torch.device | str) -> tuple[bool, str]:
    """Can a Triton kernel run on tensors of `device`? Returns (yes, why) without launching anything."""
    device = torch.device(device)
    if not has_triton():
        return False, "triton is not importable (pip install 'fullgraph[triton]')"
    if device.type == "cpu":
        if triton_interpret():
            return True, "TRITON_INTERPRET=1: kernels run in Triton's CPU interpreter (slow, for testing)"
        return False, "CPU tensors need TRITON_INTERPRET=1 (Triton's interpreter, for testing)"
    if device.type != "cuda":
        return False, f"no Triton backend for device type {device.type!r}"
    if not has_cuda():
        return False, "torch sees no CUDA device"
    if triton_interpret():
        return False, "TRITON_INTERPRET=1 is set, so kernels are built for the CPU interpreter; unset it for CUDA"
    cap = cuda_capability(device)
    if cap < MIN_TRITON_CAPABILITY:
        return False, f"compute capability {cap[0]}.{cap[1]} is below {MIN_TRITON_CAPABILITY[0]}.0"
    return True, f"CUDA, compute capability {cap[0]}.{cap[1]}"


def inductor_cache_dir() -> str:
    """Where Inductor keeps compiled artifacts (TORCHINDUCTOR_CACHE_DIR, or torch's default)."""
    try:  # torch >= 2.6
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # older layout
        from torch._inductor.runtime.runtime_utils import cache_dir
    return cache_dir()


def git_commit(path: str | None = None) -> str | None:
    """Short commit of the checkout fullgraph runs from (results are tagged with it); FULLGRAPH_COMMIT names
    it where the tree was copied without its .git folder."""
    import subprocess

    if os.environ.get("FULLGRAPH_COMMIT"):
        return os.environ["FULLGRAPH_COMMIT"]
    here = path or os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def first_line(e: BaseException, limit: int = 200) -> str:
    """`TypeName: first line of the message`, for one-line reports of a failure."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:limit]}" if lines else type(e).__name__


@dataclass(frozen=True)
class Probe:
    """One capability that was tried for real: its name, whether it worked, and why not (or how)."""

    name: str
    ok: bool
    detail: str = ""


@contextlib.contextmanager
def interpreter(enabled: bool = True):
    """Set TRITON_INTERPRET for the kernels built and launched inside the block.

    Enough for a simple kernel (the probe). Kernels that call Triton's library functions (`tl.sum`) need the
    variable set before triton is first imported: set it in the environment when the process starts.
    """
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if enabled else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def probe_triton(device: torch.device | str) -> Probe:
    """Build and launch a tiny Triton kernel on `device` and check its result.

    For "cpu" the kernel is built for Triton's interpreter whatever TRITON_INTERPRET says, so the answer is
    "could kernels run here under TRITON_INTERPRET=1".
    """
    device = torch.device(device)
    name = "triton-interpreter" if device.type == "cpu" else f"triton-{device.type}"
    already_set = triton_interpret()
    with interpreter(device.type == "cpu"):  # the interpreter reads the variable at build and at launch
        ok, why = triton_runs_on(device)
        if not ok:
            return Probe(name, False, why)
        import triton
        import triton.language as tl

        @triton.jit
        def _probe_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2 + 1, mask=mask)

        x = torch.randn(100, device=device)
        y = torch.empty_like(x)
        try:
            _probe_kernel[(triton.cdiv(100, 64),)](x, y, 100, BLOCK=64)
        except Exception as e:  # compiler or driver failures surface as many types
            return Probe(name, False, f"kernel launch failed: {first_line(e)}")
    if not torch.allclose(y, x * 2 + 1):
        return Probe(name, False, "kernel ran but returned a wrong result")
    if device.type == "cpu" and not already_set:
        why = "works; set TRITON_INTERPRET=1 to run kernels on CPU tensors (slow, for testing)"
    return Probe(name, True, why)


SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
# Third-party attention packages: (backend name, import name). Installed means importable; the attention
# op (a later layer) decides per input whether one can serve.
EXTERNAL_ATTENTION = (
    ("flash_attn", "flash_attn"),
    ("flash_attn_3", "flash_attn_interface"),
    ("sageattention", "sageattention"),
)


# SDPA sub-backend -> (its flag's getter, setter) in torch.backends.cuda (which govern CPU calls too)
_SDPA_FLAGS = {
    "flash": ("flash_sdp_enabled", "enable_flash_sdp"),
    "efficient": ("mem_efficient_sdp_enabled", "enable_mem_efficient_sdp"),
    "cudnn": ("cudnn_sdp_enabled", "enable_cudnn_sdp"),
    "math": ("math_sdp_enabled", "enable_math_sdp"),
}


class only_sdpa:
    """Within it, SDPA may use only the sub-backend `name` ("flash", "efficient", "cudnn", "math"); the flags
    are restored on exit. `torch.nn.attention.sdpa_kernel` does the same through a generator context manager
    and costs ~12 µs of host time per use here, against ~2 µs: it runs on every eager attention call. (It
    also turns off the OVERRIDEABLE backend, which serves only out-of-tree device types, not CUDA or CPU.)"""

    __slots__ = ("name", "saved")

    def __init__(self, name: str):
        if name not in _SDPA_FLAGS:
            raise UsageError(f"unknown SDPA sub-backend {name!r}; use one of {', '.join(_SDPA_FLAGS)}")
        self.name = name

    def __enter__(self) -> None:
        flags = torch.backends.cuda
        self.saved = {n: getattr(flags, get)() for n, (get, _) in _SDPA_FLAGS.items()}
        for n, (_, set_) in _SDPA_FLAGS.items():
            getattr(flags, set_)(n == self.name)

    def __exit__(self, *exc) -> None:
        for n, (_, set_) in _SDPA_FLAGS.items():
            getattr(torch.backends.cuda, set_)(self.saved[n])


# The call every attention probe makes, [batch, heads, seq, head dim], in `probe_dtype`: `fullgraph env` asks
# the attention dispatch about the same call, so its "runs here" and the probes answer one question.
PROBE_SHAPE = (1, 2, 64, 64)


def probe_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype attention is probed in on `device`: bf16 on a GPU (what fused kernels serve), else float32."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def probe_sdpa(backend: str, device: torch.device | str) -> Probe:
    """Run one small SDPA call with only `backend` allowed; usable means it ran and matched math."""
    device = torch.device(device)
    dtype = probe_dtype(device)
    q, k, v = (torch.randn(*PROBE_SHAPE, device=device, dtype=dtype) for _ in range(3))
    name = f"sdpa-{backend}"
    call = f"{str(dtype).removeprefix('torch.')} head dim {PROBE_SHAPE[3]} on {device.type}"
    try:
        with only_sdpa(backend), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    except RuntimeError:  # torch explains why in warnings; the one-line answer is what matters here
        return Probe(name, False, f"no kernel for {call}")
    scale = PROBE_SHAPE[3] ** -0.5
    ref = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * scale, dim=-1) @ v.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if not err < 2e-2:
        return Probe(name, False, f"ran but relative error {err:.2e} against float64")
    return Probe(name, True, f"ran and matched float64 ({call})")


def probe_attention(device: torch.device | str) -> list[Probe]:
    """One real call per SDPA sub-backend. Whether a backend is installed, and whether the attention dispatch
    would use it here, is the dispatch's to say (`fullgraph.ops.attention_backends`); `fullgraph env` shows
    both answers side by side with these probes."""
    return [probe_sdpa(b, device) for b in SDPA_BACKENDS]


@dataclass(frozen=True)
class EnvReport:
    """What `fullgraph env` prints. Every field is JSON-serializable; None means "not present"."""

    fullgraph: str
    python: str
    platform: str
    torch: str
    torch_cuda: str | None  # the CUDA version torch was built with
    triton: str | None  # None when triton does not import
    cuda_available: bool
    gpu: str | None
    gpu_capability: str | None  # "9.0"
    gpu_count: int
    gpu_memory_gib: float | None
    driver: str | None
    triton_gpu: Probe  # a kernel built and run on the GPU
    triton_interpreter: Probe  # a kernel run by Triton's CPU interpreter (what CI tests with)
    triton_interpret: bool  # TRITON_INTERPRET is set in this process
    inductor_cache_dir: str
    git_commit: str | None
    attention_device: str
    attention: list[Probe] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _driver_version() -> str | None:
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def collect(probe: bool = True) -> EnvReport:
    """Gather the environment report; with `probe`, launch a Triton kernel and SDPA on each backend."""
    cuda = has_cuda()
    props = torch.cuda.get_device_properties(0) if cuda else None
    device = "cuda" if cuda else "cpu"
    if probe:
        gpu_probe = probe_triton("cuda") if cuda else Probe("triton-cuda", False, "torch sees no CUDA device")
        cpu_probe = probe_triton("cpu")
    else:
        gpu_probe = Probe("triton-cuda", *triton_runs_on("cuda"))
        with interpreter():
            cpu_probe = Probe("triton-interpreter", *triton_runs_on("cpu"))
    return EnvReport(
        fullgraph=__version__,
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        triton=triton_version(),
        cuda_available=cuda,
        gpu=props.name if props else None,
        gpu_capability=f"{props.major}.{props.minor}" if props else None,
        gpu_count=torch.cuda.device_count() if cuda else 0,
        gpu_memory_gib=round(props.total_memory / 2**30, 1) if props else None,
        driver=_driver_version() if cuda else None,
        triton_gpu=gpu_probe,
        triton_interpreter=cpu_probe,
        triton_interpret=triton_interpret(),
        inductor_cache_dir=inductor_cache_dir(),
        git_commit=git_commit(),
        attention_device=device,
        attention=probe_attention(device) if probe else [],
    )
