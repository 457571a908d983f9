"""Deployment: warm starts from compile-cache artifacts, and AOTInductor packages that load without risking the
process (DESIGN.md, Layers: this package imports compile, ops and the floor; nothing below imports it).

- `save_cache` / `load_cache`: torch's cache artifacts as one file with the versions, the device, the preset and
  the inputs they were made for; a file made elsewhere is refused by name. `save_cache_in_child` compiles one model
  in a child process so that the file holds its artifacts only.
- `export` / `load`: `torch.export` + AOTInductor into one .pt2 file; `load` checks the file, loads it once in a
  child process (a crash there becomes a DeployError), and only then here.
- `save_precompiled` / `load_precompiled`: Dynamo's ahead-of-time compile of a model's call, saved to a file; a new
  process runs it with no trace and no compile (torch 2.11+).
- `publish` / `serve` (`fullgraph.deploy.published`): precompiled code published to a fleet's Redis once, and
  replicas that start from it with their own weights, or compile with the remote cache and say why.
- `export_regional` / `load_regional` (`fullgraph.deploy.regional`): one package for a repeated block.
- `compile_tuned`: a model compiled as a `fullgraph tune` result chose, its op policies applied around its calls.

Both kinds of file are code (pickles, shared libraries): only files that no one but their owner can write are
loaded. docs/deploy.md has the details.

Every name is imported on first use (`__getattr__`), so that a server that only loads packages
(`from fullgraph.deploy import load`) imports neither Dynamo, Inductor, Triton, sympy nor `fullgraph.compile`'s
compiler: a process start pays for what it uses (docs/deploy.md, "Process start on the package route"). The names
that compile, save or run compiled graphs (every module but `package` and `_common`) import `fullgraph.ops` first,
as `import fullgraph.deploy` did when it imported everything: that registers our ops, which saved graphs call, and
adds their fingerprint to torch's compile-cache keys (`fullgraph/kernels/_library.py`), so that what is saved and
what is loaded through this package agree on those keys.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

# name -> the module that defines it; the lean ones (a package's load) need neither fullgraph.ops nor a compiler.
_LEAN = {
    "DeployError": "fullgraph.deploy._common",
    "cache_dir": "fullgraph.deploy._common",
    "input_signature": "fullgraph.deploy._common",
    "LoadedPackage": "fullgraph.deploy.package",
    "inspect_package": "fullgraph.deploy.package",
    "load": "fullgraph.deploy.package",
    "probe": "fullgraph.deploy.package",
}
_COMPILING = {
    "aot_options": "fullgraph.deploy.build",
    "export": "fullgraph.deploy.build",
    "CacheMeta": "fullgraph.deploy.cache",
    "load_cache": "fullgraph.deploy.cache",
    "read_cache": "fullgraph.deploy.cache",
    "save_cache": "fullgraph.deploy.cache",
    "save_cache_in_child": "fullgraph.deploy.cache",
    "PrecompiledModel": "fullgraph.deploy.precompile",
    "load_precompiled": "fullgraph.deploy.precompile",
    "save_precompiled": "fullgraph.deploy.precompile",
    "Served": "fullgraph.deploy.published",
    "publish": "fullgraph.deploy.published",
    "serve": "fullgraph.deploy.published",
    "compile_tuned": "fullgraph.deploy.tuned",
    "read_tuned": "fullgraph.deploy.tuned",
    "FleetCache": "fullgraph.deploy.remote",
    "RemoteCacheWarning": "fullgraph.deploy.remote",
    "remote_cache": "fullgraph.deploy.remote",
}
# Submodules reached as attributes (`from fullgraph.deploy import cache`), imported on first use the same way.
_SUBMODULES = {"build", "cache", "coldstart", "precompile", "published", "regional", "remote", "tuned"}
_LEAN_SUBMODULES = {"package", "_common", "_calls", "_elf"}

__all__ = [
    "CacheMeta",
    "DeployError",
    "FleetCache",
    "LoadedPackage",
    "PrecompiledModel",
    "RemoteCacheWarning",
    "Served",
    "aot_options",
    "cache_dir",
    "compile_tuned",
    "export",
    "input_signature",
    "inspect_package",
    "load",
    "load_cache",
    "load_precompiled",
    "probe",
    "publish",
    "read_cache",
    "read_tuned",
    "remote_cache",
    "save_cache",
    "save_cache_in_child",
    "save_precompiled",
    "serve",
]


def __getattr__(name: str) -> Any:
    if name in _LEAN:
        module = _LEAN[name]
    elif name in _COMPILING or name in _SUBMODULES:
        import fullgraph.ops  # noqa: F401 - registers our ops and tags torch's compile caches (see the docstring)

        module = _COMPILING.get(name) or f"{__name__}.{name}"
    elif name in _LEAN_SUBMODULES:
        module = f"{__name__}.{name}"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    __import__(module)  # the import statement's path: `python -X importtime` reports it (import_module's it does not)
    imported = sys.modules[module]
    value = imported if module == f"{__name__}.{name}" else getattr(imported, name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES, *_LEAN_SUBMODULES})


if TYPE_CHECKING:  # what type checkers and IDEs read; nothing here runs
    from fullgraph.deploy._common import DeployError, cache_dir, input_signature
    from fullgraph.deploy.build import aot_options, export
    from fullgraph.deploy.cache import CacheMeta, load_cache, read_cache, save_cache, save_cache_in_child
    from fullgraph.deploy.package import LoadedPackage, inspect_package, load, probe
    from fullgraph.deploy.precompile import PrecompiledModel, load_precompiled, save_precompiled
    from fullgraph.deploy.published import Served, publish, serve
    from fullgraph.deploy.remote import FleetCache, RemoteCacheWarning, remote_cache
    from fullgraph.deploy.tuned import compile_tuned, read_tuned
