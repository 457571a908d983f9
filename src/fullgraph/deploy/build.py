"""Building AOTInductor packages: `export` captures a model with `torch.export.export` (dynamic dims declared as in
`fullgraph.compile`) and builds it with `torch._inductor.aoti_compile_and_package` into one .pt2 file, recording the
versions and inputs that `fullgraph.deploy.package.load` checks (see that module for loading, safely)."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import linecache
import os
import re
import shutil
import sys
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

import fullgraph.ops  # noqa: F401 - compiling here: our ops registered and torch's compile caches tagged first
from fullgraph._files import disk_full, locked, temp_dir_beside
from fullgraph._paths import cache_dir, display_path
from fullgraph.compile.dynamic import _render, _root, check_dynamic_spec
from fullgraph.compile.options import resolve
from fullgraph.deploy import package
from fullgraph.deploy._common import DeployError, environment, input_signature
from fullgraph.deploy.package import META_PREFIX, pytree_types
from fullgraph.env import first_line
from fullgraph.errors import UsageError


def _dynamic_shapes(model: torch.nn.Module, args: tuple, spec: Mapping) -> dict[str, Any]:
    """fullgraph.compile's dynamic spec ({"x": {0: (1, 32)}}) as torch.export's dynamic_shapes, by argument name."""
    spec = check_dynamic_spec(spec)
    try:
        bound = inspect.signature(model.forward).bind(*args)
    except TypeError as e:
        raise UsageError(f"the example inputs do not fit {type(model).__name__}.forward: {e}") from None
    named = dict(bound.arguments)
    for path in spec:
        if _root(path) not in named:
            raise UsageError(f"dynamic spec names {_root(path)!r}, which is not an input; inputs: {', '.join(named)}")
    left = dict(spec)

    def leaf(keypath: tuple, value: Any) -> Any:
        path = _render(keypath)
        if path not in left or not isinstance(value, torch.Tensor):
            return None
        stem, ranges = "".join(c if c.isalnum() else "_" for c in path), left.pop(path)
        for d in ranges:
            if not -value.ndim <= d < value.ndim:
                raise UsageError(f"{path} has {value.ndim} dims, so dim {d} is out of range")
        return {
            d % value.ndim: torch.export.Dim(f"{stem}_{d % value.ndim}", min=lo, max=hi)
            for d, (lo, hi) in ranges.items()
        }

    shapes = pytree.tree_map_with_path(leaf, named)
    if left:
        raise UsageError(f"dynamic spec paths {sorted(left)} do not lead to tensors among the inputs")
    return shapes


# Inductor options a preset may set that an AOTInductor package does not take: CUDA graphs (a package has none; load
# with cuda_graphs=True instead) and cpp_wrapper (a package's wrapper is always C++).
AOT_DROPPED = ("triton.cudagraphs", "triton.cudagraph_trees", "cpp_wrapper")


def aot_options(preset: str | None, mode: str | None = None) -> dict[str, Any]:
    """The Inductor options of `preset` (or "dev") with `mode`'s expansion that AOTInductor takes; {} for neither."""
    if preset is None and mode is None:
        return {}
    return {k: v for k, v in resolve(preset or "dev", mode=mode).options.items() if k not in AOT_DROPPED}


_LIBS = "aot_inductor.custom_op_libs"
# The C++ runtime's shared library by its file name (`-l:libstdc++.so.6`), not `-lstdc++`: the linker takes the first
# folder holding libstdc++.so or libstdc++.a, and the H200 image's g++ (a script running g++-real with -B
# /opt/gcc/lib/gcc/x86_64-linux-gnu/13/) puts first a folder with the archive alone, so `-lstdc++` linked the static
# copy again (same library, byte for byte). Only the shared runtime is named libstdc++.so.6.
LIBSTDCXX = ":libstdc++.so.6"


def link_libstdcxx(options: Mapping[str, Any]) -> dict[str, Any]:
    """Inductor options that link a package's library against the shared libstdc++ explicitly
    (`-l:libstdc++.so.6`), on Linux where this torch has the setting: the library then binds to the process's
    libstdc++ even when the C++ compiler would link the static one (`-static-libstdc++`, or a search folder holding
    only libstdc++.a, as on the H200 image), whose private copy clashes with torch's (`fullgraph.deploy._elf`). With
    a plain g++ the link already has it: nothing changes."""
    if not sys.platform.startswith("linux") or not hasattr(torch._inductor.config.aot_inductor, _LIBS.split(".")[1]):
        return {}
    given = options.get(_LIBS, torch._inductor.config.aot_inductor.custom_op_libs) or []
    return {_LIBS: [*given, LIBSTDCXX] if LIBSTDCXX not in given else list(given)}


def _lowerbound(declared: Mapping[str, Mapping[str, list[int]]]) -> dict[str, Any]:
    """Where a declared range starts below 2, the package's input check (on under `load`) must not hold the dim to
    at least 2, the size Dynamo's symbols assume: the program serves 0 and 1 (tests run batch 1), the check would
    refuse them."""
    low = min((r[0] for dims in declared.values() for r in dims.values()), default=2)
    if low >= 2 or not hasattr(torch._inductor.config.aot_inductor, "check_lowerbound"):
        return {}
    return {"aot_inductor.check_lowerbound": False}


def _check_built(built: str, path: str) -> None:
    """Refuse a package whose library still carries libstdc++ (a torch without the setting, or a compiler that
    ignores it): it would crash wherever it is loaded. And one whose JSON files do not parse: what a build of the
    same model racing another process's wrote before `build_lock` (an empty `*_metadata.json`)."""
    with zipfile.ZipFile(built) as z:
        libraries = package.libraries_in(z, z.namelist())
        for name in z.namelist():
            if name.endswith(".json"):
                try:
                    json.loads(z.read(name))
                except ValueError as e:
                    raise DeployError(
                        f"{display_path(path)}: the build wrote a damaged {name.rsplit('/', 1)[-1]} ({first_line(e)}); "
                        "not written. Another process building the same model into the same Inductor cache at once? "
                        "Export again"
                    ) from None
    cxx = torch._inductor.config.cpp.cxx[-1]
    package.check_libraries(
        display_path(path),
        libraries,
        fix=f"Not written. This torch or C++ compiler ({cxx}) ignored the request to link libstdc++.so "
        f"({_LIBS}=[{LIBSTDCXX!r}]); point CXX at a C++ compiler that links libstdc++.so",
    )


def export(
    model: torch.nn.Module,
    example_inputs: Sequence[Any],
    path: str | os.PathLike,
    *,
    dynamic: Mapping[str, Mapping[int, tuple[int, int]]] | None = None,
    preset: str | None = None,
    mode: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Export `model` for `example_inputs` (a tuple of positional inputs) into an AOTInductor package at `path`
    (a name ending in .pt2), written whole or not at all; returns the path.

    `dynamic={"x": {0: (1, 32)}}` declares input dims dynamic with their ranges, named as in `fullgraph.compile`;
    every other dim is fixed at its example size. The package runs on the device the model and inputs are on.
    `preset` (a `fullgraph.compile` preset name) passes that preset's Inductor options to AOTInductor (edge's
    max-autotune and freezing, say), `mode` a torch.compile mode's, less those a package cannot use (`AOT_DROPPED`:
    CUDA graphs, cpp_wrapper). Both are checked before anything is traced.
    The package records the torch and fullgraph versions and the inputs, which `load` checks.
    `kwargs` are example inputs given by name, as a tokenizer's dict (`input_ids=`, `attention_mask=`): the package
    takes inputs by position, so they must be the forward's parameters that follow the positional ones (in any
    order); the loaded package is called by position or by name either way.
    """
    path = os.fspath(path)
    if not path.endswith(".pt2"):
        raise UsageError(f"{path!r}: an AOTInductor package's name ends in .pt2 (torch's loader expects it)")
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"export takes an nn.Module, not {type(model).__name__}")
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    args = inputs_by_position(model, args, kwargs or {})
    shapes = _dynamic_shapes(model, args, dynamic) if dynamic else None
    options = aot_options(preset, mode)
    try:
        program = torch.export.export(model, args, dynamic_shapes=shapes)
    except Exception as e:  # export reports data-dependent control flow, unsupported ops, bad ranges, ...
        raise DeployError(
            f"torch.export could not capture {type(model).__name__}{_where(e)}: {first_line(e)}; "
            + (_returns_unknown_type(type(model).__name__, str(e)) or _DOCTOR)
        ) from e
    declared = {k: {str(d): list(r) for d, r in v.items()} for k, v in check_dynamic_spec(dynamic or {}).items()}
    here = environment()
    meta = {
        "fullgraph": here["fullgraph"],
        "torch": here["torch"],
        "inputs": input_signature(args),
        "dynamic": json.dumps(declared),
        "flat_dynamic": json.dumps(_flat_dynamic(model, args, declared)),
        "preset": " ".join(x for x in (preset, mode) if x),
        "args": json.dumps(_argument_names(model, args)),
        # pytree types of the inputs and outputs that `load` must import to rebuild them (a transformers output)
        "pytree": json.dumps(pytree_types(program.call_spec.in_spec, program.call_spec.out_spec)),
        # integer inputs: the tables they index (checked at each call) and the values the example held
        "index_ranges": json.dumps(index_ranges(program)),
        "int_values": json.dumps(_int_values(args)),
    }
    configs = {
        **options,
        **link_libstdcxx(options),
        **_lowerbound(declared),
        "aot_inductor.metadata": {META_PREFIX + k: v for k, v in meta.items()},
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # Built in a private folder beside `path` under its final name (the archive's inner folder is named after
    # the file), then renamed into place: a reader never sees half a package. A killed build's folder is removed
    # by the next export to the same path (fullgraph._files.sweep_stale).
    work = temp_dir_beside(path)
    try:
        with build_lock(program, configs):
            built = torch._inductor.aoti_compile_and_package(
                program, package_path=os.path.join(work, os.path.basename(path)), inductor_configs=configs
            )
            _check_built(built, path)
        os.chmod(built, 0o644)
        os.replace(built, path)
    except Exception as e:  # a full disk during the build is named as such; the rest as it comes
        full = disk_full(path, e)
        if full is None:
            raise
        raise full from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return path


def build_key(program: Any, configs: Mapping[str, Any]) -> str:
    """What two builds that would write the same files in Inductor's cache share: the exported graph's code and its
    inputs' shapes (not the weights' values: the generated code and its file names do not depend on them) and the
    build's settings."""
    inputs = [  # every input's shape, dtype and device, the weights' included (lifted into inputs by export)
        [str(getattr(v, "shape", v)), str(getattr(v, "dtype", "")), str(getattr(v, "device", ""))]
        for n in program.graph.nodes
        if n.op == "placeholder"
        for v in [n.meta.get("val")]
    ]
    text = json.dumps([program.graph_module.code, inputs, str(program.call_spec),
                       repr(sorted(configs.items(), key=str)), torch.__version__], default=str)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def build_lock(program: Any, configs: Mapping[str, Any]) -> Iterator[None]:
    """Held around one package build: builds of the same graph with the same settings, in any process of this
    machine, run one at a time. torch's AOTInductor writes a build's files (the wrapper code, its metadata JSON, the
    library) under names taken from the code in its cache folder, so two processes building the same model at once
    write the same files, and one can package the other's half-written file: 1 package of 12 held an empty
    `*_metadata.json` when four processes exported one MLP at once (2-core CPU, torch 2.13), and loading it
    failed. Other graphs build in parallel. Where the cache folder cannot be written, no lock."""
    with contextlib.ExitStack() as held:
        with contextlib.suppress(OSError):
            held.enter_context(locked(os.path.join(cache_dir(), "builds", build_key(program, configs)[:32])))
        yield


def inputs_by_position(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> tuple:
    """`args` and then `kwargs` placed by the forward's parameter names: the keyword inputs must be the parameters
    right after the positional ones, in any order; else one UsageError naming the parameters they must be."""
    if not kwargs:
        return args
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in inspect.signature(model.forward).parameters.values() if p.kind in plain]
    after = names[len(args) : len(args) + len(kwargs)]
    if set(after) != set(kwargs):
        raise UsageError(
            f"{type(model).__name__}.forward takes ({', '.join(names)}); a package takes its inputs by position, so "
            f"the inputs given by name ({', '.join(kwargs)}) must be the ones after the {len(args)} given by "
            f"position ({', '.join(after) or 'none left'}): give each parameter before them an example too"
        )
    return (*args, *(kwargs[n] for n in after))


def _argument_names(model: torch.nn.Module, args: tuple) -> list[str]:
    """The names of the forward's parameters the example inputs fill, in order, so that a loaded package can be
    called by keyword as the model was (`bert(input_ids=..., attention_mask=...)`); [] where they are not plain
    named parameters (`*args`) or do not bind."""
    try:
        sig = inspect.signature(model.forward)
        bound = sig.bind(*args).arguments
    except (TypeError, ValueError):
        return []
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return list(bound) if all(sig.parameters[n].kind in plain for n in bound) else []


def _flat_dynamic(model: torch.nn.Module, args: tuple, declared: Mapping[str, Mapping[str, list[int]]]) -> dict:
    """The declared dynamic dims by the index of their tensor among the inputs ({"0": {"0": [1, 64]}}), as
    `input_signature` lists them: how `LoadedPackage` tells inputs that do not fit from a failure of another kind."""
    if not declared:
        return {}
    named = inspect.signature(model.forward).bind(*args).arguments
    leaves, _ = pytree.tree_flatten_with_path(dict(named))
    tensors = [(_render(keypath), value) for keypath, value in leaves if isinstance(value, torch.Tensor)]
    out = {}
    for i, (p, t) in enumerate(tensors):
        if p in declared:
            out[str(i)] = {str(int(d) % t.ndim): r for d, r in declared[p].items()}
    return out


# ops through which an integer input still holds the same values (reshaped, cut, copied) on its way to an index
_SAME_VALUES = {
    "view", "reshape", "_unsafe_view", "expand", "slice", "select", "unsqueeze", "squeeze", "clone", "contiguous",
    "alias", "permute", "t", "flatten", "_to_copy", "to", "transpose",
}  # fmt: skip


def index_ranges(program: Any) -> dict[str, list[int]]:
    """For each tensor input (by its index among them, as `input_signature` lists them) that the program uses to
    index a table, the values it may hold, both ends included: 0 to rows - 1 for aten.embedding's weight and
    index_select's dim, -rows to rows - 1 for advanced indexing (aten.index, which wraps negative indices), the
    narrowest where several tables are indexed. A value outside makes the package's compiled code fail a bounds
    check, which on the CPU aborts the whole process (it throws inside an OpenMP region) and on a GPU is a
    device-side assert. `LoadedPackage` checks them."""
    from torch.export.graph_signature import InputKind, TensorArgument

    names = [s.arg.name for s in program.graph_signature.input_specs
             if s.kind == InputKind.USER_INPUT and isinstance(s.arg, TensorArgument)]  # fmt: skip
    nodes = {n.name: n for n in program.graph.nodes}
    ranges: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        val = nodes[name].meta.get("val")
        if val is None or val.is_floating_point():  # only integers index
            continue
        reached, todo, found = set(), [nodes[name]], []  # found: (rows, negatives wrap)
        while todo:
            node = todo.pop()
            if node in reached:
                continue
            reached.add(node)
            for user in node.users:
                op = _aten_name(user.target)
                if op in _SAME_VALUES:
                    todo.append(user)
                elif op == "embedding" and len(user.args) > 1 and user.args[1] is node:
                    found.append((_size(user.args[0], 0), False))
                elif op == "index_select" and len(user.args) > 2 and user.args[2] is node:
                    found.append((_size(user.args[0], user.args[1]), False))
                elif op == "index" and len(user.args) > 1:
                    found += [(_size(user.args[0], d), True) for d, x in enumerate(user.args[1]) if x is node]
        bounds = [(-rows if wraps else 0, rows - 1) for rows, wraps in found if rows is not None]
        if bounds:
            ranges[str(i)] = [max(lo for lo, _ in bounds), min(hi for _, hi in bounds)]
    return ranges


def _aten_name(target: Any) -> str:
    """`embedding` for aten.embedding.default, "" for anything not an ATen op."""
    parts = str(target).split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "aten" else ""


def _size(node: Any, dim: Any) -> int | None:
    """A node's static size along `dim`, or None (dynamic, or no shape recorded)."""
    val = getattr(node, "meta", {}).get("val")
    try:
        return int(val.shape[dim])
    except (AttributeError, IndexError, TypeError, RuntimeError):
        return None


def _int_values(args: tuple) -> dict[str, list[int]]:
    """The least and greatest value of each integer tensor input (by its index among them), as the example held
    them: `fullgraph load` and `bench load` draw random inputs from that range."""
    tensors = [x for x in pytree.tree_leaves(args) if isinstance(x, torch.Tensor)]
    return {str(i): [int(t.min()), int(t.max())] for i, t in enumerate(tensors)
            if t.numel() and not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool}  # fmt: skip


_DOCTOR = "run `fullgraph doctor TARGET` on the model: it shows each graph break with its source line and fix"


def _returns_unknown_type(name: str, text: str) -> str:
    """The fix where the model returns an object torch.export cannot flatten (transformers' KV cache: "Found <class
    'transformers.cache_utils.DynamicCache'> in output, which is not a known type"), else ""."""
    found = re.search(r"Found <class '([\w.]+)'> in output, which is not a known type", text)
    if not found:
        return ""
    qualname = found.group(1)
    cache = "; for a transformers model's KV cache, export with use_cache=False (model.config.use_cache = False)"
    return (
        f"{name} returns a {qualname.rsplit('.', 1)[-1]}, which a package cannot return: return tensors, tuples, "
        f"lists or dicts, or register {qualname} as a pytree node (torch.utils._pytree.register_pytree_node)"
        + (cache if "cache" in qualname.lower() else "")
    )


def _where(e: BaseException) -> str:
    """` at model.py:42 (`if x.sum() > 0:`)`: the user's line torch.export names under "The following call raised
    this error", or "" when it names none."""
    text = str(e)
    tail = text[text.find("The following call raised this error") :] if "The following call raised" in text else ""
    found = re.search(r'File "([^"]+)", line (\d+)', tail)
    if not found:
        return ""
    file, line = found.group(1), int(found.group(2))
    source = linecache.getline(file, line).strip()
    return f" at {display_path(file)}:{line}" + (f" (`{source}`)" if source else "")
