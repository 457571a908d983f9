"""A script of benchmarks/ loaded as a module, for the tests that check one without a GPU."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str, register: bool = False):
    """benchmarks/NAME.py executed as module NAME; `register` puts it in sys.modules first (a dataclass defined in
    it looks its module up while the class is built); the caller removes it."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
