"""benchmarks/tune_gemm_gelu.py without a GPU: the tile per row count, the CONFIGS table it prints, and the decision
points it writes, read back as `auto` of the gelu_epilogue rewrite reads them (op linear_gelu_erf)."""

import pytest

from fullgraph.ops import measured
from tests.bench.scripts import load_script

A, B = (64, 128, 64, 8, 4, 4), (128, 256, 64, 8, 8, 3)


@pytest.fixture(scope="module")
def tg():
    return load_script("tune_gemm_gelu")


def timings(tg, native: float, a: float, b: float) -> dict:
    return {(name, mode): t for name, t in (("compiled native", native), (tg.tile_name(A), a), (tg.tile_name(B), b))
            for mode in tg.MODES}  # fmt: skip


def test_tiles_by_row_count_decisions_and_the_file_auto_reads(tg, tmp_path):
    shapes = [(256, 384), (256, 768), (65536, 384), (65536, 768)]
    ms = {
        (256, 384): timings(tg, 1.0, 1.05, 1.3),  # few rows: the small tile, and it loses to native
        (256, 768): timings(tg, 1.0, 1.0, 1.2),
        (65536, 384): timings(tg, 1.0, 0.9, 0.8),  # many rows: the large tile wins, by 25% and 10%
        (65536, 768): timings(tg, 1.0, 0.95, 0.909),
    }
    chosen = tg.choose_tiles(ms, shapes, (A, B))
    assert chosen == {256: A, 65536: B}
    table = tg.configs_table(chosen)
    assert table == [("4096", A), ("1 << 62", B)]  # the geometric mean of 256 and 65536
    points = tg.decision_points(ms, shapes, chosen, ("default",))
    choice = {(p["rows"], p["width"]): p["choice"] for p in points}
    assert choice == {(256, 384): "native", (256, 768): "native", (65536, 384): "kernel", (65536, 768): "kernel"}
    path = tmp_path / "decisions.json"
    tg.merge_points(str(path), {("NVIDIA H200", "2.11"): ("3.6", points)})
    read = measured.read_points(path)
    key = ("NVIDIA H200", "2.11", "linear_gelu_erf", "bf16", 0)
    assert measured.choice_among(read, *key, 384, 50000, "default") == "kernel"  # within 2x of 65536 rows
    assert measured.choice_among(read, *key, 384, 300, "default") == "native"
    assert measured.choice_among(read, *key, 512, 65536, "default") == "native"  # a width nobody measured
