"""Callables from fullgraph.compile called from many threads at once: every caller gets its own correct output.

On the CPU the CUDA-graph paths are played by stand-ins that reuse one output buffer as a graph replay does, so
the copy-out and the locking are proven here; tests/compile/test_gpu.py and `fullgraph bench load` run the real
graphs on the H200.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn

import fullgraph
from fullgraph import serving
from fullgraph.compile import Bucketed, graphs
from fullgraph.compile.graphs import GraphedCall
from tests.skips import requires_cuda

THREADS = 8


class Net(nn.Module):
    def __init__(self, dim: int = 24) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, 5)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def hammer(call, inputs, rounds: int = 6, *, barrier: bool = True, pause: float = 0.0):
    """Every thread calls `call` on each input `rounds` times (all threads released at once); returns
    ([(input index, output copy)], [exceptions]). `pause` waits between receiving an output and reading it, as a
    server does while it serialises a response."""
    start = threading.Barrier(THREADS)
    results, errors = [], []
    lock = threading.Lock()

    def worker(k: int) -> None:
        if barrier:
            start.wait()
        for r in range(rounds):
            i = (k + r) % len(inputs)
            try:
                with torch.no_grad():  # grad mode is per thread: a server's inference threads set it each
                    out = call(inputs[i])
                time.sleep(pause)
                got = out.clone()
            except Exception as e:
                with lock:
                    errors.append(e)
                continue
            with lock:
                results.append((i, got))

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(worker, range(THREADS)))
    return results, errors


def read_after_another_call(call, inputs):
    """Call on inputs[0], let another thread call on inputs[1], then read the first output: what a caller sees when
    a second request lands while it is still serialising its response, made to happen every time rather than when
    the scheduler happens to interleave. Returns [(0, what the first caller read)]."""

    def another() -> None:
        with torch.no_grad():  # grad mode is per thread; a graph replays inference calls only
            call(inputs[1])

    with torch.no_grad():
        out = call(inputs[0])
        other = threading.Thread(target=another)
        other.start()
        other.join()
        return [(0, out.clone())]


def wrong(results, expected) -> int:
    return sum(not torch.allclose(out, expected[i], rtol=1e-4, atol=1e-5) for i, out in results)


@pytest.mark.parametrize("preset", ["dev", "perception"])
def test_cold_first_calls_from_eight_threads_compile_once_and_all_are_right(preset):
    torch._dynamo.reset()  # another preset's entries for Net.forward would count as a recompile here
    torch.manual_seed(0)
    model = Net().eval()
    inputs = [torch.randn(3, 24) for _ in range(THREADS)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    cm = fullgraph.compile(model, preset)  # perception: Inductor, its CUDA-graph trees' state guarded (none on a CPU)
    results, errors = hammer(cm, inputs)
    assert not errors, errors[:1]
    assert len(results) == THREADS * 6 and wrong(results, expected) == 0
    assert cm.stats.frames_compiled == 1 and cm.stats.recompiles == ()
    # a new shape arriving on every thread at once: one more compile, every output right
    bigger = [torch.randn(5, 24) for _ in range(THREADS)]
    with torch.no_grad():
        expected = [model(x) for x in bigger]
    results, errors = hammer(cm, bigger, rounds=2)
    assert not errors and wrong(results, expected) == 0
    assert cm.stats.frames_compiled <= 2  # the new shape compiled once (or was made dynamic once)


class SharedBuffer:
    """A CUDA-graph replay as the caller sees it: every call writes its result into one buffer and returns it."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.buffer = model, None

    def __call__(self, x):
        out = self.model(x)
        if self.buffer is None or self.buffer.shape != out.shape:
            self.buffer = torch.empty_like(out)
        self.buffer.copy_(out)
        time.sleep(0.001)  # the replay's GPU time, during which another thread would be let in
        return self.buffer


def graph_stand_in(preset: str = "perception"):
    torch.manual_seed(1)
    model = Net().eval()
    cm = fullgraph.compile(model, preset)
    cm.__dict__["_compiled"] = SharedBuffer(model)  # what torch's CUDA-graph trees hand back on every replay
    inputs = [torch.randn(4, 24) for _ in range(THREADS)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    return cm, inputs, expected


def test_the_stand_in_races_without_the_copy():
    """The check below can fail: calling the shared-buffer graph bare, an output read after another thread's call
    holds that call's result; the guarded model's does not."""
    cm, inputs, expected = graph_stand_in()
    cm(inputs[0])  # warmed up and captured in this thread first
    assert wrong(read_after_another_call(cm.__dict__["_compiled"], inputs), expected) == 1
    assert wrong(read_after_another_call(cm, inputs), expected) == 0


def test_compiled_model_under_a_graph_preset_copies_each_output_inside_its_guard():
    cm, inputs, expected = graph_stand_in()
    assert cm._copies  # perception replays CUDA graphs: outputs are copied out
    results, errors = hammer(cm, inputs, pause=0.002)
    assert not errors and len(results) == THREADS * 6
    assert wrong(results, expected) == 0


def test_borrow_holds_the_guard_until_the_block_ends():
    cm, inputs, expected = graph_stand_in()
    order = []
    inside = threading.Event()

    def other():
        inside.wait(5)
        cm(inputs[1])
        order.append("other call")

    t = threading.Thread(target=other)
    t.start()
    with cm.borrow(inputs[0]) as out:
        assert out is cm.__dict__["_compiled"].buffer  # the graph's own memory, not a copy
        inside.set()
        time.sleep(0.05)
        torch.testing.assert_close(out, expected[0])  # the other thread's call has not overwritten it
        order.append("borrow ends")
    t.join()
    assert order == ["borrow ends", "other call"]


def test_models_of_one_class_share_a_guard_and_other_classes_do_not():
    a, b = fullgraph.compile(Net(), "dev"), fullgraph.compile(Net(), "dev")
    other = fullgraph.compile(nn.Sequential(nn.Linear(3, 3)), "dev")
    assert a._guard is b._guard and a._guard is not other._guard


def test_out_of_memory_names_the_inputs_and_is_no_compile_failure():
    torch.manual_seed(2)
    model = Net().eval()
    cm = fullgraph.compile(model, "dev", on_error="eager")
    fits = torch.randn(2, 24)
    cm(fits)
    real = cm.__dict__["_compiled"]

    def limited(x):
        if x.shape[0] > 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(x)

    cm.__dict__["_compiled"] = limited
    with pytest.raises(serving.OutOfMemoryError, match=r"Net: out of GPU memory for inputs 64x24:float32@cpu.*"
                       r"smaller batch") as info:  # fmt: skip
        cm(torch.randn(64, 24))
    assert isinstance(info.value, torch.OutOfMemoryError)  # code catching torch's error still catches it
    assert cm.stats.fell_back is None and not cm._eager  # never taken for a compile failure
    with torch.no_grad():
        torch.testing.assert_close(cm(fits), model(fits))


class FakeGraph:
    """torch.cuda.CUDAGraph on the CPU: the capture records the call's body, `replay` runs it again into the same
    output memory, as a real replay does."""

    recording: FakeGraph | None = None

    def __init__(self) -> None:
        self.body = None

    def replay(self) -> None:
        self.body()


class FakeStream:
    def wait_stream(self, other) -> None:
        pass


@contextlib.contextmanager
def fake_capture(graph, capture_error_mode="global"):
    assert capture_error_mode == "thread_local"  # other threads' work goes on during a capture
    FakeGraph.recording = graph
    try:
        yield
    finally:
        FakeGraph.recording = None


@pytest.fixture
def cpu_graphs(monkeypatch):
    """GraphedCall's CUDA pieces played on the CPU (see FakeGraph); CPU tensors get a signature."""
    stream = FakeStream()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_capture)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    monkeypatch.setattr(graphs, "_signature", lambda leaves: tuple((tuple(x.shape), x.dtype) for x in leaves))
    monkeypatch.setattr(serving.CallGuard, "follow_stream", lambda self: None)  # one stream on the CPU


class GraphBody:
    """A function whose captured form writes into one output buffer (what a replay returns)."""

    def __init__(self, w: torch.Tensor, fail: BaseException | None = None) -> None:
        self.w, self.fail, self.out = w, fail, None

    def __call__(self, x):
        if FakeGraph.recording is not None:
            if self.fail is not None:
                raise self.fail
            out = torch.empty(x.shape[0], self.w.shape[1])

            def body():
                out.copy_(torch.tanh(x @ self.w))
                time.sleep(0.001)

            FakeGraph.recording.body = body
            body()
            return out
        return torch.tanh(x @ self.w)


def test_graphed_call_copies_out_inside_its_lock(cpu_graphs):
    torch.manual_seed(3)
    w = torch.randn(16, 8)
    inputs = [torch.randn(4, 16) for _ in range(THREADS)]
    expected = [torch.tanh(x @ w) for x in inputs]
    graphed = GraphedCall(GraphBody(w), name="stand-in")
    with torch.no_grad():
        results, errors = hammer(graphed, inputs, pause=0.002)
        assert not errors and len(graphed.graphs) == 1  # captured once, whichever threads came first
        assert wrong(results, expected) == 0
        bare = GraphedCall(GraphBody(w), name="bare", clone_outputs=False)  # the single-caller opt-out
        for x in inputs[:3]:  # run, capture, replay
            bare(x)
    assert wrong(read_after_another_call(bare, inputs), expected) == 1  # so the check above can fail
    assert wrong(read_after_another_call(graphed, inputs), expected) == 0


def test_an_interrupted_capture_is_undone_and_the_interrupt_goes_on(cpu_graphs, monkeypatch):
    recovered = []
    monkeypatch.setattr(graphs, "_recover", lambda caller: recovered.append(caller))
    body = GraphBody(torch.randn(16, 8), fail=KeyboardInterrupt())
    graphed = GraphedCall(body, name="interrupted")
    x = torch.randn(2, 16)
    with torch.no_grad():
        graphed(x)  # the first call of a signature runs plainly
        with pytest.raises(KeyboardInterrupt):
            graphed(x)  # the capture is interrupted
        assert len(recovered) == 1 and not graphed.graphs and not graphed.skipped  # undone; not skipped for good
        body.fail = None
        torch.testing.assert_close(graphed(x), torch.tanh(x @ body.w))
    assert len(graphed.graphs) == 1


def test_bucketed_around_a_plain_callable_guards_and_copies(cpu_graphs):
    torch.manual_seed(4)
    model = Net().eval()
    bucketed = Bucketed(SharedBuffer(model), buckets=(4, 8))
    inputs = [torch.randn(1 + k % 4, 24) for k in range(THREADS)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
        results, errors = hammer(bucketed, inputs, pause=0.002)
    assert not errors and wrong(results, expected) == 0
    assert Bucketed(fullgraph.compile(model, "dev"), buckets=(4,))._guard is None  # the model's own guard serves


def test_a_planned_part_is_compiled_only_on_the_thread_inside_the_call():
    torch.manual_seed(5)
    model = nn.Sequential(Net(), nn.ReLU()).eval()
    cm = fullgraph.compile(model, plan={"0": {"backend": "eager"}})
    x = torch.randn(3, 24)
    inside, go_on = threading.Event(), threading.Event()
    net = model[0]
    original = type(net).forward

    def slow_forward(self, x):
        if threading.current_thread() is not threading.main_thread():
            inside.set()
            go_on.wait(5)
        return original(self, x)

    type(net).forward = slow_forward
    try:
        t = threading.Thread(target=cm, args=(x,))
        t.start()
        assert inside.wait(5)
        calls = cm.plan.stats["0"].calls
        with torch.no_grad():
            torch.testing.assert_close(model(x), original(net, x).relu())  # the user's module, as written
        assert cm.plan.stats["0"].calls == calls  # not through the compiled part
        go_on.set()
        t.join()
    finally:
        type(net).forward = original
    assert cm.plan.stats["0"].calls == calls + 1


def test_process_wide_settings_run_alone_and_shared_holds_run_together():
    shared = serving._Shared()
    log = []
    reading, writer_waiting, release = threading.Event(), threading.Event(), threading.Event()

    def reader():
        shared.acquire(False)
        reading.set()
        release.wait(5)
        shared.acquire(False)  # nested in its own shared hold while a writer waits: must not wait for itself
        shared.release()
        log.append("reader done")
        shared.release()

    def writer():
        writer_waiting.set()
        shared.acquire(True)
        log.append("writer in")
        shared.release()

    r = threading.Thread(target=reader)
    r.start()
    assert reading.wait(5)
    w = threading.Thread(target=writer)
    w.start()
    assert writer_waiting.wait(5)
    time.sleep(0.05)
    assert log == []  # the writer waits for the reader
    release.set()
    r.join(5)
    w.join(5)
    assert log == ["reader done", "writer in"]


def test_the_guard_points_the_threads_graph_tree_state_at_its_own_and_back():
    trees = serving._trees_module()
    guard = serving.CallGuard()
    guard.graph_trees = True
    seen = {}

    def worker():
        seen["before"] = "tree_manager_containers" in trees.local.__dict__
        with guard:
            seen["inside"] = trees.local.tree_manager_containers is guard.trees[0]
        seen["after"] = "tree_manager_containers" in trees.local.__dict__

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"before": False, "inside": True, "after": False}
    mine = trees.get_obj(trees.local, "tree_manager_containers")  # this thread's own, made at import
    with guard:
        assert trees.local.tree_manager_containers is guard.trees[0]
    assert trees.local.tree_manager_containers is mine


def test_an_owner_thread_runs_every_call_on_one_thread_and_hands_each_caller_its_own_result():
    torch.manual_seed(9)
    model = Net().eval()
    ran_on, inside, most = set(), [0], [0]

    def call(x):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        ran_on.add(threading.get_ident())
        time.sleep(0.0005)  # lets other callers in, were the calls not queued
        try:
            if float(x[0, 0]) > 1e6:
                raise ValueError(f"bad input {float(x[0, 0]):g}")
            return model(x) if torch.is_grad_enabled() else model(x).detach()  # grad mode: the caller's
        finally:
            inside[0] -= 1

    owner = serving.OwnerThread(call, name="test-owner")
    inputs = [torch.randn(3, 24) for _ in range(THREADS)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    results, errors = hammer(owner, inputs, rounds=10)
    assert not errors and len(results) == THREADS * 10
    assert wrong(results, expected) == 0
    assert most[0] == 1 and len(ran_on) == 1 and threading.get_ident() not in ran_on
    assert owner(inputs[0]).requires_grad  # called with grad enabled here: so it ran there
    with torch.no_grad():
        assert not owner(inputs[0]).requires_grad
    bad = torch.full((3, 24), 2e6)
    with pytest.raises(ValueError, match="bad input 2e"):  # the owner's exception, raised in its caller
        owner(bad)
    assert torch.allclose(owner(inputs[1]), expected[1])  # and the owner lives on
    assert len(ran_on) == 1


def test_an_owner_thread_whose_start_fails_fails_every_call_in_its_caller():
    def start():
        raise RuntimeError("no context on this device")

    owner = serving.OwnerThread(lambda x: x + 1, on_start=start)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="no context on this device"):
            owner(torch.zeros(1))


def test_an_owner_thread_ends_when_its_callable_is_collected():
    import gc
    import weakref

    owner = serving.OwnerThread(lambda x: x * 2, name="test-owner-ends")
    assert torch.equal(owner(torch.ones(2)), torch.full((2,), 2.0))
    thread, gone = owner._thread, weakref.ref(owner)
    del owner
    gc.collect()
    thread.join(timeout=5)
    assert gone() is None and not thread.is_alive()


class ComparedStream:
    """Stands for a CUDA stream on the CPU, comparing as torch's does: unequal to nothing when the other side is
    None (`stream != None` is False), the trap that left the owner's calls on its default stream on the H100."""

    def __init__(self, stream_id: int) -> None:
        self.stream_id, self.device_index = stream_id, 0

    def __eq__(self, other):
        return other is not None and (self.stream_id, self.device_index) == (other.stream_id, other.device_index)

    def __ne__(self, other):
        return other is not None and not self == other

    __hash__ = None


def test_an_owner_thread_sets_each_callers_stream_current_before_its_call(monkeypatch):
    current = threading.local()  # as torch keeps the current stream: per thread, the default (id 0) at first
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: getattr(current, "s", ComparedStream(0)))
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: setattr(current, "s", stream))
    owner = serving.OwnerThread(lambda: torch.cuda.current_stream().stream_id, cuda_index=0)
    seen, start = {}, threading.Barrier(4)

    def caller(k: int) -> None:
        current.s = ComparedStream(k + 1)  # this caller's own stream
        start.wait()
        seen[k] = {owner() for _ in range(20)}

    pool = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(timeout=30)
    assert seen == {k: {k + 1} for k in range(4)}
    assert owner() == 0  # this thread's default stream, set back on the owner


@requires_cuda
def test_an_owner_thread_runs_each_call_on_its_callers_stream():
    torch.manual_seed(10)
    w = torch.randn(256, 256, device="cuda")
    streams_seen = []

    def call(x):
        streams_seen.append(torch.cuda.current_stream().stream_id)
        return torch.tanh(x @ w) @ w

    owner = serving.OwnerThread(call, cuda_index=torch.cuda.current_device())
    inputs = [torch.randn(512, 256, device="cuda") for _ in range(THREADS)]
    expected = [torch.tanh(x @ w) @ w for x in inputs]
    torch.cuda.synchronize()
    results, errors, start = [], [], threading.Barrier(THREADS)

    def worker(k: int) -> None:
        stream = torch.cuda.Stream()
        start.wait()
        with torch.cuda.stream(stream):
            for _ in range(10):
                out = owner(inputs[k])
                results.append((k, out.clone()))  # on the caller's stream: ordered after the owner's work
        stream.synchronize()

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(timeout=120)
    assert not errors and len(results) == THREADS * 10
    assert wrong(results, expected) == 0
    assert len(set(streams_seen)) == THREADS  # each caller's own stream, none the owner's default


@requires_cuda
def test_perception_on_cuda_from_eight_threads_cold_then_warm():
    """The real CUDA-graph trees: first calls from eight threads (torch 2.11 asserted in a thread other than the one
    that imported them), then warm calls whose outputs a later replay would overwrite without the copy."""
    torch._dynamo.reset()
    torch.manual_seed(6)
    model = Net(64).cuda().eval()
    inputs = [torch.randn(4, 64, device="cuda") for _ in range(THREADS)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    cm = fullgraph.compile(model, "perception")
    results, errors = hammer(cm, inputs, rounds=20, pause=0.001)
    assert not errors, errors[:1]
    assert wrong(results, expected) == 0 and cm.stats.frames_compiled == 1


@requires_cuda
def test_graphed_call_on_cuda_from_eight_threads():
    torch.manual_seed(7)
    w = torch.randn(64, 64, device="cuda")
    graphed = GraphedCall(lambda x: torch.tanh(x @ w) + x, name="threads")
    inputs = [torch.randn(4, 64, device="cuda") for _ in range(THREADS)]
    expected = [torch.tanh(x @ w) + x for x in inputs]
    results, errors = hammer(graphed, inputs, rounds=20, pause=0.001)
    assert not errors and len(graphed.graphs) == 1
    assert wrong(results, expected) == 0


@requires_cuda
def test_out_of_memory_within_the_declared_range_names_the_batch_and_the_next_call_is_right():
    torch._dynamo.reset()
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096)).cuda().eval()
    cm = fullgraph.compile(model, "perception", dynamic={"input": {0: (1, 1 << 17)}})
    small = torch.randn(8, 4096, device="cuda")
    cm(small)
    cm(small)
    big = torch.randn(1 << 17, 4096, device="cuda")  # 2 GiB, made before the cap: the model's activations do not fit
    total = torch.cuda.mem_get_info()[1]
    cap = (torch.cuda.memory_reserved() + (512 << 20)) / total  # room for a few MiB of activations, not 2 GiB
    torch.cuda.set_per_process_memory_fraction(cap)
    try:
        with pytest.raises(serving.OutOfMemoryError, match=r"out of GPU memory for inputs 131072x4096:float32@cuda "
                           r"\(.* GiB free of .* GiB on cuda"):  # fmt: skip
            cm(big)
        with torch.no_grad():
            torch.testing.assert_close(cm(small), model(small))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def test_after_out_of_memory_the_trees_leave_a_half_run_warm_up_node():
    """torch's trees keep the warm-up node an out-of-memory error interrupted; their next call asserted on it (H200,
    torch 2.11). recover_trees points them back at no node; a finished warm-up node, or none, is left alone."""
    import enum

    State = enum.Enum("State", "NONE WARMUP RECORDING EXECUTION")

    class CUDAWarmupNode:
        def __init__(self, outputs: int, traces: int) -> None:
            self.tensor_weakrefs, self.stack_traces = [None] * outputs, [None] * traces

    class Manager:
        def __init__(self, node) -> None:
            self.current_node, self.path_state = node, State.WARMUP

    class Container:
        def __init__(self, manager) -> None:
            self.tree_manager = manager

    guard = serving.CallGuard()
    half, done = Manager(CUDAWarmupNode(0, 2)), Manager(CUDAWarmupNode(2, 2))
    guard.trees[0].update({0: Container(half), 1: Container(done), 2: Container(None)})
    guard.recover_trees()
    assert half.current_node is None and half.path_state is State.NONE
    assert done.current_node is not None and done.path_state is State.WARMUP
