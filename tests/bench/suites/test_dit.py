import pytest

from fullgraph.bench.results import read_csv
from fullgraph.bench.suites import dit as suite
from fullgraph.cli.main import main
from fullgraph.errors import UsageError


@pytest.mark.slow
def test_suite_times_ours_and_the_plain_twin_compiled_and_eager(tmp_path, capsys):
    path = tmp_path / "dit.csv"
    assert main(["bench", "dit", "--device", "cpu", "--tokens", "33", "--reps", "2", "--csv", str(path)]) == 0
    rows = read_csv(path)
    timed = {r.variant for r in rows if r.metric == "median_ms"}
    assert {"plain, compiled", "ours auto, compiled", "ours native, compiled", "plain, eager"} <= timed
    errors = {r.variant: r.value for r in rows if r.metric == "rel_err"}
    assert errors["plain, eager"] == 0 and all(e < 1e-5 for e in errors.values()), errors  # fp32 against fp32
    ratio = {r.variant: r.value for r in rows if r.metric == "over_plain_compiled"}
    assert ratio["plain, compiled"] == 1 and all(v > 0 for v in ratio.values())
    out = capsys.readouterr().out
    if "ours kernel, compiled" not in timed:  # no kernel runs on this CPU: skipped, with our reason, not Dynamo's
        assert "skipped: FullgraphError: layer_norm: policy 'kernel'" in out


@pytest.mark.parametrize("spec", ["a", "0", ","])
def test_bad_tokens(spec):
    with pytest.raises(UsageError, match="--tokens"):
        suite.parse_tokens(spec, gpu=False)
