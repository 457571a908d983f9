"""AOTInductor packages: `load` one as a callable, safely (`fullgraph.deploy.build.export` makes them).

A package is a zip holding the generated code, a compiled shared library and the weights. `load` never takes the
process down:

1. the file is checked before anything in it runs: owned by this user or root and writable by no one else (a
   package is a shared library: loading it runs its code), a PT2 zip with AOTInductor code in it, built for
   this machine, this device (CPU, or a GPU of this compute capability) and, when `export` built it, this torch;
   its libraries must not carry their own libstdc++ (`fullgraph.deploy._elf`: the cause of the H200 image's
   segmentation fault in `aoti_load_package`);
2. a loader can still crash in native code for causes not checked here, so the package is first loaded in a
   child process; its verdict is kept per file
   content (sha256), torch and device in `<fullgraph cache dir>/aoti_probes.json`, so the probe runs once per file
   (`fullgraph.deploy._probe`: updated under a file lock, so processes loading packages at once keep each other's
   verdicts);
3. only a package whose probe passed is loaded here, by torch's C++ package loader directly (`open_package`), with
   the package's input checks on (`CHECK_INPUTS_ENV`): inputs that do not fit raise a UsageError.

Our ops inside a package: on a GPU, Inductor traces into the Triton kernels (`triton_op`), so the package holds
them as compiled code. An op it cannot trace into (an opaque `custom_op`: the attention backends, and every
Triton kernel under TRITON_INTERPRET=1, as on a CPU) stays a call back into Python through AOTInductor's proxy
executor, listed in the package's extern-node JSON: the loading process needs its Python registration (fullgraph's
own come with `import fullgraph.ops`, which `load` does) and, for a Triton kernel, a device Triton runs on there.
`load` checks both before anything runs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import os
import struct
import sys
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fullgraph import env
from fullgraph._paths import display_path
from fullgraph.compile.graphs import GraphedCall
from fullgraph.deploy import _elf, direct
from fullgraph.deploy._calls import OomCount, cuda_device, dynamic_ranges, misfit
from fullgraph.deploy._common import DeployError, cache_dir, environment, input_signature, open_trusted
from fullgraph.deploy._probe import PROBE_TIMEOUT_S, exit_text, read_json, remember, run_probe
from fullgraph.env import first_line
from fullgraph.errors import UsageError
from fullgraph.serving import OutOfMemoryError, OwnerThread, bind_cuda_context, out_of_memory

# Written into the package (aot_inductor.metadata) by `export`, read back before loading.
META_PREFIX = "fullgraph_"
_REBUILD = "export it again on this machine with this torch (fullgraph.deploy.export)"


# ---- checks before anything runs ----------------------------------------------------------------------------------


def _sha256(f) -> str:
    f.seek(0)
    h = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


CHECK_INPUTS_ENV = "AOTI_RUNTIME_CHECK_INPUTS"
# load's model instances for a CUDA package called from threads (not replayed, not serial): with the GIL released,
# two let one call launch while another's kernels run (H100, the DiT package: 761 calls/s from 4 threads, 592 with
# one instance through torch's loader; docs/deploy.md, "Many threads"). Each costs an activation arena.
DEFAULT_CUDA_RUNNERS = 2
SHA_FILE = "aoti_sha.json"
_SHA_MEMO_SIZE = 256


def _content_sha(f) -> str:
    """The sha256 of an open package, remembered by the file's identity and change times (device, inode, size,
    mtime and ctime in ns) in `<fullgraph cache dir>/aoti_sha.json`: a later load of the same unchanged file skips
    hashing it (0.12 s for 190 MB on the CPU). Rewriting the file changes its ctime, which no one can set back, and
    replacing it changes its inode, so an edited file is hashed again; the loader already refuses files that others
    can write."""
    st = os.fstat(f.fileno())
    key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    file = os.path.join(cache_dir(), SHA_FILE)
    memo = read_json(file)
    if isinstance(memo.get(key), str):
        return memo[key]
    sha = _sha256(f)
    remember(file, key, sha, keep=_SHA_MEMO_SIZE)  # a read-only cache folder costs a hash per load, nothing more
    return sha


def inspect_package(path: str | os.PathLike) -> tuple[str, dict[str, str]]:
    """Check a package without running it: who can write it, that it is a PT2 zip with AOTInductor code, and
    what it was built for. Returns (sha256 of the file, its AOTInductor metadata)."""
    sha, meta, _ = _read_package(path)
    return sha, meta


def _read_package(path: str | os.PathLike) -> tuple[str, dict[str, str], tuple[str, ...]]:
    """`inspect_package`, plus the custom ops the package calls through Python ("ns::name", sorted)."""
    shown = display_path(path)
    with open_trusted(path, "AOTInductor package") as f:
        try:
            with zipfile.ZipFile(f) as z:
                names = z.namelist()
                root = names[0].split("/")[0] if names else ""
                if f"{root}/archive_format" not in names or z.read(f"{root}/archive_format") != b"pt2":
                    raise DeployError(f"{shown} is a zip but not a PT2 archive (no archive_format 'pt2'); {_REBUILD}")
                code = [n for n in names if n.startswith(f"{root}/data/aotinductor/")]
                if not any(n.endswith((".so", ".cpp")) for n in code):
                    raise DeployError(
                        f"{shown} holds no AOTInductor model (nothing under data/aotinductor/); {_REBUILD}"
                    )
                metas = [n for n in code if n.endswith("wrapper_metadata.json")]
                meta = json.loads(z.read(metas[0])) if metas else {}
                if not isinstance(meta, dict):
                    raise ValueError(f"metadata is a {type(meta).__name__}, not an object")
                externs = [n for n in code if n.endswith(".json") and not n.endswith("_metadata.json")]
                ops = tuple(sorted({op for n in externs for op in _extern_ops(json.loads(z.read(n)))}))
                libraries = libraries_in(z, code)
        except (zipfile.BadZipFile, EOFError, ValueError, KeyError, OSError, struct.error) as e:  # damaged, bad JSON
            raise DeployError(
                f"{shown} is not a readable package ({first_line(e)}): damaged or truncated; {_REBUILD}"
            ) from None
        sha = _content_sha(f)
    _check_target(shown, meta)
    check_libraries(shown, libraries)
    return sha, meta, ops


def libraries_in(z: zipfile.ZipFile, names: Sequence[str]) -> dict[str, _elf.ElfFacts | None]:
    """`_library_facts` of each shared library among `names`, by name."""
    return {n: _library_facts(z, n) for n in names if n.endswith(".so")}


def _library_facts(z: zipfile.ZipFile, name: str) -> _elf.ElfFacts | None:
    """What a library in the package needs and carries, read from the zip member without extracting it (only its
    headers and dynamic tables: a stored member is read in place, so a 190 MB library costs milliseconds); None
    for a file that is not a 64-bit ELF library (another platform's: `_check_target` names that)."""
    info = z.getinfo(name)
    raw = z.fp
    try:
        if info.compress_type == zipfile.ZIP_STORED and raw is not None and hasattr(raw, "fileno"):
            fd = raw.fileno()  # read with pread: the zip reader's own position is left alone
            local = os.pread(fd, 30, info.header_offset)
            if local[:4] != b"PK\x03\x04":
                raise zipfile.BadZipFile(f"{name}: no local file header")
            name_len, extra_len = struct.unpack_from("<HH", local, 26)
            start, size = info.header_offset + 30 + name_len + extra_len, info.file_size

            def read(offset: int, length: int) -> bytes:
                length = max(0, min(length, size - offset))
                return os.pread(fd, length, start + offset)

            return _elf.facts(_elf.Image(read))
        with z.open(name) as member:
            return _elf.facts(_elf.Image.of_file(member))
    except ValueError:
        return None


def check_libraries(shown: str, libraries: Mapping[str, _elf.ElfFacts | None], fix: str | None = None) -> None:
    """Refuse a package whose compiled code carries its own libstdc++ (`_elf`'s docstring: it crashes or fails
    when the model is created, in any process that has torch's libstdc++.so loaded). `fix`: what to do instead."""
    for name, found in libraries.items():
        if found is not None and found.static_libstdcxx:
            built_by = "; ".join(found.comment) or "an unnamed compiler"
            raise DeployError(
                f"{shown}: {os.path.basename(name)} has libstdc++ linked in statically (built by {built_by}; it "
                "needs no libstdc++.so), and its std::locale clashes with the one torch loaded: creating the model "
                f"would crash (SIGSEGV) or fail with std::bad_cast. {fix or _STATIC_FIX}"
            )


_STATIC_FIX = (
    "Export it again with fullgraph.deploy.export, which links the shared libstdc++ by its file name "
    "(aot_inductor.custom_op_libs=[':libstdc++.so.6']) whatever the C++ compiler would link"
)


def _extern_ops(extern: Any) -> list[str]:
    """The ops named in AOTInductor's extern-node JSON ({"nodes": [{"node": {"target": "ns::op"}}, ...]}): the
    calls its proxy executor makes into Python, by name without the overload."""
    nodes = extern.get("nodes") if isinstance(extern, dict) else None
    inner = (n.get("node") for n in (nodes if isinstance(nodes, list) else ()) if isinstance(n, dict))
    targets = (node.get("target") for node in inner if isinstance(node, dict))
    return [t.split(".")[0] for t in targets if isinstance(t, str) and "::" in t]


def _check_target(shown: str, meta: Mapping[str, str]) -> None:
    """Refuse a package built for another machine, device or torch (its own metadata says which)."""
    here = environment()
    wrong = []
    if meta.get("AOTI_PLATFORM", sys.platform) != sys.platform:
        wrong.append(f"platform {meta['AOTI_PLATFORM']} there, {sys.platform} here")
    device = meta.get("AOTI_DEVICE_KEY", "")
    if device == "cuda":
        cap = here["capability"]
        built = meta.get("AOTI_COMPUTE_CAPABILITY", "")
        if cap is None:
            wrong.append("a CUDA GPU there, none here")
        elif built and built != cap.replace(".", ""):
            wrong.append(f"compute capability {built} there, {cap.replace('.', '')} here")
    built_torch = meta.get(META_PREFIX + "torch")
    if built_torch is not None and built_torch != here["torch"]:
        wrong.append(f"torch {built_torch} there, {here['torch']} here")
    if wrong:
        raise DeployError(f"refusing package {shown}: {'; '.join(wrong)}; {_REBUILD}")


# Pytree node types a fresh `import torch` registers itself; any other type a package takes or returns (a
# transformers ModelOutput) is registered by importing its module, which `export` records.
_TORCH_PYTREE_MODULES = ("builtins", "collections", "torch")


def pytree_types(*specs: Any) -> dict[str, str]:
    """The pytree node types in `specs` (TreeSpecs: a program's inputs and outputs) that a fresh `import torch` does
    not register, by serialized name (what the package's call spec holds), each with the module defining it. Read
    from the serialized form, which is what the loader parses."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                names.add(node["type"])
            for child in node.get("children_spec") or ():
                walk(child)

    for spec in specs:
        if spec is not None:
            walk(json.loads(pytree.treespec_dumps(spec))[1])
    known = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
    return {
        name: known[name].__module__
        for name in sorted(names)
        if name in known and known[name].__module__.split(".")[0] not in _TORCH_PYTREE_MODULES
    }


def recorded(meta: Mapping[str, str], name: str, kind: type) -> Any:
    """The JSON value `export` recorded under META_PREFIX + `name`, where it is a `kind` (dict, list); an empty one
    where the package records none (an older export) or something else."""
    try:
        value = json.loads(meta.get(META_PREFIX + name) or "null")
    except ValueError:
        return kind()
    return value if isinstance(value, kind) else kind()


def pytree_modules(meta: Mapping[str, str]) -> list[str]:
    """The modules whose import registers the pytree types the package takes or returns, from its metadata
    (`export` records them); a process loading it (the probe child too) imports them first."""
    return sorted(set(recorded(meta, "pytree", dict).values()))


def _register_pytree_types(shown: str, meta: Mapping[str, str]) -> list[str]:
    """Import what registers the package's own pytree types (a transformers model's output class) where they are not
    registered yet; returns the modules, which the probe child imports too. One DeployError naming the type and the
    module where that fails."""
    types = recorded(meta, "pytree", dict)
    modules = sorted(set(types.values()))
    for module in modules:
        named = [n for n, m in types.items() if m == module]
        if all(n in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE for n in named):
            continue
        try:
            importlib.import_module(module)
        except Exception as e:
            raise DeployError(
                f"{shown} takes or returns {', '.join(named)}, which {module} defines, and importing it failed "
                f"here: {first_line(e)}; install it where the package runs"
            ) from None
        still = [n for n in named if n not in pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE]
        if still:
            raise DeployError(
                f"{shown} returns {', '.join(still)}, and importing {module} did not register it as a pytree node "
                "here (another version of that library?); export again where it runs"
            )
    return modules


def _is_triton_kernel(qualname: str) -> bool:
    """Is `qualname` one of fullgraph's Triton kernels (registered from fullgraph.kernels), not another op of ours?"""
    try:
        from torch._library.custom_ops import OPDEFS  # every op made by torch.library.custom_op / triton_op
    except ImportError:
        return False
    launcher = getattr(OPDEFS.get(qualname), "launcher", None)
    return getattr(launcher, "__module__", "").startswith("fullgraph.kernels.")


def _check_custom_ops(shown: str, meta: Mapping[str, str], ops: Sequence[str]) -> None:
    """Refuse a package whose Python custom ops cannot run here (call after `import fullgraph.ops`)."""
    missing = []
    for qualname in ops:
        namespace, _, name = qualname.partition("::")
        try:
            getattr(getattr(torch.ops, namespace), name)
        except (AttributeError, RuntimeError):
            missing.append(qualname)
    if missing:
        raise DeployError(
            f"{shown} calls custom ops through Python that nothing imported here registers ({', '.join(missing)}); "
            "import the module that defines them before loading (fullgraph's own come with fullgraph.ops)"
        )
    kernels = [op for op in ops if op.startswith("fullgraph::") and _is_triton_kernel(op)]
    device = meta.get("AOTI_DEVICE_KEY") or "cpu"
    runs, why = env.triton_runs_on(device) if kernels else (True, "")
    if not runs:
        raise DeployError(
            f"{shown} calls fullgraph's Triton kernels as opaque ops ({', '.join(kernels)}: exported where Inductor "
            f"could not trace into them, as under TRITON_INTERPRET=1), and they cannot run on {device} here: {why}; "
            "set TRITON_INTERPRET=1 before importing fullgraph, or export with the native policy "
            "(fullgraph.ops.policy(all='native'), `fullgraph export --ops none`)"
        )


# ---- the probe (fullgraph.deploy._probe) --------------------------------------------------------------------------


def probe(path: str | os.PathLike, *, device_index: int = -1, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Load the package in a child process (once per file content, torch and device: the verdict is cached) and
    return the verdict: {"ok": bool, "rc": exit code, "detail": the child's last line of output, ...}."""
    path = os.fspath(path)
    sha, meta, ops = _read_package(path)
    return run_probe(path, sha, device_index, timeout, ops, pytree_modules(meta))


# ---- load ---------------------------------------------------------------------------------------------------------


class PackageCall:
    """A package's model run through torch's C++ package loader: flattens the call's tensors by the package's input
    spec, runs them (`boxed_run`) and rebuilds the outputs by its output spec, both read once here."""

    def __init__(self, loader: Any):
        self.loader = loader
        inputs, outputs = loader.get_call_spec()
        self._in, self._out = pytree.treespec_loads(inputs), pytree.treespec_loads(outputs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:  # in the order the program was exported with, as torch's own wrapper does
            from torch.export._tree_utils import reorder_kwargs

            kwargs = reorder_kwargs(kwargs, self._in)
        flat = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        return pytree.tree_unflatten(self.loader.boxed_run(flat), self._out)

    def get_metadata(self) -> dict[str, str]:
        return self.loader.get_metadata()


def _device(meta: Mapping[str, str]) -> torch.device:
    """The device a package was exported for, as its metadata records it."""
    return torch.device(meta.get("AOTI_DEVICE_KEY") or "cpu")


def _cuda_index(meta: Mapping[str, str]) -> int | None:
    """The CUDA device a package runs on (its own index, or the current device), None for a CPU package."""
    device = _device(meta)
    if device.type != "cuda":
        return None
    return torch.cuda.current_device() if device.index is None else device.index


def _loader_class() -> Any:
    return getattr(torch._C._aoti, "AOTIModelPackageLoader", None)


def open_package(
    path: str,
    device_index: int = -1,
    model_name: str = "model",
    single_threaded: bool = False,
    runners: int = 1,
    release_gil: bool = False,
    metadata: Mapping[str, str] | None = None,
    say_fallback: bool = True,
) -> Callable:
    """The package's model, loaded by torch's C++ loader (`torch._C._aoti.AOTIModelPackageLoader`) directly. torch's
    `aoti_load_package` first reads the archive through torch.export's PT2 reader in Python: for a 190 MB package on
    the CPU that took 1.3 s of its 1.5 s, where the C++ loader alone took 0.16 s. Where this torch's loader class
    takes other arguments, `aoti_load_package` loads it. Unchecked: `load` checks the file first.

    `single_threaded=True` runs the model without the runtime's pool of model instances, whose bookkeeping queries a
    CUDA event at every call (`cudaEventQuery`, which a CUDA graph capture refuses: "operation not permitted when
    stream is capturing", H200, torch 2.11) and records one: the form to capture, callable from one thread at a
    time. Otherwise the pool holds `runners` instances of the model (AOTInductor's `num_runners`; one set of
    weights, an activation arena each): a call takes a free instance, and with one, a call waits until the previous
    call's kernels have finished on the GPU before it launches its own.

    `release_gil=True` runs the model through its library's C interface with the GIL released during the run
    (`fullgraph.deploy.direct`), where the package allows it; otherwise it loads it as above, warning with the reason
    when `say_fallback`. `metadata` is the package's, as `_read_package` reads it (its device)."""
    if release_gil:
        try:
            return direct.DirectCall(
                path, _device(metadata or {}).type, model_name=model_name, device_index=device_index,
                runners=runners, single_threaded=single_threaded,
            )  # fmt: skip
        except direct.Unfit as e:  # `direct.unfit`'s reasons: torch's loader runs it
            if say_fallback:
                warnings.warn(f"release_gil=True: {display_path(path)} runs through torch's loader, which holds the "
                              f"GIL: {e}", stacklevel=3)  # fmt: skip
    loader_class = _loader_class()
    if loader_class is not None:
        try:
            loader = loader_class(path, model_name, single_threaded, runners, device_index)
        except TypeError:  # another signature: torch's own route below
            pass
        else:
            return PackageCall(loader)
    if runners != 1:
        raise DeployError(f"runners={runners}: this torch's package loader takes no count of model instances")
    return torch._inductor.aoti_load_package(path, run_single_threaded=single_threaded, device_index=device_index)


class LoadedPackage:
    """A loaded AOTInductor package: call it like the exported model (`loaded(x)`)."""

    def __init__(
        self,
        path: str,
        sha256: str,
        metadata: Mapping[str, str],
        model: Callable,
        custom_ops: Sequence[str] = (),
        verdict: Mapping[str, Any] | None = None,
        check_indices: bool = True,
        gil_released: bool = False,
        runners: int = 1,
    ):
        self.path, self.sha256, self.metadata = path, sha256, dict(metadata)
        self.custom_ops = tuple(custom_ops)  # ops the package calls through Python ("fullgraph::rms_norm", ...)
        self.verdict = verdict  # the probe's (`probe`), or None when it was skipped
        self._model = model
        self._graphed = isinstance(model, GraphedCall)
        # whether each run releases the GIL (`load(..., release_gil=True)` where the package allows it)
        self.gil_released = gil_released
        self.runners = runners  # the model instances the runtime keeps (`load(..., runners=)`)
        # the forward's parameter names of the exported inputs, to call it by keyword as the model was
        self._names = tuple(recorded(self.metadata, "args", list))
        # the tensor inputs that index a table, by their index among the tensor inputs: {index: (lowest, highest)}
        ranges = recorded(self.metadata, "index_ranges", dict) if check_indices else {}
        self._index_ranges = {
            int(k): (v[0], v[1]) for k, v in ranges.items()
            if k.isdigit() and isinstance(v, list) and len(v) == 2 and all(isinstance(b, int) for b in v)
        }  # fmt: skip
        self._ooms = OomCount()
        # the package's CUDA device: bound on each calling thread (serving.bind_cuda_context)
        self._cuda_index = _cuda_index(self.metadata)
        with contextlib.suppress(Exception):  # the baseline of the device's out-of-memory count (a CUDA package)
            self._ooms.start(_device(self.metadata))

    @property
    def route(self) -> str:
        """How each call runs, in words (what `fullgraph load` prints)."""
        if self._graphed:
            return "replayed from a CUDA graph (cuda_graphs=True), one call at a time"
        if isinstance(self._model, OwnerThread):
            how = "on one thread of its own (serial=True)"
        else:
            how = f"{self.runners} model instance{'s' * (self.runners != 1)}"
        gil = "the GIL released during each run" if self.gil_released else "through torch's loader (the GIL held)"
        return f"{how}, {gil}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's output. Callable from many threads at once: the AOTInductor runner is (0 wrong of 200 calls
        from 4 threads on the H200), and with cuda_graphs=True, GraphedCall holds its own lock around a replay and
        the copy of its outputs. Failures are told apart on the error path only (`fullgraph.deploy._calls`)."""
        if self._cuda_index is not None:
            bind_cuda_context(self._cuda_index)  # a fresh thread: the package's driver-API launches need a context
        if kwargs:  # the package takes its inputs by position, as exported
            args, kwargs = self._by_position(args, kwargs), {}
        if self._index_ranges:
            self._check_indices(args)
        try:
            if self._graphed:
                with torch.no_grad():  # GraphedCall captures inference calls only; a package has no autograd anyway
                    return self._model(*args, **kwargs)
            return self._model(*args, **kwargs)
        except OutOfMemoryError:
            raise
        except torch.OutOfMemoryError as e:
            raise out_of_memory(display_path(self.path), args, kwargs, e) from None
        except Exception as e:
            if self._ooms.rose(cuda_device(args, kwargs)):  # the runtime passes one on as a generic RuntimeError
                raise out_of_memory(display_path(self.path), args, kwargs, e) from None
            unfit = self._unfit(args, kwargs, first_line(e))
            if unfit is None:
                raise
            raise unfit from None

    def _check_indices(self, args: tuple) -> None:
        """A UsageError naming the input where an integer input holds a value outside the table it indexes: the
        package's compiled code would fail a bounds check there, which aborts the process on the CPU (thrown
        inside an OpenMP region) and is a device-side assert, fatal to the process's CUDA context, on a GPU. One
        reduction and one device sync per such input."""
        tensors = [x for x in pytree.tree_leaves(args) if isinstance(x, torch.Tensor)]
        for i, (lowest, highest) in self._index_ranges.items():
            t = tensors[i] if i < len(tensors) else None
            if t is None or not t.numel() or t.is_floating_point() or t.dtype == torch.bool:
                continue
            low, high = torch.stack(torch.aminmax(t)).tolist()
            if low < lowest or high > highest:
                name = self._names[i] if len(self._names) == len(tensors) else f"tensor input {i}"
                raise UsageError(
                    f"{name} holds values {low} to {high}, and {display_path(self.path)} indexes a table with it "
                    f"that takes {lowest} to {highest}: outside it the package's compiled code would abort this "
                    "process; check the inputs (token ids past the vocabulary, another tokenizer's ids?)"
                )

    def _by_position(self, args: tuple, kwargs: Mapping[str, Any]) -> tuple:
        """`args` and `kwargs` as the positional inputs the package was exported with, matched by the forward's
        parameter names (`export` records them); a UsageError naming the names where they do not match."""
        names, shown = self._names, display_path(self.path)
        if not names:
            raise UsageError(
                f"{shown} takes its inputs by position (its export recorded no parameter names): call it as "
                f"loaded(*inputs), got keywords {', '.join(kwargs)}"
            )
        rest = names[len(args) :]
        if len(args) > len(names) or set(kwargs) != set(rest):
            raise UsageError(
                f"{shown} was exported with inputs ({', '.join(names)}); got {len(args)} by position and "
                f"{', '.join(kwargs)} by name: give each of them once, by position or by name"
            )
        return (*args, *(kwargs[n] for n in rest))

    def _unfit(self, args: Any, kwargs: Mapping[str, Any], msg: str) -> UsageError | None:
        """The UsageError for inputs that do not fit the package, named by its own input checks (`msg`, on the CPU)
        or by comparing them with the inputs it records (a GPU's runtime gives generic words); None when they fit."""
        given = input_signature(args, kwargs)
        if "input_handles[" in msg or "expected inputs vector size" in msg:
            why = msg
        else:
            why = misfit(given, self.inputs, dynamic_ranges(self.metadata, META_PREFIX))
            if why is None:
                return None
        dims = self.metadata.get(META_PREFIX + "dynamic")
        declared = f", dynamic dims {dims}" if dims and dims != "{}" else ", every dim fixed"
        return UsageError(
            f"these inputs ({given}) do not fit {display_path(self.path)} ({why}); it was exported for "
            f"{self.inputs or 'other inputs'}{declared}: export it again for these inputs or declare the dim "
            "dynamic (fullgraph.deploy.export(..., dynamic=...))"
        )

    @property
    def graphs(self) -> GraphedCall | None:
        """The CUDA-graph wrapper when loaded with cuda_graphs=True (its `.graphs` and `.skipped` per signature)."""
        return self._model if self._graphed else None

    @property
    def inputs(self) -> str | None:
        """The example inputs it was exported with (`input_signature`), when `export` built it."""
        return self.metadata.get(META_PREFIX + "inputs")

    def __repr__(self) -> str:
        return f"LoadedPackage({display_path(self.path)!r}, inputs={self.inputs!r})"


def load(
    path: str | os.PathLike,
    *,
    device_index: int = -1,
    probe_first: bool = True,
    probe_timeout: float = PROBE_TIMEOUT_S,
    cuda_graphs: bool = False,
    runners: int | None = None,
    serial: bool = False,
    check_indices: bool = True,
    release_gil: bool | None = None,
) -> LoadedPackage:
    """Load an AOTInductor package as a callable, without risking this process.

    The file is checked first (see the module docstring), and so are the custom ops it calls through Python:
    registered here and, for our Triton kernels, runnable on the package's device. Then, with `probe_first` (the
    default), it is loaded once in a child process and loaded here only if that worked: a crash there (a
    segmentation fault in torch's native loader, say) becomes a DeployError naming the exit. The verdict is cached
    by the file's content, so later loads of the same file skip the probe; one takes `probe_timeout` seconds at
    most. `device_index` picks the GPU (-1: the current one). `cuda_graphs=True` (a CUDA package) replays each call
    signature from a CUDA graph after its first two calls (`fullgraph.compile.GraphedCall`: the package's kernel
    launches without the host between them, which is what small batches wait on); calls run under no_grad, and the
    model runs single-threaded (`open_package`), and GraphedCall serialises its calls. Either way the result is
    callable from many threads at once (`LoadedPackage.__call__`). `runners` (without cuda_graphs) is how many
    instances of the model the runtime keeps, so that calls from several threads, or one thread's next call, need
    not wait for the previous call's kernels (`open_package`); each costs one more activation arena, not weights.
    By default (None) a CUDA package without cuda_graphs or serial keeps `DEFAULT_CUDA_RUNNERS` (2), anything else
    one.
    `serial=True` (without cuda_graphs) runs one instance single-threaded on a thread of the package's own, fed by a
    queue (`fullgraph.serving.OwnerThread`): every launch comes from that one thread, whichever thread calls; no
    event bookkeeping per call, no wait inside the runtime for the previous call; one thread hop per call.
    `check_indices` (the default) checks, before each call, the integer inputs that the package uses to index a
    table (token ids into an embedding, as `export` records): a value outside the table is a UsageError naming the
    input, where the compiled code would abort the process (CPU) or its CUDA context (GPU). It costs one reduction
    and one device sync per such input; a package with none pays nothing.
    `release_gil=True` calls the model's library through its C interface, with the GIL released while it runs
    (`fullgraph.deploy.direct`): torch's loader holds the GIL through the whole run, so another thread can do nothing
    while one call launches its kernels. Same outputs, same errors; a package that needs torch's proxy executor or
    keeps its weights outside its library loads as before, with a warning saying why. By default (None) a CUDA
    package without cuda_graphs is called that way where it can be, and through torch's loader without a word where
    it cannot (`loaded.gil_released` says which); a CPU package goes through torch's loader. The defaults are what
    served the uncaptured DiT package best from 1 and 4 threads on an H100 (docs/deploy.md, "Many threads"): 733 /
    761 calls/s with the GIL released and two instances, against 666 / 592 through torch's loader with one.
    Security: a package is a shared library and pickles; only files that no one else can write are loaded.
    """
    path = os.fspath(path)
    shown = display_path(path)
    if runners is not None and (isinstance(runners, bool) or not isinstance(runners, int) or runners < 1):
        raise UsageError(
            f"runners={runners!r}: give how many model instances to keep, a positive int (default "
            f"{DEFAULT_CUDA_RUNNERS} for a CUDA package without cuda_graphs or serial, else 1)"
        )
    if cuda_graphs and runners not in (None, 1):
        raise UsageError(f"runners={runners} with cuda_graphs=True: the replayed model runs single-threaded; drop one")
    if serial and (cuda_graphs or runners not in (None, 1)):
        other = "cuda_graphs=True (which runs it single-threaded already)" if cuda_graphs else f"runners={runners}"
        raise UsageError(f"serial=True with {other}: serial runs one model instance on one thread; drop one")
    sha, meta, ops = _read_package(path)
    if ops:  # only then: fullgraph.ops imports Dynamo and Triton, which loading a package needs no more
        import fullgraph.ops  # registers our custom ops, which the package calls

        fullgraph.ops.register_ops(ops)  # and those that register on first use
        _check_custom_ops(shown, meta, ops)
    modules = _register_pytree_types(shown, meta)
    device = meta.get("AOTI_DEVICE_KEY") or "cpu"
    if cuda_graphs and not device.startswith("cuda"):
        raise UsageError(f"cuda_graphs=True: {shown} runs on {device}; CUDA graphs need a package exported on a GPU")
    uncaptured_cuda = device.startswith("cuda") and not cuda_graphs  # the defaults' case, serial or pooled
    if runners is None:
        runners = DEFAULT_CUDA_RUNNERS if uncaptured_cuda and not serial else 1
    asked_gil = release_gil is not None  # only a release asked for says why it could not be
    release_gil = uncaptured_cuda if release_gil is None else release_gil
    verdict = None
    if probe_first:
        verdict = run_probe(path, sha, device_index, probe_timeout, ops, modules)
        if not verdict["ok"]:
            seen = " (verdict cached from an earlier probe of this file)" if verdict["cached"] else ""
            how = "crashed" if verdict["rc"] < 0 else "failed in"
            raise DeployError(
                f"loading {shown} {how} a probe process ({exit_text(verdict['rc'])}: {verdict['detail']}){seen}; "
                f"not loaded here. {_REBUILD}, or use cache artifacts (fullgraph.deploy.save_cache) instead"
            )
    # Every package has input checks compiled in, which read this variable at its first call: on, a call with
    # inputs of other shapes, dtypes or devices than exported fails by name instead of computing garbage.
    os.environ.setdefault(CHECK_INPUTS_ENV, "1")
    try:
        model = open_package(path, device_index, single_threaded=cuda_graphs or serial, runners=runners,
                             release_gil=release_gil, metadata=meta, say_fallback=asked_gil)  # fmt: skip
    except Exception as e:  # the loader raises RuntimeError for most problems, others for a few
        raise DeployError(f"torch could not load {shown}: {first_line(e)}; {_REBUILD}") from e
    released = isinstance(model, direct.DirectCall)
    if cuda_graphs:
        model = GraphedCall(model, name=os.path.basename(path))
    elif serial:
        index = _cuda_index(meta)
        model = OwnerThread(
            model, cuda_index=index, on_start=None if index is None else functools.partial(bind_cuda_context, index),
            name=f"fullgraph {os.path.basename(path)}",
        )  # fmt: skip
    return LoadedPackage(os.path.abspath(path), sha, meta, model, ops, verdict, check_indices=check_indices,
                         gil_released=released, runners=runners)  # fmt: skip
