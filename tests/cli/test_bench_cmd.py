from fullgraph.bench.results import read_csv
from fullgraph.cli.main import main


def test_bench_ceilings_appends_rows(tmp_path, capsys):
    path = tmp_path / "c.csv"
    args = ["bench", "ceilings", "--device", "cpu", "--copy-mib", "4", "--gemm-n", "128", "--reps", "3"]
    assert main([*args, "--csv", str(path)]) == 0
    assert main([*args, "--csv", str(path)]) == 0
    rows = read_csv(path)
    assert len(rows) == 16
    rates = [r for r in rows if r.metric in ("tbps", "tflops")]
    assert {r.variant for r in rates} == {"torch.copy_", "torch.mm"} and all(r.value > 0 for r in rates)
    out = capsys.readouterr().out
    assert "TB/s" in out and "TFLOP/s" in out and f"8 rows appended to {path}" in out


def test_unknown_suite_exits_2(capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["bench", "no-such-suite"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
