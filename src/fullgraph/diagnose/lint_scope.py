"""The lint of one model or function, found from the live object: the doctor's question is "what in this model's
code breaks or recompiles the graph", not "what is in the files it came from" (that is `fullgraph lint PATH`).

For a module: the classes of the model and of its submodules (`type(m)` for `m in model.modules()`, each once; those
defined in the torch package are torch's business), each linted from its own class body, found in its file by
`inspect` (so every finding's file:line is the real one). The forward of each class (inherited from a base class
when the class has none) is scanned with what it calls in its file, as `fullgraph lint` does. Only the model's own
forward takes the call's arguments: submodules are called by the model's code inside the same graph, so their
arguments are not where a new value enters (FG006, FG010 and FG005 on arguments look at the model's forward only).

For a function (or a `torch.compile`-wrapped one): that function and what it calls in its file.
"""

from __future__ import annotations

import ast
import inspect
import linecache
from collections import defaultdict

import torch

from fullgraph import env
from fullgraph.diagnose import syntax as S
from fullgraph.diagnose.lint import lint_functions
from fullgraph.diagnose.report import Finding
from fullgraph.errors import FullgraphError

Roots = list[tuple[ast.FunctionDef, ast.ClassDef | None, bool]]


class _Files:
    """Source files read and parsed once each (inspect.getsource parses a class's whole file on every call); the
    roots to lint in each."""

    def __init__(self):
        self.trees: dict[str, tuple[str, ast.Module, dict[str, list[ast.AST]]]] = {}
        self.roots: dict[str, Roots] = defaultdict(list)
        self.classes: dict[str, list[ast.ClassDef]] = defaultdict(list)

    def locate(self, obj) -> tuple[str, ast.Module, ast.FunctionDef | ast.ClassDef]:
        """The file of a class or function, its tree, and the definition's node, found by qualified name (and first
        line where Python records it). OSError/TypeError when the source cannot be had (exec, python -c)."""
        path = inspect.getsourcefile(obj)  # TypeError for built-in classes
        if path is None:
            raise OSError("no source file")
        if path not in self.trees:
            text = "".join(linecache.getlines(path, vars(inspect.getmodule(obj) or object())))
            tree = S.parse(text, path)
            self.trees[path] = (text, tree, S.definitions(tree))
        _, tree, defs = self.trees[path]
        found = defs.get(obj.__qualname__, [])
        start = getattr(obj, "__firstlineno__", None) or getattr(getattr(obj, "__code__", None), "co_firstlineno", None)
        if start is not None:
            found = [n for n in found if S.first_line(n) == start]
        elif len(found) > 1:  # a class defined twice (in both branches of an if): the one holding its methods' code
            code = [f.__code__ for f in vars(obj).values() if hasattr(f, "__code__")]
            lines = [c.co_firstlineno for c in code if c.co_filename == path]
            found = [n for n in found if any(n.lineno <= line <= n.end_lineno for line in lines)] or found
        if not found:
            raise OSError(f"no definition of {obj.__qualname__} in {path}")
        return path, tree, found[0]

    def lint(self) -> list[Finding]:
        found = []
        for path, roots in self.roots.items():
            text, tree, _ = self.trees[path]
            found += lint_functions(text, path, tree, roots, self.classes[path])
        return sorted(found, key=lambda f: (f.path, f.line, f.col, f.rule))


def _is_torch(cls: type) -> bool:
    return cls.__module__ == "torch" or cls.__module__.startswith("torch.")


def _unwrap(fn):
    """The user's function under torch.compile's wrapper, functools.wraps decorators and bound methods."""
    seen = set()
    while id(fn) not in seen:
        seen.add(id(fn))
        fn = getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", None) or fn
    return getattr(fn, "__func__", fn)


def _name(obj) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


def _module_roots(model: torch.nn.Module, files: _Files, notes: list[str]) -> None:
    model = getattr(model, "_orig_mod", model)  # torch.compile(model) wraps it in an OptimizedModule
    classes = [c for c in dict.fromkeys(type(m) for m in model.modules()) if not _is_torch(c)]
    for cls in classes:
        owner = next((k for k in cls.__mro__ if "forward" in vars(k)), None)  # whose forward runs: maybe a base's
        try:
            path, _, node = files.locate(cls)
            files.classes[path].append(node)  # its methods under @torch.compile are compiled on their own
            if owner is None or _is_torch(owner):
                continue
            path, _, node = files.locate(owner)
            forward = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
            if forward is None:  # assigned (forward = fn) or made by a decorator: no def in the class body
                raise OSError(f"no `def forward` in the body of {owner.__qualname__} at {path}:{node.lineno}")
            files.roots[path].append((forward, node, cls is type(model)))
        except (OSError, TypeError, FullgraphError) as e:
            notes.append(f"lint: {cls.__module__}.{_name(cls)}: source not readable ({env.first_line(e)})")


def _function_roots(fn, files: _Files, notes: list[str]) -> None:
    target = _unwrap(fn)
    try:
        path, tree, node = files.locate(target)
    except (OSError, TypeError, FullgraphError) as e:
        notes.append(f"lint: {_name(target)}: source not readable ({env.first_line(e)})")
        return
    owner = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and node in c.body), None)
    files.roots[path].append((node, owner, True))


def lint_target(obj) -> tuple[list[Finding], list[str]]:
    """Findings in the code of `obj`, a module (its classes and its submodules', not torch's) or a function (plain
    or wrapped by torch.compile), sorted by file and line; and notes, one line each, on what could not be read."""
    files, notes = _Files(), []
    if isinstance(obj, torch.nn.Module):
        _module_roots(obj, files, notes)
    elif callable(obj):
        _function_roots(obj, files, notes)
    else:
        raise TypeError(f"lint_target takes an nn.Module or a function, not {type(obj).__name__}")
    return files.lint(), notes
