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

import torch

_state = [False]


class replayed:
    """Within it, code traced by torch.compile will run from CUDA graphs (`on`); restores the previous state. A
    class, not a generator context manager: it is entered around every call of a compiled model (a fraction of a
    microsecond against a few)."""

    __slots__ = ("before", "on")

    def __init__(self, on: bool = True):
        self.on = on

    def __enter__(self) -> None:
        self.before = _state[0]
        _state[0] = self.on

    def __exit__(self, *exc) -> None:
        _state[0] = self.before


@torch.compiler.assume_constant_result
def under_graphs() -> bool:
    """Will the code being traced now run from CUDA graphs (see the module docstring)?"""
    return _state[0]
