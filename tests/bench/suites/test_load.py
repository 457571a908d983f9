import threading
import time

import pytest
import torch

from fullgraph.bench.results import read_csv
from fullgraph.bench.suites import load as suite
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
    of its CSV by thread count and metric)."""
    path = tmp_path / "load.csv"
    rc = main(["bench", "load", *FAST, *args, "--csv", str(path)])
    rows = read_csv(path) if path.exists() else []
    by = {}
    for r in rows:
        by.setdefault(int(r.variant.rsplit(", ", 1)[1].split()[0]), {})[r.metric] = r.value
    return rc, by


def assert_clean(by, cold=False):
    assert set(by) == {1, 8}
    for n, m in by.items():
        assert m["calls"] > 0 and m["calls_per_s"] > 0 and m["items_per_s"] == pytest.approx(4 * m["calls_per_s"])
        checked = n * suite.CHECK_ROUNDS * suite.INPUT_SETS + (n if cold else 0)  # each cold first call is checked
        assert m["wrong"] == 0 and m["exceptions"] == 0 and m["checked"] == checked
        assert m["max_rel_err"] <= suite.TOLERANCE and m["p99_ms"] >= m["p50_ms"] > 0
        assert "ratio_vs_1_thread" in m and "mem_growth" not in m  # no GPU memory on the CPU
    assert by[1]["ratio_vs_1_thread"] == 1


def test_compiled_under_dev_from_eight_threads_is_correct(tmp_path, capsys):
    rc, by = bench_load(tmp_path, *SMALL)
    assert rc == 0
    assert_clean(by)
    out = capsys.readouterr().out
    assert f"compiled dev, warm on {SMALL[0]} 4x8:float32 cpu" in out and "wrong/checked" in out and "n/a" in out


def test_precompiled_cold_first_calls_from_eight_threads_at_once(tmp_path, capsys):
    rc, by = bench_load(tmp_path, *SMALL, "--callable", "precompiled", "--cold")
    assert rc == 0, capsys.readouterr().err
    assert_clean(by, cold=True)
    assert all(m["first_call_s"] > 0 for m in by.values())


def test_bucketed_pads_every_other_input_set_and_stays_correct(tmp_path):
    rc, by = bench_load(tmp_path, *SMALL, "--callable", "bucketed", "--threads", "4")
    assert rc == 0 and by[4]["wrong"] == 0 and by[4]["checked"] > 0
    # half the sets are one item shorter (3 of batch 4, padded back to the bucket 4): 3.5 items a call on average
    assert by[4]["items_per_s"] / by[4]["calls_per_s"] == pytest.approx(3.5, abs=0.3)


def test_a_racy_callable_is_caught_and_the_run_fails(tmp_path, capsys):
    rc, by = bench_load(tmp_path, f"{HERE}:shared_buffer", "--callable", "eager")
    assert rc == 1
    assert by[1]["wrong"] == 0  # alone, the buffer holds its own result
    assert by[8]["wrong"] > 0 and by[8]["max_rel_err"] > suite.TOLERANCE
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("fullgraph bench load: failed: ") and "wrong outputs of" in err and "eager, warm" in err


def test_exceptions_in_worker_threads_are_counted_with_the_first_message(tmp_path, capsys):
    rc, by = bench_load(tmp_path, f"{HERE}:main_thread_only", "--callable", "eager", "--threads", "2")
    assert rc == 1
    assert by[2]["exceptions"] >= 2 and by[2]["calls"] == 0  # every worker stops after MAX_ERRORS
    assert "0 wrong outputs of 0 checked and" in capsys.readouterr().err
    rows = read_csv(tmp_path / "load.csv")
    assert '"error":"AssertionError"' in rows[0].params


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--callable", "threaded"), "--callable 'threaded': choose one of compiled, bucketed"),
        (("--threads", "0,4"), "--threads: cannot read '0,4'"),
        (("--threads", "four"), "--threads: cannot read 'four'"),
        (("--seconds", "0"), "--seconds 0: give the seconds"),
        (("--cuda-graphs",), "--cuda-graphs replays a package's calls"),
        (("--preset", "fastest"), "fastest"),
        (("--input-sets", "0"), "--input-sets 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    assert main(["bench", "load", *SMALL, *FAST, *args, "--csv", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fullgraph bench: error: ") and says in err[-1]
    assert not (tmp_path / "x.csv").exists()


def test_a_package_file_runs_only_as_a_package(tmp_path, capsys):
    assert main(["bench", "load", str(tmp_path / "model.pt2"), "--callable", "compiled", *FAST]) == 2
    assert "model.pt2 is a package: it runs as --callable package" in capsys.readouterr().err


def test_input_sets_vary_the_floats_and_keep_ids():
    example = ((torch.randn(4, 8), torch.arange(4)), {"mask": torch.ones(4, 2, dtype=torch.bool)})
    sets = suite.input_sets(example, 3, shorter=True)
    assert [s[0][0].shape[0] for s in sets] == [4, 3, 4]
    assert not torch.equal(sets[0][0][0], sets[2][0][0]) and torch.equal(sets[2][0][1], example[0][1])
    assert sets[1][1]["mask"].shape == (3, 2)
