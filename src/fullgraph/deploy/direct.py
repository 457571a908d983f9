"""A package's model run through its shared library's C interface, with the GIL released while it runs.

torch's package loader (`torch._C._aoti.AOTIModelPackageLoader.boxed_run`) holds the GIL through the whole run of
the model: on a GPU that is every kernel launch, and a DiT-B call at batch 1 is bound by them (H100, torch 2.11:
~1.4 ms of launches against ~0.4 ms of GPU work). A second Python thread can do nothing meanwhile, not even take
its own input or its previous output, so from 4 threads the package served 0.94x its 1-thread rate (issue 31,
docs/deploy.md). Every AOTInductor model library exports the same C functions (torch's
`aoti_runtime/interface.h`: `AOTInductorModelContainerCreateWithDevice`, `...Run`, `...RunSingleThreaded`, ...),
and ctypes releases the GIL around each foreign call: called that way, other threads run Python while one thread's
call launches, and with `runners` > 1 several calls launch at once.

What it takes: the model library and its kernel binaries extracted from the archive into a private folder (as
torch's loader does), the container created on the package's device, and per call the inputs' tensor handles
(`torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors`, which the run takes over) and the outputs' (turned back into
tensors by `alloc_tensors_by_stealing_from_void_ptrs`). It does not serve packages that need torch's proxy executor
(ops run outside the library: a `<library>.json` of extern nodes beside it) or keep their weights outside the
library (`data/weights/`, `data/constants/`): `unfit` says why, and `load` opens those with torch's loader.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import tempfile
import weakref
import zipfile
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

_H = ctypes.c_void_p
_SIZE = ctypes.c_size_t


class Unfit(RuntimeError):
    """A package the direct route cannot run (`unfit`'s reasons, or a library without a function it calls)."""


@functools.cache
def _capsules() -> tuple[Any, Any]:
    """ctypes' view of CPython's capsule functions: torch's handle helpers pass `void*` as unnamed capsules."""
    api = ctypes.PyDLL(None)  # this process's CPython, called with the GIL held
    get, new = api.PyCapsule_GetPointer, api.PyCapsule_New
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return get, new


def _model_dir(names: Sequence[str], model_name: str) -> str | None:
    """The archive folder holding the model's library (`[prefix/]data/aotinductor/<model_name>/`), or None."""
    for name in names:
        head, sep, _ = name.partition(f"data/aotinductor/{model_name}/")
        if sep and name.endswith(".so") and (not head or head.endswith("/")):
            return head + f"data/aotinductor/{model_name}/"
    return None


def unfit(names: Sequence[str], model_name: str = "model") -> str | None:
    """Why the direct route cannot run the package whose archive holds `names` (None when it can)."""
    if not hasattr(torch._C._aoti, "unsafe_alloc_void_ptrs_from_tensors"):
        return f"torch {torch.__version__} has no tensor-handle helpers (torch._C._aoti.unsafe_alloc_void_ptrs_...)"
    folder = _model_dir(names, model_name)
    if folder is None:
        return f"no compiled model library under data/aotinductor/{model_name}/"
    libraries = [n for n in names if n.startswith(folder) and n.endswith(".so")]
    if len(libraries) != 1:
        return f"{len(libraries)} model libraries in {folder}"
    if libraries[0][: -len(".so")] + ".json" in names:
        return "it calls ops outside its library (an extern-node file for torch's proxy executor)"
    if any(("/data/weights/" in "/" + n) or ("/data/constants/" in "/" + n) for n in names):
        return "its weights are stored beside its library, which torch's loader reads in"
    return None


class DirectCall:
    """A package's model, called like the exported model, run through its library's C interface with the GIL
    released (module docstring). `runners` model instances (AOTInductor's `num_runners`); `single_threaded` runs
    the model without the runtime's pool (`RunSingleThreaded`, the form a CUDA graph can capture, one caller at a
    time). The model's folder is removed when the object is collected."""

    def __init__(
        self,
        path: str,
        device: str,
        *,
        model_name: str = "model",
        device_index: int = -1,
        runners: int = 1,
        single_threaded: bool = False,
    ):
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            why = unfit(names, model_name)
            if why:
                raise Unfit(why)
            folder = _model_dir(names, model_name)
            assert folder is not None
            self._dir = tempfile.mkdtemp(prefix="fullgraph-direct-")  # 0700: only this user can swap the library
            for name in names:
                if name.startswith(folder) and not name.endswith("/"):
                    z.extract(name, self._dir)
        try:
            self._open(folder, device, device_index, runners, single_threaded)
        except BaseException:
            shutil.rmtree(self._dir, True)
            raise

    def _open(self, folder: str, device: str, device_index: int, runners: int, single_threaded: bool) -> None:
        model_dir = os.path.join(self._dir, folder)
        library = next(os.path.join(model_dir, n) for n in os.listdir(model_dir) if n.endswith(".so"))
        self._lib = lib = ctypes.CDLL(library)  # CDLL: the GIL is released around every call into it
        run = [_H, ctypes.POINTER(_H), _SIZE, ctypes.POINTER(_H), _SIZE, _H, _H]
        text = ctypes.POINTER(ctypes.c_char_p)
        for suffix, args in (
            ("CreateWithDevice", [ctypes.POINTER(_H), _SIZE, ctypes.c_char_p, ctypes.c_char_p]),
            ("Delete", [_H]),
            ("GetNumInputs", [_H, ctypes.POINTER(_SIZE)]),
            ("GetNumOutputs", [_H, ctypes.POINTER(_SIZE)]),
            ("GetCallSpec", [_H, text, text]),
            ("Run", run),
            ("RunSingleThreaded", run),
        ):
            name = "AOTInductorModelContainer" + suffix
            if not hasattr(lib, name):  # a library from a torch without it
                raise Unfit(f"{os.path.basename(library)} has no {name}")
            function = getattr(lib, name)
            function.argtypes, function.restype = args, ctypes.c_int32
        # the message of this thread's last failed call, where the library has it (newer torch): rc = f(&message)
        self._last_error = getattr(lib, "AOTInductorGetLastError", None)
        if self._last_error is not None:
            self._last_error.argtypes = [ctypes.POINTER(ctypes.c_char_p)]
            self._last_error.restype = ctypes.c_int32
        self.device = torch.device(device if device_index < 0 or device == "cpu" else f"{device}:{device_index}")
        handle = _H()
        create = lib.AOTInductorModelContainerCreateWithDevice
        where = str(self.device).encode()
        self._check(create(ctypes.byref(handle), runners, where, model_dir.encode()), "create its model")
        self._handle = handle
        self._finalizer = weakref.finalize(self, _release, lib.AOTInductorModelContainerDelete, handle, self._dir)
        n_in, n_out = _SIZE(), _SIZE()
        self._check(lib.AOTInductorModelContainerGetNumInputs(handle, ctypes.byref(n_in)), "count its inputs")
        self._check(lib.AOTInductorModelContainerGetNumOutputs(handle, ctypes.byref(n_out)), "count its outputs")
        self._n_in, self._n_out = n_in.value, n_out.value
        self._in_array, self._out_array = _H * self._n_in, _H * self._n_out  # made once: a call fills fresh ones
        self._capsule_fns = _capsules()
        spec_in, spec_out = ctypes.c_char_p(), ctypes.c_char_p()
        self._check(lib.AOTInductorModelContainerGetCallSpec(handle, ctypes.byref(spec_in), ctypes.byref(spec_out)),
                    "read its call spec")  # fmt: skip
        self._in = pytree.treespec_loads(spec_in.value.decode()) if spec_in.value else None
        self._out = pytree.treespec_loads(spec_out.value.decode()) if spec_out.value else None
        self._run = getattr(lib, "AOTInductorModelContainerRun" + ("SingleThreaded" if single_threaded else ""))
        self._cuda = self.device.type == "cuda"

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            detail = ctypes.c_char_p()
            if self._last_error is None or self._last_error(ctypes.byref(detail)) != 0:
                detail = ctypes.c_char_p()
            text = (detail.value or b"").decode(errors="replace").strip()
            reason = text or f"AOTIRuntimeError {rc} (the library printed its message to stderr)"
            raise RuntimeError(f"the package's library could not {what}: {reason}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs and self._in is not None:  # in the order the program was exported with
            from torch.export._tree_utils import reorder_kwargs

            kwargs = reorder_kwargs(kwargs, self._in)
        if kwargs or not all(type(x) is torch.Tensor for x in args):  # plain tensors: the common case, cheaply
            flat = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        else:
            flat = args
        if len(flat) != self._n_in:  # before the run takes over the handles, which it does only past this check
            raise RuntimeError(f"expected inputs vector size {self._n_in}, but got {len(flat)} tensor inputs")
        get, new = self._capsule_fns
        ins = self._in_array(*[get(c, None) for c in torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(flat)])
        outs = self._out_array()
        stream = torch.cuda.current_stream(self.device).cuda_stream if self._cuda else None
        self._check(self._run(self._handle, ins, self._n_in, outs, self._n_out, stream, None), "run")
        tensors = torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs([new(h, None, None) for h in outs])
        return tensors if self._out is None else pytree.tree_unflatten(tensors, self._out)

    def close(self) -> None:
        """Delete the model and its folder now (otherwise when collected); the object is unusable after."""
        self._finalizer()


def _release(delete: Any, handle: Any, folder: str) -> None:
    """The model's container, then its folder (a finalizer: holds no reference to the DirectCall)."""
    try:
        delete(handle)
    finally:
        shutil.rmtree(folder, True)
