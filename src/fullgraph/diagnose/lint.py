"""Static lint of forward code for what breaks or recompiles a torch.compile graph (rules: rules.py, docs/rules.md).

Scanned: `forward` methods, functions decorated with or passed to `torch.compile`, and what they call in the same
file (`self.method(...)` within the class, module-level functions by name), transitively; a callee under
`torch.compiler.disable` runs eagerly by design and is skipped, and so is code that a compiled inference call never
runs (`if self.training:`, `if not torch.compiler.is_compiling():`). `lint_source` lints a whole file;
`lint_scope.lint_target` lints one model's classes or one function through `lint_functions`.

Nothing is imported or run, so "this is a tensor" is read from syntax (the exact guesses: docs/rules.md). Shapes,
ranks, `len()`, `self.<attr>` flags and config, and Python scalars are not tensors: Dynamo guards and specializes
on them rather than breaking the graph (DESIGN.md errata 2), so a condition on them is never a finding.
"""

from __future__ import annotations

import ast
import os
import re
import tokenize
from collections.abc import Iterable

from fullgraph.diagnose import rules as R
from fullgraph.diagnose import syntax as S
from fullgraph.diagnose.report import Finding
from fullgraph.errors import FullgraphError, UsageError

_TENSOR = re.compile(r"(Optional\[)?(torch\.)?([A-Z][a-z]+)?Tensor(?(1)\]|( \| None)?)|None \| (torch\.)?Tensor")
Functions = (ast.FunctionDef, ast.AsyncFunctionDef)


class _Class:
    def __init__(self, node: ast.ClassDef, imports: dict[str, str]):
        self.node = node
        self.methods = {n.name: n for n in node.body if isinstance(n, Functions)}
        self.tensors = S.class_tensors(node, imports)  # buffers and parameters, in whichever method makes them


class _Module:
    """What the file defines (imports, loggers, classes, functions) and which functions to scan."""

    def __init__(self, tree: ast.Module):
        self.imports = S.imports(tree)
        self.loggers = set(R.LOGGER_NAMES) | S.loggers(tree, self.imports)
        self.functions = {n.name: n for n in tree.body if isinstance(n, Functions)}
        self.classes = [_Class(c, self.imports) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
        self.compiled_by_call = S.compiled_by_call(tree, self.imports)  # fast = torch.compile(step)

    def decorated(self, fn: ast.FunctionDef, names: frozenset[str]) -> bool:
        for d in fn.decorator_list:
            d = d.func if isinstance(d, ast.Call) else d
            if S.dotted(d, self.imports) in names or (isinstance(d, ast.Name) and f"torch.{d.id}" in names):
                return True  # a bare `@compile` is taken to be torch's
        return False

    def entry_points(self) -> list[tuple[ast.FunctionDef, ast.ClassDef | None, bool]]:
        """What a whole file offers torch.compile: every forward, and the functions compiled in the file."""
        methods = [(fn, c.node) for c in self.classes for fn in c.methods.values()]
        roots = [(fn, c, True) for fn, c in methods if fn.name == "forward" or self.decorated(fn, R.COMPILE)]
        roots += [(fn, None, True) for n, fn in self.functions.items() if n in self.compiled_by_call]
        return roots + [(fn, None, True) for fn in self.functions.values() if self.decorated(fn, R.COMPILE)]

    def scanned(self, roots) -> list[tuple[ast.FunctionDef, _Class | None, bool]]:
        """(function, its class, whether it is an entry point) for `roots` and what they call, once each."""
        classes = {id(c.node): c for c in self.classes}
        todo = [(fn, classes[id(node)] if node else None, entry) for fn, node, entry in roots]
        seen: dict[int, tuple[ast.FunctionDef, _Class | None, bool]] = {}
        while todo:
            fn, cls, entry = todo.pop(0)
            if id(fn) in seen or self.decorated(fn, R.DISABLE):
                continue
            seen[id(fn)] = (fn, cls, entry)
            self_name = S.self_of(fn) if cls else None
            dead = S.dead_nodes(fn, self_name)  # a callee reached only from a training branch is not scanned
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and id(n) not in dead):
                match call.func:
                    case ast.Attribute(value=ast.Name(id=name), attr=attr) if name == self_name and attr in cls.methods:
                        todo.append((cls.methods[attr], cls, False))
                    case ast.Name(id=name) if name in self.functions:
                        todo.append((self.functions[name], None, False))
        return list(seen.values())


class _Function:
    """The checks on one function. `check` yields (node, rule id, the code to quote)."""

    def __init__(self, module: _Module, fn: ast.FunctionDef, cls: _Class | None, entry: bool):
        self.m, self.fn, self.cls, self.entry = module, fn, cls, entry
        self.self_name = S.self_of(fn) if cls else None
        a = fn.args
        positional = a.posonlyargs + a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + a.defaults
        pairs = zip(positional + a.kwonlyargs, defaults + a.kw_defaults, strict=True)
        ctx = positional[0].arg if cls and not self.self_name and positional else None  # autograd.Function's ctx
        self.params = [(p, d) for p, d in pairs if p.arg not in (self.self_name, ctx)]
        self.param_names = {p.arg for p, _ in self.params}
        self.kwargs = a.kwarg.arg if a.kwarg else None
        flags = {p.arg for p, d in self.params if isinstance(d, ast.Constant) and isinstance(d.value, bool)}
        self.tensors = {p.arg for p, _ in self.params if _TENSOR.fullmatch(S.annotation(p))} - flags
        self.inputs = {p.arg for p, d in self.params if p.annotation is None and d is None}  # most likely tensors
        self.shapes: set[str] = set()
        self.masks: set[str] = set()
        self.modules: set[str] = set()  # loop variables over self.<ModuleList>
        self.locals = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self.locals |= {v.arg for v in (a.vararg, a.kwarg) if v}  # *args, **kwargs: new objects on every call
        self.dead = S.dead_nodes(fn, self.self_name)  # training-only code does not run in the compiled call
        live = [n for n in ast.walk(fn) if id(n) not in self.dead]
        for _ in range(2):  # the second pass sees names assigned from names bound later in the walk
            for node in live:
                if isinstance(node, ast.For) and isinstance(node.iter, ast.Attribute) and self.is_self(node.iter.value):
                    self.modules.update(S.names(node.target))
                elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    names = [n for t in S.targets(node) for n in S.names(t)]
                    if self.is_mask(node.value):
                        self.masks.update(names)
                    if self.is_shape(node.value):
                        self.shapes.update(names)
                    elif (self.tensor_like(node.value) or self.returns_tensor(node.value, loose=True)) and not (
                        isinstance(node.targets[0] if isinstance(node, ast.Assign) else node.target, ast.Tuple)
                        and self.submodule_call(node.value)  # emb, n_frames = self.embed(x): which is a tensor?
                    ):
                        self.tensors.update(names)

    def is_self(self, e: ast.expr) -> bool:
        return self.self_name is not None and isinstance(e, ast.Name) and e.id == self.self_name

    def is_shape(self, e: ast.expr) -> bool:
        """A size from a tensor's shape. Its rank (`dim()`, `ndim`) is fixed per model and does not count."""
        match e:
            case ast.Attribute(attr=attr):
                return attr == "shape"
            case ast.Subscript(value=v):
                return self.is_shape(v)
            case ast.BinOp(left=left, right=right):
                return self.is_shape(left) or self.is_shape(right)
            case ast.Name(id=name):
                return name in self.shapes
            case ast.Call(func=ast.Attribute(attr=attr)):
                return attr in ("size", "numel", "nelement")
            case ast.Call(func=ast.Name(id="len"), args=[arg]):
                return self.tensor_like(arg, loose=True)
        return False

    def tensor_like(self, e: ast.expr, *, loose: bool = False) -> bool:
        """Is `e` a tensor? `loose` counts bare forward arguments too: right for `x[x > 0]`, `len(x)`, `x.sort()`,
        wrong for conditions, where a bare argument is far more often a flag (`if use_cache:`, `if rank == 0:`)
        and a tensor of more than one element would raise in eager anyway."""
        match e:
            case ast.Name(id=name):
                return name in self.tensors or (loose and name in self.inputs)
            case ast.Attribute(value=v, attr=attr) if self.is_self(v):
                return attr in self.cls.tensors
            case ast.Attribute(value=v, attr=attr):
                return attr in R.TENSOR_ATTRS and self.tensor_like(v, loose=loose)
            case ast.Subscript(value=v) | ast.UnaryOp(operand=v):
                return self.tensor_like(v, loose=loose)
            case ast.BinOp(left=a, right=b) | ast.IfExp(body=a, orelse=b):
                return self.tensor_like(a, loose=loose) or self.tensor_like(b, loose=loose)
            case ast.BoolOp(values=values):
                return any(self.tensor_like(v, loose=loose) for v in values)
            case ast.Compare(ops=ops) if all(isinstance(op, (ast.Is, ast.IsNot)) for op in ops):
                return False
            case ast.Compare(left=left, ops=ops) if any(isinstance(op, (ast.In, ast.NotIn)) for op in ops):
                return self.tensor_like(left, loose=loose)  # `k in d` looks a key up; only `t in x` reads a value
            case ast.Compare(left=left, comparators=rest):
                return any(self.tensor_like(v, loose=loose) for v in [left, *rest])
            case ast.Call():
                return self.returns_tensor(e, loose=loose)
        return False

    def submodule_call(self, e: ast.expr) -> bool:
        match e:
            case ast.Call(func=ast.Subscript() as f):  # self.blocks[i](x)
                return self.is_self(S.root(f))
            case ast.Call(func=ast.Name(id=name)):
                return name in self.modules
            case ast.Call(func=ast.Attribute(value=v, attr=attr)):
                return self.is_self(v) and attr not in self.cls.methods
        return False

    def returns_tensor(self, call: ast.expr, *, loose: bool = False) -> bool:
        if self.submodule_call(call):
            return True
        match getattr(call, "func", None):
            case ast.Attribute(value=v, attr=attr) as f:
                dotted = S.dotted(f, self.m.imports)
                if dotted is not None:
                    return S.torch_returns_tensor(dotted)
                if self.is_self(v):  # self.helper(x) is a method: unknown
                    return False
                python_value = (
                    attr in R.SIZE_METHODS or attr in R.PYTHON_METHODS or attr.startswith(("is_", "get_", "_"))
                )
                return not python_value and self.tensor_like(v, loose=True)  # x.relu() on an argument is a tensor
        return False

    def is_mask(self, e: ast.expr) -> bool:
        match e:
            case ast.Compare():
                return self.tensor_like(e, loose=True)
            case ast.Name(id=name):
                return name in self.masks
            case ast.UnaryOp(op=ast.Invert(), operand=v):
                return self.is_mask(v)
            case ast.BinOp(op=ast.BitAnd() | ast.BitOr() | ast.BitXor(), left=a, right=b):
                return self.is_mask(a) or self.is_mask(b)
            case ast.Call(func=ast.Attribute(attr=attr)):
                return attr in R.MASK_FUNCS and self.returns_tensor(e, loose=True)
        return False

    def value_dependent(self, test: ast.expr) -> bool:
        if isinstance(test, ast.BoolOp):  # `not is_compiling() and bool(x)` never reads x once compiled
            return any(self.value_dependent(v) for v in test.values if id(v) not in self.dead)
        for call in (n for n in ast.walk(test) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
            lib = (S.dotted(call.func.value, self.m.imports) or "torch").split(".")[0]
            if call.func.attr in R.VALUE_METHODS and lib == "torch":  # np.any(a) is FG003's; math.prod(s) is fine
                return True
        return self.tensor_like(test)

    def check(self) -> Iterable[tuple[ast.AST, str, str]]:
        nodes = [n for n in ast.walk(self.fn) if id(n) not in self.dead]
        lazy = S.lazy_inits(self.fn)
        tests = [n.test for n in nodes if isinstance(n, (ast.If, ast.While, ast.IfExp, ast.Assert))]
        tests += [t for n in nodes if isinstance(n, ast.comprehension) for t in n.ifs]
        inside = {id(n) for t in tests for n in ast.walk(t)}
        # Outside a condition, `a or b` still tests the truth of a.
        tests += [v for n in nodes if isinstance(n, ast.BoolOp) and id(n) not in inside for v in n.values[:-1]]
        in_branch: set[int] = set()  # nodes of a reported condition: a host sync there is the same finding
        for test in filter(self.value_dependent, tests):
            in_branch.update(id(n) for n in ast.walk(test))
            yield test, "FG001", S.snippet(test)
        for node in nodes:
            if isinstance(node, ast.Call) and (rule := self.check_call(node)):
                if not (rule == "FG002" and id(node) in in_branch):
                    yield node, rule, S.snippet(node)
            elif isinstance(node, (ast.For, ast.comprehension)) and (rule := self.check_loop(node.iter)):
                yield node.iter, rule, S.snippet(node.iter)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):  # x[mask] = 0 keeps its shape
                index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
                if any(map(self.is_mask, index)):
                    yield node, "FG008", S.snippet(node)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value and self.self_name:
                for t in (t for target in S.targets(node) for t in ast.walk(target) if isinstance(t, ast.Attribute)):
                    in_place = isinstance(node, ast.AugAssign) and self.tensor_like(t)  # self.buf += 1 is fine
                    if isinstance(t.ctx, ast.Store) and self.is_self(S.root(t)) and not in_place and id(t) not in lazy:
                        yield t, "FG009", S.snippet(t)
        for p in self.varying_numbers(nodes) if self.entry else ():
            yield p, "FG010", p.arg

    def varying_numbers(self, nodes: list[ast.AST]) -> list[ast.arg]:
        """Number arguments used as values: in arithmetic with a tensor (`x * scale`) or as a loop's bound
        (`range(steps)`), directly or through a local (`s = scale * 2`). Flags (bool) and numbers only tested,
        sliced with or passed on (`use_cache`, `logits_to_keep`) select a graph and are fixed per call site."""
        numbers = {p.arg: p for p, d in self.params if S.is_number_argument(p, d)}
        used: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.BinOp):
                for side, other in ((node.left, node.right), (node.right, node.left)):
                    if self.tensor_like(other, loose=True):
                        used |= S.value_names(side, self.m.imports)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
                used |= {n for a in node.args for n in S.value_names(a, self.m.imports)}
        origin = S.value_origins(nodes, set(numbers), self.m.imports)
        return [numbers[a] for a in sorted({a for n in used & origin.keys() for a in origin[n]})]

    def check_call(self, call: ast.Call) -> str | None:
        f = call.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        dotted = S.dotted(f, self.m.imports) or ""
        receiver = f.value if isinstance(f, ast.Attribute) else None
        bare = isinstance(f, ast.Name)
        if name == "bool" and bare and call.args and self.value_dependent(call.args[0]):
            return "FG001"
        if dotted.split(".")[0] in R.NON_TORCH_LIBS:
            return "FG003"
        if (name in R.SYNC_METHODS and receiver is not None and not dotted) or name == "synchronize":
            return "FG002"
        if name == "to" and any(isinstance(a, ast.Constant) and a.value == "cpu" for a in ast.walk(call)):
            return "FG002"
        if name in ("int", "float") and bare and len(call.args) == 1 and self.tensor_like(call.args[0]):
            return "FG002"
        if (name == "print" and bare) or (name in R.LOG_METHODS and receiver is not None and self._is_logger(receiver)):
            return "FG004"
        if (
            name in R.LIST_MUTATORS
            and receiver is not None
            and not S.is_dict_pop(call)
            and self._outlives_call(receiver)
        ):
            return "FG005"
        if name in R.DICT_VIEWS and self.entry and isinstance(receiver, ast.Name):
            return "FG006" if receiver.id in self.param_names or receiver.id == self.kwargs else None
        method = receiver is not None and not dotted and not self.is_self(receiver)  # x.nonzero(), not np.unique
        torch_op = dotted.startswith("torch.") or method
        if name in R.DYNAMIC_SHAPE_OPS and torch_op:
            return "FG008"
        if name == "where" and dotted.startswith("torch.") and len(call.args) == 1 and not call.keywords:
            return "FG008"
        return None

    def _is_logger(self, r: ast.expr) -> bool:
        r = r.func if isinstance(r, ast.Call) else r  # logging.getLogger(__name__).info(...)
        if (S.dotted(r, self.m.imports) or "").split(".")[0] == "logging":
            return True
        if isinstance(r, ast.Name):
            return r.id in self.m.loggers
        return isinstance(r, ast.Attribute) and r.attr in R.LOGGER_NAMES  # self.logger.info(...)

    def _outlives_call(self, r: ast.expr) -> bool:
        """A list that survives the call: on the module, a global, or an argument of forward. Local lists are fine."""
        if self.tensor_like(r, loose=True):  # x.sort() is a tensor op
            return False
        if isinstance(r, ast.Attribute):
            return self.is_self(S.root(r))
        if not isinstance(r, ast.Name) or r.id in self.m.imports:
            return False
        return self.entry if r.id in self.param_names else r.id not in self.locals

    def check_loop(self, it: ast.expr) -> str | None:
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
            return "FG007" if any(map(self.is_shape, it.args)) else None
        if not self.entry or not isinstance(it, ast.Name):  # a helper's dict argument may be a local of forward
            return None
        # `for k in inputs` iterates a dict when it is **kwargs or annotated as one; inputs.items() is check_call's.
        ann = next((S.annotation(p) for p, _ in self.params if p.arg == it.id), "")
        return "FG006" if it.id == self.kwargs or re.search(r"dict|mapping", ann, re.IGNORECASE) else None


def lint_source(text: str, path: str = "<string>") -> list[Finding]:
    """Findings in one file's source, sorted by position. FullgraphError if it does not parse."""
    tree = S.parse(text, path)
    return lint_functions(text, path, tree, _Module(tree).entry_points())


def lint_functions(text: str, path: str, tree: ast.Module, roots, classes=()) -> list[Finding]:
    """Findings in `roots`, (function node, its class node or None, whether torch.compile is called on it), in the
    methods of `classes` (class nodes) under @torch.compile, and in what they call in the file, sorted by position.
    `tree` is `text` parsed."""
    module = _Module(tree)
    roots = list(roots)
    for c in classes:
        roots += [(fn, c, True) for fn in c.body if isinstance(fn, Functions) and module.decorated(fn, R.COMPILE)]
    found: dict[tuple[int, int, str], str] = {}  # a chain such as x.cpu().numpy() is one finding
    for fn, cls, entry in module.scanned(roots):
        for node, rule, what in _Function(module, fn, cls, entry).check():
            found.setdefault((node.lineno, node.col_offset + 1, rule), what)
    silenced = S.suppressions(text)
    findings = []
    for (line, col, rule), what in found.items():
        if line not in silenced or (silenced[line] is not None and rule not in silenced[line]):
            r = R.BY_ID[rule]
            findings.append(Finding(path, line, col, rule, r.message.format(what=what), r.fix))
    return sorted(findings, key=lambda f: (f.line, f.col, f.rule))


def python_files(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Files named, and *.py under directories named (skipping hidden ones and __pycache__), in order, once each."""
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


def check_select(select: Iterable[str] | None) -> set[str]:
    """The rule ids to report: all when None; UsageError naming any unknown id."""
    wanted = set(R.BY_ID) if select is None else {s.strip().upper() for s in select}
    unknown = sorted(wanted - set(R.BY_ID))
    if unknown:
        raise UsageError(f"unknown rule {', '.join(unknown)}; the rules are {', '.join(R.BY_ID)}")
    return wanted


def lint_paths(paths: Iterable[str | os.PathLike], select: Iterable[str] | None = None) -> list[Finding]:
    """Findings in every file under `paths`, limited to the rule ids in `select` (all rules when None)."""
    wanted = check_select(select)
    findings = []
    for path in python_files(paths):
        try:
            with tokenize.open(path) as f:  # honours a coding cookie, as Python does
                text = f.read()
        except (OSError, SyntaxError, UnicodeDecodeError) as e:
            raise FullgraphError(f"{path}: cannot read: {e}") from e
        findings += [f for f in lint_source(text, path) if f.rule in wanted]
    return findings
