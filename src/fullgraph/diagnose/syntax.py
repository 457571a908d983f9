"""What the linter reads from syntax alone: dotted names, assignment targets, annotations, short snippets."""

from __future__ import annotations

import ast

from fullgraph.diagnose import rules as R


def dotted(node: ast.expr, imports: dict[str, str]) -> str | None:
    """`np.random.rand` -> "numpy.random.rand" when the root name was imported in the file, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in imports:
        return None
    return ".".join([imports[node.id], *reversed(parts)])


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
