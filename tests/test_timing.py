import contextlib
import time

import pytest
import torch

from fullgraph import timing
from fullgraph.errors import UsageError
from tests.skips import requires_cuda


def sleeper(ms: float):
    return lambda *args: time.sleep(ms / 1e3)


def test_quantile_interpolates():
    vals = sorted(torch.rand(11).tolist())
    assert timing.quantile(vals, 0.5) == vals[5]
    assert timing.quantile(vals, 0.0) == vals[0] and timing.quantile(vals, 1.0) == vals[-1]
    q = timing.quantile(vals, 0.25)  # position 2.5
    assert q == pytest.approx((vals[2] + vals[3]) / 2)


def test_cpu_timing_of_known_sleep():
    # time.sleep overshoots by a scheduler tick at most; the median lands within [5 ms, 5 ms + 3 ms].
    t = timing.measure(sleeper(5.0), device="cpu", warmup=1, reps=15)
    assert t.method == "cpu-clock" and t.reps == 15
    assert 5.0 <= t.median_ms < 8.0
    assert t.min_ms <= t.p20_ms <= t.median_ms <= t.p80_ms


def test_percentiles_follow_the_samples():
    # Alternate 2 ms and 10 ms calls: p20 sits on the short ones, p80 on the long ones, the median between.
    t = timing.measure(lambda ms: time.sleep(ms / 1e3), device="cpu", warmup=0, reps=20, rotate=[(2.0,), (10.0,)])
    assert 2.0 <= t.p20_ms < 4.0
    assert 10.0 <= t.p80_ms < 13.0
    assert t.p20_ms < t.median_ms < t.p80_ms


def test_inner_reports_per_call_time():
    t = timing.measure(sleeper(2.0), device="cpu", warmup=0, reps=5, inner=4)
    assert t.inner == 4 and 2.0 <= t.median_ms < 4.0


def test_rotate_cycles_inputs_in_order():
    seen = []
    timing.measure(lambda a: seen.append(a), device="cpu", warmup=2, reps=4, inner=2, rotate=[(0,), (1,), (2,)])
    warm, timed = seen[:2], seen[2:]
    assert warm == [0, 1] and timed == [0, 1, 2, 0, 1, 2, 0, 1]


def test_first_call_is_kept_apart_from_steady_state():
    calls = []

    def slow_then_fast():  # like a compiled model: the first call pays for compilation
        time.sleep(0.060 if not calls else 0.001)
        calls.append(1)

    m = timing.benchmark(slow_then_fast, device="cpu", warmup=2, reps=10)
    assert 0.060 <= m.first_call_s < 0.1
    assert 1.0 <= m.timing.median_ms < 4.0
    assert m.peak_memory_bytes is None  # no allocator statistics on the CPU


@pytest.mark.parametrize("bad", [{"reps": 0}, {"inner": 0}, {"warmup": -1}, {"rotate": []}])
def test_bad_arguments(bad):
    with pytest.raises(UsageError):
        timing.measure(lambda *a: None, device="cpu", **bad)


def test_graph_needs_cuda():
    with pytest.raises(UsageError, match="CUDA"):
        timing.measure(lambda: None, device="cpu", graph=True)


def _cycles_for(ms: float) -> int:
    """Calibrate torch.cuda._sleep: cycles that take about `ms` (the clock is not reported reliably)."""
    probe = 10_000_000
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        torch.cuda._sleep(probe)
    torch.cuda.synchronize()
    per_ms = probe * 5 / ((time.perf_counter() - t0) * 1e3)
    return int(per_ms * ms)


@requires_cuda
def test_cuda_events_scale_with_work():
    c = _cycles_for(1.0)
    one = timing.measure(lambda: torch.cuda._sleep(c), device="cuda", warmup=3, reps=20)
    two = timing.measure(lambda: torch.cuda._sleep(2 * c), device="cuda", warmup=3, reps=20)
    assert one.method == "cuda-events"
    assert 0.5 < one.median_ms < 2.0
    assert 1.8 < two.median_ms / one.median_ms < 2.2


@requires_cuda
def test_cuda_events_agree_with_host_clock():
    c = _cycles_for(2.0)
    t = timing.measure(lambda: torch.cuda._sleep(c), device="cuda", warmup=3, reps=20)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        torch.cuda._sleep(c)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / 20
    assert t.median_ms == pytest.approx(wall_ms, rel=0.1)


@requires_cuda
def test_cuda_graph_times_replays():
    c = _cycles_for(0.5)
    ev = timing.measure(lambda: torch.cuda._sleep(c), device="cuda", warmup=3, reps=20)
    gr = timing.measure(lambda: torch.cuda._sleep(c), device="cuda", warmup=3, reps=20, inner=8, graph=True)
    assert gr.method == "cuda-graph" and gr.inner == 8
    assert gr.median_ms == pytest.approx(ev.median_ms, rel=0.1)


@requires_cuda
def test_peak_memory_counts_allocations():
    n = 256 << 20

    def alloc():
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        return None

    peak = timing.peak_memory(alloc, "cuda")
    assert n <= peak < n + (8 << 20)


def test_round_medians_start_each_round_one_callable_further_along():
    firsts, calls = [], []

    def recorder(name):
        def fn():
            if not calls or calls[-1] != name:  # a new block of calls: warm-up and reps run back to back
                firsts.append(name)
            calls.append(name)

        return fn

    out = timing.round_medians({n: recorder(n) for n in "abc"}, device="cpu", rounds=4, warmup=1, reps=2)
    assert firsts == list("abcbcacababc")
    assert {n: len(m) for n, m in out.items()} == {"a": 4, "b": 4, "c": 4}
    assert len(calls) == 4 * 3 * (1 + 2)
    assert timing.round_medians({}, device="cpu", rounds=4) == {}  # nothing to time: no rounds
    with pytest.raises(UsageError, match="graph=True needs a CUDA device"):  # graph= reaches each measurement
        timing.round_medians({"a": recorder("a")}, device="cpu", rounds=1, graph=True)


def test_a_time_budget_adds_the_rounds_that_fit_after_the_first_and_keeps_the_least(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter_ns", lambda: int(clock[0] * 1e9))

    def taking(seconds):  # each call advances the CPU clock the timings read by `seconds`
        return lambda: clock.__setitem__(0, clock[0] + seconds)

    fns = {"a": taking(0.001), "b": taking(0.003)}  # a round: (1 + 9) calls each, 0.04 s
    out = timing.round_medians(fns, device="cpu", rounds=3, warmup=1, reps=9, budget_s=0.4)
    assert {n: len(m) for n, m in out.items()} == {"a": 10, "b": 10}
    assert out["a"][0] == pytest.approx(1.0) and out["b"][-1] == pytest.approx(3.0)  # ms per call
    out = timing.round_medians(fns, device="cpu", rounds=3, warmup=1, reps=9, budget_s=0.4, most_rounds=6)
    assert len(out["a"]) == 6  # capped
    out = timing.round_medians(fns, device="cpu", rounds=3, warmup=1, reps=9, budget_s=0.05)
    assert len(out["a"]) == 3  # one round fits: the least stands
    assert len(timing.round_medians(fns, device="cpu", rounds=3, warmup=1, reps=9)["a"]) == 3  # no budget: fixed
    assert timing.rounds_within(0.0, 1.0, 5) == timing.MOST_ROUNDS


def test_a_variants_context_is_entered_once_around_each_of_its_measurements_not_per_call():
    entered, seen = [], []

    @contextlib.contextmanager
    def state(name):
        entered.append(name)
        current.append(name)
        yield
        current.pop()

    current: list[str] = []
    fns = {n: (lambda n=n: seen.append((n, tuple(current)))) for n in "ab"}
    timing.round_medians(fns, device="cpu", rounds=3, warmup=1, reps=4, around={"b": lambda: state("b")})
    assert entered == ["b"] * 3  # once a round: around warm-up and timed calls together
    assert {s for n, s in seen if n == "b"} == {("b",)} and {s for n, s in seen if n == "a"} == {()}
    assert len(seen) == 2 * 3 * (1 + 4)
