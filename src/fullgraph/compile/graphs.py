"""One CUDA graph around a whole call, for models whose compiled parts are called apart.

`mode="reduce-overhead"` puts each compiled function under CUDA graphs (Inductor's cudagraph trees). That
suits a model compiled whole. A model whose compiled parts run as separate calls with eager code between
them (per-block regional compilation: twelve calls of one compiled block per forward) gains little from
it and breaks with it:

- each block call is a new `torch.compile` invocation, so the trees start a new generation per block and
  the next block's input, the previous block's output, has been overwritten ("accessing tensor output of
  CUDAGraphs that has been overwritten by a subsequent run", timm's ViT-B/16 on the H200, torch 2.11);
- `torch.compiler.cudagraph_mark_step_begin()` per model call would avoid that, but once called it switches
  the whole process to explicit steps: other reduce-overhead models that never call it stop starting new
  generations. Not ours to change for the process;
- even working, twelve compiled calls per forward still pay Dynamo's guards and the wrappers' Python twelve
  times: at batch 8, per-block ViT-B/16 ran at 0.68x the whole model's speed in default mode (launch-bound).

`GraphedCall` captures the whole call instead, eager glue and compiled blocks alike, into one
`torch.cuda.CUDAGraph` per input signature (shapes, dtypes, devices and strides of the tensor leaves,
plus the non-tensor arguments): the first call with a signature runs normally (it compiles), the second
warms up once on a side stream and captures, later ones copy their inputs into the captured ones and
replay, with no Python or guards between the kernels. The compiled parts are compiled without CUDA graphs
of their own.

Contract, as with reduce-overhead: the captured call must not synchronise with the host or change shape
with the data. A `.item()`, a host copy or a data-dependent shape makes the capture fail; a failed capture
leaves the CUDA RNG unusable ("Offset increment outside graph capture encountered unexpectedly", seen on the
H200) and the capture stream current, both undone here (also when the capture is interrupted, by a
KeyboardInterrupt say, which then goes on up). The signature is reported once in a `CudaGraphSkipWarning`
naming the cause and runs uncaptured from then on. Until 2026-12 the warm-up ran with host syncs raising
(`torch.cuda.set_sync_debug_mode("error")`) to find them before the capture; that mode is process-wide, so
another thread's ordinary `.item()` raised meanwhile: the capture itself now finds them, in its own thread
only (`capture_error_mode="thread_local"`: other threads' work goes on during a capture).

Threads (fullgraph.serving): a call holds this object's lock from the input copy through the replay to the
copy of its outputs, on the stream the replay ran on, so every caller gets its own result; the first call of
a signature and its capture happen once, whichever threads arrive at the same time. Outputs are cloned out
of the graph's memory (a copy per call); `borrow(*args)` holds the lock and yields the graph's own tensors
(valid until the block ends), and `clone_outputs=False` returns them unlocked, for a single caller that is
done with each output before its next call. At most `max_graphs` signatures are captured (each holds its
inputs, outputs and memory pool); later ones run uncaptured, said once. Inputs that are not all on one CUDA
device, and calls while grad is enabled, run uncaptured. A call that runs out of GPU memory raises
`fullgraph.serving.OutOfMemoryError` naming its inputs and the free memory; the graphs already captured stay,
and a signature whose capture ran out of memory is tried again at its next call.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from fullgraph.serving import CallGuard, copy_out, out_of_memory


class CudaGraphSkipWarning(UserWarning):
    """A call signature that runs without the CUDA graph it was meant to replay, and why."""


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # the captured tensor leaves, in flatten order
    output: Any


def _signature(leaves: list[Any]) -> tuple | None:
    """A hashable key of a call's flattened arguments; None when it cannot be graphed (a non-hashable
    value, a CPU tensor, tensors on several devices)."""
    key, devices = [], set()
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            devices.add(leaf.device)
            key.append((tuple(leaf.shape), tuple(leaf.stride()), leaf.dtype))
        else:
            try:
                hash(leaf)
            except TypeError:
                return None
            key.append((type(leaf), leaf))
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return None
    return (*key, next(iter(devices)))


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _recover(caller: torch.cuda.Stream) -> None:
    """Undo what a failed capture leaves behind: `torch.cuda.graph` raised in its exit before restoring the
    caller's stream, and the CUDA generator still holds the aborted capture's offset ("Offset increment outside
    graph capture encountered unexpectedly" at the next random op); one small capture that completes resets it."""
    torch.cuda.set_stream(caller)
    with contextlib.suppress(Exception):
        torch.cuda.synchronize()
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.zeros(1, device=caller.device).add_(1)
    except Exception:
        torch.cuda.set_stream(caller)


# What a capture refused reads like: the refused call itself, or (torch 2.11 on the H200, a `.item()` captured with
# capture_error_mode="thread_local") the invalidated capture it left.
_HOST_SYNC = ("operation not permitted when stream is capturing", "StreamCaptureUnsupported", "synchroniz",
              "previous error during capture")  # fmt: skip


class GraphedCall:
    """`fn` replayed from one CUDA graph per input signature (see the module docstring)."""

    def __init__(self, fn: Callable, *, name: str = "model", max_graphs: int = 16, clone_outputs: bool = True):
        self.fn = fn
        self.name = name
        self.max_graphs = max_graphs
        self.clone_outputs = clone_outputs
        self.graphs: dict[tuple, _Graph] = {}
        self.skipped: dict[tuple, str] = {}  # signature -> why it runs uncaptured
        self._seen: set[tuple] = set()
        self._said_full = False
        self._guard = CallGuard()  # a lock, and the stream of the last replay (fullgraph.serving)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.clone_outputs:
            return self._run(args, kwargs)
        with self._guard:
            return copy_out(self._run(args, kwargs))

    @contextlib.contextmanager
    def borrow(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """The output in the graph's own memory, without a copy, valid inside the block: the lock is held until it
        ends, so no other caller's replay overwrites it (see the module docstring)."""
        with self._guard:
            yield self._run(args, kwargs)

    def _run(self, args: tuple, kwargs: dict) -> Any:
        try:
            return self._replay(args, kwargs)
        except torch.OutOfMemoryError as e:
            raise out_of_memory(self.name, args, kwargs, e) from None

    def _replay(self, args: tuple, kwargs: dict) -> Any:
        leaves, spec = tree_flatten((args, kwargs))
        key = None if torch.is_grad_enabled() else _signature(leaves)
        if key is None or key in self.skipped:
            return self.fn(*args, **kwargs)
        entry = self.graphs.get(key)
        if entry is None:
            if key not in self._seen:  # the first call of a signature compiles: never inside a capture
                self._seen.add(key)
                return self.fn(*args, **kwargs)
            entry = self._capture(key, leaves, spec)
            if entry is None:
                return self.fn(*args, **kwargs)
        self._guard.follow_stream()  # a caller on another stream waits for the last caller's copy-out
        tensors = (leaf for leaf in leaves if isinstance(leaf, torch.Tensor))
        for mine, theirs in zip(entry.inputs, tensors, strict=True):
            if mine.data_ptr() != theirs.data_ptr():
                mine.copy_(theirs)
        entry.graph.replay()
        return entry.output

    def _capture(self, key: tuple, leaves: list[Any], spec: Any) -> _Graph | None:
        if len(self.graphs) >= self.max_graphs:
            if not self._said_full:
                self._said_full = True
                warnings.warn(f"{self.name}: {self.max_graphs} CUDA graphs captured (max_graphs); new input "
                              "signatures run uncaptured", CudaGraphSkipWarning, stacklevel=5)  # fmt: skip
            self.skipped[key] = "max_graphs reached"
            return None
        inputs = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        args, kwargs = tree_unflatten(inputs, spec)
        caller = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(caller)
        try:  # cuBLAS and the allocator set up their per-stream state here
            with torch.cuda.stream(side):
                self.fn(*args, **kwargs)
        finally:
            caller.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                output = self.fn(*args, **kwargs)
        except BaseException as e:  # an op that cannot be captured; an interrupt or out of memory: undone, raised
            _recover(caller)
            if not isinstance(e, Exception) or isinstance(e, torch.OutOfMemoryError):
                raise
            refused = any(word in str(e) for word in _HOST_SYNC)  # a sync and a stream query read alike here
            how = "capture failed: it synchronises with the host or calls what a capture refuses" * refused
            return self._skip(key, f"{how or 'capture failed'} ({_first_line(e)})")
        entry = _Graph(graph, [x for x in inputs if isinstance(x, torch.Tensor)], output)
        self.graphs[key] = entry
        return entry

    def _skip(self, key: tuple, cause: str) -> None:
        self.skipped[key] = cause
        warnings.warn(f"{self.name}: runs without a CUDA graph for these input shapes: {cause}",
                      CudaGraphSkipWarning, stacklevel=6)  # fmt: skip

    def describe(self) -> str:
        skipped = f", {len(self.skipped)} signature(s) uncaptured" if self.skipped else ""
        return f"one CUDA graph per input signature ({len(self.graphs)} captured{skipped})"
