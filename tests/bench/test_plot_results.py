import random
import sys

import pytest

from fullgraph.bench.results import append_csv, make_rows
from tests.bench.scripts import load_script


@pytest.fixture(scope="module")
def plot():
    yield load_script("plot_results", register=True)
    del sys.modules["plot_results"]


def timing(ms: float) -> dict:
    return {"median_ms": (ms, "ms"), "p20_ms": (ms * 0.9, "ms"), "p80_ms": (ms * 1.2, "ms")}


@pytest.fixture
def csvs(tmp_path):
    """A vit CSV (two batch sizes, three variants, a breakdown) and one of nms and robot, with random medians."""
    rng = random.Random()
    ms = {}
    vit, other = tmp_path / "vit.csv", tmp_path / "other.csv"
    for batch in (1, 7):
        point = f"192d x2 b{batch}"
        params = {"batch": batch, "dtype": "bf16"}
        for variant in ("plain, eager fp32", "plain, compiled default bf16", "ours, fullgraph.compile dev bf16"):
            ms[point, variant] = rng.uniform(0.5, 20)
            metrics = {**timing(ms[point, variant]), "images_per_s": (batch / ms[point, variant] * 1e3, "img/s"),
                       "first_call_s": (rng.uniform(0.1, 9), "s"), "rel_err": (rng.uniform(1e-4, 1e-2), ""),
                       "peak_memory_bytes": (3 * 2**20, "B")}  # fmt: skip
            append_csv(vit, make_rows("vit", point, variant, metrics, params))
    append_csv(vit, make_rows("vit", "192d x2 b7", "ours, fullgraph.compile dev bf16",
                              {"class_ms_gemm": (0.25, "ms"), "class_ms_attention": (0.125, "ms")}))  # fmt: skip
    for variant, exact in (("ours, eager", 1.0), ("ours, compiled", 0.0)):
        ms["n200 b4", variant] = rng.uniform(1, 10)
        metrics = {**timing(ms["n200 b4", variant]), "first_call_s": (1.5, "s"), "exact": (exact, "")}
        append_csv(other, make_rows("nms", "n200 b4", variant, metrics, {"boxes": 200, "batch": 4}))
    for way in ("eager", "plan"):
        ms["stream", way] = rng.uniform(1, 10)
        metrics = {**timing(ms["stream", way]), "recompiles_after_warmup": (0.0, ""), "compile_seconds": (2.0, "s")}
        append_csv(other, make_rows("robot", "stream", way, metrics, {}))
    return vit, other, ms


def table_rows(markdown: str, suite: str) -> dict[tuple[str, str], dict[str, str]]:
    """(point, variant) -> {header: cell} of one suite's table."""
    section = markdown.split(f"### {suite}\n", 1)[1]
    lines = section[section.index("\n|") + 1 :].split("\n\n", 1)[0].splitlines()  # the first table
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    assert set(lines[1]) == {"|", "-"}
    cells = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]
    return {(c["point"], c["variant"]): c for c in cells}


def test_tables_and_chart(plot, csvs, tmp_path, capsys):
    vit, other, ms = csvs
    md, png = tmp_path / "results.md", tmp_path / "results.png"
    pytest.importorskip("matplotlib")
    assert plot.main([str(vit), str(other), "--markdown", str(md), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = md.read_text()
    assert [line for line in text.splitlines() if line.startswith("### ")] == ["### vit", "### nms", "### robot"]

    rows = table_rows(text, "vit")
    assert len(rows) == 6
    for (point, variant), row in rows.items():
        batch = int(point.rsplit("b", 1)[1])
        assert float(row["ms"]) == pytest.approx(ms[point, variant], abs=6e-4)
        assert row["p20-p80"] == f"{ms[point, variant] * 0.9:.3f}-{ms[point, variant] * 1.2:.3f}"
        assert float(row["img/s"]) == pytest.approx(batch / ms[point, variant] * 1e3, rel=0.01, abs=0.06)
        over = ms[point, "plain, eager fp32"] / ms[point, variant]
        assert float(row["x eager fp32"]) == pytest.approx(over, abs=0.006)
        assert row["peak MiB"] == "3" and "exact" not in row and "boxes/s" not in row
    assert "| 192d x2 b7 | ours, fullgraph.compile dev bf16 | 0.250 | 0.125 |" in text  # the breakdown table

    nms = table_rows(text, "nms")
    compiled = nms["n200 b4", "ours, compiled"]
    assert compiled["exact"] == "NO" and nms["n200 b4", "ours, eager"]["exact"] == "yes"
    assert float(compiled["boxes/s"]) == pytest.approx(800 / ms["n200 b4", "ours, compiled"] * 1e3, abs=0.6)
    over = ms["n200 b4", "ours, eager"] / ms["n200 b4", "ours, compiled"]
    assert float(compiled["x ours, eager"]) == pytest.approx(over, abs=0.006)
    robot = table_rows(text, "robot")
    assert robot["stream", "plan"]["recompiles after warm-up"] == "0" and "img/s" not in robot["stream", "plan"]
    assert capsys.readouterr().out == f"wrote {md}\nwrote {png}\n"


def test_a_later_run_replaces_an_earlier_one(plot, csvs, capsys):
    vit, _, _ = csvs
    append_csv(vit, make_rows("vit", "192d x2 b1", "plain, eager fp32", timing(123.25)))
    assert plot.main([str(vit)]) == 0
    rows = table_rows(capsys.readouterr().out, "vit")
    assert rows["192d x2 b1", "plain, eager fp32"]["ms"] == "123.2" and len(rows) == 6


def test_without_matplotlib_the_chart_is_one_line_and_exit_2(plot, csvs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert plot.main([str(csvs[0]), "--png", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs matplotlib" in err and not (tmp_path / "x.png").exists()


def test_a_file_without_these_suites_is_refused(plot, tmp_path, capsys):
    path = tmp_path / "ops.csv"
    append_csv(path, make_rows("ops", "rms_norm", "eager", timing(1.0)))
    assert plot.main([str(path)]) == 2
    assert "no rows of the vit, nms, robot suites" in capsys.readouterr().err
