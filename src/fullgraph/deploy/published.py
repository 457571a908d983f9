"""Compile once, serve everywhere (issue 35): a model's precompiled code (`fullgraph.deploy.precompile`: Dynamo's
ahead-of-time compile, no weights in it) published to a fleet's Redis, and replicas that start from it.

    publish(model, (x,), url, password=..., key=..., preset="perception")   # one machine: `fullgraph cache warm`
    served = serve(model, (x,), url, password=..., key=..., preset="perception")   # every replica
    y = served(x)       # no trace and no compile: the published code with this replica's own weights

The Redis key names everything the code depends on (`artifact_key`): the model's class and its parameters' names,
shapes and dtypes, the preset, its mode and Inductor options, the op policies in force, the inputs and dynamic
ranges, and the versions and GPU of `fullgraph.deploy._common.environment` with the Python version. A replica whose
description differs looks up another key and finds nothing, never a wrong artifact. The entry is the precompiled
file's bytes, wrapped and signed as the remote cache's entries are (`fullgraph.deploy.remote.wrap`: HMAC-SHA256
over the key, the header and the bytes, with the fleet's signing key), then checked again as `load_precompiled`
checks a file (its own header, the checksum, the class, the inputs).

`serve` falls back to `fullgraph.compile(model, preset)` with the fleet's remote cache on (`remote_cache`), saying
why once (a `PublishedWarning`): no entry, a refused entry (signature, versions, GPU), or a guard that fails at the
first call (the code was made for other inputs). Redis down or slow costs one timeout: the fallback then compiles
without the remote cache. The fallback's first call compiles, reading what
the remote FX-graph and AOTAutograd caches hold. Where the preset replays CUDA graphs, the published code was
compiled with them and runs behind `GraphedCall`. AOT packages carry their weights and stay an explicit route
(`fullgraph.deploy.load`): never served here.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import threading
import types
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fullgraph.compile.options import GUARD_FILTER, resolve
from fullgraph.deploy._common import DeployError, environment, input_signature
from fullgraph.deploy.precompile import load_precompiled_bytes, precompiled_bytes, save_precompiled
from fullgraph.deploy.remote import (
    DEFAULT_TIMEOUT_S,
    _secret,
    client,
    import_redis,
    redis_url,
    remote_cache,
    shown_url,
    unwrap,
    wrap,
)
from fullgraph.errors import UsageError
from fullgraph.ops import policies

PREFIX = "fullgraph:precompiled:"
REDIS_FAILED = "Redis failed: "  # a fallback's reason that also keeps the remote cache off (one timeout, not two)


class PublishedWarning(UserWarning):
    """A replica that could not start from the published code, and compiles instead: one line naming why."""


def _options_text(options: Mapping[str, Any]) -> dict[str, str]:
    """Inductor options as text for the key: values that are objects (a custom pass) by their type and uuid, functions
    (the guard filter) by their module and qualified name: the same in every process."""
    out = {}
    for k, v in sorted(options.items()):
        if isinstance(v, (bool, int, float, str, type(None))):
            out[k] = repr(v)
        elif isinstance(v, types.FunctionType):
            out[k] = f"{v.__module__}.{v.__qualname__}"
        else:
            uuid = getattr(v, "uuid", None)
            out[k] = f"{type(v).__qualname__}:{uuid() if callable(uuid) else id(v)}"
    return out


def _resolved(preset: str) -> Any:
    """The preset's configuration as `fullgraph.compile(model, preset)` compiles it: its Inductor options and the
    pass of its default rewrites (`rewrites="auto"`), so the published code is the code a cold replica compiles."""
    from fullgraph.compile.presets import get_preset
    from fullgraph.compile.rewrites import Recorder, with_rewrites

    resolved = resolve(preset)
    return with_rewrites(resolved, get_preset(preset).rewrites, forced=False, approximate_gelu=False,
                         recorder=Recorder())  # fmt: skip


def _precompile_options(resolved: Any) -> dict[str, Any]:
    """The torch.compile options a precompile takes: the preset's, without `fullgraph.compile`'s guard filter. A
    precompile saves its guards, and torch's own filter for that (the guards it can serialize) applies only when no
    filter is given: with ours, the save failed ("MODULE_MATCH guard cannot be serialized")."""
    options = dict(resolved.compile_kwargs().get("options", {}))
    options.pop(GUARD_FILTER, None)
    return options


def describe(model: torch.nn.Module, inputs: Sequence[Any], *, preset: str,
             dynamic: Mapping[str, Mapping[int, tuple[int, int]]] | None = None) -> dict[str, Any]:  # fmt: skip
    """What the published code depends on (module docstring), as JSON-able data: the rewrite pass by its identity
    (the rewrites' sources and decision data)."""
    resolved = _resolved(preset)
    return {
        "model": f"{type(model).__module__}.{type(model).__qualname__}",
        "parameters": [[n, list(t.shape), str(t.dtype)] for n, t in model.state_dict().items()],
        "preset": resolved.preset,
        "mode": resolved.mode,
        "options": _options_text(_precompile_options(resolved)),
        "policies": dict(sorted(policies.snapshot().items())),
        "inputs": input_signature(tuple(inputs)),
        "dynamic": {k: {str(d): list(r) for d, r in v.items()} for k, v in (dynamic or {}).items()},
        "environment": {**environment(), "python": platform.python_version()},
    }


def artifact_key(model: torch.nn.Module, inputs: Sequence[Any], *, preset: str,
                 dynamic: Mapping[str, Mapping[int, tuple[int, int]]] | None = None) -> str:  # fmt: skip
    """The Redis key of the model's published code (module docstring)."""
    text = json.dumps(describe(model, inputs, preset=preset, dynamic=dynamic), sort_keys=True)
    return PREFIX + hashlib.sha256(text.encode()).hexdigest()


def publish(model: torch.nn.Module, inputs: Sequence[Any], url: str | None = None, *, password: str | None = None,
            key: str | bytes | None = None, preset: str = "dev",
            dynamic: Mapping[str, Mapping[int, tuple[int, int]]] | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> tuple[str, int]:  # fmt: skip
    """Precompile `model(*inputs)` with the preset's mode and Inductor options and publish it: (the Redis key, the
    bytes written). Raises a DeployError when Redis cannot take it (it is the point of the call), and
    `NotPrecompilable` (a DeployError) when torch cannot precompile the model or save its code."""
    url = redis_url(url, "give the Redis URL (url=...)")
    secret = _secret(key)
    inputs = tuple(inputs)
    resolved = _resolved(preset)
    if resolved.backend != "inductor":
        raise UsageError(f"preset {preset!r} compiles with {resolved.backend!r}; published code is Inductor's")
    name = artifact_key(model, inputs, preset=preset, dynamic=dynamic)
    with tempfile.TemporaryDirectory(prefix="fullgraph-publish-") as work:
        path = os.path.join(work, "model.fgpre")
        save_precompiled(model, inputs, path, dynamic=dynamic, options=_precompile_options(resolved))
        data = precompiled_bytes(path)
    entry = wrap(secret, name, data, environment())
    c = client(url, password, timeout)
    try:
        c.set(name, entry)
    except import_redis().RedisError as e:
        raise DeployError(f"remote cache {shown_url(url)}: could not publish ({type(e).__name__}: "
                          f"{' '.join(str(e).split())})") from None  # fmt: skip
    finally:
        c.close()
    return name, len(entry)


class Served:
    """A replica's model: the published code while it serves these inputs, else `fullgraph.compile(model, preset)`
    with the fleet's remote cache on. `how` says which and why; callable from many threads (both callables are)."""

    def __init__(self, model: torch.nn.Module, preset: str, published: Any, why: str | None, remote: dict[str, Any]):
        self.model, self.preset, self._remote = model, preset, remote
        self._fn, self.how = published, "published precompiled code"
        self._lock = threading.Lock()
        if published is None:
            self._fall_back(why or "no published code")

    def _fall_back(self, why: str) -> None:
        import fullgraph.compile

        with self._lock:
            if self.how.startswith("compiled"):
                return
            remote = not why.startswith(REDIS_FAILED)  # Redis answered: its remote caches may hold the graphs
            how = "compiling with the fleet's remote cache" if remote else "compiling here"
            warnings.warn(f"{type(self.model).__name__}: not starting from the published code ({why}); {how}",
                          PublishedWarning, stacklevel=3)  # fmt: skip
            if remote:
                remote_cache(**self._remote)
            self._fn = fullgraph.compile.compile(self.model, self.preset)
            self.how = f"compiled here: {why}"

    def __call__(self, *args: Any) -> Any:
        fn = self._fn
        if self.how.startswith("published"):
            try:
                return fn(*args)
            except DeployError as e:  # a guard failed: the code was made for other inputs
                self._fall_back(str(e))
        return self._fn(*args)

    def __repr__(self) -> str:
        return f"Served({type(self.model).__name__}, {self.preset!r}: {self.how})"


def serve(model: torch.nn.Module, inputs: Sequence[Any], url: str | None = None, *, password: str | None = None,
          key: str | bytes | None = None, preset: str = "dev",
          dynamic: Mapping[str, Mapping[int, tuple[int, int]]] | None = None,
          timeout: float = DEFAULT_TIMEOUT_S) -> Served:  # fmt: skip
    """`model` (this replica's weights) served from the fleet's published code for `inputs`' signature, or compiled
    with the remote cache where that cannot be (module docstring). `inputs` are example inputs: their shapes,
    dtypes and device choose the key."""
    url = redis_url(url, "give the Redis URL (url=...)")
    secret = _secret(key)
    remote = {"url": url, "password": password, "key": key, "timeout": timeout}
    name = artifact_key(model, tuple(inputs), preset=preset, dynamic=dynamic)
    where = f"<{shown_url(url)} {name[len(PREFIX) : len(PREFIX) + 12]}>"
    try:
        c = client(url, password, timeout)
        try:
            data = c.get(name)
        finally:
            c.close()
    except import_redis().RedisError as e:
        why = f"{REDIS_FAILED}{type(e).__name__}: {' '.join(str(e).split())}; not asking it again"
        return Served(model, preset, None, why, remote)
    if data is None:
        return Served(model, preset, None, f"nothing published under {where}", remote)
    payload, why = unwrap(secret, name, data, environment())
    if payload is None:
        return Served(model, preset, None, f"refused the entry {where}: {why}", remote)
    try:
        loaded = load_precompiled_bytes(payload, model, name=where, signature=input_signature(tuple(inputs)))
    except DeployError as e:
        return Served(model, preset, None, str(e), remote)
    return Served(model, preset, loaded, None, remote)
