"""Replacing a function where torchvision's own code looks it up at call time, for the length of a `with` block.

torchvision's detection modules call their helpers through module attributes (`box_ops.batched_nms`, the poolers'
`roi_align`), so replacing the attribute in every loaded torchvision module that holds the original reaches them
all. Code that bound the name itself (`from torchvision.ops import roi_align` in the user's module) keeps the
original. The change is process-wide while the block runs, and undone on the way out, an error included.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator

from fullgraph.errors import UsageError


@contextlib.contextmanager
def swapped(module: str, name: str, make: Callable[[Callable], Callable], caller: str) -> Iterator[None]:
    """Within the block, `module.name` and every loaded torchvision module's attribute that is the same function
    are `make(original)`. `caller` names the public function in the error raised when torchvision is missing."""
    try:
        original = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise UsageError(f"{caller}() needs torchvision: pip install torchvision") from e
    replacement = make(original)
    loaded = [m for key, m in list(sys.modules.items()) if key.split(".")[0] == "torchvision" and m is not None]
    holders = [m for m in loaded if getattr(m, name, None) is original]
    for m in holders:
        setattr(m, name, replacement)
    try:
        yield
    finally:
        for m in holders:
            setattr(m, name, original)
