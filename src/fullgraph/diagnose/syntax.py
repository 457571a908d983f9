"""What the linter reads from syntax alone: imports and dotted names, assignment targets, annotations, the branches a
compiled inference call never takes, where a number's value flows, suppression comments, short snippets."""

from __future__ import annotations

import ast
import io
import re
import tokenize

from fullgraph.diagnose import rules as R
from fullgraph.errors import FullgraphError

_IGNORE = re.compile(r"#\s*fullgraph:\s*ignore(?:\[([^\]]*)\])?")
_NUMBER = re.compile(r"(Optional\[)?(int|float)(?(1)\]|( \| None)?)|None \| (int|float)")


def parse(text: str, path: str) -> ast.Module:
    """The file's syntax tree; FullgraphError naming the file (and line) if it does not parse."""
    try:
        return ast.parse(text, filename=path)
    except SyntaxError as e:
        raise FullgraphError(f"{path}:{e.lineno}: cannot parse: {e.msg}") from e
    except ValueError as e:  # null bytes in the source
        raise FullgraphError(f"{path}: cannot parse: {e}") from e


def dotted(node: ast.expr, imports: dict[str, str]) -> str | None:
    """`np.random.rand` -> "numpy.random.rand" when the root name was imported in the file, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imports:
        return None
    return ".".join([imports[node.id], *reversed(parts)])


def imports(tree: ast.Module) -> dict[str, str]:
    """The names a file's absolute imports bind -> what they name: `np` -> "numpy", `F` -> "torch.nn.functional"."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(
                {a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0] for a in node.names}
            )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return out


def loggers(tree: ast.Module, imports: dict[str, str]) -> set[str]:
    """Module-level names bound to `logging.getLogger(...)`."""
    out: set[str] = set()
    for node in tree.body:
        match node:
            case ast.Assign(targets=targets, value=ast.Call(func=f)) if dotted(f, imports) == "logging.getLogger":
                out.update(n for t in targets for n in names(t))
    return out


def compiled_by_call(tree: ast.Module, imports: dict[str, str]) -> set[str]:
    """Names of functions passed to torch.compile in the file: `fast = torch.compile(step)`."""
    calls = (n for n in ast.walk(tree) if isinstance(n, ast.Call) and dotted(n.func, imports) in R.COMPILE)
    return {a.id for n in calls for a in n.args[:1] if isinstance(a, ast.Name)}


def class_tensors(node: ast.ClassDef, imports: dict[str, str]) -> set[str]:
    """The attributes a class makes tensors, in any of its methods: `register_buffer("name", ...)`, and
    `self.attr = nn.Parameter(...)` / `nn.Buffer(...)` / a torch function's result."""
    out: set[str] = set()
    for n in (n for fn in node.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(fn)):
        match n:
            case ast.Call(func=ast.Attribute(attr="register_buffer"), args=[ast.Constant(value=str(name)), *_]):
                out.add(name)
            case ast.Assign(value=ast.Call(func=func)):
                name = dotted(func, imports) or ""
                if name.rsplit(".", 1)[-1] in ("Parameter", "Buffer") or torch_returns_tensor(name):
                    out.update(t.attr for t in n.targets if isinstance(t, ast.Attribute))
    return out


def torch_returns_tensor(dotted: str) -> bool:
    """torch.relu, F.relu, torch.ops.lib.op do; torch.is_tensor, torch.device, torch.nn.Linear, torch.cuda.* don't."""
    namespace, name = dotted.rsplit(".", 1) if "." in dotted else ("", dotted)
    return (
        (namespace in R.TENSOR_NAMESPACES or dotted.startswith("torch.ops."))
        and name[:1].islower()
        and not name.startswith(("is_", "has_", "get_", "set_"))
        and name not in R.NOT_TENSOR_TORCH
    )


def annotation(p: ast.arg) -> str:
    return ast.unparse(p.annotation).strip("'\"") if p.annotation else ""


def root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def names(target: ast.expr | None) -> list[str]:
    match target:
        case ast.Name(id=name):
            return [name]
        case ast.Tuple(elts=elts) | ast.List(elts=elts):
            return [n for e in elts for n in names(e)]
        case ast.Starred(value=value):
            return names(value)
    return []


def targets(node: ast.Assign | ast.AugAssign | ast.AnnAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def is_number(d: ast.expr | None) -> bool:
    if isinstance(d, ast.UnaryOp) and isinstance(d.op, (ast.USub, ast.UAdd)):
        d = d.operand
    return isinstance(d, ast.Constant) and isinstance(d.value, (int, float))  # bool is an int too


def snippet(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 60 else text[:57] + "..."


def is_number_argument(p: ast.arg, default: ast.expr | None) -> bool:
    """Annotated int or float (or Optional of one), or with a number default; a bool is a flag, not a number."""
    flag = "bool" in annotation(p) or (isinstance(default, ast.Constant) and isinstance(default.value, bool))
    return not flag and bool(_NUMBER.fullmatch(annotation(p)) or is_number(default))


def is_dict_pop(call: ast.Call) -> bool:
    """`d.pop("key")`, `d.pop(k, default)`: a dict's pop (a list's takes one index), which no list guard sees."""
    f, args = call.func, call.args
    key = bool(args) and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str)
    return isinstance(f, ast.Attribute) and f.attr == "pop" and (len(args) == 2 or key)


def definitions(tree: ast.Module) -> dict[str, list[ast.AST]]:
    """Qualified name (as `__qualname__` spells it: `Outer.Inner`, `make.<locals>.Net`) -> the class and function
    nodes defined under it, in source order."""
    out: dict[str, list[ast.AST]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                out.setdefault(prefix + child.name, []).append(child)
                inner = "." if isinstance(child, ast.ClassDef) else ".<locals>."
                visit(child, prefix + child.name + inner)
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def first_line(node: ast.FunctionDef | ast.ClassDef) -> int:
    """The line `inspect` starts a definition at: its first decorator's, else its own."""
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def self_of(fn: ast.FunctionDef) -> str | None:
    """The name a method calls its instance (`self`); None for a static method."""
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    args = fn.args.posonlyargs + fn.args.args
    return args[0].arg if args and not static else None


def known_truth(test: ast.expr, self_name: str | None) -> bool | None:
    """What a condition is in a compiled inference call, where syntax alone says: `self.training` is False (the
    doctor runs the model in eval mode), `is_compiling()` and its kin True, `torch.jit.is_scripting()` and
    `is_tracing()` False; `not`, `and`, `or` of those. None for anything else."""
    match test:
        case ast.Attribute(value=ast.Name(id=name), attr="training"):
            return False if name == self_name else None
        case ast.Call(func=ast.Attribute(attr=name) | ast.Name(id=name), args=[], keywords=[]):
            return True if name in R.COMPILING else False if name in R.NOT_COMPILING else None
        case ast.UnaryOp(op=ast.Not(), operand=v):
            truth = known_truth(v, self_name)
            return None if truth is None else not truth
        case ast.BoolOp(op=op, values=values):
            truths = [known_truth(v, self_name) for v in values]
            decisive = isinstance(op, ast.Or)  # the value that settles the whole: True for `or`, False for `and`
            return decisive if decisive in truths else (not decisive if all(t is not None for t in truths) else None)
    return None


def dead_nodes(fn: ast.FunctionDef, self_name: str | None) -> set[int]:
    """ids of the nodes in branches a compiled inference call never takes (known_truth): Dynamo does not trace them."""
    dead: set[int] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.BoolOp):  # what follows a settled operand is not evaluated: `not is_compiling() and x`
            settled = [i for i, v in enumerate(node.values) if known_truth(v, self_name) is isinstance(node.op, ast.Or)]
            for v in node.values[settled[0] + 1 :] if settled else []:
                dead.update(id(n) for n in ast.walk(v))
        if isinstance(node, (ast.If, ast.IfExp, ast.While)) and id(node) not in dead:
            truth = known_truth(node.test, self_name)
            branch = node.body if truth is False else node.orelse if truth is True else []
            for part in branch if isinstance(branch, list) else [branch]:
                dead.update(id(n) for n in ast.walk(part))
    return dead


def lazy_inits(fn: ast.FunctionDef) -> set[int]:
    """ids of attribute writes made only while the attribute is unset, `if self.cache is None: self.cache = ...`:
    the write happens once, so the guard on it fails once (one recompile), not on every call."""
    out = set()
    for node in (n for n in ast.walk(fn) if isinstance(n, ast.If)):
        test = node.test  # `unset and ...` runs the body only while unset; `unset or ...` may run it every call
        for t in test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]:
            match t:
                case ast.Compare(left=ast.Attribute() as left, ops=[ast.Is()], comparators=[ast.Constant(value=None)]):
                    stores = (a for n in node.body for a in ast.walk(n) if isinstance(a, ast.Attribute))
                    out.update(id(a) for a in stores if isinstance(a.ctx, ast.Store) and _same(a, left))
    return out


def _same(a: ast.expr, b: ast.expr) -> bool:
    """The same expression, whether stored to or loaded."""
    return ast.dump(a).replace("Store()", "Load()") == ast.dump(b).replace("Store()", "Load()")


def value_names(e: ast.expr | None, imports: dict[str, str]) -> set[str]:
    """Names whose value flows into `e` by arithmetic (`2 * scale + t`, `-n`, `a or 1.0`, `float(s)`, `math.sqrt(s)`):
    not through subscripts, attributes or other calls, and not through a condition's test."""
    match e:
        case ast.Name(id=name):
            return {name}
        case ast.BinOp(left=a, right=b) | ast.IfExp(body=a, orelse=b):
            return value_names(a, imports) | value_names(b, imports)
        case ast.UnaryOp(operand=v):
            return value_names(v, imports)
        case ast.BoolOp(values=values):
            return {n for v in values for n in value_names(v, imports)}
        case ast.Call(func=f, args=args) if (isinstance(f, ast.Name) and f.id in R.NUMBER_FUNCS) or (
            (dotted(f, imports) or "").startswith("math.")
        ):
            return {n for a in args for n in value_names(a, imports)}
    return set()


def value_origins(nodes: list[ast.AST], names: set[str], imports: dict[str, str]) -> dict[str, set[str]]:
    """name -> which of `names` its value comes from by arithmetic: each of `names` itself, and locals assigned from
    them (`s = scale * 2`, then `t = s + 1`)."""
    origin = {n: {n} for n in names}
    for _ in range(2):  # the second pass sees a local assigned from one bound later in the walk
        for node in nodes:
            match node:
                case ast.Assign(targets=[ast.Name(id=name)], value=value) if (
                    src := value_names(value, imports) & origin.keys()
                ):
                    origin[name] = set().union(*(origin[n] for n in src))
    return origin


def suppressions(text: str) -> dict[int, frozenset[str] | None]:
    """line -> rule ids silenced there by `# fullgraph: ignore[FG001,FG002]`; None for a bare `# fullgraph: ignore`."""
    out: dict[int, frozenset[str] | None] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and (m := _IGNORE.search(tok.string)):
            ids = None if m.group(1) is None else frozenset(s.strip().upper() for s in m.group(1).split(","))
            out[tok.start[0]] = ids
    return out
