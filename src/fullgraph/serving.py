"""What keeps the callables fullgraph returns correct when a server's threads call them at once (the floor: `compile`
and `deploy` use it; it imports torch alone).

A served model is called from a thread pool. Three things go wrong without care (issue 31, measured on the H200 with
torch 2.11, timm ViT-S/16 bf16, 200 calls from 4 threads): a CUDA-graph replay returns tensors in the graph's own
memory, which the next replay overwrites, so a caller reading its result after another thread's replay gets that
thread's result (76-90 of 200 wrong under `torch.compile(mode="reduce-overhead")`, silently); torch's CUDA-graph trees
keep their state per thread, so a worker thread's first call asserts on torch 2.11 (`cudagraph_trees.get_obj`) and
captures a second memory pool on 2.13; and settings that torch keeps process-wide (Dynamo's config, the compile stance,
the trace logger) set around one model's call are seen by another model compiling on another thread.

The design, chosen against an owner thread fed by a queue (one thread hop per call: 20-60 us of host time, which a
batch-4 ViT at 0.6 ms per call cannot pay) and against N graph instances per model (N times the graph memory):

- `CallGuard`: one lock per model, held across the call, the replay and the copy of its outputs, so each caller gets
  its own tensors, copied on the stream the replay ran on before the next caller can replay. Models of one class
  share a guard (`guard_for`): Dynamo caches compiled code per code object, so instances of a class run the same
  compiled function and the same CUDA graphs. The first call of a new shape compiles once, under the lock, while the
  other threads wait for it.
- Within the guard, torch's per-thread CUDA-graph-tree state (`torch._inductor.cudagraph_trees.local`) points at the
  guard's own, in the calling thread only and only for the call: whichever thread calls, the model records and
  replays in one tree manager with one memory pool (its own: models no longer share one pool, see docs/deploy.md,
  "Many threads"), on torch 2.11 and 2.13 alike.
- `hold_process` / `release_process`: a call that changes a process-wide torch setting (a recompile limit, a strict
  stance, a trace logger) holds the process alone; every other call holds it shared. Readers never wait for one
  another.
- `copy_out`: the outputs cloned (same strides) on the current stream; `borrow` in the callers skips it for a caller
  that reads the output while it holds the lock.
- `OwnerThread`: the owner-thread form, for a callable whose calls hold the GIL through a long launch loop (an
  uncaptured AOTInductor package: `deploy.load(..., serial=True)`), where a pool of callers would hand that loop
  from core to core; measured in docs/deploy.md, "Many threads".
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map_only

from fullgraph.errors import FullgraphError

_TREES = "torch._inductor.cudagraph_trees"


def _trees_module() -> Any:
    module = sys.modules.get(_TREES)
    if module is None:
        import torch._inductor.cudagraph_trees as module
    return module


_tree_local: list[Any] = []  # cudagraph_trees.local, once read


def _trees_local() -> Any:
    if not _tree_local:
        _tree_local.append(_trees_module().local)
    return _tree_local[0]


class _Shared:
    """A readers-writer lock over the settings torch keeps process-wide: shared by ordinary calls, exclusive for a
    call that changes one of them. Re-entrant per thread in both modes (a model called inside another's forward);
    a thread's nested shared holds count once. The shared path is one lock round trip: it is on every call's path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._readers = 0  # threads holding it shared
        self._writer: int | None = None
        self._writer_depth = 0
        self._writers_waiting = 0  # new shared holds wait behind them, so a stream of calls cannot starve one
        self._mine = threading.local()  # .n: this thread's shared holds

    def acquire(self, exclusive: bool) -> None:
        mine = self._mine
        n = getattr(mine, "n", 0)
        if not exclusive:
            if n:  # nested in this thread's own shared hold: counted once already
                mine.n = n + 1
                return
            with self._lock:
                if self._writer is None and not self._writers_waiting:
                    self._readers += 1
                    mine.n = 1
                    return
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:  # nested in this thread's exclusive hold
                self._writer_depth += 1
                return
            if exclusive:
                self._writers_waiting += 1
                try:
                    while self._writer is not None or self._readers > (1 if n else 0):
                        self._cond.wait()
                finally:
                    self._writers_waiting -= 1
                self._writer, self._writer_depth = me, 1
            else:
                while self._writer is not None or self._writers_waiting:
                    self._cond.wait()
                self._readers += 1
                mine.n = 1

    def release(self) -> None:
        mine = self._mine
        n = getattr(mine, "n", 0)
        if n > 1:
            mine.n = n - 1
            return
        with (
            self._lock
        ):  # the condition's own lock: entered directly, Condition's Python-level enter costs on every call
            if self._writer == threading.get_ident():
                self._writer_depth -= 1
                if self._writer_depth == 0:
                    self._writer = None
                    self._cond.notify_all()
                return
            mine.n = 0
            self._readers -= 1
            if self._writers_waiting and self._readers <= 1:  # a writer waits for none, or for its own hold alone
                self._cond.notify_all()


_PROCESS = _Shared()
hold_process, release_process = _PROCESS.acquire, _PROCESS.release  # the hold as two calls: a caller that decides
# its mode under a shared hold (CompiledModel reads Dynamo's config there, where no call can change it)


_MAX_AGAINS = 64  # see CallGuard.warmed_up
_primed = threading.local()  # .devices: the CUDA devices whose library handles this thread has made


def _prime_thread() -> None:
    """Make this thread's cuBLAS, cuBLASLt and cuDNN handles on the current CUDA device, outside any capture. torch
    keeps them per thread and makes one at a thread's first use: inside a CUDA-graph capture that invalidates the
    capture ("operation failed due to a previous error during capture", H200, torch 2.11, a graph warmed up on one
    thread and recorded on another), after which the pool and the CUDA RNG refuse every later capture."""
    device = torch.cuda.current_device()
    done = _primed.__dict__.setdefault("devices", set())
    if device in done or torch.cuda.is_current_stream_capturing():  # called inside a capture of the caller's own
        return
    a = torch.ones(16, 16, device=device)
    torch.mm(a, a)  # cuBLAS
    b = a.to(torch.bfloat16)
    torch.addmm(b[0], b, b)  # cuBLASLt (a bias epilogue)
    if torch.backends.cudnn.is_available():
        torch.nn.functional.conv2d(a.view(1, 1, 16, 16), a[:3, :3].reshape(1, 1, 3, 3))  # cuDNN
    done.add(device)


_bound = threading.local()  # .devices: the CUDA devices whose primary context this thread has made current


def bind_cuda_context(index: int) -> None:
    """Make CUDA device `index`'s primary context current on the calling thread, once per thread and device.

    Code that launches kernels through CUDA's driver API (AOTInductor's compiled packages: `cuLaunchKernel`) needs
    a current context and does not make one, where the runtime API that torch's own ops use binds the device's
    primary context at a thread's first call. A package whose first kernel is a Triton kernel then failed on every
    call from a fresh thread ("CUDA driver error: invalid device context", H200, torch 2.11, our DiT's package
    served from a thread pool), while its calls in the thread that loaded it worked. One small runtime launch binds
    it; nothing is launched while this thread captures a CUDA graph (a capture has a current context already)."""
    done = _bound.__dict__.setdefault("devices", set())
    if index in done:
        return
    if not torch.cuda.is_current_stream_capturing():
        with torch.cuda.device(index):
            torch.zeros(1, device=torch.device("cuda", index))
    done.add(index)


class OwnerThread:
    """`fn`'s calls, from any number of threads, run one at a time on one thread of its own (the owner), fed by a
    queue: each caller waits for its own call's result (or exception) and gets it back. Launches then always come
    from one thread, where a pool of callers would hand a host-bound launch loop from core to core. A call runs on
    the caller's current CUDA stream (`cuda_index` given) and in the caller's grad mode; `on_start` runs once on the
    owner (bind a CUDA context there). A call from the owner itself (re-entry) runs at once. The owner is a daemon
    thread, started at the first call (again in a forked child), and ends when this object is collected.
    Costs one thread hop per call: two wake-ups (tens of microseconds of host time)."""

    def __init__(self, fn: Callable[..., Any], *, cuda_index: int | None = None,
                 on_start: Callable[[], None] | None = None, name: str = "fullgraph-owner"):  # fmt: skip
        self._fn, self._cuda_index, self._on_start, self._name = fn, cuda_index, on_start, name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = -1
        self._start_lock = threading.Lock()
        weakref.finalize(self, self._queue.put, None)  # the owner's loop ends at a None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        thread = self._thread
        if thread is threading.current_thread():
            return self._fn(*args, **kwargs)
        if thread is None or self._pid != os.getpid():
            self._start()
        stream = torch.cuda.current_stream(self._cuda_index) if self._cuda_index is not None else None
        job = _Job(args, kwargs, stream, torch.is_grad_enabled())
        self._queue.put(job)
        job.done.acquire()  # released by the owner once the call has returned or raised
        if job.error is not None:
            raise job.error
        return job.result

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            if self._pid != -1:  # a forked child: the parent's owner and its queue's waiters are not here
                self._queue = queue.SimpleQueue()
                weakref.finalize(self, self._queue.put, None)
            thread = threading.Thread(
                target=_own, args=(self._fn, self._queue, self._on_start), name=self._name, daemon=True
            )
            thread.start()
            self._thread, self._pid = thread, os.getpid()


class _Job:
    """One call handed to an owner thread; `done` is held until the owner has set `result` or `error`."""

    __slots__ = ("args", "done", "error", "grad", "kwargs", "result", "stream")

    def __init__(self, args: tuple, kwargs: dict, stream: Any, grad: bool) -> None:
        self.args, self.kwargs, self.stream, self.grad = args, kwargs, stream, grad
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Lock()
        self.done.acquire()


def _own(fn: Callable[..., Any], jobs: queue.SimpleQueue, on_start: Callable[[], None] | None) -> None:
    """The owner's loop (a function, so that the thread holds no reference to its OwnerThread)."""
    error: BaseException | None = None
    if on_start is not None:
        try:
            on_start()
        except BaseException as e:  # every call then fails with it, in its caller
            error = e
    current = None  # (id, device) of the stream this thread has set current; compared as such: torch's Stream
    # compares unequal to nothing when the other side is None (`stream != None` is False), which once left every
    # call on the owner's default stream
    while (job := jobs.get()) is not None:
        try:
            if error is not None:
                raise error
            stream = job.stream
            if stream is not None and (stream.stream_id, stream.device_index) != current:
                torch.cuda.set_stream(stream)
                current = (stream.stream_id, stream.device_index)
            with torch.set_grad_enabled(job.grad):
                job.result = fn(*job.args, **job.kwargs)
        except BaseException as e:
            job.error = e
        finally:
            job.args = job.kwargs = None
            job.done.release()


class CallGuard:
    """One model's critical section (see the module docstring): a re-entrant lock, and with `graph_trees` on, torch's
    CUDA-graph-tree state of the calling thread pointed at this guard's own for the call. `with guard: out = ...;
    out = copy_out(out)` is the pattern; the copy belongs inside."""

    __slots__ = ("__weakref__", "_agains", "_depth", "_saved", "_stream", "graph_trees", "lock", "trees")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.graph_trees = False  # set once a model behind this guard replays torch's CUDA-graph trees
        self.trees = ({}, defaultdict(threading.Lock))  # what cudagraph_trees keeps per thread, kept per guard here
        self._saved: tuple[Any, Any] | None = None  # the calling thread's own tree state, while the guard is held
        self._depth = 0
        self._stream: Any = None  # the CUDA stream of the last call (see follow_stream)
        self._agains = 0  # calls run again to record on their thread (see warmed_up)

    def __enter__(self) -> CallGuard:
        if self.graph_trees and not getattr(_primed, "devices", None) and torch.cuda.is_initialized():
            _prime_thread()  # a thread's first call (see _prime_thread; one device is the usual case, checked cheaply)
        self.lock.acquire()
        self._depth += 1
        if self.graph_trees and self._depth == 1:
            try:
                mine = _trees_local().__dict__  # the calling thread's
                self._saved = mine.get("tree_manager_containers"), mine.get("tree_manager_locks")
                mine["tree_manager_containers"], mine["tree_manager_locks"] = self.trees
            except BaseException:
                self._depth -= 1
                self.lock.release()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._saved is not None and self._depth == 1:
                (containers, locks), self._saved = self._saved, None
                mine = _trees_local().__dict__
                if containers is None:
                    mine.pop("tree_manager_containers", None)
                    mine.pop("tree_manager_locks", None)
                else:
                    mine["tree_manager_containers"], mine["tree_manager_locks"] = containers, locks
        finally:
            self._depth -= 1
            self.lock.release()

    def warmed_up(self) -> bool:
        """Inside the guard, after a call: did it leave torch's CUDA-graph trees in warm-up (a graph run once, to be
        recorded at its next run)? The caller then runs it again at once, so that the recording happens on the thread
        that warmed it up, whose per-thread caches (cuDNN's attention graphs per shape, say) hold what the graph uses;
        a recording on a thread that only replayed so far would build them inside the capture. torch-private state
        (`path_state`), read defensively: anything unexpected reads "no", which is how it was before. At most
        `_MAX_AGAINS` times per guard: code whose trees warm up at every call would otherwise run every call twice."""
        if self._agains >= _MAX_AGAINS:
            return False
        for container in self.trees[0].values():
            state = getattr(getattr(container, "tree_manager", None), "path_state", None)
            if getattr(state, "name", None) == "WARMUP":
                self._agains += 1
                return True
        return False

    def recover_trees(self) -> None:
        """Inside the guard, after a call that ran out of memory: a graph warming up when it did leaves torch's trees
        pointing at a half-run warm-up node, and their next call fails an internal assert (H200, torch 2.11:
        `len(node.tensor_weakrefs) == len(node.stack_traces)` in `try_end_curr_warmup`). Pointing them back at no
        node lets the next call start from the graphs already recorded. torch-private state, touched defensively."""
        for container in self.trees[0].values():
            manager = getattr(container, "tree_manager", None)
            node = getattr(manager, "current_node", None)
            if node is None or type(node).__name__ != "CUDAWarmupNode":
                continue
            if len(getattr(node, "tensor_weakrefs", ())) != len(getattr(node, "stack_traces", ()) or ()):
                manager.current_node = None
                state = getattr(manager, "path_state", None)
                if state is not None:
                    manager.path_state = type(state).NONE

    def follow_stream(self) -> None:
        """Inside the guard, on CUDA: a call on another stream than the last one waits for the last one's work, so a
        replay never overwrites outputs whose copy the previous caller's stream has not run yet. Read through torch's
        C binding: a `torch.cuda.Stream` object per call would cost microseconds on every call's path."""
        now = torch._C._cuda_getCurrentStream(torch._C._cuda_getDevice())  # (stream id, device index, device type)
        last = self._stream
        if last is not None and last != now:
            torch.cuda.current_stream().wait_stream(torch.cuda.Stream(stream_id=last[0], device_index=last[1],
                                                                      device_type=last[2]))  # fmt: skip
        self._stream = now


_GUARDS: weakref.WeakKeyDictionary[type, CallGuard] = weakref.WeakKeyDictionary()
_GUARDS_LOCK = threading.Lock()


def guard_for(cls: type) -> CallGuard:
    """The guard shared by every model of class `cls` (they share compiled code; see the module docstring)."""
    with _GUARDS_LOCK:
        guard = _GUARDS.get(cls)
        if guard is None:
            guard = _GUARDS[cls] = CallGuard()
        return guard


def input_signature(args: Any = (), kwargs: Mapping[str, Any] | None = None) -> str:
    """The inputs as text, in the CLI's input spec form: ``"4x3x224x224:float32@cpu, 7"``.

    Tensors give shape, dtype and device type; other leaves their repr. Saved beside compiled code so that a
    file made for other inputs is refused by name rather than recompiled in silence, and named in errors.
    """
    leaves = tree_leaves((tuple(args) if isinstance(args, (tuple, list)) else (args,), dict(kwargs or {})))
    parts = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            parts.append("x".join(map(str, v.shape)) + f":{str(v.dtype).removeprefix('torch.')}@{v.device.type}")
        else:
            parts.append(repr(v))
    return ", ".join(parts)


class OutOfMemoryError(FullgraphError, torch.OutOfMemoryError):
    """A call whose inputs do not fit in the GPU's free memory; the model is unchanged and the next call that fits
    runs normally. Still a `torch.OutOfMemoryError`, for code that catches torch's."""


def out_of_memory(name: str, args: Any, kwargs: Mapping[str, Any] | None, e: BaseException) -> OutOfMemoryError:
    """The error to raise for `e`, torch's out-of-memory error in a call of `name` with these inputs: it names the
    inputs and the device's free and total memory, and the fix."""
    where = ""
    devices = {t.device for t in tree_leaves((args, dict(kwargs or {}))) if isinstance(t, torch.Tensor)}
    cuda = [d for d in devices if d.type == "cuda"]
    if cuda:
        with contextlib.suppress(Exception):
            free, total = torch.cuda.mem_get_info(cuda[0])
            where = f" ({free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB on {cuda[0]})"
    return OutOfMemoryError(
        f"{name}: out of GPU memory for inputs {input_signature(args, kwargs)}{where}; call it with a smaller batch "
        "or free memory first (the model is unchanged: the next call that fits runs normally)"
    )


def copy_out(out: Any) -> Any:
    """Every tensor in `out` cloned, strides kept, on the current stream; anything else as it is."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if type(out) in (tuple, list) and all(isinstance(o, torch.Tensor) for o in out):
        return type(out)(o.clone() for o in out)
    return tree_map_only(torch.Tensor, torch.clone, out)


__all__ = [
    "CallGuard",
    "OutOfMemoryError",
    "copy_out",
    "guard_for",
    "hold_process",
    "input_signature",
    "out_of_memory",
    "release_process",
]
