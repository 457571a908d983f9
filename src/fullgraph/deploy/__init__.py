"""Deployment: warm starts from compile-cache artifacts, and AOTInductor packages that load without risking the
process (DESIGN.md, Layers: this package imports compile, ops and the floor; nothing below imports it).

- `save_cache` / `load_cache`: torch's cache artifacts as one file with the versions, the device, the preset and
  the inputs they were made for; a file made elsewhere is refused by name. `save_cache_in_child` compiles one model
  in a child process so that the file holds its artifacts only.
- `export` / `load`: `torch.export` + AOTInductor into one .pt2 file; `load` checks the file, loads it once in a
  child process (a crash there becomes a DeployError), and only then here.
- `save_precompiled` / `load_precompiled`: Dynamo's ahead-of-time compile of a model's call, saved to a file; a new
  process runs it with no trace and no compile (torch 2.11+).
- `export_regional` / `load_regional` (`fullgraph.deploy.regional`): one package for a repeated block.
- `compile_tuned`: a model compiled as a `fullgraph tune` result chose, its op policies applied around its calls.

Both kinds of file are code (pickles, shared libraries): only files that no one but their owner can write are
loaded. docs/deploy.md has the details.
"""

from fullgraph.deploy._common import DeployError, cache_dir, input_signature
from fullgraph.deploy.build import aot_options, export
from fullgraph.deploy.cache import CacheMeta, load_cache, read_cache, save_cache, save_cache_in_child
from fullgraph.deploy.package import LoadedPackage, inspect_package, load, probe
from fullgraph.deploy.precompile import PrecompiledModel, load_precompiled, save_precompiled
from fullgraph.deploy.tuned import compile_tuned, read_tuned

__all__ = [
    "CacheMeta",
    "DeployError",
    "LoadedPackage",
    "PrecompiledModel",
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
    "read_cache",
    "read_tuned",
    "save_cache",
    "save_cache_in_child",
    "save_precompiled",
]
