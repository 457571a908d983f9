"""Every Triton kernel of ours is found by its module and name, as torch finds a user kernel when it loads a
precompiled model: `torch.compiler.load_compiled_function` re-imports each kernel of the process's side table as
`getattr(import_module(fn.__module__), fn.__name__)`. A kernel built inside a function is not found, and every
precompiled model saved in a process that had traced it failed to load (H200, torch 2.11: gemm_gelu)."""

import ast
import importlib
from pathlib import Path

import pytest

import fullgraph.kernels

KERNELS = Path(fullgraph.kernels.__file__).parent


def _jit_decorated(fn: ast.AST) -> bool:
    return any("jit" in ast.unparse(d) for d in getattr(fn, "decorator_list", ()))


@pytest.mark.parametrize("path", sorted(KERNELS.glob("*.py")), ids=lambda p: p.name)
def test_no_kernel_is_defined_inside_a_function(path):
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    nested = [
        f"{path.name}:{node.lineno} {node.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and id(node) not in top and _jit_decorated(node)
    ]
    assert not nested, f"kernels built inside functions (move them to a module of their own): {nested}"


def test_each_kernel_module_gives_back_its_kernels_by_module_and_name():
    pytest.importorskip("triton")
    found = 0
    for path in sorted(KERNELS.glob("_*_jit.py")):
        module = importlib.import_module(f"fullgraph.kernels.{path.stem}")
        for value in vars(module).values():
            fn = getattr(value, "fn", None)  # a JITFunction, or under TRITON_INTERPRET=1 an InterpretedFunction
            if callable(fn) and fn.__module__ == module.__name__:
                again = getattr(importlib.import_module(fn.__module__), fn.__name__)
                assert again is value, (path.name, fn.__name__)
                found += 1
    assert found >= 8  # row norm, rope, attention, modulation, GEMV, GEMM-GELU and their helpers
