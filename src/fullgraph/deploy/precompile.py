"""Dynamo precompilation: a model's call compiled ahead of time into one file, loaded by a new process that then
runs it with no Dynamo tracing and no Inductor compile.

`save_precompiled` captures `model(*inputs)` in one graph for the example inputs with
`torch.compile(fn, fullgraph=True).aot_compile(...)` (torch 2.11 and later; `fn` takes the model as its first
input), compiles it with Inductor,
and writes what that returns (the compiled code, its guards and the Python glue) with a header saying where it was
made. `load_precompiled(path, model)` checks the header, deserializes it with
`torch.compiler.load_compiled_function` and returns a callable that runs `model` through the compiled
code. The weights are not in the file: they are read from `model` at each call, so the same file serves any
instance of the same class with the same parameter shapes.

Where it differs from the other warm starts: cache artifacts (`fullgraph.deploy.cache`) skip Inductor but Dynamo
still traces the model in the new process; an AOTInductor package (`fullgraph.deploy.package`) skips both, but
goes through torch.export and a shared library loaded by native code (which crashed on the H200 image). Here the
loaded code is Python (Inductor's output module) and kernels: on a GPU the Triton kernels travel compiled inside
the file; on a CPU the C++ kernels travel as source and are built by the C++ compiler when the file is loaded,
unless the Inductor cache folder already holds them.

What the file holds is checked at each call by torch's guards: other shapes, dtypes or devices than precompiled
(outside a range declared with `dynamic=`), another module class, or a changed global setting make the call
raise a DeployError naming the guard that failed, instead of recompiling.

Calls run under `torch.no_grad()`: the graph is an inference graph, compiled with autograd off.

CUDA graphs: torch applies its CUDA-graph trees to loaded code only where Inductor's `triton.cudagraphs` is on in
the loading process when the file is loaded (`deserialize_bundled_cache_entry` reads the global setting; the
mode saved with the file is not consulted), so a file precompiled with `mode="reduce-overhead"` ran every kernel
launch from Python: 2.2 ms a call at timm ViT-S/16 batch 4 on the H200 against 0.59 for torch.compile's
reduce-overhead (`benchmarks/precompiled_probe.py`). Such a file (`meta.cuda_graphs`) is loaded behind
`fullgraph.compile.GraphedCall` instead: the first call of each input signature runs the code, the second
captures it in a CUDA graph, later ones replay it. The weights are captured by address: update them in place
(`load_state_dict`, `copy_`), never by assigning new tensors to the model.

Security: the file is a pickle of code objects that run when loaded. `load_precompiled` refuses a file that
another user owns or that anyone but its owner can write, like the other loaders (fullgraph.deploy._common).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import os
import platform
import re
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

# Inductor's runtime, which the loader runs through, imported with this module rather than inside the first load:
# torch imports it lazily (~500 modules, 1-4 s without bytecode), and a replica's first request should not pay that.
import torch._inductor.compile_fx
from torch.utils import _pytree as pytree

import fullgraph.ops  # noqa: F401 - compiling here: our ops registered and torch's compile caches tagged first
from fullgraph._files import disk_full, temp_dir_beside
from fullgraph._paths import display_path
from fullgraph.compile.dynamic import check_dynamic_spec, declare_dynamic
from fullgraph.compile.graphs import GraphedCall
from fullgraph.deploy._common import (
    DeployError,
    environment,
    input_signature,
    mismatches,
    open_trusted,
    parse_framed,
    read_framed,
    write_private,
)
from fullgraph.env import first_line
from fullgraph.errors import UsageError
from fullgraph.serving import OutOfMemoryError, copy_out, guard_for, out_of_memory

MAGIC = b"FULLGRAPH-PRECOMPILED\n"
FORMAT = 1
MIN_TORCH = (2, 11)  # aot_compile as used here: bound methods, guards on the module, dynamic=; 2.9/2.10 differ
# Header keys that must equal this process's: torch refuses another Python or torch itself (with less clear
# errors), and compiled kernels belong to one triton and one GPU.
ENVIRONMENT_KEYS = ("python", "torch", "triton", "fullgraph", "device", "capability")
_FIX = "precompile the model again in this environment (fullgraph.deploy.save_precompiled)"


class NotPrecompilable(DeployError):
    """The model cannot be precompiled in this torch (a graph break, or a guard torch cannot write to a file): the
    message names the cause and the routes that remain. `fullgraph cache warm` says it and publishes nothing."""


@dataclass(frozen=True)
class PrecompiledMeta:
    """The header of a precompiled file: where it was made, for which model and inputs, and a checksum."""

    python: str
    torch: str
    triton: str | None
    fullgraph: str
    device: str  # GPU name, or "cpu"
    capability: str | None
    model: str  # the module class, "package.module.Class"
    signature: str  # the example inputs, fullgraph.deploy.input_signature
    dynamic: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # {"x": {"0": [2, 64]}}
    mode: str | None = None
    cuda_graphs: bool = False  # the compiled code replays torch's CUDA-graph trees (a mode or option on a GPU)
    payload_sha256: str = ""
    payload_bytes: int = 0
    created: str = ""
    format: int = FORMAT


def _here() -> dict[str, Any]:
    return {**environment(), "python": platform.python_version()}


def _class_name(model: torch.nn.Module) -> str:
    cls = type(model)
    return f"{cls.__module__}.{cls.__qualname__}"


def unsupported_reason() -> str | None:
    """Why this torch cannot precompile (one line), or None when it can."""
    version = torch.__version__
    release = tuple(int(p) for p in re.findall(r"\d+", str(version).split("+")[0])[:2])
    if release < MIN_TORCH or not hasattr(torch.compiler, "load_compiled_function"):
        need = ".".join(map(str, MIN_TORCH))
        return (
            f"precompiling needs torch {need} or later (torch.compile(...).aot_compile and "
            f"torch.compiler.load_compiled_function), this is torch {version}; use cache artifacts "
            "(fullgraph.deploy.save_cache) instead"
        )
    return None


def _require_api() -> None:
    reason = unsupported_reason()
    if reason:
        raise DeployError(reason)


def _call_model(model: torch.nn.Module, *args: Any) -> Any:
    """What is compiled: a call of the model passed in. The model is an input, not part of the compiled function
    (torch refuses to serialize a module it finds inside one, as in the wrapper it puts around a bound
    `forward` of torch's own modules, nn.Sequential's say), and its weights are read at each call."""
    return model(*args)


def _aot_compile(model: torch.nn.Module, args: tuple, mode: str | None, options: Mapping[str, Any] | None,
                 declared: bool = False) -> Any:  # fmt: skip
    """`model(*args)` captured and compiled: torch's AOTCompiledFunction, called as fn(model, *args).

    Static unless dims were declared (`declared`: marked on the inputs): every precompile compiles the one function
    `_call_model`, so under torch's automatic dynamic shapes a second precompile in a process, at another size,
    came out dynamic (its guard then accepted sizes it was never meant for), depending on what the process had
    compiled before."""
    # Off by default before torch 2.13; read when torch.compile builds its wrapper, so it is set around that call.
    patch = {"enable_aot_compile": True} if hasattr(torch._dynamo.config, "enable_aot_compile") else {}
    dynamic = None if declared else False
    with torch._dynamo.config.patch(patch):
        wrapper = torch.compile(_call_model, fullgraph=True, backend="inductor", mode=mode, options=options,
                                dynamic=dynamic)  # fmt: skip
    if not hasattr(wrapper, "aot_compile"):
        raise DeployError(f"torch {torch.__version__} offers no torch.compile(...).aot_compile here; {_FIX}")
    with torch.no_grad():
        return wrapper.aot_compile(((model, *args), {}))


def save_precompiled(
    model: torch.nn.Module,
    example_inputs: Sequence[Any],
    path: str | os.PathLike,
    *,
    dynamic: Mapping[str, Mapping[int, tuple[int, int]]] | None = None,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> PrecompiledMeta:
    """Compile a call of `model` on `example_inputs` (a tuple of positional inputs, on the device to run on) ahead
    of time and write it to `path`, whole or not at all, with mode 0644; returns the header written.

    `dynamic={"x": {0: (2, 64)}}` declares input dims dynamic with their ranges, named as in `fullgraph.compile`;
    every other dim is fixed at its example size. Dynamo specializes sizes 0 and 1, so a range is served from 2
    on (a size-1 call fails its guard). `mode` and `options` are torch.compile's (Inductor's). The call is
    `model(*inputs)`, so forward hooks registered at save time are traced into it. Compiles in this process, under
    `torch.no_grad()`; nothing is installed on `model`, whose own calls stay eager.
    """
    _require_api()
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"save_precompiled takes an nn.Module, not {type(model).__name__}")
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    spec = check_dynamic_spec(dynamic or {})
    # Marked on aliases, so that the caller's tensors carry no dynamic marks afterwards.
    args = pytree.tree_map_only(torch.Tensor, lambda t: t.detach(), args)
    if spec:
        declare_dynamic(model, args, {}, spec)
    if torch._inductor.config.force_disable_caches:
        raise DeployError(
            "precompiling needs Inductor's caches, which are disabled here "
            "(TORCHINDUCTOR_FORCE_DISABLE_CACHES or torch._inductor.config.force_disable_caches); unset it"
        )
    try:
        compiled = _aot_compile(model, args, mode, options, declared=bool(spec))
    except DeployError:
        raise
    except Exception as e:  # Dynamo reports graph breaks and unsupported code, Inductor its lowering failures
        if "guard cannot be serialized" in str(e):  # torch's PackageError, raised as it saves the guards
            raise NotPrecompilable(
                f"torch {torch.__version__} cannot save {type(model).__name__}'s compiled code: {first_line(e)} "
                "(its graph is guarded on the identity of a Python object, such as a library's enum member or a "
                "method passed as an argument, and torch cannot write that check to a file); serve it from an AOT "
                "package (fullgraph.deploy.export) or compile it through the remote cache "
                "(fullgraph.deploy.remote_cache)"
            ) from e
        raise NotPrecompilable(
            f"could not precompile {type(model).__name__} in one graph: {first_line(e)}; run "
            "`fullgraph doctor TARGET` on the model: it shows each graph break with its source line and fix"
        ) from e
    unfindable = _kernels_not_found_by_name()
    if unfindable:
        raise NotPrecompilable(
            f"cannot precompile {type(model).__name__} in this process: torch {torch.__version__} saves every Triton "
            "kernel the process has traced as its module and name, and loads it by importing that module and "
            f"reading that name, which finds nothing for {', '.join(unfindable)} (defined inside a function or the "
            "main script, or bound to another name): define those kernels at module level of an importable module, "
            "under their own names, or precompile in a process that never traced them"
        )
    payload = _serialize(compiled, os.fspath(path))
    meta = PrecompiledMeta(
        **_here(),
        model=_class_name(model),
        signature=input_signature(args),
        dynamic={k: {str(d): list(r) for d, r in v.items()} for k, v in spec.items()},
        mode=mode,
        cuda_graphs=_replays_graphs(mode, options) and "@cuda" in input_signature(args),
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        payload_bytes=len(payload),
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    header = json.dumps(asdict(meta), sort_keys=True).encode() + b"\n"
    write_private(path, (MAGIC, header, payload))
    return meta


def _kernels_not_found_by_name() -> list[str]:
    """The Triton kernels of the process's side table (every user kernel Dynamo traced, this model's or not) that
    torch's loader could not find again: it imports each one's module and reads its name, so a kernel defined
    inside a function makes every file precompiled in this process unloadable ("module has no attribute")."""
    try:
        from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    except ImportError:
        return []
    missing = []
    for kernel in list(kernel_side_table.id_to_kernel.values()):
        fn = getattr(kernel, "fn", None)
        module, name = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
        found = getattr(sys.modules.get(module or ""), name or "", None)
        if module == "__main__":  # another process's main script is another module
            found = None
        if found is None or not (found is kernel or found is fn or getattr(found, "fn", None) is fn):
            missing.append(f"{module}.{getattr(fn, '__qualname__', name)}")
    return missing


def _replays_graphs(mode: str | None, options: Mapping[str, Any] | None) -> bool:
    """Does code compiled with this mode or these Inductor options replay CUDA graphs (on a GPU)?"""
    chosen = {**(torch._inductor.list_mode_options(mode) if mode else {}), **(options or {})}
    return bool(chosen.get("triton.cudagraphs", torch._inductor.config.triton.cudagraphs))


def _serialize(compiled: Any, path: str) -> bytes:
    """The bytes torch writes for a compiled function (save_compiled_function takes a path), via a private
    folder beside `path` (`fullgraph._files.temp_dir_beside`: a killed save's is removed by the next one)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    work = temp_dir_beside(path)
    try:
        raw = os.path.join(work, "compiled.bin")
        try:
            compiled.save_compiled_function(raw)
        except Exception as e:  # a backend whose output torch cannot serialize, an object in the closure, ...
            full = disk_full(path, e)
            if full is not None:
                raise full from None
            raise DeployError(f"torch could not serialize the precompiled model: {first_line(e)}") from e
        with open(raw, "rb") as f:
            return f.read()
    finally:
        shutil.rmtree(work, ignore_errors=True)


# How a precompiled file is framed and named in refusals (fullgraph.deploy._common.parse_framed's arguments).
_FRAME = {"kind": "precompiled", "magic": MAGIC, "fmt": FORMAT, "meta_cls": PrecompiledMeta, "fix": _FIX,
          "make": "fullgraph.deploy.save_precompiled", "contents": "compiled code"}  # fmt: skip


def read_precompiled(path: str | os.PathLike) -> tuple[PrecompiledMeta, bytes]:
    """The header and the payload of a precompiled file, after the ownership and permission checks and the
    checksum; nothing is unpickled."""
    return read_framed(path, what="precompiled model", **_FRAME)


class PrecompiledModel:
    """A precompiled call bound to a model: call it like the model (`loaded(x)`), under `torch.no_grad()`.

    Callable from many threads at once. Code that replays CUDA graphs (`meta.cuda_graphs`, on a GPU) goes through
    a `GraphedCall` (module docstring), which holds its lock around a replay and copies the outputs out inside
    it. Otherwise each call runs under the model class's `CallGuard` (`fullgraph.serving`), so the compiled code's
    lazy set-up at a first call runs once; where torch's own CUDA-graph trees replay (Inductor's `triton.cudagraphs`
    on when the file was loaded), the outputs are copied out inside the guard and the trees' per-thread state is
    the guard's whichever thread calls. `borrow` skips the copy."""

    def __init__(self, path: str, meta: PrecompiledMeta, model: torch.nn.Module, compiled: Any, *, trees: bool = False):
        self.path, self.meta, self.model = path, meta, model
        self._compiled = compiled
        graphs = meta.cuda_graphs or (meta.device != "cpu" and _replays_graphs(meta.mode, None))
        on_gpu = "@cuda" in meta.signature  # the inputs' device (meta.device is the machine's GPU, if any)
        self._graphed = GraphedCall(self._bare, name=display_path(path)) if graphs and on_gpu and not trees else None
        self._trees = graphs and self._graphed is None  # torch's trees replay inside the code (or a stand-in's)
        self._guard = guard_for(type(model))
        if self._trees:
            self._guard.graph_trees = True

    @property
    def graphs(self) -> GraphedCall | None:
        """The `GraphedCall` that captures and replays this model's CUDA graphs, or None where none does."""
        return self._graphed

    def __call__(self, *args: Any) -> Any:
        """The model's output for these positional inputs (precompiled for positional inputs only), the caller's
        own: copied out of the CUDA graph's memory where one replays."""
        if self._graphed is not None:
            with torch.no_grad():  # GraphedCall captures inference calls only
                return self._graphed(*args)
        with self._guard:
            out = self._run(args)
            return copy_out(out) if self._trees else out

    @contextlib.contextmanager
    def borrow(self, *args: Any) -> Iterator[Any]:
        """`with loaded.borrow(x) as out:` the output without a copy, valid inside the block only: the model's
        lock is held until the block ends, so no other thread's call can overwrite it meanwhile."""
        if self._graphed is not None:
            with torch.no_grad(), self._graphed.borrow(*args) as out:
                yield out
            return
        with self._guard:
            yield self._run(args)

    def _bare(self, *args: Any) -> Any:
        """One call of the code, what GraphedCall runs and captures (under its own lock)."""
        with self._guard:  # the class's guard: the compiled code's lazy set-up at its first call runs once
            return self._run(args)

    def _run(self, args: tuple) -> Any:
        """One call, inside the guard; torch's out-of-memory and guard failures as our errors."""
        if self._trees and "@cuda" in self.meta.signature:
            self._guard.follow_stream()
        try:
            with torch.no_grad():
                out = self._compiled(self.model, *args)
                if self._trees and self._guard.warmed_up():  # record on this thread now (CallGuard.warmed_up)
                    del out
                    out = self._compiled(self.model, *args)
                return out
        except OutOfMemoryError:
            raise
        except torch.OutOfMemoryError as e:
            if self._trees:
                self._guard.recover_trees()
            raise out_of_memory(display_path(self.path), args, None, e) from None
        except RuntimeError as e:
            if not str(e).startswith("GuardManager check failed"):
                raise
            guard = _failed_guard(str(e), self.model)
            hint = ", or declare the dim dynamic (save_precompiled(..., dynamic=))" if "size" in guard else ""
            raise DeployError(
                f"{display_path(self.path)} was precompiled for inputs {self.meta.signature}, not "
                f"{input_signature(args)}: {guard}; precompile again for these inputs{hint}"
            ) from None

    def __repr__(self) -> str:
        return f"PrecompiledModel({display_path(self.path)!r}, {self.meta.model}, inputs={self.meta.signature!r})"


def _failed_guard(message: str, model: torch.nn.Module) -> str:
    """The first failed guard in torch's GuardDebugInfo text, without its source comment, inputs by their names in
    the model's forward (torch names them L['args'][0], the model L['model'])."""
    found = re.search(r"verbose_code_parts=\[\s*(['\"])(.*?)\1", message, re.S)
    if not found:
        return "a guard failed"
    guard = found.group(2).split("  #")[0].strip()
    with contextlib.suppress(TypeError, ValueError):
        names = list(inspect.signature(model.forward).parameters)
        guard = re.sub(r"L\['args'\]\[(\d+)\]", lambda m: names[int(m[1])] if int(m[1]) < len(names) else m[0], guard)
    return "guard " + guard.replace("L['model']", "the model")[:200]


def load_precompiled(
    path: str | os.PathLike, model: torch.nn.Module, *, signature: str | None = None
) -> PrecompiledModel:
    """Load a file written by `save_precompiled` as a callable that runs `model` (same class, any weights of the
    same shapes) through the precompiled code: its first call traces nothing and compiles nothing.

    Refused, with one line naming the cause, before anything is unpickled: a file another user owns or that others
    can write, a damaged or truncated file, a file made with another Python, torch, triton or fullgraph or on another
    GPU (or on the CPU for a GPU, and back), for another module class, and, when given, for other inputs than
    `signature` (`input_signature(x)`).
    """
    _require_api()
    path = os.fspath(path)
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"load_precompiled takes the nn.Module to run, not {type(model).__name__}")
    meta, payload = read_precompiled(path)
    return _load(os.path.abspath(path), meta, payload, model, signature)


def precompiled_bytes(path: str | os.PathLike) -> bytes:
    """A precompiled file's bytes, whole (header and payload), after the same checks as `load_precompiled`'s:
    what `fullgraph.deploy.published` sends to a fleet's Redis."""
    with open_trusted(path, "precompiled model") as f:
        data = f.read()
    parse_framed(data, display_path(path), **_FRAME)
    return data


def load_precompiled_bytes(data: bytes, model: torch.nn.Module, *, name: str, signature: str | None = None):
    """`load_precompiled` on a file's bytes held in memory (fetched from a fleet's Redis); `name` says where from
    in messages. The same header checks; the bytes' origin is the caller's to vouch for (a signature)."""
    _require_api()
    meta, payload = parse_framed(data, name, **_FRAME)
    return _load(name, meta, payload, model, signature)


def _load(path: str, meta: PrecompiledMeta, payload: bytes, model: torch.nn.Module, signature: str | None):
    shown = display_path(path)
    wrong = mismatches(asdict(meta), _here(), ENVIRONMENT_KEYS)
    if meta.model != _class_name(model):
        wrong.append(f"model {meta.model} there, {_class_name(model)} here")
    if signature is not None and signature != meta.signature:
        wrong.append(f"inputs {meta.signature} there, {signature} here")
    if wrong:
        raise DeployError(f"refusing precompiled model {shown}: {'; '.join(wrong)}; {_FIX}")
    trees = bool(torch._inductor.config.triton.cudagraphs)  # read by torch as it loads the code (module docstring)
    try:
        compiled = torch.compiler.load_compiled_function(io.BytesIO(payload))
    except Exception as e:  # torch's unpickler and compatibility checks raise what they meet
        raise DeployError(f"torch could not load the precompiled model {shown}: {first_line(e)}; {_FIX}") from e
    return PrecompiledModel(path, meta, model, compiled, trees=trees)
