import pytest

from fullgraph.bench.results import read_csv
from fullgraph.bench.suites import attention as suite
from fullgraph.cli.main import main
from fullgraph.errors import UsageError


def test_suite_times_every_serving_backend_and_auto(triton_device, tmp_path, capsys):
    path = tmp_path / "att.csv"
    dtype = "bf16" if triton_device == "cuda" else "fp32"  # bf16 dots are wrong in Triton's CPU interpreter
    args = ["bench", "attention", "--device", triton_device, "--seqs", "17", "--reps", "2", "--dtype", dtype]
    assert main([*args, "--csv", str(path)]) == 0
    rows = read_csv(path)
    timed = {(r.case, r.variant) for r in rows if r.metric == "tflops"}
    points = {case for case, _ in timed}
    assert len(points) == 4  # two families x causal or not
    assert all((p, "sdpa-math") in timed and (p, "triton") in timed for p in points)
    errors = [r.value for r in rows if r.metric == "rel_err"]
    assert errors and all(e < suite.TOLERANCE[suite.DTYPES[dtype]] for e in errors)
    ratios = [r.value for r in rows if r.metric == "auto_over_best"]
    assert len(ratios) == 4 and all(r >= 1.0 for r in ratios)  # auto's time over the fastest it was timed against
    assert "auto ->" in capsys.readouterr().out


@pytest.mark.parametrize("spec", ["a,b", "0", ","])
def test_bad_seqs(spec):
    with pytest.raises(UsageError, match="--seqs"):
        suite.parse_seqs(spec, gpu=False)


def test_batch_fills_short_sequences():
    assert suite.batch_for(197) == 20 and suite.batch_for(16384) == 1
