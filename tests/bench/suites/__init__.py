from fullgraph.bench.results import read_csv
from fullgraph.cli.main import main


def run_suite(tmp_path, suite: str, *args: str):
    """`fullgraph bench SUITE --device cpu --reps 2 ARGS`, which must succeed: (rows of its CSV, {variant timed}); a
    run that measured nothing writes no CSV."""
    path = tmp_path / f"{suite}.csv"
    assert main(["bench", suite, "--device", "cpu", "--reps", "2", *args, "--csv", str(path)]) == 0
    rows = read_csv(path) if path.exists() else []
    return rows, {r.variant for r in rows if r.metric == "median_ms"}
