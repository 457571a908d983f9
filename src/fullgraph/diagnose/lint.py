"""Static lint of forward code for what breaks or recompiles a torch.compile graph (rules in rules.py).

Scanned: `forward` methods, functions decorated with or passed to `torch.compile`, and what they call in the same
file (`self.method(...)` within the class, module-level functions by name), transitively. A callee under
`torch.compiler.disable` is skipped: it runs eagerly by design.

Nothing is imported or run, so "this is a tensor" is a guess from syntax. Tensors: forward arguments with no
annotation and no default (or annotated `Tensor`), values computed from them by torch calls and tensor methods,
outputs of submodules, and buffers/parameters made in `__init__`. Not tensors: `.shape`, `.size()`, `.dim()`,
`len()`, other `self.<attr>` (flags, config) and Python scalars. Conditions on those are guarded and specialized
by Dynamo, not broken (DESIGN.md errata 2), so they are never findings.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterable

from fullgraph.diagnose.report import Finding
from fullgraph.diagnose.rules import BY_ID
from fullgraph.errors import FullgraphError, UsageError

# Reductions and conversions whose result is a tensor's value: a condition that calls one is data-dependent.
VALUE_METHODS = frozenset(
    "sum any all item max min mean median std var norm prod amax amin argmax argmin count_nonzero equal allclose "
    "is_nonzero tolist".split()
)
SIZE_METHODS = frozenset("size dim ndimension numel nelement element_size stride storage_offset get_device".split())
TENSOR_ATTRS = frozenset("T mT H mH real imag data grad".split())  # attributes of a tensor that are tensors
SYNC_METHODS = frozenset("item tolist numpy cpu".split())
NON_TORCH_LIBS = frozenset(("numpy", "scipy", "pandas"))
LOG_METHODS = frozenset("debug info warning warn error exception critical log".split())
LOGGER_NAMES = frozenset(("logger", "_logger", "LOGGER", "log", "_log"))
LIST_MUTATORS = frozenset("append extend insert pop remove sort clear reverse".split())
DICT_VIEWS = frozenset(("items", "keys", "values"))
DYNAMIC_SHAPE_OPS = frozenset(("nonzero", "unique", "unique_consecutive", "masked_select", "argwhere"))
MASK_FUNCS = frozenset(
    "isnan isinf isfinite isneginf isposinf isin isclose logical_and logical_or logical_not logical_xor "
    "eq ne gt ge lt le bool".split()
)
NOT_TENSOR_TORCH = frozenset(("finfo", "iinfo", "device", "numel", "broadcast_shapes"))
NOT_TENSOR_PACKAGES = ("torch.cuda.", "torch.backends.", "torch.compiler.", "torch.jit.", "torch._dynamo.")
SCALAR_TYPES = frozenset(("int", "float", "bool"))
DISABLE = frozenset(("torch.compiler.disable", "torch._dynamo.disable"))
_IGNORE = re.compile(r"#\s*fullgraph:\s*ignore(?:\[([^\]]*)\])?")


def _dotted(node: ast.expr, imports: dict[str, str]) -> str | None:
    """`np.random.rand` -> "numpy.random.rand" when the root name was imported in the file, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imports:
        return None
    return ".".join([imports[node.id], *reversed(parts)])


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _names(e)]
    return _names(target.value) if isinstance(target, ast.Starred) else []


def _is_scalar_annotation(a: ast.expr) -> bool:
    if isinstance(a, ast.Constant) and isinstance(a.value, str):  # a string annotation: "int"
        try:
            a = ast.parse(a.value, mode="eval").body
        except SyntaxError:
            return False
    if isinstance(a, ast.Name):
        return a.id in SCALAR_TYPES
    if isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name) and a.value.id == "Optional":
        return _is_scalar_annotation(a.slice)
    if isinstance(a, ast.BinOp) and isinstance(a.op, ast.BitOr):  # int | None
        sides = (a.left, a.right)
        none = [isinstance(s, ast.Constant) and s.value is None for s in sides]
        return all(n or _is_scalar_annotation(s) for n, s in zip(none, sides)) and not all(none)
    return False


def _is_number(d: ast.expr | None) -> bool:
    if isinstance(d, ast.UnaryOp) and isinstance(d.op, (ast.USub, ast.UAdd)):
        d = d.operand
    return isinstance(d, ast.Constant) and isinstance(d.value, (int, float)) and d.value is not None


def _snippet(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 60 else text[:57] + "..."


class _Module:
    """What the file defines: imports, loggers, classes and their tensors, functions; and what to scan."""

    def __init__(self, tree: ast.Module):
        self.imports: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    root = a.name.split(".")[0]
                    self.imports[a.asname or root] = a.name if a.asname else root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                self.imports.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        self.loggers = set(LOGGER_NAMES)
        self.functions: dict[str, ast.FunctionDef] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                if _dotted(node.value.func, self.imports) == "logging.getLogger":
                    self.loggers.update(n for t in node.targets for n in _names(t))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
        self.classes = [_Class(c, self.imports) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
        self.compiled_by_call = {
            a.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _dotted(node.func, self.imports) == "torch.compile"
            for a in node.args[:1]
            if isinstance(a, ast.Name)
        }

    def _decorated(self, fn: ast.FunctionDef, names: Iterable[str]) -> bool:
        for d in fn.decorator_list:
            d = d.func if isinstance(d, ast.Call) else d
            if _dotted(d, self.imports) in names or (isinstance(d, ast.Name) and f"torch.{d.id}" in names):
                return True  # a bare `@compile` is taken to be torch's
        return False

    def scanned(self) -> list[tuple[ast.FunctionDef, _Class | None, bool]]:
        """(function, its class, is it an entry point) for everything to scan, each once."""
        todo = [(fn, c, True) for c in self.classes for name, fn in c.methods.items() if name == "forward"]
        todo += [
            (fn, c, True) for c in self.classes for fn in c.methods.values() if self._decorated(fn, {"torch.compile"})
        ]
        todo += [
            (fn, None, True)
            for name, fn in self.functions.items()
            if name in self.compiled_by_call or self._decorated(fn, {"torch.compile"})
        ]
        seen: dict[int, tuple[ast.FunctionDef, _Class | None, bool]] = {}
        while todo:
            fn, cls, entry = todo.pop(0)
            if id(fn) in seen or self._decorated(fn, DISABLE):
                continue
            seen[id(fn)] = (fn, cls, entry)
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                f = call.func
                if (
                    cls
                    and isinstance(f, ast.Attribute)
                    and isinstance(f.value, ast.Name)
                    and f.value.id == cls.self_of(fn)
                ):
                    if f.attr in cls.methods:
                        todo.append((cls.methods[f.attr], cls, False))
                elif isinstance(f, ast.Name) and f.id in self.functions:
                    todo.append((self.functions[f.id], None, False))
        return list(seen.values())


class _Class:
    def __init__(self, node: ast.ClassDef, imports: dict[str, str]):
        body = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.methods = {n.name: n for n in body}
        self.tensors: set[str] = set()  # buffers and parameters, wherever the class makes them
        for node in (n for fn in body for n in ast.walk(fn)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                if node.func.attr == "register_buffer" and isinstance(node.args[0], ast.Constant):
                    self.tensors.add(str(node.args[0].value))
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                dotted = _dotted(node.value.func, imports) or ""
                last = dotted.rsplit(".", 1)[-1]
                if last in ("Parameter", "Buffer") or (dotted.startswith("torch.") and last[:1].islower()):
                    self.tensors.update(t.attr for t in node.targets if isinstance(t, ast.Attribute))

    @staticmethod
    def self_of(fn: ast.FunctionDef) -> str | None:
        static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
        args = fn.args.posonlyargs + fn.args.args
        return args[0].arg if args and not static else None


class _Function:
    """The checks on one function's body. `check` yields (node, rule id, the code to quote)."""

    def __init__(self, module: _Module, fn: ast.FunctionDef, cls: _Class | None, entry: bool):
        self.m, self.fn, self.cls, self.entry = module, fn, cls, entry
        self.self_name = cls.self_of(fn) if cls else None
        a = fn.args
        positional = a.posonlyargs + a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + a.defaults
        self.params = [
            (p, d) for p, d in zip(positional + a.kwonlyargs, defaults + a.kw_defaults) if p.arg != self.self_name
        ]
        self.kwargs = a.kwarg.arg if a.kwarg else None
        self.tensors = {
            p.arg
            for p, d in self.params
            if (p.annotation is None and d is None) or (p.annotation and "Tensor" in ast.unparse(p.annotation))
        }
        self.shapes: set[str] = set()
        self.masks: set[str] = set()
        self.modules: set[str] = set()  # loop variables over self.<ModuleList>
        self.locals = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for _ in range(2):  # a second pass sees names assigned from names bound later in the walk
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.For)
                    and self.is_self(_root(node.iter))
                    and isinstance(node.iter, ast.Attribute)
                ):
                    self.modules.update(_names(node.target))
                elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    names = [n for t in getattr(node, "targets", [getattr(node, "target", None)]) for n in _names(t)]
                    if self.is_mask(node.value):
                        self.masks.update(names)
                    if self.is_shape(node.value):
                        self.shapes.update(names)
                    elif self.tensor_like(node.value):
                        self.tensors.update(names)

    def is_self(self, e: ast.expr) -> bool:
        return self.self_name is not None and isinstance(e, ast.Name) and e.id == self.self_name

    def is_shape(self, e: ast.expr) -> bool:
        if isinstance(e, ast.Attribute):
            return e.attr in ("shape", "ndim")
        if isinstance(e, ast.Subscript):
            return self.is_shape(e.value)
        if isinstance(e, ast.BinOp):
            return self.is_shape(e.left) or self.is_shape(e.right)
        if isinstance(e, ast.Name):
            return e.id in self.shapes
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
            return e.func.attr in SIZE_METHODS
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "len" and len(e.args) == 1:
            return self.tensor_like(e.args[0])
        return False

    def tensor_like(self, e: ast.expr) -> bool:
        if isinstance(e, ast.Name):
            return e.id in self.tensors
        if isinstance(e, ast.Attribute):
            if self.is_self(e.value):
                return e.attr in self.cls.tensors
            return e.attr in TENSOR_ATTRS and self.tensor_like(e.value)
        if isinstance(e, ast.Subscript):
            return self.tensor_like(e.value)
        if isinstance(e, ast.BinOp):
            return self.tensor_like(e.left) or self.tensor_like(e.right)
        if isinstance(e, ast.UnaryOp):
            return self.tensor_like(e.operand)
        if isinstance(e, ast.BoolOp):
            return any(map(self.tensor_like, e.values))
        if isinstance(e, ast.IfExp):
            return self.tensor_like(e.body) or self.tensor_like(e.orelse)
        if isinstance(e, ast.Compare):
            if all(isinstance(op, (ast.Is, ast.IsNot)) for op in e.ops):
                return False
            if any(isinstance(op, (ast.In, ast.NotIn)) for op in e.ops):  # `k in d` is a dict lookup, not a value
                return self.tensor_like(e.left)
            return any(map(self.tensor_like, [e.left, *e.comparators]))
        return isinstance(e, ast.Call) and self.returns_tensor(e)

    def returns_tensor(self, call: ast.Call) -> bool:
        f = call.func
        if isinstance(f, ast.Subscript):  # self.blocks[i](x)
            return self.is_self(_root(f))
        if isinstance(f, ast.Name):
            return f.id in self.modules
        if not isinstance(f, ast.Attribute):
            return False
        dotted = _dotted(f, self.m.imports)
        if dotted is not None:
            last = dotted.rsplit(".", 1)[-1]
            return (
                dotted.startswith("torch.")
                and not dotted.startswith(NOT_TENSOR_PACKAGES)
                and last[:1].islower()
                and not last.startswith(("is_", "get_", "set_"))
                and last not in NOT_TENSOR_TORCH
            )
        if self.is_self(f.value):  # self.norm(x) is a submodule; self.helper(x) is a method, unknown
            return f.attr not in self.cls.methods
        return self.tensor_like(f.value) and f.attr not in SIZE_METHODS and not f.attr.startswith("is_")

    def is_mask(self, e: ast.expr) -> bool:
        if isinstance(e, ast.Compare):
            return self.tensor_like(e)
        if isinstance(e, ast.Name):
            return e.id in self.masks
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Invert):
            return self.is_mask(e.operand)
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
            return self.is_mask(e.left) or self.is_mask(e.right)
        return isinstance(e, ast.Call) and getattr(e.func, "attr", "") in MASK_FUNCS and self.returns_tensor(e)

    def value_dependent(self, test: ast.expr) -> bool:
        if isinstance(test, ast.BoolOp):
            return any(map(self.value_dependent, test.values))
        for call in (n for n in ast.walk(test) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
            lib = (_dotted(call.func.value, self.m.imports) or "torch").split(".")[0]
            if call.func.attr in VALUE_METHODS and lib == "torch":  # np.any(...) is FG003's, math.prod(...) is fine
                return True
        return self.tensor_like(test)

    def check(self) -> Iterable[tuple[ast.AST, str, str]]:
        in_branch: set[int] = set()  # nodes inside a reported condition: their host syncs are the same finding
        tests = []
        for node in ast.walk(self.fn):
            if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
                tests.append(node.test)
            elif isinstance(node, ast.comprehension):
                tests += node.ifs
            elif isinstance(node, ast.BoolOp):
                tests += node.values[:-1]  # `a or b` tests the truth of a
        for test in tests:
            if self.value_dependent(test):
                in_branch.update(id(n) for n in ast.walk(test))
                yield test, "FG001", _snippet(test)
        for node in ast.walk(self.fn):
            if isinstance(node, ast.Call):
                rule = self.check_call(node)
                if rule and not (rule == "FG002" and id(node) in in_branch):
                    yield node, rule, _snippet(node)
            elif isinstance(node, (ast.For, ast.comprehension)):
                rule = self.check_loop(node.iter)
                if rule:
                    yield node.iter, rule, _snippet(node.iter)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
                if any(map(self.is_mask, index)):
                    yield node, "FG008", _snippet(node)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and self.self_name and node.value:
                targets = getattr(node, "targets", [getattr(node, "target", None)])
                for t in (t for t in targets for t in ast.walk(t) if isinstance(t, ast.Attribute)):
                    in_place = isinstance(node, ast.AugAssign) and self.tensor_like(t)  # self.buf += 1 is fine
                    if self.is_self(_root(t)) and isinstance(t.ctx, ast.Store) and not in_place:
                        yield t, "FG009", _snippet(t)
        if self.entry:
            for p, d in self.params:
                if (p.annotation is not None and _is_scalar_annotation(p.annotation)) or _is_number(d):
                    yield p, "FG010", p.arg

    def check_call(self, call: ast.Call) -> str | None:
        f = call.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        dotted = _dotted(f, self.m.imports) or ""
        receiver = f.value if isinstance(f, ast.Attribute) else None
        if name == "bool" and isinstance(f, ast.Name) and call.args and self.value_dependent(call.args[0]):
            return "FG001"
        if dotted.split(".")[0] in NON_TORCH_LIBS:
            return "FG003"
        if (name in SYNC_METHODS and receiver is not None and not dotted) or name == "synchronize":
            return "FG002"
        if name == "to" and any(isinstance(a, ast.Constant) and a.value == "cpu" for a in self._arg_values(call)):
            return "FG002"
        if name in ("int", "float") and isinstance(f, ast.Name) and len(call.args) == 1:
            return "FG002" if self.tensor_like(call.args[0]) else None
        if name == "print" and isinstance(f, ast.Name):
            return "FG004"
        if name in LOG_METHODS and receiver is not None and self._is_logger(receiver):
            return "FG004"
        if name in LIST_MUTATORS and receiver is not None and self._outlives_call(receiver):
            return "FG005"
        torch_op = dotted.startswith("torch.") or (receiver is not None and not dotted and not self.is_self(receiver))
        if name in DYNAMIC_SHAPE_OPS and torch_op:
            return "FG008"
        if name == "where" and dotted.startswith("torch.") and len(call.args) == 1 and not call.keywords:
            return "FG008"
        return None

    @staticmethod
    def _arg_values(call: ast.Call) -> list[ast.expr]:
        return [*call.args, *(k.value for k in call.keywords)]

    def _is_logger(self, r: ast.expr) -> bool:
        r = r.func if isinstance(r, ast.Call) else r  # logging.getLogger(__name__).info(...)
        if (_dotted(r, self.m.imports) or "").split(".")[0] == "logging":
            return True
        return (
            r.id in self.m.loggers
            if isinstance(r, ast.Name)
            else isinstance(r, ast.Attribute) and r.attr in LOGGER_NAMES
        )

    def _outlives_call(self, r: ast.expr) -> bool:
        """A list that survives the call: on the module, a global, or (in forward) an argument. Local lists are fine."""
        if self.tensor_like(r):  # x.sort() is a tensor op
            return False
        if isinstance(r, ast.Attribute):
            return self.is_self(_root(r))
        if not isinstance(r, ast.Name) or r.id in self.m.imports:
            return False
        is_param = r.id in {p.arg for p, _ in self.params}
        return (is_param and self.entry) or (not is_param and r.id not in self.locals)

    def check_loop(self, it: ast.expr) -> str | None:
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
            return "FG007" if any(map(self.is_shape, it.args)) else None
        if not self.entry:  # a helper's dict argument may well be a local of forward
            return None
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr in DICT_VIEWS:
            d = it.func.value  # inputs.items(): a dict whatever its annotation
        elif isinstance(it, ast.Name) and (it.id == self.kwargs or self._dict_annotated(it.id)):
            d = it  # `for k in inputs` iterates a dict only when it is annotated as one
        else:
            return None
        return "FG006" if isinstance(d, ast.Name) and d.id in {p.arg for p, _ in self.params} | {self.kwargs} else None

    def _dict_annotated(self, name: str) -> bool:
        return any(
            p.arg == name and p.annotation is not None and re.search(r"dict|mapping", ast.unparse(p.annotation), re.I)
            for p, _ in self.params
        )


def _suppressions(text: str) -> dict[int, frozenset[str] | None]:
    """line -> rule ids silenced there by `# fullgraph: ignore[FG001,FG002]`; None for a bare `# fullgraph: ignore`."""
    out: dict[int, frozenset[str] | None] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and (m := _IGNORE.search(tok.string)):
            ids = None if m.group(1) is None else frozenset(s.strip().upper() for s in m.group(1).split(","))
            out[tok.start[0]] = ids
    return out


def lint_source(text: str, path: str = "<string>") -> list[Finding]:
    """Findings in one file's source, sorted by line; one per rule per line. Raises FullgraphError if it won't parse."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as e:
        raise FullgraphError(f"{path}:{e.lineno}: cannot parse: {e.msg}") from e
    except ValueError as e:  # null bytes in the source
        raise FullgraphError(f"{path}: cannot parse: {e}") from e
    module = _Module(tree)
    first: dict[tuple[int, str], tuple[int, str]] = {}
    for fn, cls, entry in module.scanned():
        for node, rule, what in _Function(module, fn, cls, entry).check():
            key, col = (node.lineno, rule), node.col_offset + 1
            if key not in first or col < first[key][0]:
                first[key] = (col, what)
    silenced = _suppressions(text)
    findings = []
    for (line, rule), (col, what) in first.items():
        if line in silenced and (silenced[line] is None or rule in silenced[line]):
            continue
        r = BY_ID[rule]
        findings.append(Finding(path, line, col, rule, r.message.format(what=what), r.fix))
    return sorted(findings, key=lambda f: (f.line, f.col, f.rule))


def python_files(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Files named, and *.py under directories named (skipping hidden ones and __pycache__), in order."""
    files: list[str] = []
    for p in map(os.fspath, paths):
        if os.path.isdir(p):
            for root, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
        elif os.path.exists(p):
            files.append(p)  # named explicitly: linted whatever its suffix (pre-commit passes scripts too)
        else:
            raise FullgraphError(f"{p}: no such file or directory")
    return list(dict.fromkeys(files))


def lint_paths(paths: Iterable[str | os.PathLike], select: Iterable[str] | None = None) -> list[Finding]:
    """Findings in every file under `paths`, limited to the rule ids in `select` (all rules when None)."""
    wanted = set(BY_ID) if select is None else {s.strip().upper() for s in select}
    unknown = sorted(wanted - set(BY_ID))
    if unknown:
        raise UsageError(f"unknown rule {', '.join(unknown)}; the rules are {', '.join(BY_ID)}")
    findings = []
    for path in python_files(paths):
        try:
            with tokenize.open(path) as f:  # honours a coding cookie, as Python does
                text = f.read()
        except (OSError, SyntaxError, UnicodeDecodeError) as e:
            raise FullgraphError(f"{path}: cannot read: {e}") from e
        findings += [f for f in lint_source(text, path) if f.rule in wanted]
    return findings
