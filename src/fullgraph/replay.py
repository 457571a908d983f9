"""Whether the code torch.compile is tracing will run from CUDA graphs: `compile` says so, `ops` read it (the floor).

Some of an op's compiled choices trade host time for GPU time: `ops.linear_gelu`'s cuBLASLt epilogue saves a pass
over the MLP's widest activation but costs more host time per call than Inductor's addmm + GELU, so compiled
`auto` takes it only above a size where the GPU time saved outweighs the host time (`ops/measured.py`). Under CUDA
graphs the host time is paid once, at capture, and the trade pays at every size (timm-weight ViT-B/16 at batch 4 on
the H200, reduce-overhead: 0.626 ms with the epilogue against 0.675 without; `benchmarks/results/vit_probe_h200.txt`).

Traced code cannot see which mode its backend will compile in, so `fullgraph.compile` says it: it enters
`replayed()` around the calls of a model (or a plan's part) whose configuration replays CUDA graphs (a mode or
options with `triton.cudagraphs`, backend "cudagraphs"), and the ops read `under_graphs()` while Dynamo traces (a
constant to it: read once per trace, never guarded). A plain `torch.compile(mode="reduce-overhead")` does not enter
it, and the ops then take the choice that is right in every mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_state = [False]


@contextlib.contextmanager
def replayed(on: bool = True) -> Iterator[None]:
    """Within it, code traced by torch.compile will run from CUDA graphs (`on`); restores the previous state."""
    before = _state[0]
    _state[0] = on
    try:
        yield
    finally:
        _state[0] = before


@torch.compiler.assume_constant_result
def under_graphs() -> bool:
    """Will the code being traced now run from CUDA graphs (see the module docstring)?"""
    return _state[0]
