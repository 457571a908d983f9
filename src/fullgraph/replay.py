"""Whether the code torch.compile is tracing will run from CUDA graphs: `compile` says so, `ops` read it (the floor).

Some of an op's compiled choices trade host time for GPU time: `ops.linear_gelu`'s cuBLASLt epilogue saves a pass
over the MLP's widest activation but costs more host time per call than Inductor's addmm + GELU, so compiled
`auto` takes it only above a size where the GPU time saved outweighs the host time (`ops/measured.py`). Under CUDA
graphs the host time is paid once, at capture, and the trade pays at every size (timm-weight ViT-B/16 at batch 4 on
the H200, reduce-overhead: 0.626 ms with the epilogue against 0.675 without; `benchmarks/results/vit_probe_h200.txt`).

Two ways say it to the traced code. `fullgraph.compile` enters `replayed()` around the calls of a model (or a plan's
part) whose configuration replays CUDA graphs (a mode or options with `triton.cudagraphs`, backend "cudagraphs"); a
plain `torch.compile(mode="reduce-overhead")` (or max-autotune, or those options, or backend "cudagraphs") is read
from the compile now tracing: Dynamo's tracer holds the backend it will hand the graph to, and Inductor's wrapper
holds the mode's options (`_backend_replays`; torch-private attributes, so anything unexpected reads "no", the
choice that is right in every mode). The flag is per thread (a server's threads trace and call apart). The ops read
`under_graphs()` while Dynamo traces: a constant to it, read once per trace and never guarded (Dynamo keeps one
cache entry per backend, so a model compiled both ways gets each its own answer).
"""

from __future__ import annotations

import threading

import torch

_state = threading.local()  # per thread: a model's call on one thread says nothing about another's trace


class replayed:
    """Within it, code traced by torch.compile will run from CUDA graphs (`on`); restores the previous state. A
    class, not a generator context manager: it is entered around every call of a compiled model (a fraction of a
    microsecond against a few)."""

    __slots__ = ("before", "on")

    def __init__(self, on: bool = True):
        self.on = on

    def __enter__(self) -> None:
        self.before = getattr(_state, "on", False)
        _state.on = self.on

    def __exit__(self, *exc) -> None:
        _state.on = self.before


def _under_graphs() -> bool:
    """Will the code being traced now run from CUDA graphs (see the module docstring)?"""
    return getattr(_state, "on", False) or _backend_replays()


def __getattr__(name: str):
    # `under_graphs` is `_under_graphs` marked a constant for Dynamo (`torch.compiler.assume_constant_result`),
    # marked on first use: the marking imports Dynamo, and importing this module should not (a process that only
    # loads AOT packages needs no compiler). Dynamo reads a module attribute missing from its __dict__ with a plain
    # getattr, so a first use inside a trace runs this here, outside the trace, and the trace sees the marked function.
    if name == "under_graphs":
        marked = globals()["under_graphs"] = torch.compiler.assume_constant_result(_under_graphs)
        return marked
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _backend_replays() -> bool:
    """Does the torch.compile tracing now hand its graph to a backend that replays CUDA graphs? False outside a
    trace and whenever torch's internals are not as expected (torch 2.9-2.14: the tracer's `output.compiler_fn`,
    Dynamo's wrappers around the backend, which is Inductor's `_TorchCompileInductorWrapper` with its `config` or
    the "cudagraphs" backend function)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        fn = InstructionTranslator.current_tx().output.compiler_fn
    except Exception:
        return False
    for _ in range(8):  # Dynamo's wrappers (functools.wraps: __wrapped__) around the backend it was given
        if getattr(fn, "__name__", None) == "cudagraphs":
            return True
        config = getattr(fn, "config", None)
        if isinstance(config, dict) and type(fn).__name__ == "_TorchCompileInductorWrapper":
            default = bool(torch._inductor.config.triton.cudagraphs)  # what Inductor reads if the compile is silent
            return bool(config.get("triton.cudagraphs", default))
        fn = getattr(fn, "__wrapped__", None) or getattr(fn, "compiler_fn", None)
        if fn is None:
            return False
    return False
