import argparse
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
import torch

from fullgraph.bench.results import read_csv
from fullgraph.bench.suites import load as suite
from fullgraph.bench.suites import load_threads
from fullgraph.cli.main import main

HERE = __name__  # TARGETs below are `tests.bench.suites.test_load:<function>`
# two linear layers (coldstart's: a compile in seconds), batch 4
SMALL = ("tests.bench.suites.test_coldstart:linears", "--input", "4x8:fp32")
FAST = ("--device", "cpu", "--threads", "1,8", "--seconds", "0.3")


class SharedBuffer(torch.nn.Module):
    """A racy callable, as a CUDA-graph replay without copy-out is: every output is one buffer, written, then handed
    back after a pause in which another thread's call overwrites it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("out", torch.zeros(4, 8))

    def forward(self, x):
        self.out.copy_(x * 2)
        time.sleep(0.002)
        return self.out


def shared_buffer():
    return SharedBuffer(), torch.randn(4, 8)


class MainThreadOnly(torch.nn.Module):
    """Raises outside the thread that built it, without a message (as torch 2.11's CUDA-graph trees assert)."""

    def __init__(self):
        super().__init__()
        self.home = threading.get_ident()

    def forward(self, x):
        if threading.get_ident() != self.home:
            raise AssertionError
        return x + 1


def main_thread_only():
    return MainThreadOnly(), torch.randn(2, 3)


def bench_load(tmp_path, *args):
    """`fullgraph bench load TARGET ARGS` on the CPU for 0.3 s at 1 and 8 threads (later flags win): (exit code, rows
    of its CSV by callable, thread count and metric)."""
    path = tmp_path / "load.csv"
    rc = main(["bench", "load", *FAST, *args, "--csv", str(path)])
    by = {}
    for r in read_csv(path) if path.exists() else []:
        params = json.loads(r.params)
        by.setdefault(params["callable"], {}).setdefault(params["threads"], {})[r.metric] = r.value
    return rc, by


def assert_clean(by, cold=False):
    assert set(by) == {1, 8}
    for n, m in by.items():
        assert m["calls"] > 0 and m["calls_per_s"] > 0
        checked = n * load_threads.CHECK_ROUNDS * suite.INPUT_SETS + (n if cold else 0)  # each cold first call checked
        assert m["wrong"] == 0 and m["exceptions"] == 0 and m["checked"] == checked
        assert m["max_rel_err"] <= load_threads.TOLERANCE and m["p99_ms"] >= m["p50_ms"] > 0
        assert "ratio_vs_1_thread" in m and "mem_growth" not in m  # no GPU memory on the CPU
    assert by[1]["ratio_vs_1_thread"] == 1


def test_compiled_and_bucketed_under_dev_from_eight_threads_are_correct(tmp_path, capsys):
    rc, by = bench_load(tmp_path, *SMALL, "--callable", "compiled,bucketed,locked")
    assert rc == 0
    assert_clean(by["compiled"])
    assert_clean(by["bucketed"])
    assert_clean(by["locked"])  # the hand-written lock, the floor compared against on the GPU
    for n, m in by["compiled"].items():
        assert m["items_per_s"] == pytest.approx(4 * m["calls_per_s"])
        # half of bucketed's sets are one item shorter (3 of batch 4, padded back to the bucket 4)
        assert by["bucketed"][n]["items_per_s"] / by["bucketed"][n]["calls_per_s"] == pytest.approx(3.5, abs=0.3)
    out = capsys.readouterr().out
    assert f"{SMALL[0]} 4x8:float32 cpu, warm start" in out and "wrong/checked" in out and "n/a" in out
    assert "compiled dev" in out and "bucketed dev" in out


def test_precompiled_cold_first_calls_from_eight_threads_at_once(tmp_path, capsys):
    rc, by = bench_load(tmp_path, *SMALL, "--callable", "precompiled", "--cold")
    assert rc == 0, capsys.readouterr().err
    assert_clean(by["precompiled"], cold=True)
    assert all(m["first_call_s"] > 0 for m in by["precompiled"].values())


def test_a_racy_callable_is_caught_and_the_run_fails(tmp_path, capsys):
    rc, by = bench_load(tmp_path, f"{HERE}:shared_buffer", "--callable", "eager")
    assert rc == 1
    by = by["eager"]
    assert by[1]["wrong"] == 0  # alone, the buffer holds its own result
    assert by[8]["wrong"] > 0 and by[8]["max_rel_err"] > load_threads.TOLERANCE
    progress = capsys.readouterr().err
    # each point's figures as it ends, before the table: what a process that dies later still shows
    assert re.search(r"eager, 8 threads: [\d.]+ calls/s, [1-9]\d* wrong of 192, 0 exceptions", progress), progress
    err = progress.strip().splitlines()[-1]
    assert (
        err.startswith("fullgraph bench load: failed: ")
        and "eager, warm: " in err
        and "wrong outputs of 216, 0 exceptions" in err
    )


def test_exceptions_in_worker_threads_are_counted_with_the_first_message(tmp_path, capsys):
    rc, by = bench_load(tmp_path, f"{HERE}:main_thread_only", "--callable", "eager", "--threads", "2")
    assert rc == 1
    assert by["eager"][2]["exceptions"] >= 2 and by["eager"][2]["calls"] == 0  # each worker stops after MAX_ERRORS
    # each of the 2 threads stops after MAX_ERRORS in each round (its first and timed calls together), then in its
    # checks
    raised = 2 * (suite.DEFAULT_ROUNDS + 1) * load_threads.MAX_ERRORS
    assert f"eager, warm: 0 wrong outputs of 0, {raised} exceptions" in capsys.readouterr().err
    rows = read_csv(tmp_path / "load.csv")
    assert '"error":"AssertionError"' in rows[0].params


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--callable", "threaded"), "--callable 'threaded': give one or more of compiled, bucketed"),
        (("--callable", "eager,eager"), "each once"),
        (("--package", "m.pt2"), "--package m.pt2: give a FILE.pt2, for --callable package"),
        (("--threads", "0,4"), "--threads: cannot read '0,4'"),
        (("--threads", "four"), "--threads: cannot read 'four'"),
        (("--seconds", "0"), "--seconds 0: give the seconds"),
        (("--cuda-graphs",), "--cuda-graphs replays a package's calls"),
        (("--preset", "fastest"), "fastest"),
        (("--input-sets", "0"), "--input-sets 0"),
        (("--runners", "2"), "--runners 2: a package's model instances, for --callable package or nogil"),
        (("--callable", "package", "--cuda-graphs", "--runners", "2"), "--runners 2: a package's model instances"),
        (("--rounds", "0"), "--rounds 0: give 1 or more"),
        (("--cold", "--rounds", "2"), "--rounds 2: a cold run measures each thread count once"),
        (("--cold", "--memory-calls", "10000"), "--memory-calls 10000: a cold run times each thread count once"),
        (("--memory-calls", "-1"), "--memory-calls -1: give a number of calls"),
        (("--callable", "package,serial", "--runners", "2"), "and not beside serial (one instance by design)"),
        (("--callable", "package,serial", "--cuda-graphs"), "--cuda-graphs with --callable serial, owner or nogil: a"),
        (("--callable", "package,owner", "--cuda-graphs"), "--cuda-graphs with --callable serial, owner or nogil: a"),
        (("--callable", "package,nogil", "--cuda-graphs"), "--cuda-graphs with --callable serial, owner or nogil: a"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    assert main(["bench", "load", *SMALL, *FAST, *args, "--csv", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fullgraph bench: error: ") and says in err[-1]
    assert not (tmp_path / "x.csv").exists()


def test_a_package_file_runs_only_as_a_package(tmp_path, capsys):
    assert main(["bench", "load", str(tmp_path / "model.pt2"), "--callable", "compiled", *FAST]) == 2
    assert (
        "model.pt2 is a package: it runs as --callable package (or serial: single-threaded on its own thread; "
        "owner: on its own thread; nogil: the GIL released; locked: behind one lock), not compiled"
        in capsys.readouterr().err
    )


def test_input_sets_vary_the_floats_and_keep_ids():
    example = ((torch.randn(4, 8), torch.arange(4)), {"mask": torch.ones(4, 2, dtype=torch.bool)})
    sets = suite.input_sets(example, 3, shorter=True)
    assert [s[0][0].shape[0] for s in sets] == [4, 3, 4]
    assert not torch.equal(sets[0][0][0], sets[2][0][0]) and torch.equal(sets[2][0][1], example[0][1])
    assert sets[1][1]["mask"].shape == (3, 2)


class PerThreadState(torch.nn.Module):
    """Holds 1 MiB "allocated" at each thread's first call, as torch keeps a library workspace per calling thread;
    `held` is what a GPU's memory reading would count."""

    held = 0
    lock = threading.Lock()

    def __init__(self):
        super().__init__()
        self.seen = threading.local()

    def forward(self, x):
        if not getattr(self.seen, "once", False):
            self.seen.once = True
            with PerThreadState.lock:
                PerThreadState.held += 2**20
        return x * 2


def per_thread_state():
    return PerThreadState(), torch.randn(4, 8)


def test_memory_is_read_in_the_threads_that_make_the_timed_calls(tmp_path, monkeypatch):
    # A server's pool keeps its threads: per-thread state made at a thread's first call is no growth over calls.
    # Reading the baseline in other threads than the timed ones counted one state more per thread count (H200,
    # uncaptured DiT package: +33 MiB per thread, read as +7.7% growth at 4 threads).
    PerThreadState.held = 64 * 2**20
    monkeypatch.setattr(suite.Driver, "memory", lambda self: PerThreadState.held)
    rc, by = bench_load(tmp_path, f"{HERE}:per_thread_state", "--callable", "eager", "--threads", "1,4,16")
    assert rc == 0
    for n in (1, 4, 16):
        assert by["eager"][n]["mem_growth"] == 0.0
        assert by["eager"][n]["mem_after_first_bytes"] > 64 * 2**20  # each thread made its state before the reading
    whole = by["eager"]["all"]  # every thread count's calls of the one callable: still none
    assert whole["mem_growth"] == 0.0 and whole["calls"] == sum(by["eager"][n]["calls"] for n in (1, 4, 16))


class Leaky(torch.nn.Module):
    """Keeps 1 KiB more at every call: growth over calls, which the point must show whichever round it is in."""

    held = 2**20

    def forward(self, x):
        Leaky.held += 1024
        return x * 2


def leaky():
    return Leaky(), torch.randn(4, 8)


def test_memory_that_grows_with_the_calls_shows_as_growth(tmp_path, monkeypatch):
    monkeypatch.setattr(suite.Driver, "memory", lambda self: Leaky.held)
    rc, by = bench_load(tmp_path, f"{HERE}:leaky", "--callable", "eager", "--threads", "1,4")
    assert rc == 0
    for n in (1, 4):
        point = by["eager"][n]
        grew = point["mem_end_bytes"] - point["mem_after_first_bytes"]
        assert point["mem_growth"] > 0 and grew >= 1024 * point["calls"]  # every timed call's KiB, in all rounds
    # over all thread counts: the first point's baseline plus what every point's calls added
    whole, calls = by["eager"]["all"], by["eager"][1]["calls"] + by["eager"][4]["calls"]
    base = by["eager"][1]["mem_after_first_bytes"]
    assert whole["calls"] == calls and whole["mem_growth"] * base >= 1024 * calls - 1 and whole["mem_growth"] > 0


def test_a_package_targets_second_kind_opens_the_file_again():
    # `package,locked` on a .pt2: the loaded package serves the first kind only; the second starts untouched
    opened = []

    def open_package(path, specs, **options):
        opened.append(options)
        return object(), None

    plan = suite.Plan(target="m.pt2", kinds=("package", "locked"), threads=(1,), seconds=1.0, cold=True,
                      preset="dev", cuda_graphs=False, device="cpu", runners=2)  # fmt: skip
    sources = suite.Sources(None, open_package, None, None, None, lambda msg: None)
    loaded = object()
    assert suite.opener(plan, "package", loaded, ((), {}), sources, "")() is loaded
    assert opened == []
    locked = suite.opener(plan, "locked", loaded, ((), {}), sources, "")()
    # every option given, torch's loader included: a kind means the same whatever load's defaults
    assert opened == [{"cuda_graphs": False, "runners": 2, "release_gil": False}] and locked is not loaded


def test_serial_opens_the_package_again_single_threaded(tmp_path):
    # `package,serial`: serial is its own load of the file (the runtime opened single-threaded), for a .pt2 TARGET
    # and for a package exported here from a Python TARGET, exported once for both kinds
    opened, exported = [], []

    def open_package(path, specs, **options):
        opened.append((os.path.basename(path), options))
        return object(), None

    def export(model, args, path, preset):
        exported.append(path)
        Path(path).write_bytes(b"pt2")
        return path

    sources = suite.Sources(None, open_package, export, None, None, lambda msg: None)
    plan = suite.Plan(target="m.pt2", kinds=("package", "serial"), threads=(1,), seconds=1.0, cold=False,
                      preset="dev", cuda_graphs=False, device="cpu")  # fmt: skip
    loaded = object()
    assert suite.opener(plan, "package", loaded, ((), {}), sources, "")() is loaded
    assert suite.opener(plan, "serial", loaded, ((), {}), sources, "")() is not loaded
    assert opened == [("m.pt2", {"cuda_graphs": False, "runners": 1, "release_gil": False, "serial": True})]
    plan = suite.Plan(target="t.py:m", kinds=("package", "serial"), threads=(1,), seconds=1.0, cold=False,
                      preset="dev", cuda_graphs=False, device="cpu")  # fmt: skip
    work, opened[:] = str(tmp_path), []
    for kind in plan.kinds:
        suite.opener(plan, kind, torch.nn.Linear(2, 2), ((torch.randn(1, 2),), {}), sources, work)()
    assert exported == [os.path.join(work, "model.pt2")]
    pooled = {"cuda_graphs": False, "runners": 1, "release_gil": False}
    assert opened == [("model.pt2", pooled), ("model.pt2", {**pooled, "serial": True})]


def test_nogil_locked_is_the_nogil_load_behind_one_lock_copying_out(tmp_path):
    # the floor a GIL-released package's many callers must not fall below: the same load behind one lock
    opened = []
    out = torch.zeros(3)

    def open_package(path, specs, **options):
        opened.append(options)
        return (lambda x: out.add_(x)), None  # writes into one buffer: only a copy inside the lock keeps it

    sources = suite.Sources(None, open_package, None, None, None, lambda msg: None)
    plan = suite.Plan(target="m.pt2", kinds=("nogil", "nogil-locked"), threads=(1, 4), seconds=1.0, cold=False,
                      preset="dev", cuda_graphs=False, device="cpu", runners=2)  # fmt: skip
    fn = suite.opener(plan, "nogil-locked", object(), ((), {}), sources, "")()
    assert opened == [{"cuda_graphs": False, "runners": 2, "release_gil": True}]
    first = fn(torch.ones(3))
    fn(torch.ones(3))
    assert first.tolist() == [1.0, 1.0, 1.0] and out.tolist() == [2.0, 2.0, 2.0]  # its own copy
    assert plan.label("nogil-locked") == "package, GIL released, locked, 2 runners"
    with pytest.raises(suite.UsageError, match="--cuda-graphs with --callable serial, owner or nogil"):
        suite.Plan(target="m.pt2", kinds=("package", "nogil-locked"), threads=(1,), seconds=1.0, cold=False,
                   preset="dev", cuda_graphs=True, device="cpu")  # fmt: skip


def test_owner_hands_the_package_runtimes_calls_to_one_thread_of_its_own():
    ran_on = []

    def run(x):
        ran_on.append(threading.get_ident())
        return x + 1

    def open_package(path, specs, **options):
        assert options == {"cuda_graphs": False, "runners": 1, "release_gil": False}  # the pooled runtime, as `package`
        return run, None

    sources = suite.Sources(None, open_package, None, None, None, lambda msg: None)
    plan = suite.Plan(target="m.pt2", kinds=("package", "owner"), threads=(1,), seconds=1.0, cold=False,
                      preset="dev", cuda_graphs=False, device="cpu")  # fmt: skip
    owned = suite.opener(plan, "owner", run, ((), {}), sources, "")()
    outs = []
    pool = [threading.Thread(target=lambda: outs.append(owned(torch.ones(2)))) for _ in range(4)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert [o.tolist() for o in outs] == [[2.0, 2.0]] * 4
    assert len(set(ran_on)) == 1 and ran_on[0] not in {th.ident for th in pool}


def test_x_one_thread_is_the_median_of_the_rounds_ratios_so_a_drift_does_not_read_as_threading():
    def point(threads, rates):
        return suite.Point(threads, load_threads.Tally(calls=int(sum(rates))), len(rates), load_threads.Tally(),
                           None, None, None, tuple(rates))  # fmt: skip

    # a machine that speeds up by 10% a round: one thread's rounds ran first each time
    one, four = point(1, [100.0, 110.0, 121.0]), point(4, [105.0, 115.5, 127.05])
    assert suite.vs_one_thread(four, one) == pytest.approx(1.05)  # each round's ratio is 1.05
    # the totals of points measured one after the other read the drift: 1 thread early, 4 threads late
    early, late = point(1, [100.0]), point(4, [121.0])
    assert suite.vs_one_thread(late, early) == pytest.approx(1.21)
    assert suite.vs_one_thread(four, None) is None


def test_package_kinds_take_turns_round_after_round_so_a_drift_hits_them_alike():
    said = []
    example = argparse.Namespace(args=(torch.randn(2, 3),), kwargs={})

    def open_package(path, specs, **options):
        return (lambda x: x * 3), example

    sources = suite.Sources(None, open_package, None, None, None, said.append)
    args = argparse.Namespace(target="m.pt2", callable="package,serial,owner", threads="1,2", seconds=0.3,
                              cold=False, preset=None, cuda_graphs=False, device="cpu", input=[], input_sets=2,
                              package=None, runners=1, rounds=2)  # fmt: skip
    rows, text, failed = suite.run(args, sources=sources)
    assert failed is None and "in 2 rounds" in text and text.count("package, owner thread") == 2  # 2 thread counts
    turns = [m.split(", round")[0] for m in said if ", round " in m]
    first = [f"{k}, {n} thread{'s' * (n != 1)}" for k in ("package", "package, serial", "package, owner thread")
             for n in (1, 2)]  # fmt: skip
    second = [f"{k}, {n} thread{'s' * (n != 1)}" for k in ("package, owner thread", "package, serial", "package")
              for n in (1, 2)]  # fmt: skip
    assert turns == first + second  # every kind's rounds among the others', the order reversed every other round
    assert {r.params and json.loads(r.params)["rounds"] for r in rows} == {2}


def test_each_kind_starts_from_empty_dynamo_caches(tmp_path, monkeypatch):
    # a kind compiled after another would otherwise inherit its automatic dynamic shapes (bucketed's varied batch)
    resets, real = [], torch._dynamo.reset
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1) or real())
    rc, by = bench_load(tmp_path, *SMALL, "--callable", "compiled,plain", "--threads", "1", "--seconds", "0.2")
    assert rc == 0 and set(by) == {"compiled", "plain"}
    assert len(resets) >= 2


class SlowLeaky(Leaky):
    """Leaky at about 1 ms a call, so that the timed rounds make far fewer calls than --memory-calls asks."""

    def forward(self, x):
        time.sleep(0.001)
        return super().forward(x)


def slow_leaky():
    return SlowLeaky(), torch.randn(4, 8)


def memory_calls_run(tmp_path, monkeypatch, target: str, calls: int):
    """`bench load` of this file's TARGET as eager at 1 and 4 threads with --memory-calls, GPU memory read as
    Leaky.held: bench_load's (exit code, rows)."""
    monkeypatch.setattr(suite.Driver, "memory", lambda self: Leaky.held)
    return bench_load(tmp_path, f"{HERE}:{target}", "--callable", "eager", "--threads", "1,4", "--memory-calls",
                      str(calls))  # fmt: skip


def test_memory_calls_reads_memory_over_that_many_calls(tmp_path, monkeypatch, capsys):
    # the "GPU memory after 10,000 calls" where the timed rounds make fewer (ViT-B/16 b64: ~5,000 in 30 s)
    rc, by = memory_calls_run(tmp_path, monkeypatch, "slow_leaky", 3000)
    assert rc == 0
    timed = int(by["eager"][1]["calls"] + by["eager"][4]["calls"])
    whole = by["eager"]["all"]
    assert timed < 3000 and whole["calls"] == 3000 and whole["untimed_calls"] == 3000 - timed
    # every call's KiB counted, the untimed ones too
    assert whole["mem_growth"] * by["eager"][1]["mem_after_first_bytes"] >= 1024 * 3000 - 1  # float rounding
    says = f"over 3000 calls after the first 100 (all thread counts, {3000 - timed} of them untimed from 4 threads)"
    assert says in capsys.readouterr().out


def test_memory_calls_on_the_cpu_says_there_is_nothing_to_read(tmp_path, capsys):
    rc, by = bench_load(tmp_path, *SMALL, "--callable", "eager", "--memory-calls", "100000")
    assert rc == 0 and "all" not in by["eager"]
    assert "--memory-calls 100000: no GPU memory to read on cpu" in capsys.readouterr().out


class FailsLate(SlowLeaky):
    """Raises from its 3,000th call on: after the timed rounds and checks (~2,300 calls at most), inside the untimed
    calls of --memory-calls."""

    calls = 0

    def forward(self, x):
        FailsLate.calls += 1
        if FailsLate.calls > 3000:
            raise RuntimeError("out of buffers")
        return super().forward(x)


def fails_late():
    FailsLate.calls = 0
    return FailsLate(), torch.randn(4, 8)


def test_an_exception_in_the_memory_calls_fails_the_run(tmp_path, monkeypatch, capsys):
    rc, by = memory_calls_run(tmp_path, monkeypatch, "fails_late", 6000)
    assert rc == 1
    assert by["eager"][1]["exceptions"] == by["eager"][4]["exceptions"] == 0  # the timed rounds and checks were clean
    captured = capsys.readouterr()
    assert "eager, warm: first exception: RuntimeError: out of buffers" in captured.out
    assert re.search(r"eager, warm: 0 wrong outputs of \d+, [1-9]\d* exceptions", captured.err.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["plain", "locked", "eager"])
def test_the_baselines_run_without_autograd_from_a_fresh_thread(kind):
    # a baseline with autograd on is one no server runs: reduce-overhead's CUDA-graph trees then keep a backward
    # pending and fell to 18.8 calls/s on an H100 (ViT-S/16 b4) against 1307 for fullgraph's callable
    plan = suite.Plan(target="t.py:m", kinds=(kind,), threads=(1,), seconds=1.0, cold=False, preset="dev",
                      cuda_graphs=False, device="cpu")  # fmt: skip
    model = torch.nn.Linear(5, 3)
    x = torch.randn(2, 5)
    fn = suite.opener(plan, kind, model, ((x,), {}), None, "")()
    got = {}
    thread = threading.Thread(target=lambda: got.update(out=fn(x), grad=torch.is_grad_enabled()))
    thread.start()
    thread.join()
    assert got["grad"] is True  # the thread's own mode is untouched after the call
    assert got["out"].requires_grad is False and got["out"].grad_fn is None
    torch.testing.assert_close(got["out"], model(x).detach())
