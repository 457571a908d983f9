"""benchmarks/plot_sweep.py without a GPU: the points of sweep CSVs by mode, the losses by the noise rule it names,
the chart where matplotlib is installed, and a file with no sweep rows refused."""

import pytest

from fullgraph.bench.results import append_csv
from tests.bench.scripts import load_script
from tests.bench.suites.test_sweep import dit_rows

PLAIN, AGAIN, AUTO, NATIVE = (
    "plain, compiled",
    "plain again (second instance), compiled",
    "ours auto, compiled",
    ("ours native, compiled"),
)


@pytest.fixture(scope="module")
def ps():
    return load_script("plot_sweep")


def write(tmp_path, name, points):
    path = tmp_path / name
    for case, mode, ms in points:
        append_csv(str(path), dit_rows(case, mode, ms))
    return str(path)


def test_points_by_mode_and_the_losses_by_the_noise_rule(ps, tmp_path):
    a = write(tmp_path, "a.csv", [
        ("1152x16h x4 b8 n256 bf16", "default", {PLAIN: 1.0, AGAIN: 1.0, AUTO: 1.02, NATIVE: 1.0}),  # auto 0.980: loss
        ("1152x16h x4 b2 n1024 bf16", "default", {PLAIN: 1.0, AGAIN: 1.05, AUTO: 1.02, NATIVE: 0.98}),  # noise 0.952
    ])  # fmt: skip
    ro = "1152x16h x4 b8 n256 bf16 reduce-overhead"
    b = write(tmp_path, "b.csv", [(ro, "reduce-overhead", {PLAIN: 1.0, AGAIN: 1.0, AUTO: 0.9, NATIVE: 1.0})])
    by_mode = ps.points([a, b])
    assert [label for label, _ in by_mode["default"]] == ["DiT 1152x16 b8 n256", "DiT 1152x16 b2 n1024"]
    assert [label for label, _ in by_mode["reduce-overhead"]] == ["DiT 1152x16 b8 n256"]
    assert ps.losses(by_mode, "auto") == ["default DiT 1152x16 b8 n256 0.980 (again 1.000)"]
    assert ps.losses(by_mode, "native") == []  # 1/0.98 is faster; 1.0 is no loss


def test_main_writes_the_chart_and_refuses_a_file_without_sweep_rows(ps, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    a = write(tmp_path, "a.csv", [("1152x16h x4 b8 n256 bf16", "default", {PLAIN: 1.0, AGAIN: 1.0, AUTO: 1.02})])
    png = tmp_path / "s.png"
    assert ps.main([a, "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "1 points (default 1)" in capsys.readouterr().out
    empty = tmp_path / "e.csv"
    empty.write_text("suite,case,variant,metric,value,unit,params,device,gpu,torch,triton,fullgraph,commit,date\n")
    assert ps.main([str(empty), "--png", str(png)]) == 2
    assert "no sweep rows" in capsys.readouterr().err
