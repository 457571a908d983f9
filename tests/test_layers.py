"""DESIGN.md's layers: every import between fullgraph's packages points down (read from the source with ast)."""

import ast
from pathlib import Path

import fullgraph

SRC = Path(fullgraph.__file__).parent
# replay: whether traced code will replay from CUDA graphs, said by compile and read by ops (fullgraph/replay.py);
# serving: what keeps callables correct under concurrent callers, used by compile and deploy (fullgraph/serving.py)
FLOOR = {"env", "errors", "timing", "replay", "serving", "_capture", "_paths", "_files", "_version"}
# What each package may import besides the floor (DESIGN.md, Layers); cli may import anything.
ALLOWED = {
    "diagnose": {"compile", "bench", "models", "ops", "rewrite"},
    "bench": {"models", "ops", "compile", "kernels", "rewrite"},
    "deploy": {"compile", "ops"},
    "models": {"ops"},
    "rewrite": {"ops", "kernels", "compile"},
    "ops": {"kernels"},
    "compile": set(),
    "kernels": set(),
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):  # function-level imports count too
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "fullgraph":
                names |= {f"fullgraph.{a.name}" for a in node.names}
    return {n.split(".")[1] for n in names if n.startswith("fullgraph.") and len(n.split(".")) > 1}


def test_every_import_between_packages_points_down():
    wrong = []
    for package, allowed in ALLOWED.items():
        for path in sorted((SRC / package).rglob("*.py")):
            for target in imported_packages(path) - FLOOR - allowed - {package}:
                wrong.append(f"{path.relative_to(SRC)} imports fullgraph.{target}")
    assert not wrong, "\n".join(wrong)


def test_the_floor_imports_only_the_floor():
    wrong = [f"{name}.py imports fullgraph.{target}" for name in sorted(FLOOR) if (SRC / f"{name}.py").exists()
             for target in imported_packages(SRC / f"{name}.py") - FLOOR]  # fmt: skip
    assert not wrong, "\n".join(wrong)
