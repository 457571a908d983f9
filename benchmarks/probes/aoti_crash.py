"""Why does an AOTInductor package segfault when a fresh process loads it (H200 image, torch 2.11)? One batch run.

Builds a 3-layer fp32 MLP package on the device (and variants: `aot_inductor.package_cpp_only`,
`embed_kernel_binary`, `embed_cubin`, constants outside the .so, each only where the installed torch has that
config), then runs each experiment in its own fresh child process (`python -X faulthandler`, with a timeout),
and prints one line per experiment: `experiment | exit code / signal | seconds | last line`.

  i   versions: torch, CUDA, triton, driver, the C++ compiler Inductor uses, the compiler that built wrapper.so
  c   load in the same process that built the package
  a   aoti_load_package in a fresh process (the crash on the H200), and per variant package
  b   the same after torch.cuda.init() and a CUDA op
  d   the loader class directly (AOTIModelPackageLoader, its signature read at run time), its metadata reader
      alone, single-threaded, and the model-container runner on the extracted wrapper.so (no package loader)
  e   ctypes dlopen of the extracted wrapper.so alone (without and with torch imported), then the C ABI's
      AOTInductorModelContainerCreateWithDevice: does dlopen crash, or only creating the model?
  f   ldd of wrapper.so against the libraries the process has mapped (/proc/self/maps): mismatches
  g   LD_DEBUG=bindings,symbols on the fresh load, last 40 loader lines kept (the last symbol bound)
  h   environment variants: AOTI_RUNTIME_CHECK_INPUTS=1, device_index=0, LD_BIND_NOW=1,
      CUDA_MODULE_LOADING=EAGER, TMPDIR in the output folder
  bt  the fresh load with a SIGSEGV handler that prints the native stack (glibc backtrace, LD_PRELOAD; built
      with the C compiler Inductor needs anyway), symbolized from the libraries' ELF symbol tables; gdb if present
  k   the other warm start: fullgraph.deploy.precompile (Dynamo aot_compile) saved, then loaded in a fresh
      process with an empty Inductor cache

Writes DIR/aoti_crash.json (rows, each child's output tail, versions, ELF facts) after every row, each child's
output to DIR/logs/, the native stack to DIR/native_backtrace.txt and the loader's last lines to
DIR/ld_debug_tail.txt; packages and caches go to a temporary folder (--work-dir to choose it). The run keeps
to --budget seconds: what would start past it is listed as skipped.
On a CPU (--device cpu) every experiment is expected to pass: that is the control.

Run: PYTHONPATH=src python benchmarks/probes/aoti_crash.py --out DIR [--device cuda] [--budget 420] [--only a,e]
  [--selftest]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import functools
import itertools
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict
from pathlib import Path

from fullgraph.deploy import _elf

ROOT = Path(__file__).resolve().parents[2]  # benchmarks/probes/ -> the repository
MODEL_DIMS = (64, 256, 256, 10)
BATCH = 8
VARIANTS = {  # name -> Inductor configs; a config the installed torch lacks is skipped with a note
    "base": {},
    # the fix (fullgraph.deploy.build.LIBSTDCXX): wrapper.so asks for libstdc++.so.6 by its file name; `-lstdc++`
    # linked the archive again on the H200 image, whose g++ searches a folder holding libstdc++.a alone first
    "linked": {"aot_inductor.custom_op_libs": [":libstdc++.so.6"]},
    "cpp_only": {"aot_inductor.package_cpp_only": True},
    "embed_kernel_binary": {"aot_inductor.embed_kernel_binary": True},
    "embed_cubin": {"aot_inductor.embed_cubin": True},
    "consts_outside_so": {"aot_inductor.package_constants_in_so": False},
}
LIB_PREFIXES = ("libtorch", "libc10", "libcudart", "libcuda.", "libstdc++", "libgcc_s", "libgomp", "libnv", "libcu")


# ==== the child side: each experiment runs here, in a fresh interpreter =========================================


def step(msg: str) -> None:
    """A progress marker: the last one printed says how far a child that died got."""
    print(f"STEP {msg}", flush=True)


def result(summary: str, **data) -> None:
    print("RESULT " + json.dumps({"summary": summary, **data}, default=str), flush=True)


def _mlp(device: str):
    import torch

    torch.manual_seed(0)
    dims = MODEL_DIMS
    layers = []
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).eval().to(device)
    x = torch.randn(BATCH, dims[0]).to(device)
    return model, x


def _err(out, work: str) -> float:
    import torch

    ref = torch.load(os.path.join(work, "ref.pt"))
    first = out[0] if isinstance(out, (list, tuple)) else out
    return (first.detach().float().cpu() - ref["y"]).abs().max().item()


def _input(work: str, device: str):
    import torch

    return torch.load(os.path.join(work, "ref.pt"))["x"].to(device)


def _maps() -> dict[str, set[str]]:
    """Shared libraries mapped in this process: file name -> real paths."""
    found: dict[str, set[str]] = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and ".so" in parts[5]:
                path = parts[5].strip()
                found.setdefault(os.path.basename(path), set()).add(os.path.realpath(path))
    return found


def _cuda_init(device: str) -> str:
    import torch

    if device != "cuda":
        return "no CUDA init (cpu)"
    torch.cuda.init()
    (torch.ones(4, device="cuda") * 2).sum().item()
    torch.cuda.synchronize()
    return f"CUDA initialised on {torch.cuda.get_device_name(0)}"


def child_versions(a) -> None:
    import platform

    import torch

    info = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "torch_cuda": torch.version.cuda,
        "cxx11_abi": getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None),
        "glibc": " ".join(platform.libc_ver()),
        "cuda_available": torch.cuda.is_available(),
        "torch_lib": os.path.join(os.path.dirname(torch.__file__), "lib"),
        "cmake_prefix_path": getattr(torch.utils, "cmake_prefix_path", None),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as e:  # a broken triton is a fact to report
        info["triton"] = f"not importable: {type(e).__name__}: {e}"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    info["driver"] = _driver_version()
    try:
        from torch._inductor import config as ic

        info["aot_inductor_configs"] = sorted(k for k in ic.get_config_copy() if k.startswith("aot_inductor."))
        from torch._inductor.cpp_builder import get_cpp_compiler

        cxx = get_cpp_compiler()
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        info["inductor_cxx"] = f"{cxx}: {(done.stdout or done.stderr).splitlines()[0]}"
    except Exception as e:  # no compiler found is a fact to report
        info["inductor_cxx"] = f"unknown ({type(e).__name__}: {e})"
    libs = _maps()
    info["process_libs"] = {k: sorted(v) for k, v in libs.items() if k.startswith(LIB_PREFIXES)}
    summary = (
        f"torch {info['torch']} (CUDA {info['torch_cuda']}), triton {info['triton']}, driver {info['driver']}, "
        f"python {info['python']}, {info['inductor_cxx']}"
    )
    result(summary, info=info)


def _driver_version() -> str:
    """The CUDA driver's version: from libcuda itself (cuDriverGetVersion), else nvidia-smi, else "none"."""
    import ctypes

    parts = []
    with contextlib.suppress(OSError, AttributeError):
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            parts.append(f"CUDA {v.value // 1000}.{v.value % 1000 // 10}")
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            q = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            out = subprocess.run(q, capture_output=True, text=True, timeout=30).stdout.strip()
            if out:
                parts.append(f"nvidia {out.splitlines()[0]}")
    return ", ".join(parts) or "none (no libcuda.so.1, no nvidia-smi)"


def child_build(a) -> None:
    import torch

    configs = json.loads(a.config)
    known = set(torch._inductor.config.get_config_copy())
    missing = [k for k in configs if k not in known]
    if missing:
        result(f"skipped: this torch has no {', '.join(missing)}", skipped=True)
        return
    model, x = _mlp(a.device)
    with torch.no_grad():
        y = model(x)
    if a.same_process:  # the reference every other child compares with
        torch.save({"x": x.cpu(), "y": y.cpu()}, os.path.join(a.work, "ref.pt"))
    start = time.perf_counter()
    program = torch.export.export(model, (x,))
    step("exported")
    built = torch._inductor.aoti_compile_and_package(program, package_path=a.pkg, inductor_configs=configs)
    build_s = time.perf_counter() - start
    step(f"BUILT {built} in {build_s:.1f} s")
    if not a.same_process:
        result(f"built in {build_s:.1f} s", build_s=build_s)
        return
    step("c: loading in the process that built it")
    start = time.perf_counter()
    loaded = torch._inductor.aoti_load_package(built)
    load_s = time.perf_counter() - start
    step("c: loaded; running")
    out = loaded(x)
    result(f"built {build_s:.1f} s; same process: loaded {load_s:.2f} s, max err {_err(out, a.work):.1e}")


def child_load(a) -> None:
    import torch

    x = _input(a.work, a.device)
    if a.cuda_first:
        step(_cuda_init(a.device))
    step(f"aoti_load_package(device_index={a.device_index})")
    start = time.perf_counter()
    if os.environ.get("AOTI_CRASH_SELFTEST") == "1":  # --selftest: a real segfault where the loader would run
        import ctypes

        ctypes.string_at(0)
    loaded = torch._inductor.aoti_load_package(a.pkg, device_index=a.device_index)
    load_s = time.perf_counter() - start
    step(f"loaded in {load_s:.2f} s")
    if a.load_constants:  # a package built with its weights outside the .so holds none: the caller supplies them
        weights = _mlp(a.device)[0].state_dict()
        fqns = loaded.get_constant_fqns() if hasattr(loaded, "get_constant_fqns") else list(weights)
        loaded.load_constants({k: weights[k] for k in fqns if k in weights}, check_full_update=True)
        step(f"load_constants: {len(fqns)} weights")
    step("running")
    out = loaded(x)
    if a.device == "cuda":
        torch.cuda.synchronize()
    result(f"loaded {load_s:.2f} s, ran, max err {_err(out, a.work):.1e}", load_s=load_s)


def _doc(obj) -> str:
    text = (getattr(obj, "__doc__", None) or "").strip()
    return " ".join(text.split())[:600]


def child_signatures(a) -> None:
    import torch

    aoti = torch._C._aoti
    found = {}
    for name in dir(aoti):
        if name.startswith("AOTI"):
            cls = getattr(aoti, name)
            found[name] = {"init": _doc(cls.__init__), "methods": [m for m in dir(cls) if not m.startswith("_")]}
    loader = found.get("AOTIModelPackageLoader", {}).get("init", "absent")
    result(f"{', '.join(found)}; AOTIModelPackageLoader {loader[:160]}", classes=found)


def child_metadata(a) -> None:
    import torch

    step("AOTIModelPackageLoader.load_metadata_from_package")
    meta = torch._C._aoti.AOTIModelPackageLoader.load_metadata_from_package(a.pkg, a.model_name)
    keys = {k: meta[k] for k in sorted(meta) if k.startswith("AOTI")}
    result(f"metadata read: {keys}", metadata=dict(meta))


def child_loader(a) -> None:
    import torch

    x = _input(a.work, a.device)
    cls = torch._C._aoti.AOTIModelPackageLoader
    step(f"__init__: {_doc(cls.__init__)[:200]}")
    tries = [
        (a.pkg, a.model_name, a.single_threaded, 1, a.device_index),
        (a.pkg, a.model_name, a.single_threaded, 1),
        (a.pkg, a.model_name),
    ]
    loader, used, errors = None, None, []
    for args in tries:
        step(f"AOTIModelPackageLoader{args[1:]}")
        try:
            loader = cls(*args)
            used = args[1:]
            break
        except TypeError as e:  # another signature: try the next form
            errors.append(str(e).splitlines()[0])
    if loader is None:
        raise RuntimeError(f"no constructor form fits: {errors}")
    step("constructed; running through boxed_run")
    out = loader.boxed_run([x]) if hasattr(loader, "boxed_run") else loader.run([x])
    result(f"constructed with {used}; ran, max err {_err(out, a.work):.1e}", signature_errors=errors)


def child_runner(a) -> None:
    import torch

    x = _input(a.work, a.device)
    aoti = torch._C._aoti
    if a.device == "cuda":
        cls = getattr(aoti, "AOTIModelContainerRunnerCuda", None)
        if cls is None:
            raise RuntimeError("torch._C._aoti has no AOTIModelContainerRunnerCuda")
        tries = [(a.so, 1, "cuda", a.cubin_dir), (a.so, 1, "cuda"), (a.so, 1)]
    else:
        cls = aoti.AOTIModelContainerRunnerCpu
        tries = [(a.so, 1)]
    step(f"{cls.__name__}.__init__: {_doc(cls.__init__)[:200]}")
    runner, errors = None, []
    for args in tries:
        step(f"{cls.__name__}{args[1:]}")
        try:
            runner = cls(*args)
            break
        except TypeError as e:
            errors.append(str(e).splitlines()[0])
    if runner is None:
        raise RuntimeError(f"no constructor form fits: {errors}")
    step("runner created; running")
    out = runner.run([x])
    result(f"{cls.__name__} on the extracted .so: ran, max err {_err(out, a.work):.1e}")


def child_dlopen(a) -> None:
    import ctypes

    before = _maps()
    if not a.bare:
        import torch

        step(_cuda_init(a.device) if a.create else f"torch {torch.__version__} imported")
        before = _maps()
    step(f"dlopen({os.path.basename(a.so)}, RTLD_NOW|RTLD_GLOBAL)")
    try:
        lib = ctypes.CDLL(a.so, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as e:
        if a.bare:  # expected where wrapper.so has no RUNPATH to torch/lib: that is what the result says
            result(f"dlopen without torch imported fails: {e}", error=str(e))
            return
        raise
    after = _maps()
    new = sorted(p for name, paths in after.items() for p in paths - before.get(name, set()))
    twice = {name: sorted(paths) for name, paths in after.items() if len(paths) > 1}
    step(f"dlopen ok; {len(new)} new libraries mapped")
    if not a.create:
        result(f"dlopen ok; new: {[os.path.basename(p) for p in new]}; twice: {twice or 'none'}", new=new, twice=twice)
        return
    create = lib.AOTInductorModelContainerCreateWithDevice
    create.restype = ctypes.c_int32
    create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p]
    handle = ctypes.c_void_p()
    device = b"cuda" if a.device == "cuda" else b"cpu"
    step(f"AOTInductorModelContainerCreateWithDevice(1, {device.decode()}, cubin_dir)")
    rc = create(ctypes.byref(handle), 1, device, a.cubin_dir.encode())
    if rc != 0:
        raise RuntimeError(f"AOTInductorModelContainerCreateWithDevice returned {rc}")
    counts = []
    for fn in ("AOTInductorModelContainerGetNumInputs", "AOTInductorModelContainerGetNumOutputs"):
        n = ctypes.c_size_t()
        getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        getattr(lib, fn)(handle, ctypes.byref(n))
        counts.append(n.value)
    step("created; deleting")
    lib.AOTInductorModelContainerDelete.argtypes = [ctypes.c_void_p]
    lib.AOTInductorModelContainerDelete(handle)
    result(f"dlopen ok, container created and deleted ({counts[0]} input, {counts[1]} output)", twice=twice)


def _ldd(so: str) -> dict[str, str]:
    done = subprocess.run(["ldd", so], capture_output=True, text=True, timeout=60)
    found = {}
    for line in done.stdout.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(.*?)(?:\s+\(0x[0-9a-f]+\))?$", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def child_ldd(a) -> None:
    if not shutil.which("ldd"):
        result("skipped: no ldd here", skipped=True)
        return
    step(_cuda_init(a.device))
    maps = _maps()
    resolved = _ldd(a.so)
    rows, mismatches = {}, []
    for name, path in resolved.items():
        mapped = sorted(maps.get(name, ()))
        rows[name] = {"ldd": path, "process": mapped}
        if path == "not found":
            continue  # resolved at run time from what the process already has (the torch libraries)
        if mapped and os.path.realpath(path) not in mapped:
            mismatches.append(f"{name}: ldd {path}, process {', '.join(mapped)}")
    absent = [n for n, p in resolved.items() if p == "not found" and n not in maps]
    text = "; ".join(mismatches) or "none"
    extra = f"; not found and not in the process: {absent}" if absent else ""
    result(f"{len(resolved)} libraries; mismatches: {text}{extra}", libs=rows, mismatches=mismatches)


def child_precompile_save(a) -> None:
    from fullgraph.deploy.precompile import save_precompiled

    model, x = _mlp(a.device)
    start = time.perf_counter()
    meta = save_precompiled(model, (x,), a.pkg)
    result(f"saved in {time.perf_counter() - start:.1f} s, {meta.payload_bytes} bytes", meta=meta.__dict__)


def child_precompile_load(a) -> None:
    import torch
    from torch._dynamo.utils import counters

    from fullgraph.deploy.precompile import load_precompiled

    model, x = _mlp(a.device)
    start = time.perf_counter()
    loaded = load_precompiled(a.pkg, model)
    load_s = time.perf_counter() - start
    out = loaded(x)
    if a.device == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - start - load_s
    seen = {k: dict(v) for k, v in counters.items() if v}
    graphs = seen.get("stats", {}).get("unique_graphs", 0)
    misses = seen.get("inductor", {}).get("fxgraph_cache_miss", 0)
    result(
        f"load {load_s:.2f} s + first call {first_s:.3f} s, max err {_err(out, a.work):.1e}, "
        f"Dynamo graphs {graphs}, Inductor misses {misses}",
        counters=seen,
    )


CHILDREN = {
    "versions": child_versions,
    "build": child_build,
    "load": child_load,
    "signatures": child_signatures,
    "metadata": child_metadata,
    "loader": child_loader,
    "runner": child_runner,
    "dlopen": child_dlopen,
    "ldd": child_ldd,
    "precompile_save": child_precompile_save,
    "precompile_load": child_precompile_load,
}


# ==== ELF: the compiler that built a library, what it needs, and symbol names for raw offsets =====================


@functools.lru_cache(maxsize=64)
def _functions(path: str) -> tuple[list[int], list[tuple[int, int, str]]]:
    """Function symbols of an ELF file (.symtab, else .dynsym), sorted by address."""
    with open(path, "rb") as f:
        image = _elf.Image.of_file(f)
        kind = _elf.SHT_SYMTAB if any(h["type"] == _elf.SHT_SYMTAB for h in image.sections) else _elf.SHT_DYNSYM
        found = [(value, size, name) for name, info, shndx, value, size in image.symbols(kind)
                 if info & 0xF == 2 and value and shndx]  # fmt: skip
    found.sort()
    return [v for v, _, _ in found], found


def symbolize(path: str, offset: int) -> str | None:
    """`name+0x12` for an offset into a library, from its own symbol table; None when none covers it."""
    try:
        starts, symbols = _functions(path)
    except (OSError, ValueError, struct.error):
        return None
    i = bisect.bisect_right(starts, offset) - 1
    if i < 0:
        return None
    value, size, name = symbols[i]
    if size and offset >= value + size:
        return None
    return f"{name}+{offset - value:#x}"


def demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {}
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        done = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=30)
        return dict(zip(names, done.stdout.splitlines(), strict=False))
    return {}


_FRAME = re.compile(r"^(?P<path>[^(\s\[]+)\((?P<sym>[^+)]*)\+?(?P<off>0x[0-9a-f]+)?\)\s*\[(?P<addr>0x[0-9a-f]+)\]")


def readable_backtrace(lines: list[str]) -> list[str]:
    """glibc backtrace_symbols lines made readable: raw offsets named from symbol tables, C++ names demangled."""
    frames = []
    for line in lines:
        m = _FRAME.match(line.strip())
        if not m:
            frames.append((line.strip(), None))
            continue
        path, sym, off = m.group("path"), m.group("sym"), m.group("off")
        if not sym and off:
            sym = symbolize(path, int(off, 16)) or f"+{off}"  # a stripped library: its offset, for addr2line later
        elif off:
            sym = f"{sym}+{off}"
        frames.append((os.path.basename(path), sym))
    plain = {s.split("+")[0] for _, s in frames if s}
    names = demangle(sorted(plain))
    out = []
    for where, sym in frames:
        if sym is None:
            out.append(where)
            continue
        base, _, rest = sym.partition("+")
        out.append(f"{where}: {names.get(base, base)[:160]}{'+' + rest if rest else ''}")
    return out


# ==== the parent: builds, experiments, table ======================================================================

BACKTRACE_C = r"""
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void say(const char *s) { ssize_t r = write(2, s, strlen(s)); (void)r; }

static void say_hex(unsigned long v) {
  char b[24];
  int i = 23;
  b[i] = 0;
  do { b[--i] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v && i > 2);
  b[--i] = 'x';
  b[--i] = '0';
  say(b + i);
}

static void on_fault(int sig, siginfo_t *info, void *context) {
  void *frames[128];
  int n = backtrace(frames, 128);
  (void)context;
  say("NATIVE-BACKTRACE signal ");
  say_hex((unsigned long)sig);
  say(" address ");
  say_hex((unsigned long)info->si_addr);
  say("\n");
  backtrace_symbols_fd(frames, n, 2);
  say("NATIVE-BACKTRACE-END\n");
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  static char alt[1 << 16];
  void *warm[2];
  stack_t ss;
  struct sigaction sa;
  int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  backtrace(warm, 2); /* loads the unwinder now rather than inside the handler */
  memset(&ss, 0, sizeof ss);
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  sigaltstack(&ss, 0);
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, 0);
}
"""


def exit_text(rc: int | None, timeout: float) -> str:
    if rc is None:
        return f"timeout {timeout:.0f}s"
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"{rc} {signal.Signals(-rc).name}"
    return str(rc)


class Runner:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out).resolve()
        # Packages, extracted files and Inductor's cache stay out of DIR, which the GPU machine sends back.
        self.work = Path(args.work_dir).resolve() if args.work_dir else Path(tempfile.mkdtemp(prefix="aoti-crash-"))
        self.logs = self.out / "logs"
        for d in (self.work, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.start = time.monotonic()
        self.rows: list[dict] = []
        self.facts: dict = {"device": args.device, "argv": sys.argv, "work": str(self.work)}
        self.facts["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p),
            "PYTHONUNBUFFERED": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(self.work / "inductor-cache"),
        }

    # -- bookkeeping --

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.start)

    def wanted(self, name: str) -> bool:
        only = self.args.only
        return not only or any(name == p or name.startswith(p + ".") or name.startswith(p + "[") for p in only)

    def add(self, name: str, what: str, rc: str, seconds: float | None, last: str, **extra) -> dict:
        row = {"experiment": name, "what": what, "exit": rc, "seconds": seconds, "last": last, **extra}
        self.rows.append(row)
        secs = "-" if seconds is None else f"{seconds:.1f}"
        print(f"{name:<28} | {rc:<14} | {secs:>6} | {last[:170]}", flush=True)
        self.save()
        return row

    def save(self) -> None:
        data = {**self.facts, "rows": self.rows, "elapsed_s": round(time.monotonic() - self.start, 1)}
        tmp = self.out / "aoti_crash.json.tmp"
        tmp.write_text(json.dumps(data, indent=1, default=str))
        tmp.replace(self.out / "aoti_crash.json")

    # -- children --

    def child_argv(self, kind: str, *extra: str, faulthandler: bool = True) -> list[str]:
        flags = ["-X", "faulthandler"] if faulthandler else []
        common = ["--child", kind, "--work", str(self.work), "--device", self.args.device]
        return [sys.executable, *flags, str(Path(__file__).resolve()), *common, *extra]

    def run(self, argv: list[str], timeout: float, env: dict | None = None, tail_bytes: int = 200_000):
        """Run a child in its own session, keep the first 20 kB and the last `tail_bytes` of its output (stdout and
        stderr together), kill its whole group at the deadline. Returns (rc or None on timeout, seconds, text)."""
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env or self.env,
            start_new_session=True,
            cwd=str(self.work),
        )
        head, tail, total = bytearray(), bytearray(), 0
        fd = proc.stdout.fileno()
        timed_out, exited_at = False, None
        while True:
            remaining = timeout - (time.monotonic() - start)
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                if proc.poll() is not None:  # exited, but something it started still holds the pipe
                    exited_at = exited_at or time.monotonic()
                    if time.monotonic() - exited_at > 5:
                        break
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            total += len(chunk)
            if len(head) < 20_000:
                head += chunk[: 20_000 - len(head)]
            tail += chunk
            if len(tail) > 2 * tail_bytes:
                del tail[: len(tail) - tail_bytes]
        with contextlib.suppress(OSError):  # at the deadline, or what it left running
            os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
        proc.stdout.close()
        seconds = time.monotonic() - start
        tail = tail[-tail_bytes:]
        if total <= len(head) + len(tail):  # nothing lost: the head's start and the tail make the whole output
            text = (head[: total - len(tail)] + tail).decode(errors="replace")
        else:
            text = head.decode(errors="replace") + f"\n[... {total} bytes in all ...]\n" + tail.decode(errors="replace")
        return (None if timed_out else rc), seconds, text

    def experiment(self, name: str, what: str, argv: list[str], *, timeout: float | None = None, env=None, **kw):
        """One row: run the child, or list it as skipped when the budget cannot hold it."""
        if not self.wanted(name):
            return None
        timeout = min(timeout or self.args.timeout, self.left())
        if timeout < 10:
            return self.add(name, what, "skipped", None, "budget spent (--budget)")
        rc, seconds, text = self.run(argv, timeout, env=env, **kw)
        (self.logs / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.log").write_text(text)
        found = parse_result(text)
        last = last_line(text, rc, found)
        extra = {"result": found, "tail": text.strip().splitlines()[-30:]}
        return self.add(name, what, exit_text(rc, timeout), seconds, last, **extra)


def parse_result(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("RESULT "):
            with contextlib.suppress(ValueError):
                return json.loads(line[len("RESULT ") :])
    return None


def last_line(text: str, rc: int | None, found: dict | None) -> str:
    """What to show for a child: its summary when it passed; else the last step it reached with faulthandler's
    verdict and innermost Python frame, or the last line it printed (a Python error)."""
    if rc == 0 and found:
        return found["summary"]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    steps = [ln[5:] for ln in lines if ln.startswith("STEP ")]
    reached = f"after '{steps[-1][:70]}'" if steps else "before any step"
    for i, ln in enumerate(lines):
        if ln.startswith("Fatal Python error"):
            frame = next((f for f in lines[i + 1 :] if f.startswith("File ")), "")
            return f"{ln} {reached}; {frame}"
    if rc is None:
        return f"no exit {reached}"
    errors = [ln for ln in lines if not ln.startswith(("STEP ", "File ", "[..."))]
    return f"{errors[-1][:200] if errors else 'no output'} ({reached})"


# -- package handling in the parent (no torch here: a parent that crashes would lose the table) --


def package_parts(pkg: Path, into: Path) -> dict:
    """Extract a package; its model name, wrapper .so, the folder of its kernel binaries, and its file list."""
    shutil.rmtree(into, ignore_errors=True)
    with zipfile.ZipFile(pkg) as z:
        names = z.namelist()
        z.extractall(into)
    models = sorted({m.group(1) for n in names if (m := re.search(r"/data/aotinductor/([^/]+)/", n))})
    sos = sorted(into / n for n in names if n.endswith(".so"))
    cubins = sorted(into / n for n in names if n.endswith((".cubin", ".hsaco", ".spv")))
    model_dir = next((p.parent for p in sos), into)
    return {
        "model_name": models[0] if models else "model",
        "so": str(sos[0]) if sos else None,
        "cubin_dir": str(cubins[0].parent if cubins else model_dir),
        "files": [f"{n} ({z_size} B)" for n, z_size in _sizes(pkg)],
        "kinds": sorted({Path(n).suffix or Path(n).name for n in names}),
    }


def _sizes(pkg: Path) -> list[tuple[str, int]]:
    with zipfile.ZipFile(pkg) as z:
        return [(i.filename, i.file_size) for i in z.infolist()]


def build_all(r: Runner) -> dict[str, dict]:
    """Build the packages in parallel children (each in its own process, so a crash costs one variant).
    The base build then loads its package in the same process: experiment c."""
    procs = {}
    for variant, configs in VARIANTS.items():
        if variant != "base" and not r.wanted(f"build[{variant}]") and not r.wanted(f"a[{variant}]"):
            continue
        pkg = r.work / f"{variant}.pt2"
        with contextlib.suppress(FileNotFoundError):
            pkg.unlink()
        extra = ["--pkg", str(pkg), "--config", json.dumps(configs)]
        if variant == "base":
            extra.append("--same-process")
        log = open(r.logs / f"build_{variant}.log", "w")  # noqa: SIM115 - closed below
        argv = r.child_argv("build", *extra)
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=r.env, start_new_session=True, cwd=str(r.work)
        )
        procs[variant] = (proc, log, pkg, time.monotonic())
    built = {}
    deadline = time.monotonic() + min(r.args.build_timeout, max(r.left() - 60, 30))
    for variant, (proc, log, pkg, started) in procs.items():
        try:
            rc = proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        seconds = time.monotonic() - started
        log.close()
        text = (r.logs / f"build_{variant}.log").read_text(errors="replace")
        found = parse_result(text)
        configs = json.dumps(VARIANTS[variant]) if VARIANTS[variant] else "defaults"
        tail = text.strip().splitlines()[-30:]
        if found and found.get("skipped"):
            r.add(f"build[{variant}]", configs, "skipped", seconds, found["summary"])
            continue
        built_ok = pkg.exists() and "STEP BUILT" in text
        if variant == "base":
            build_line = next((ln[5:] for ln in text.splitlines() if ln.startswith("STEP BUILT")), "")
            r.add("build[base]", configs, "0" if built_ok else exit_text(rc, 0), seconds, build_line or "not built")
            r.add(
                "c.same_process",
                "load in the process that built it",
                exit_text(rc, r.args.build_timeout),
                seconds,
                last_line(text, rc, found),
                result=found,
                tail=tail,
            )
        else:
            r.add(
                f"build[{variant}]", configs, exit_text(rc, r.args.build_timeout), seconds, last_line(text, rc, found)
            )
        if built_ok:
            built[variant] = {"pkg": str(pkg), **package_parts(pkg, r.work / "extracted" / variant)}
    r.facts["packages"] = built
    r.save()
    return built


def native_backtrace_helper(r: Runner) -> str | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    src, lib = r.work / "native_bt.c", r.work / "native_bt.so"
    src.write_text(BACKTRACE_C)
    done = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], capture_output=True, text=True)
    return str(lib) if done.returncode == 0 else None


def run_experiments(r: Runner, built: dict[str, dict]) -> None:
    a = r.args
    base = built.get("base")
    if base is None:
        r.add("a.fresh", "everything else", "skipped", None, "the base package was not built: see build[base]")
        return
    pkg, so, cubins, name = base["pkg"], base["so"], base["cubin_dir"], base["model_name"]
    p = ["--pkg", pkg]
    s = ["--so", so or "", "--cubin-dir", cubins]
    r.experiment("a.fresh", "aoti_load_package, fresh process", r.child_argv("load", *p))
    if "linked" in built:  # the fix (fullgraph.deploy.export builds this way): right after the crash it mends
        what = "fresh load of the package linked to libstdc++.so (-lstdc++)"
        r.experiment("a[linked]", what, r.child_argv("load", "--pkg", built["linked"]["pkg"]))
    r.experiment("e.dlopen", "ctypes dlopen of wrapper.so after import torch", r.child_argv("dlopen", *s))
    r.experiment("e.create", "dlopen + ModelContainerCreateWithDevice (C ABI)", r.child_argv("dlopen", *s, "--create"))
    r.experiment("d.metadata", "load_metadata_from_package alone", r.child_argv("metadata", *p, "--model-name", name))
    r.experiment("d.signatures", "torch._C._aoti classes and __init__ docs", r.child_argv("signatures"))
    r.experiment("d.loader", "AOTIModelPackageLoader(...) directly", r.child_argv("loader", *p, "--model-name", name))
    r.experiment("d.runner", "ModelContainerRunner on extracted .so", r.child_argv("runner", *s))
    if r.wanted("bt.backtrace"):
        helper = native_backtrace_helper(r)
        if helper is None:
            r.add("bt.backtrace", "native stack on SIGSEGV", "skipped", None, "no C compiler to build the handler")
        else:
            env = {**r.env, "LD_PRELOAD": helper}
            row = r.experiment(
                "bt.backtrace",
                "fresh load, SIGSEGV handler (LD_PRELOAD)",
                r.child_argv("load", *p, faulthandler=False),
                env=env,
            )
            if row:
                attach_backtrace(r, row)
    if r.wanted("bt.gdb"):
        gdb = shutil.which("gdb")
        if not gdb:
            r.add("bt.gdb", "fresh load under gdb", "skipped", None, "no gdb here")
        else:
            batch = [gdb, "-q", "-batch", "-return-child-result", "-ex", "run", "-ex", "bt 40"]
            row = r.experiment("bt.gdb", "fresh load under gdb (bt 40)", [*batch, "--args", *r.child_argv("load", *p)])
            log = r.logs / "bt.gdb.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            frames = [ln.strip() for ln in text.splitlines() if re.match(r"\s*#\d+ ", ln)]
            if frames:
                row["last"] = " | ".join(frames[:4])[:400]
            elif row and "exited normally]" in text:  # gdb's own exit is 1 then: its `bt` found no stack
                row["exit"] = "0 (under gdb)"
                row["last"] = (parse_result(text) or {}).get("summary", row["last"])
            r.save()
    r.experiment("f.ldd", "ldd wrapper.so vs /proc/self/maps", r.child_argv("ldd", *s))
    r.experiment("b.cuda_first", "torch.cuda.init() + a CUDA op, then load", r.child_argv("load", *p, "--cuda-first"))
    if a.device == "cuda":
        argv = r.child_argv("load", *p, "--device-index", "0")
        r.experiment("h.device_index0", "aoti_load_package(device_index=0)", argv)
    elif r.wanted("h.device_index0"):  # torch's CPU runner refuses any index but -1 ("Incorrect device passed")
        r.add(
            "h.device_index0",
            "aoti_load_package(device_index=0)",
            "skipped",
            None,
            "CUDA only: the CPU runner takes -1",
        )
    variants_env = [
        ("h.check_inputs", "AOTI_RUNTIME_CHECK_INPUTS=1", {"AOTI_RUNTIME_CHECK_INPUTS": "1"}),
        ("h.bind_now", "LD_BIND_NOW=1: every symbol bound at dlopen", {"LD_BIND_NOW": "1"}),
        ("h.cuda_eager", "CUDA_MODULE_LOADING=EAGER", {"CUDA_MODULE_LOADING": "EAGER"}),
        ("h.tmpdir", "TMPDIR in DIR, not under /tmp (extraction)", {"TMPDIR": str(r.out / "tmp")}),
    ]
    (r.out / "tmp").mkdir(exist_ok=True)
    for row_name, what, extra_env in variants_env:
        r.experiment(row_name, what, r.child_argv("load", *p), env={**r.env, **extra_env})
    r.experiment(
        "d.loader_single_threaded",
        "AOTIModelPackageLoader(run_single_threaded=True)",
        r.child_argv("loader", *p, "--model-name", name, "--single-threaded"),
    )
    r.experiment("e.dlopen_no_torch", "dlopen wrapper.so without torch imported", r.child_argv("dlopen", *s, "--bare"))
    if r.wanted("g.ld_debug"):
        row = r.experiment(
            "g.ld_debug",
            "LD_DEBUG=bindings,symbols on the fresh load",
            r.child_argv("load", *p),
            env={**r.env, "LD_DEBUG": "bindings,symbols"},
            timeout=min(a.timeout * 2, 240),
        )
        if row:
            attach_ld_debug(r, row)
    for variant, parts in built.items():
        if variant in ("base", "linked", "cpp_only"):
            continue
        extra = ["--load-constants"] if "package_constants_in_so" in json.dumps(VARIANTS[variant]) else []
        what = f"fresh load of the {variant} package" + (", weights by load_constants" if extra else "")
        r.experiment(f"a[{variant}]", what, r.child_argv("load", "--pkg", parts["pkg"], *extra))
    if "cpp_only" in built:
        cpp_only(r, built["cpp_only"])
    if r.wanted("k"):
        fg = str(r.work / "mlp.fgpre")
        r.experiment(
            "k.precompile_save", "fullgraph.deploy.save_precompiled", r.child_argv("precompile_save", "--pkg", fg)
        )
        if (r.work / "mlp.fgpre").exists():
            env = {**r.env, "TORCHINDUCTOR_CACHE_DIR": str(r.work / "inductor-empty")}
            shutil.rmtree(r.work / "inductor-empty", ignore_errors=True)
            r.experiment(
                "k.precompile_load",
                "load_precompiled, fresh process, empty cache",
                r.child_argv("precompile_load", "--pkg", fg),
                env=env,
            )


def attach_backtrace(r: Runner, row: dict) -> None:
    log = r.logs / "bt.backtrace.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    if "NATIVE-BACKTRACE" not in text:
        return
    block = text.split("NATIVE-BACKTRACE", 1)[1].split("NATIVE-BACKTRACE-END", 1)[0].splitlines()
    frames = readable_backtrace(block[1:])
    row["native_backtrace"] = [block[0].strip(), *frames]
    (r.out / "native_backtrace.txt").write_text("\n".join(row["native_backtrace"]) + "\n")
    # Innermost first: the handler's own frame, then the kernel's signal trampoline, then where the fault was.
    handler = next((i for i, f in enumerate(frames) if f.startswith("native_bt.so")), -1)
    inner = frames[handler + 2 : handler + 6]
    row["last"] = f"{block[0].strip()}: {' <- '.join(inner)}"[:400]
    print(f"{'':<28}   native stack (innermost first): {' <- '.join(inner)[:300]}", flush=True)
    r.save()


def attach_ld_debug(r: Runner, row: dict) -> None:
    log = r.logs / "g.ld_debug.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    fatal = next((i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")), None)
    if fatal is not None:  # what the loader did before the crash, not while faulthandler wrote its report
        lines = lines[:fatal] + [ln for ln in lines[fatal:] if not re.match(r"\s*\d+:", ln)]
    loader = [ln for ln in lines if re.match(r"\s*\d+:", ln)]
    other = [ln for ln in lines if ln.strip() and not re.match(r"\s*\d+:", ln)]
    bound = [ln for ln in loader if "binding file" in ln]
    row["ld_debug_last"] = loader[-40:]
    row["ld_debug_other_last"] = other[-20:]
    if bound:
        last_bound = re.sub(r"^\s*\d+:\s*", "", bound[-1])
        row["last"] = f"{row['last'][:80]}; last bound: {last_bound}"[:400]
    (r.out / "ld_debug_tail.txt").write_text("\n".join([*loader[-40:], "", *other[-20:]]) + "\n")
    r.save()


def cpp_only(r: Runner, parts: dict) -> None:
    """What a package_cpp_only package holds, and, if cmake is here, whether it builds and its .so creates a
    model: the same generated code compiled by CMake rather than by Inductor's own command line."""
    kinds = ", ".join(parts["kinds"])
    r.add("cpp_only.contents", "files in the package_cpp_only package", "0", None, f"file kinds: {kinds}")
    if not r.wanted("cpp_only.cmake"):
        return
    cmake = shutil.which("cmake")
    lists = sorted(Path(r.work / "extracted" / "cpp_only").rglob("CMakeLists.txt"))
    if not cmake or not lists:
        why = "no cmake here" if not cmake else "no CMakeLists.txt in the package"
        r.add("cpp_only.cmake", "CMake build of the generated code", "skipped", None, why)
        return
    need = re.search(r"cmake_minimum_required\s*\(\s*VERSION\s+([\d.]+)", lists[0].read_text(), re.I)
    have = re.search(r"([\d.]+)", subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout)
    if need and have and _release(have[1]) < _release(need[1]):
        why = f"cmake {have[1]} here, the package's CMakeLists.txt needs {need[1]}"
        r.add("cpp_only.cmake", "CMake build of the generated code", "skipped", None, why)
        return
    if r.left() < 60:
        r.add("cpp_only.cmake", "CMake build of the generated code", "skipped", None, "budget spent (--budget)")
        return
    source, build = lists[0].parent, r.work / "cpp_only_build"
    shutil.rmtree(build, ignore_errors=True)
    prefix = (r.facts.get("versions") or {}).get("cmake_prefix_path") or ""
    script = (
        f"{cmake} -S {source} -B {build} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH={prefix} "
        f"&& {cmake} --build {build} -j {os.cpu_count() or 2}"
    )
    row = r.experiment(
        "cpp_only.cmake", "CMake build of the generated code", ["bash", "-c", script], timeout=min(240, r.left())
    )
    sos = sorted(build.rglob("*.so")) if build.exists() else []
    if row and row["exit"] == "0" and sos:
        row["last"] = f"built {', '.join(s.name for s in sos)}"
        r.save()
        argv = r.child_argv("dlopen", "--so", str(sos[0]), "--cubin-dir", str(source), "--create")
        r.experiment("cpp_only.create", "CMake-built .so: dlopen + create", argv)


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def elf_rows(r: Runner, built: dict[str, dict]) -> None:
    base = built.get("base")
    versions = r.facts.get("versions") or {}
    if not base or not base.get("so") or not r.wanted("i.elf"):
        return
    facts = {"wrapper.so": asdict(_elf.file_facts(base["so"]))}
    torch_cpu = Path(versions.get("torch_lib", "")) / "libtorch_cpu.so"
    if torch_cpu.exists():
        facts["libtorch_cpu.so"] = {"comment": _elf.file_facts(torch_cpu).comment}
    for variant, parts in built.items():
        if parts.get("so"):
            facts[f"{variant}: static libstdc++"] = _elf.file_facts(parts["so"]).static_libstdcxx
    facts["compiler"] = compiler_text()
    r.facts["elf"] = facts
    w = facts["wrapper.so"]
    built_by = "; ".join(w["comment"]) or "no .comment"
    torch_by = "; ".join(facts.get("libtorch_cpu.so", {}).get("comment", [])) or "?"
    static = "libstdc++ LINKED IN (static)" if w["carries_libstdcxx"] and "libstdc++.so.6" not in w["needed"] else ""
    last = f"wrapper.so: {built_by} | {static} | libtorch_cpu.so: {torch_by[:60]} | NEEDED {w['needed']}"
    r.add("i.elf", "compilers (.comment), NEEDED, libstdc++ inside?", "0", None, last, facts=facts)


def compiler_text() -> dict:
    """The C++ compiler Inductor runs, and its text when it is a script (a wrapper that adds flags)."""
    import torch

    name = torch._inductor.config.cpp.cxx[-1]
    path = shutil.which(name) or name
    found: dict = {"cxx": name, "path": path, "realpath": os.path.realpath(path)}
    with contextlib.suppress(OSError):
        head = Path(path).read_bytes()[:4096]
        if head.startswith(b"#!"):
            found["script"] = head.decode(errors="replace").splitlines()[:40]
    return found


def verdict(r: Runner) -> list[str]:
    """A few plain conclusions from the rows that ran."""
    status = {row["experiment"]: row["exit"] for row in r.rows}

    def ok(name: str) -> bool | None:
        if name not in status or status[name] == "skipped":
            return None
        return status[name].split()[0] == "0"

    lines = []
    if ok("a.fresh") is False:
        lines.append(f"fresh-process load fails ({status['a.fresh']})")
        if ok("c.same_process"):
            lines.append("the same package loads in the process that built it: the fresh process lacks some state")
        if ok("b.cuda_first"):
            lines.append("initialising CUDA first avoids it")
        if ok("e.dlopen") is False:
            lines.append("dlopen of wrapper.so alone crashes: static initializers or symbol resolution")
        elif ok("e.dlopen") and ok("e.create") is False:
            lines.append("dlopen is fine; creating the model container through the C ABI crashes (constants/kernels)")
        elif ok("e.create"):
            lines.append("the model container creates fine through the C ABI: the crash is in torch's package loader")
        if ok("d.runner"):
            lines.append("torch's container runner on the extracted .so works: look at package extraction/metadata")
        if ok("d.metadata") is False:
            lines.append("reading the package metadata alone crashes (zip reader)")
        if ok("a[linked]"):
            lines.append(
                "the package linked to libstdc++.so loads: wrapper.so's static libstdc++ is the cause "
                "(fullgraph.deploy.export links it so; see fullgraph/deploy/_elf.py)"
            )
        loads = [n for n in status if n.startswith(("a[", "h.", "bt.")) and ok(n)]
        if loads:
            lines.append(f"these load: {', '.join(loads)}")
    elif ok("a.fresh"):
        lines.append("fresh-process load works here")
    precompiled = next((row for row in r.rows if row["experiment"] == "k.precompile_load"), None)
    if precompiled:
        lines.append(f"precompile route ({precompiled['exit']}): {str(precompiled['last'])[:120]}")
    failed = [n for n, s in status.items() if s.split()[0] not in ("0", "skipped")]
    lines.append(f"failed or crashed: {', '.join(failed) or 'none'}")
    return lines


def print_table(r: Runner) -> None:
    print("\n" + f"{'experiment':<28} | {'exit/signal':<14} | {'s':>6} | last line")
    print("-" * 120)
    for row in r.rows:
        secs = "-" if row["seconds"] is None else f"{row['seconds']:.1f}"
        print(f"{row['experiment']:<28} | {row['exit']:<14} | {secs:>6} | {str(row['last'])[:170]}")
    lines = verdict(r)
    r.facts["verdict"] = lines
    r.save()
    print("verdict: " + "\n         ".join(lines))
    print(f"JSON: {r.out / 'aoti_crash.json'}   logs: {r.logs}   ({time.monotonic() - r.start:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for the JSON summary, logs and packages")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per experiment child")
    parser.add_argument("--build-timeout", type=float, default=300.0, help="seconds for the parallel builds")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run")
    parser.add_argument("--work-dir", default=None, help="folder for packages and caches (default: a temporary one)")
    parser.add_argument("--keep-work", action="store_true", help="keep the temporary work folder")
    parser.add_argument("--only", default="", help="comma list of experiment prefixes (a, e, d.runner, k, ...)")
    parser.add_argument(
        "--selftest",
        action="store_true",
        help="make every aoti_load_package child segfault on purpose (a read of address 0), to check the crash "
        "reporting (faulthandler, native stack, LD_DEBUG tail, verdict) where nothing crashes",
    )
    # child side
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--pkg", help=argparse.SUPPRESS)
    parser.add_argument("--so", help=argparse.SUPPRESS)
    parser.add_argument("--cubin-dir", default="", help=argparse.SUPPRESS)
    parser.add_argument("--model-name", default="model", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--device-index", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--same-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cuda-first", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--single-threaded", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--create", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load-constants", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        CHILDREN[args.child](args)
        return 0
    if not args.out:
        parser.error("--out DIR is required")
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    if args.device == "cuda" and not os.path.exists("/dev/nvidiactl") and not shutil.which("nvidia-smi"):
        print("no NVIDIA device here: run with --device cpu for the control", file=sys.stderr)
        return 2
    if args.selftest:
        os.environ["AOTI_CRASH_SELFTEST"] = "1"
    r = Runner(args)
    print(f"{'experiment':<28} | {'exit/signal':<14} | {'s':>6} | last line", flush=True)
    row = r.experiment("i.versions", "versions and build tools", r.child_argv("versions"))
    if row and row.get("result"):
        r.facts["versions"] = row["result"].get("info")
    built = build_all(r)
    elf_rows(r, built)
    run_experiments(r, built)
    print_table(r)
    shutil.rmtree(r.out / "tmp", ignore_errors=True)
    if not args.work_dir and not args.keep_work:
        shutil.rmtree(r.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
