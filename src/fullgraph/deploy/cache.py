"""Compile-cache artifacts as one file with metadata: a warm start for `torch.compile` in a new process.

`torch.compiler.save_cache_artifacts()` serializes what this process compiled (Inductor's FX graphs, AOTAutograd
entries, autotuning results); `load_cache_artifacts` puts them into the local caches, so that the next compile of
the same graph hits them instead of compiling. Dynamo still traces in the new process; what is skipped is Inductor.

The file is the artifacts with a header saying where they were made: torch, triton and fullgraph versions, the GPU
(name and compute capability) or "cpu", the preset and the model's inputs. `load_cache` refuses a file made
elsewhere with one line naming the difference: torch would ignore such artifacts (a silent cold compile) or, for
a changed runtime, could misbehave.

torch saves everything compiled in the process, not one model's artifacts: `save_cache_in_child` compiles the
model in a child process, so the file holds that model's artifacts only.

Security: the artifacts are pickles and generated code that run when loaded. Load only files you made or trust;
`load_cache` refuses a file that another user owns or that anyone but its owner can write.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

import fullgraph.ops  # noqa: F401 - compiling here: our ops registered and torch's compile caches tagged first
from fullgraph._paths import display_path
from fullgraph.deploy._common import (
    DeployError,
    environment,
    input_signature,
    mismatches,
    read_framed,
    write_private,
)
from fullgraph.errors import UsageError

MAGIC = b"FULLGRAPH-CACHE\n"
FORMAT = 1
# Keys of the header that must equal this process's for the artifacts to be used.
ENVIRONMENT_KEYS = ("torch", "triton", "fullgraph", "device", "capability")
_FIX = "compile the model again in this environment and save a new file (fullgraph.deploy.save_cache)"


@dataclass(frozen=True)
class CacheMeta:
    """The header of a cache file: where its artifacts were made, for what, and a checksum of them."""

    torch: str
    triton: str | None
    fullgraph: str
    device: str  # GPU name, or "cpu"
    capability: str | None  # "9.0"; None on the CPU
    preset: str | None
    signature: str | None  # the model's inputs, fullgraph.deploy.input_signature
    artifacts: dict[str, int] = field(default_factory=dict)  # kind ("inductor", "autotune", ...) -> count
    payload_sha256: str = ""
    payload_bytes: int = 0
    created: str = ""
    format: int = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _preset_name(preset: Any) -> str | None:
    if preset is None or isinstance(preset, str):
        return preset
    name = getattr(preset, "name", None)  # a fullgraph.compile.Preset
    if not isinstance(name, str):
        raise UsageError(f"preset={preset!r}: give a preset name or a fullgraph.compile.Preset")
    return name


def save_cache(path: str | os.PathLike, *, preset: Any = None, signature: str | None = None) -> CacheMeta:
    """Write everything this process has compiled so far to `path`, with a header describing this process.

    `preset` (a name or Preset) and `signature` (`input_signature(x)`, the model's inputs) are recorded so that
    `load_cache` can refuse artifacts made for another configuration. The file is written whole or not at all,
    with mode 0644. To hold one model's artifacts only, compile it alone: `save_cache_in_child`.
    """
    if signature is not None and not isinstance(signature, str):
        raise UsageError(f"signature={signature!r}: give text, e.g. fullgraph.deploy.input_signature(x)")
    saved = torch.compiler.save_cache_artifacts()
    if saved is None or not saved[0]:
        raise DeployError(
            "nothing was compiled in this process, so there are no cache artifacts to save; "
            "compile the model and run it once first (fullgraph.compile(model).warmup(x))"
        )
    payload, info = saved
    kinds = {kind: len(keys) for kind, keys in getattr(info, "artifacts", {}).items() if keys}
    meta = CacheMeta(
        **environment(),
        preset=_preset_name(preset),
        signature=signature,
        artifacts=kinds,
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        payload_bytes=len(payload),
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    header = json.dumps(meta.to_dict(), sort_keys=True).encode() + b"\n"
    write_private(path, (MAGIC, header, payload))
    return meta


def read_cache(path: str | os.PathLike) -> tuple[CacheMeta, bytes]:
    """The header and the artifacts of a cache file, after the ownership and permission checks and the checksum;
    nothing is loaded."""
    return read_framed(path, kind="cache", what="cache artifacts", magic=MAGIC, fmt=FORMAT, meta_cls=CacheMeta,
                       fix=_FIX, make="fullgraph.deploy.save_cache", contents="artifacts")  # fmt: skip


def load_cache(path: str | os.PathLike, *, preset: Any = None, signature: str | None = None) -> CacheMeta:
    """Load a cache file written by `save_cache` into this process's compile caches; returns its header.

    Refused, with one line naming the cause, before anything is unpickled: a file another user owns or that
    others can write (the artifacts are pickles and code that run when loaded), a damaged or truncated file,
    artifacts made with another torch, triton or fullgraph, on another GPU (or on the CPU for a GPU, and back);
    and, when given, a different `preset` or input `signature` than recorded. Then compile the model as before:
    its graphs come from the cache instead of being compiled (torch's counters show `fxgraph_cache_hit`).
    """
    meta, payload = read_cache(path)
    wrong = mismatches(asdict(meta), environment(), ENVIRONMENT_KEYS)
    if preset is not None and _preset_name(preset) != meta.preset:
        wrong.append(f"preset {meta.preset} there, {_preset_name(preset)} here")
    if signature is not None and signature != meta.signature:
        wrong.append(f"inputs {meta.signature} there, {signature} here")
    if wrong:
        raise DeployError(f"refusing cache artifacts {display_path(path)}: {'; '.join(wrong)}; {_FIX}")
    try:
        torch.compiler.load_cache_artifacts(payload)
    except Exception as e:  # torch's deserializer raises what it meets
        raise DeployError(f"torch could not load the artifacts in {display_path(path)} ({e}); {_FIX}") from e
    return meta


# ---- one model's artifacts: compile it in a child process ----------------------------------------------------


def _target(build: str | Callable) -> str:
    """`build` as "module:qualname", importable by a fresh interpreter."""
    if isinstance(build, str):
        module, _, name = build.partition(":")
        if not module or not name:
            raise UsageError(f"build={build!r}: give 'package.module:function' (it returns (model, inputs))")
        return build
    module, name = getattr(build, "__module__", None), getattr(build, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        raise UsageError(
            f"build={build!r}: a child process must import it; define it at the top level of a "
            "module (not __main__, a lambda or a nested function), or give 'module:function'"
        )
    return f"{module}:{name}"


def save_cache_in_child(
    build: str | Callable,
    path: str | os.PathLike,
    *,
    preset: Any = "dev",
    timeout: float | None = None,
    **compile_kwargs: Any,
) -> CacheMeta:
    """Compile one model in a fresh Python process and save its cache artifacts (and nothing else) to `path`.

    `build` is a top-level function ("package.module:function" or the function itself) that returns
    ``(model, example_inputs)``, a tuple of positional inputs on the device to compile for. The child calls
    ``fullgraph.compile(model, preset, **compile_kwargs).warmup(*example_inputs)`` then `save_cache`, recording
    the preset and `input_signature(example_inputs)`. `compile_kwargs` must be Python literals (mode="...",
    dynamic={"x": {0: (1, 32)}}). The child sees this process's sys.path and environment (its Inductor cache
    folder included: a warm cache makes the child fast, and hits are saved like fresh compiles).
    """
    target = _target(build)
    if not isinstance(preset, str):
        raise UsageError(f"preset={preset!r}: a child process takes a preset by name")
    if isinstance(compile_kwargs.get("dtype"), torch.dtype):  # sent by name: torch.bfloat16 -> "bfloat16"
        compile_kwargs["dtype"] = str(compile_kwargs["dtype"]).removeprefix("torch.")
    request = repr({"target": target, "path": os.fspath(path), "preset": preset, "kwargs": compile_kwargs})
    try:
        ast.literal_eval(request)
    except (ValueError, SyntaxError):
        raise UsageError(
            f"compile options {compile_kwargs!r} must be Python literals to reach a child process"
        ) from None
    here = [os.getcwd() if p == "" else p for p in sys.path]
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(here)}
    code = "import sys; from fullgraph.deploy.cache import _child_main; _child_main(sys.argv[1])"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, request], env=child_env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise DeployError(f"compiling {target} in a child process took over {timeout} s; raise timeout=") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        why = lines[-1] if lines else "no output"
        raise DeployError(f"compiling {target} in a child process failed (exit {done.returncode}): {why}")
    meta, _ = read_cache(path)
    return meta


def _child_main(request: str) -> None:
    """In the child: build, compile, warm up, save. Errors end the process with a traceback on stderr."""
    import importlib

    import fullgraph.compile

    req = ast.literal_eval(request)
    module, _, name = req["target"].partition(":")
    build = importlib.import_module(module)
    for part in name.split("."):
        build = getattr(build, part)
    built = build()
    if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[1], (tuple, list))):
        raise UsageError(f"{req['target']} returned {type(built).__name__}; return (model, example_inputs)")
    model, inputs = built
    if isinstance(req["kwargs"].get("dtype"), str):
        req["kwargs"]["dtype"] = getattr(torch, req["kwargs"]["dtype"])
    compiled = fullgraph.compile(model, req["preset"], **req["kwargs"])
    compiled.warmup(*inputs)
    save_cache(req["path"], preset=req["preset"], signature=input_signature(inputs))
